"""The shaped encoder in LanceDB's embedding-function registry, as ``"isotrope"``.

Importing this module registers it (LanceDB has no plugin entry point for embedding functions)::

    import isotrope.connectors.lancedb_registry  # noqa: F401  registers "isotrope"
    from lancedb.embeddings import get_registry
    from lancedb.pydantic import LanceModel, Vector

    func = get_registry().get("isotrope").create(encoder="my-encoder/")  # or model=NAME, shape="l2"

    class Doc(LanceModel):
        text: str = func.SourceField()
        vector: Vector(func.ndims()) = func.VectorField()

    table = lancedb.connect("db").create_table("docs", schema=Doc)
    table.add([{"text": "..."}])            # embedded as documents
    table.search("a question").limit(5)     # embedded as a query

LanceDB keeps the arguments of ``create`` in the table's schema metadata and re-creates the function
from them when the table is used again. ``create`` adds the encoder's fingerprint to those arguments,
so a table records which encoder wrote its vectors, and re-creating it over a folder that now holds
another encoder raises :class:`~isotrope.errors.EncoderMismatchError` instead of mixing shapings.
A process that opens such a table must import this module first.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from lancedb.embeddings import TextEmbeddingFunction, register
from pydantic import PrivateAttr

from isotrope.connectors.encoders import encoder_folder, resolve_encoder
from isotrope.encoder import ShapedEncoder
from isotrope.errors import EncoderMismatchError
from isotrope.persist import read_spec

NAME = "isotrope"


@functools.lru_cache(maxsize=4)
def _cached(encoder: str | None, saved: str | None, model: str | None, shape: str | None, device: str) -> ShapedEncoder:
    """One loaded encoder per recipe (and saved fingerprint) and process."""
    return resolve_encoder(encoder, model, device=device, **({"shape": shape} if shape is not None else {}))


def _load(encoder: str | None, model: str | None, shape: str | None, device: str) -> ShapedEncoder:
    """The encoder of the function's arguments; LanceDB re-creates the function on every table use, so it is
    cached, keyed by the folder's saved fingerprint too (a replaced folder is loaded again)."""
    saved = None if encoder is None else read_spec(encoder_folder(encoder))["fingerprint"]
    return _cached(encoder, saved, model, shape, device)


@register(NAME)
class IsotropeEmbeddingFunction(TextEmbeddingFunction):
    """A fitted isotrope encoder (``encoder=FOLDER`` or a store) or a recipe needing no corpus
    (``model=NAME``, ``shape=``); documents and queries are embedded as their kinds."""

    encoder: str | None = None
    model: str | None = None
    shape: str | None = None
    device: str = "auto"
    fingerprint: str | None = None
    max_retries: int = 0  # a local encoder's error is not a rate limit: no retries

    _encoder: ShapedEncoder = PrivateAttr()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._encoder = _load(self.encoder, self.model, self.shape, self.device)
        if self.fingerprint is not None and self.fingerprint != self._encoder.fingerprint:
            source = f"encoder={self.encoder}" if self.encoder is not None else f"model={self.model}"
            raise EncoderMismatchError(
                f"this LanceDB table's vectors were written by encoder {self.fingerprint}, but {source} is now "
                f"encoder {self._encoder.fingerprint}; vectors from different shapings are not comparable"
            )

    @classmethod
    def create(cls, **kwargs: Any) -> IsotropeEmbeddingFunction:
        """The function, its fingerprint recorded among the arguments LanceDB keeps in the table."""
        instance = super().create(**kwargs)
        instance._original_args = {**kwargs, "fingerprint": instance._encoder.fingerprint}
        return instance

    def ndims(self) -> int:
        """The vector dimension (LanceDB sizes the vector column with it)."""
        return self._encoder.dim

    def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[np.ndarray | None]:
        """Document vectors of ``texts``; None for a null text (LanceDB's "no embedding")."""
        texts = list(texts)
        present = [i for i, text in enumerate(texts) if text is not None]
        out: list[np.ndarray | None] = [None] * len(texts)
        for i, vector in zip(present, self._encoder.encode([texts[i] for i in present], kind="document")):
            out[i] = vector
        return out

    def compute_query_embeddings(self, query: str, *args: Any, **kwargs: Any) -> list[np.ndarray]:
        """The query vector of ``query``, encoded as a query."""
        return list(self._encoder.encode([query], kind="query"))


__all__ = ["NAME", "IsotropeEmbeddingFunction"]
