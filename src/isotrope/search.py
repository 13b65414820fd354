"""A collection: a vector store plus the fitted encoder that wrote it, queried with that encoder."""

from __future__ import annotations

import importlib
import json
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.autofusion import PROPERTY, SAMPLE, fit_default_search, pseudo_queries, sample_chunks, sample_store, stored_default
from isotrope.encoder import ShapedEncoder
from isotrope.errors import EncoderMismatchError, EncoderMissingError
from isotrope.fusion import check_alpha, check_mode, search_store
from isotrope.persist import SPEC_FILE, read_spec
from isotrope.stores import index_plan
from isotrope.stores.base import Hit, VectorStore, as_vectors
from isotrope.stores.filters import check_field, check_fields, parse_where
from isotrope.stores.layout import ENCODER_DIR, MARKER, recover_interrupted_reshape
from isotrope.stores.options import AUTO, RENAMED
from isotrope.teacher_queries import start_loading

logger = logging.getLogger(__name__)

#: store kind -> "module:class" of its implementation
STORE_KINDS = {
    "faiss": "isotrope.connectors.faiss_store:FaissStore",
    "lancedb": "isotrope.connectors.lancedb_store:LanceDBStore",
}
UNCALIBRATED_NOTE = (
    "{store} has no calibrated default search (written before calibration existed, or filled through the "
    "Python API rather than `isotrope index`): searching dense; "
    "run `isotrope calibrate {store} --default-search` to choose it from the store's own chunks"
)
#: stored chunks sampled per pseudo-query that calibrates the index (chunks too short to cut one from are skipped)
INDEX_QUERY_SAMPLE = 5
#: the least cosine between a given vector and this encoder's vector of its text (float32 round-off aside)
MIN_VERIFY_COSINE = 0.99


def holds_vectors(path: Path) -> bool:
    """Whether ``path`` holds a FAISS or LanceDB store's data (with or without its encoder)."""
    return path.is_dir() and ((path / "index.faiss").exists() or any(path.glob("*.sqlite")) or any(path.glob("*.lance")))


def _missing_encoder_message(path: Path) -> str:
    return (
        f"{path} holds vectors but no {ENCODER_DIR}/ folder (no {ENCODER_DIR}/{SPEC_FILE}): the encoder that "
        f"shaped them is lost, and vectors "
        f"of another shaping must not be mixed in. Restore {path / ENCODER_DIR} from a backup, or re-index the "
        f"documents into a new store (or delete {path} first)"
    )


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


def _store_class(kind: str) -> type[Any]:
    module_name, class_name = STORE_KINDS[kind].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"the {kind} store needs its extra: pip install '.[{kind}]' in the isotrope source ({error})") from None
    return getattr(module, class_name)


def check_index(kind: str, index: str) -> None:
    """Refuse an ``index`` (a shared store option) that a store of ``kind`` cannot build, before any fitting."""
    _store_class(kind).check_index(index)


def _start_loading_teacher(encoder_dir: Path) -> None:
    """Start loading the teacher of a ``--teacher-queries`` encoder while the store and the encoder load (a cold
    search waited 0.2 s for its session after them); a spec that cannot be read here is reported by the load."""
    try:
        teacher = read_spec(encoder_dir).get("query_teacher")
        if teacher:
            start_loading(str(teacher["model"]), str(teacher["backend"]))
    except (OSError, ValueError, KeyError, TypeError):
        return


