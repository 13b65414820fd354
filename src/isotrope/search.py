"""A collection: a vector store plus the fitted encoder that wrote it, queried with that encoder."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from isotrope.encoder import ShapedEncoder
from isotrope.persist import SPEC_FILE
from isotrope.stores.base import Hit, VectorStore
from isotrope.stores.filters import parse_where

logger = logging.getLogger(__name__)

ENCODER_DIR = "encoder"
#: store kind -> "module:class" of its implementation
STORE_KINDS = {
    "faiss": "isotrope.connectors.faiss_store:FaissStore",
    "lancedb": "isotrope.connectors.lancedb_store:LanceDBStore",
}


class EncoderMismatchError(ValueError):
    """A store opened with an encoder other than the one that wrote it."""


def parse_store_uri(uri: str | Path) -> tuple[str, Path]:
    """``faiss:DIR`` / ``lancedb:DIR`` -> (kind, path); a bare existing folder is recognised by its files."""
    text = str(uri)
    kind, sep, rest = text.partition(":")
    if sep and kind in STORE_KINDS:
        return kind, Path(rest).expanduser()
    path = Path(text).expanduser()
    if (path / "index.faiss").exists() or any(path.glob("*.sqlite")):
        return "faiss", path
    if any(path.glob("*.lance")):
        return "lancedb", path
    raise ValueError(f"cannot tell the store kind of {text!r}: write faiss:DIR or lancedb:DIR")


def _store_class(kind: str) -> type:
    module_name, class_name = STORE_KINDS[kind].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"the {kind} store needs its extra: pip install 'isotrope[{kind}]' ({error})") from None
    return getattr(module, class_name)


class Collection:
    """A store and its encoder. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, store: VectorStore, encoder: ShapedEncoder, path: Path, kind: str) -> None:
        self.store = store
        self.encoder = encoder
        self.path = path
        self.kind = kind

    @classmethod
    def exists(cls, uri: str | Path) -> bool:
        """Whether ``uri`` holds a store (also one whose reshape was interrupted mid-swap, encoder folder aside)."""
        from isotrope.reshape import MARKER

        try:
            _, path = parse_store_uri(uri)
        except ValueError:
            return False
        return (path / ENCODER_DIR / SPEC_FILE).is_file() or (path / MARKER).is_file()

    @classmethod
    def create(cls, uri: str | Path, encoder: ShapedEncoder, **store_options: Any) -> Collection:
        """A new, empty store at ``uri`` with ``encoder`` (fitted) saved beside it."""
        kind, path = parse_store_uri(uri)
        if cls.exists(uri):
            raise FileExistsError(f"{path} already holds an isotrope store; open it instead")
        encoder.check_is_fitted()
        path.mkdir(parents=True, exist_ok=True)
        if kind == "lancedb":  # keep the pre-transform vectors so the shaping can be refitted (reshape)
            store_options.setdefault("raw_dim", encoder.backbone.dim)
        store = _store_class(kind)(path, dim=encoder.dim, **store_options)
        store.set_properties(**describe_encoder(encoder))
        store.commit()
        encoder.save(path / ENCODER_DIR)
        return cls(store, encoder, path, kind)

    @classmethod
    def open(cls, uri: str | Path, encoder: ShapedEncoder | None = None, device: str = "auto",
             backend: str | None = None) -> Collection:
        """Open a store with the encoder that wrote it; a different ``encoder`` is an error naming both fingerprints.

        ``backend`` runs the store's encoder on another runtime; a different runtime (for the
        store's encoder or a given one) follows :func:`~isotrope.backbones.backends.check_backend_switch`.
        """
        from isotrope.backbones.backends import check_backend_switch, recorded_backend
        from isotrope.persist import read_spec

        kind, path = parse_store_uri(uri)
        if not cls.exists(uri):
            raise FileNotFoundError(f"no isotrope store at {path} (missing {ENCODER_DIR}/{SPEC_FILE})")
        store = _store_class(kind)(path)
        from isotrope.reshape import recover_interrupted_reshape

        try:
            recover_interrupted_reshape(path, store)
        except BaseException:
            store.close()
            raise
        recorded = store.properties.get("fingerprint")
        try:
            if encoder is None:
                encoder = ShapedEncoder.load(path / ENCODER_DIR, device=device, backend=backend)
            written = recorded_backend(read_spec(path / ENCODER_DIR)["backbone"])
            used = recorded_backend(encoder.spec["backbone"])
            if used != written and encoder.fingerprint_as(written) == recorded:
                check_backend_switch(written, used, f"store {path}")
                return cls(store, encoder, path, kind)
        except BaseException:
            store.close()
            raise
        if encoder.fingerprint != recorded:
            store.close()
            raise EncoderMismatchError(
                f"store {path} was written by encoder {recorded} but the encoder given has fingerprint "
                f"{encoder.fingerprint}; vectors from different shapings are not comparable"
            )
        return cls(store, encoder, path, kind)

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        where: Mapping[str, Any] | str | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """Encode the query text(s) as queries and return the best ``k`` hits (a list per query for a list)."""
        single = isinstance(queries, str)
        texts = [queries] if single else list(queries)
        if isinstance(where, str):
            where = parse_where(where)
        vectors = self.encoder.encode(texts, kind="query")
        hits = self.store.search(vectors, k, where=where)
        return hits[0] if single else hits

    def info(self) -> dict[str, Any]:
        """Counts, model, shaping and fingerprint."""
        return {"store": f"{self.kind}:{self.path}", "chunks": len(self.store), **self.store.properties,
                **self.encoder.metadata}

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def describe_encoder(encoder: ShapedEncoder) -> dict[str, str]:
    """The store properties that record which encoder wrote the vectors."""
    backbone = encoder.spec["backbone"]
    return {
        "fingerprint": encoder.fingerprint,
        "model": str(backbone.get("model") or backbone.get("source")),
        "pooling": encoder.pooling,
        "weighting": encoder.weighting.scheme,
        "shape": encoder.shape,
        "dim": str(encoder.dim),
    }