class Collection:
    """A store and its encoder. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, store: VectorStore, encoder: ShapedEncoder, path: Path, kind: str) -> None:
        self.store = store
        self.encoder = encoder
        self.path = path
        self.kind = kind
        self._told_uncalibrated = False
        store.calibration_queries = lambda: self.index_queries()[0]  # an index built from here on calibrates on them

    @classmethod
    def exists(cls, uri: str | Path) -> bool:
        """Whether ``uri`` holds a store (also one whose reshape was interrupted mid-swap, encoder folder aside)."""
        try:
            _, path = parse_store_uri(uri)
        except ValueError:
            return False
        return (path / ENCODER_DIR / SPEC_FILE).is_file() or (path / MARKER).is_file()

    @classmethod
    def check_creatable(cls, uri: str | Path, index: str | None = None) -> tuple[str, Path]:
        """``(kind, path)`` of a store that can be created at ``uri`` with ``index`` (checked before any fitting)."""
        kind, path = parse_store_uri(uri)
        if index is not None:
            check_index(kind, index)
        if cls.exists(uri):
            raise FileExistsError(f"{path} already holds an isotrope store; open it instead")
        if holds_vectors(path):
            raise EncoderMissingError(_missing_encoder_message(path))
        return kind, path

    @classmethod
    def create(cls, uri: str | Path, encoder: ShapedEncoder, **store_options: Any) -> Collection:
        """A new, empty store at ``uri`` with ``encoder`` (fitted) saved beside it."""
        kind, path = cls.check_creatable(uri)
        encoder.check_is_fitted()
        store_class = _store_class(kind)
        new_folder = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        if kind == "lancedb":  # keep the pre-transform vectors so the shaping can be refitted (reshape)
            store_options.setdefault("raw_dim", encoder.backbone.dim)
        if not any(name in store_options for name in ("index", *(old for old, new in RENAMED.items() if new == "index"))):
            store_options["index"] = AUTO  # the index follows the size (stores.index_plan)
        store = None
        try:
            store = store_class(path, dim=encoder.dim, **store_options)
            store.set_properties(**describe_encoder(encoder))
            store.commit()
            encoder.save(path / ENCODER_DIR)
        except BaseException:  # no half-made store (vectors' table without its encoder) is left behind
            if store is not None:
                store.close()
            if new_folder:
                shutil.rmtree(path, ignore_errors=True)
            raise
        return cls(store, encoder, path, kind)

    @classmethod
    def open(
        cls,
        uri: str | Path,
        encoder: ShapedEncoder | None = None,
        device: str = "auto",
        backend: str | None = None,
        **store_options: Any,
    ) -> Collection:
        """Open a store with the encoder that wrote it; a different ``encoder`` is an error naming both fingerprints.

        ``backend`` runs the store's encoder on another runtime; a different runtime (for the
        store's encoder or a given one) follows :func:`~isotrope.backbones.backends.check_backend_switch`.
        ``store_options`` go to the store, under the names every store shares (:mod:`isotrope.stores.options`:
        e.g. ``nprobe``, ``ef``, ``refine``).
        """
        from isotrope.backbones.backends import check_backend_switch, recorded_backend

        kind, path = parse_store_uri(uri)
        if not cls.exists(uri):
            if holds_vectors(path):
                raise EncoderMissingError(_missing_encoder_message(path))
            raise FileNotFoundError(f"no isotrope store at {path} (missing {ENCODER_DIR}/{SPEC_FILE})")
        if encoder is None:
            _start_loading_teacher(path / ENCODER_DIR)
        store = _store_class(kind)(path, **store_options)
        try:
            recover_interrupted_reshape(path, store)
        except BaseException:
            store.close()
            raise
        recorded = store.encoder_fingerprint
        try:
            loaded = encoder is None
            if encoder is None:
                encoder = ShapedEncoder.load(path / ENCODER_DIR, device=device, backend=backend)
            written_spec = read_spec(path / ENCODER_DIR)
            written = recorded_backend(written_spec["backbone"])
            used = recorded_backend(encoder.spec["backbone"])
            if used != written and encoder.fingerprint_as(written) == recorded:
                check_backend_switch(written, used, f"store {path}")
                return cls(store, encoder, path, kind)
            # a loaded encoder was checked against its saved fingerprint: not computed twice
            fingerprint = written_spec["fingerprint"] if loaded and used == written else encoder.fingerprint
        except BaseException:
            store.close()
            raise
        if fingerprint != recorded:
            store.close()
            raise EncoderMismatchError(
                f"store {path} was written by encoder {recorded} but the encoder given has fingerprint "
                f"{fingerprint}; vectors from different shapings are not comparable"
            )
        return cls(store, encoder, path, kind)

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        where: Mapping[str, Any] | str | None = None,
        mode: str | None = None,
        alpha: float | None = None,
        group_by: str | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """The best ``k`` hits of the query text(s) (a list per query for a list).

        ``mode``: ``"dense"`` (the encoder's vectors), ``"lexical"`` (BM25 over the stored texts) or
        ``"hybrid"`` (both, fused by a convex combination of z-score-normalised scores with weight ``alpha``
        on the dense side, over the dense top :data:`isotrope.fusion.DEFAULT_CANDIDATES` and the keyword top
        :data:`~isotrope.fusion.KEYWORD_SHARE` of that, completed with the other side's exact scores; default
        ``alpha``: the store's calibrated weight if its default is hybrid, else
        :data:`isotrope.fusion.DEFAULT_ALPHA`). No mode: ``hybrid`` at ``alpha`` when one is given, else the
        store's calibrated default (:meth:`default_search`).
        ``where`` filters by metadata in every mode; a field no stored row has is an error.
        ``group_by`` (a metadata field, e.g. ``"source"``) keeps the best hit per value: ``k`` documents; a
        field no stored row has is an error too (a typo would otherwise group nothing).
        """
        single = isinstance(queries, str)
        texts = [queries] if isinstance(queries, str) else list(queries)
        if mode is None:
            mode, alpha = ("hybrid", alpha) if alpha is not None else self.default_search()[:2]
        elif mode == "hybrid" and alpha is None:  # the store's calibrated weight, when it chose hybrid
            alpha = self.default_search()[1]
        check_mode(mode)
        if mode == "hybrid":
            check_alpha(alpha)
        elif alpha is not None:
            raise ValueError(f"alpha weighs the two sides of hybrid search; mode {mode!r} takes none")
        for index, text in enumerate(texts):
            if isinstance(text, str) and not text.strip():
                raise ValueError("the query is empty" if single else f"queries[{index}] is empty")
        if isinstance(where, str):
            where = parse_where(where)
        if where or group_by is not None:
            known = self.store.metadata_fields()  # one read for both checks
            check_fields(where, known)
            if group_by is not None:
                check_field(group_by, known, "group_by")
        vectors = None if mode == "lexical" else self.encoder.encode(texts, kind="query")
        hits = search_store(self.store, texts, vectors, k, where=where, mode=mode, alpha=alpha, group_by=group_by)
        return hits[0] if single else hits

    def add(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
        *,
        vectors: Any = None,
        verify: bool = True,
        commit: bool = True,
        batch_size: int = 64,
    ) -> list[str]:
        """Upsert texts under ``ids`` with their metadata, encoded by this collection's encoder; the ids.

        ``vectors`` passes embeddings a caller already made (a framework's embedding step): they must
        be this encoder's document vectors of ``texts``, which :meth:`check_vectors` checks unless
        ``verify=False`` (the caller checked them on the texts it embedded).
        ``commit=False`` leaves the write pending until :meth:`commit` (batching many calls).
        """
        ids, texts = list(ids), list(texts)
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        if not ids:
            return []
        rows = [None] * len(ids) if metadata is None else list(metadata)
        extra: dict[str, Any] = {}
        if vectors is None:
            raw = self.encoder.embed_raw(texts, kind="document", batch_size=batch_size)
            vectors = self.encoder.apply_transforms(raw)
            if self.store.stores_raw_vectors:
                extra["raw_vectors"] = raw
        else:
            vectors = as_vectors(vectors, self.store.dim)
            if len(vectors) != len(ids):
                raise ValueError(f"{len(vectors)} vectors for {len(ids)} texts")
            if verify:
                self.check_vectors(ids, texts, vectors)
        self.store.add(ids, vectors, texts, rows, **extra)
        if commit:
            self.store.commit()
        return ids

    def check_vectors(self, ids: Sequence[str], texts: Sequence[str], vectors: np.ndarray) -> None:
        """Refuse vectors made elsewhere unless the first non-empty text re-encodes to its vector
        (cosine ≥ :data:`MIN_VERIFY_COSINE`): vectors of another encoder never enter the store."""
        for id, text, vector in zip(ids, texts, vectors):
            if not text.strip():
                continue
            expected = self.encoder.encode([text], kind="document")[0].astype(np.float64)
            given = vector.astype(np.float64)
            cosine = float(expected @ given / max(np.linalg.norm(expected) * np.linalg.norm(given), 1e-12))
            if cosine < MIN_VERIFY_COSINE:
                raise EncoderMismatchError(
                    f"{id}: its vector is not this store's encoder's ({self.encoder.fingerprint[:12]}) vector of "
                    f"its text (cosine {cosine:.3f}); embed with this store's encoder, or pass no vectors"
                )
            return

    def delete(self, ids: Sequence[str] | None = None, where: Mapping[str, Any] | str | None = None, commit: bool = True) -> int:
        """Delete rows by id and/or by metadata filter (rows matching both, when both are given); the
        number of stored rows deleted. A filter no row matches deletes nothing."""
        if ids is None and where is None:
            raise ValueError("delete needs ids or a where filter")
        if isinstance(where, str):
            where = parse_where(where)
        doomed = set(self.store.contains(ids)) if ids is not None else None
        if where is not None:  # {} matches every row
            matched = set(self.store.ids(where or None))
            doomed = matched if doomed is None else doomed & matched
        if doomed:
            self.store.delete(sorted(doomed))
            if commit:
                self.store.commit()
        return len(doomed or ())

    def get(self, ids: Sequence[str]) -> list[Hit | None]:
        """The stored rows (text, metadata) of ``ids``, ``None`` where an id is not stored."""
        return self.store.get(list(ids))

    def commit(self) -> None:
        """Make pending writes durable and visible."""
        self.store.commit()

    def info(self) -> dict[str, Any]:
        """Counts, model, shaping, fingerprint and the default search (with why it was chosen)."""
        index = self.store.index_info()
        mode, alpha, choice = self.default_search()
        return {
            "store": f"{self.kind}:{self.path}",
            "chunks": len(self.store),
            **self.store.properties,
            **self.encoder.metadata,
            **index,
            PROPERTY: choice
            or {
                "mode": mode,
                "alpha": alpha,
                "calibrated": False,
                "note": UNCALIBRATED_NOTE.format(store=f"{self.kind}:{self.path}"),
            },
        }

    def default_search(self) -> tuple[str, float | None, dict[str, Any] | None]:
        """``(mode, alpha, choice)`` searches use when the caller names no mode: the store's calibrated
        choice (:mod:`isotrope.autofusion`), or dense for a store never calibrated (``choice`` None)."""
        mode, alpha, choice = stored_default(self.store.properties)
        if choice is None and not self._told_uncalibrated:
            self._told_uncalibrated = True
            logger.warning(UNCALIBRATED_NOTE.format(store=f"{self.kind}:{self.path}"))
        return mode, alpha, choice

    def fit_default_search(self, sample: int = SAMPLE, seed: int = 0) -> dict[str, Any]:
        """Choose and save the default search from pseudo-queries made from a sample of the stored chunks
        (:func:`isotrope.autofusion.fit_default_search`); the choice with its evidence."""
        texts, vectors = sample_store(self.store, sample, seed)
        choice = fit_default_search(texts, vectors, self.encoder, self.store.metric, store_size=len(self.store), seed=seed)
        timings = ("seconds", "cpu_seconds")  # the stored evidence is the same wherever it was computed
        self.store.set_properties(**{PROPERTY: json.dumps({k: v for k, v in choice.items() if k not in timings})})
        self.store.commit()
        return choice

    def optimize(self) -> dict[str, Any]:
        """Rebuild the store's approximate index for its current size (and compact LanceDB); the new index info."""
        self.store.optimize()
        return self.store.index_info()

    def index_queries(self, n: int = index_plan.INDEX_QUERIES, seed: int = 0) -> tuple[np.ndarray | None, list[str]]:
        """Queries like real ones for calibrating the store's approximate index at build, without the user's:
        :meth:`index_query_texts` encoded as queries, and the ids of the chunks they were cut from; ``(None, [])``
        where the chunks give too few."""
        texts, sources = self.index_query_texts(n, seed)
        return (self.encoder.encode(texts, kind="query") if texts else None), sources

    def index_query_texts(self, n: int = index_plan.INDEX_QUERIES, seed: int = 0) -> tuple[list[str], list[str]]:
        """At most ``n`` pseudo-queries cut from a seeded sample of the stored chunks (a sentence cut out of a
        chunk, as the default search's: :func:`isotrope.autofusion.pseudo_queries`) and the ids of the chunks they
        were cut from; ``([], [])`` where the chunks give too few."""
        ids, texts = sample_chunks(self.store, INDEX_QUERY_SAMPLE * n, seed)
        try:
            queries, proxy = pseudo_queries(texts, n, seed)
        except ValueError as error:
            logger.info("%s: %s; the index calibrates on queries made from stored vectors", self.path, error)
            return [], []
        logger.info("%s: calibrating the index on %d %s pseudo-queries", self.path, len(queries), proxy)
        return [q.text for q in queries], [ids[q.target] for q in queries]

    def calibrate(self, queries: Sequence[str], target: float | None = None) -> dict[str, Any]:
        """Set the approximate index's search breadth (IVF lists, HNSW ef) to the smallest whose recall@10
        against exact search reaches ``target`` (default 0.95) on these queries, encoded as searches are,
        and save it; the new index info. Queries like the users' calibrate better than those the index is
        built with, made from stored vectors (:mod:`isotrope.stores.index_plan`)."""
        texts = list(queries)
        if not texts:
            raise ValueError("calibrating needs at least one query")
        self.store.calibrate(target, queries=self.encoder.encode(texts, kind="query"))
        self.store.commit()
        return self.store.index_info()

    def close(self) -> None:
        """Close the store (uncommitted writes are discarded; ``with`` commits them first)."""
        self.store.close()

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def describe_encoder(encoder: ShapedEncoder) -> dict[str, str]:
    """The store properties that record which encoder wrote the vectors."""
    backbone = encoder.spec["backbone"]
    described = {
        "fingerprint": encoder.fingerprint,
        "model": str(backbone.get("model") or backbone.get("source")),
        "pooling": encoder.pooling,
        "weighting": encoder.weighting.scheme,
        "shape": encoder.shape,
        "dim": str(encoder.dim),
    }
    teacher = encoder.query_teacher  # written for every encoder: a reshaped store keeps no stale value
    described["queries"] = (
        "as documents"
        if teacher is None
        else f"the table's vector and {teacher.model}'s ({teacher.backend}), weight {teacher.weight:g}"
    )
    return described
