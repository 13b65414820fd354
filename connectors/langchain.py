"""LangChain adapters: :class:`IsotropeEmbeddings` (``Embeddings``) and :class:`IsotropeVectorStore` (``VectorStore``).

* ``IsotropeEmbeddings(encoder=DIR)`` embeds with a fitted encoder (a folder, or a store's own);
  ``IsotropeEmbeddings(model=NAME, shape="l2")`` with a recipe that needs no corpus;
  :meth:`IsotropeEmbeddings.fit` fits one on texts. Documents embed as ``kind="document"``,
  queries as ``kind="query"`` (a model's query prefix applies).
* ``IsotropeVectorStore("faiss:DIR" | "lancedb:DIR", embedding)`` is an isotrope collection: the
  store keeps the encoder beside its vectors, writes through :meth:`Collection.add` (which encodes
  the texts itself) and refuses another encoder. An ``Embeddings`` that is not an isotrope encoder
  cannot be kept beside the vectors, so it is refused rather than silently stored.

Metadata: JSON scalars are stored as filterable fields; lists and dicts are kept exactly (as JSON under
:data:`JSON_KEY`) but cannot be filtered on. Filters are the dicts LangChain's Chroma/PGVector use, as
isotrope's own (:mod:`isotrope.stores.filters`): ``{"source": "a.txt", "year": {"$gte": 2020}}``,
``$eq $ne $gt $gte $lt $lte $in $nin``, ``$and``/``$or``, and ``$between: [lo, hi]``.
Search modes (``mode="dense" | "lexical" | "hybrid"``, ``alpha``; none: the store's calibrated default) pass through ``similarity_search``
and so through ``as_retriever(search_kwargs={"mode": "hybrid", "k": 5})``.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore

from isotrope.connectors.encoders import fit_encoder, resolve_encoder
from isotrope.encoder import ShapedEncoder
from isotrope.fusion import search_store
from isotrope.search import Collection
from isotrope.stores.base import Hit
from isotrope.stores.filters import COMPARISONS, check_fields
from isotrope.stores.layout import ENCODER_DIR

T = TypeVar("T")
#: the reserved metadata field holding a document's non-scalar metadata values as JSON
JSON_KEY = "_langchain_json"


# --------------------------------------------------------------------------- embeddings


class IsotropeEmbeddings(Embeddings):
    """LangChain ``Embeddings`` over a fitted isotrope encoder.

    ``encoder``: a saved encoder folder or a store (``faiss:DIR``); or ``model`` + recipe fields
    (``shape``, ``pooling``, ...) for a recipe that needs no corpus. ``device``: where it runs.
    """

    def __init__(
        self,
        encoder: str | os.PathLike[str] | ShapedEncoder | None = None,
        model: str | None = None,
        *,
        device: str = "auto",
        **recipe: Any,
    ) -> None:
        if isinstance(encoder, ShapedEncoder):
            encoder.check_is_fitted()
            self.encoder = encoder
        else:
            self.encoder = resolve_encoder(encoder, model, device=device, **recipe)

    @classmethod
    def fit(
        cls, texts: Iterable[str], path: str | os.PathLike[str], model: str, shape: str | None = None, **create_options: Any
    ) -> IsotropeEmbeddings:
        """Fit ``model`` with ``shape`` on ``texts``, save the encoder to ``path`` and embed with it."""
        return cls(fit_encoder(texts, path, model, shape, **create_options))

    @property
    def fingerprint(self) -> str:
        """The fingerprint of the isotrope encoder behind these embeddings."""
        return self.encoder.fingerprint

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Document vectors of ``texts``, as lists of floats."""
        return self.encoder.encode(list(texts), kind="document").tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        """The query vector of ``text``, as a list of floats."""
        return self.encoder.encode([text], kind="query")[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """``embed_documents`` in a worker thread."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> list[float]:
        """``embed_query`` in a worker thread."""
        return await asyncio.to_thread(self.embed_query, text)


# --------------------------------------------------------------------------- filters

_RANGE = "$between"


def to_where(filter: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A LangChain-style metadata filter dict as isotrope's ``where`` (``$between: [lo, hi]`` becomes
    ``$gte``/``$lte``); an operator neither knows is a ``ValueError`` naming it. None or ``{}``: no filter."""
    if not filter:
        return None
    if not isinstance(filter, Mapping):
        raise ValueError(f"filter must be a dict such as {{'source': 'a.txt'}}; got {type(filter).__name__}")
    out: dict[str, Any] = {}
    for key, value in filter.items():
        if key in ("$and", "$or"):
            out[key] = [to_where(child) or {} for child in value]
        elif key.startswith("$"):
            raise ValueError(f"filter operator {key!r} is not supported at the top level (use $and / $or)")
        elif isinstance(value, Mapping):
            out[key] = {}
            for op, operand in value.items():
                if op == _RANGE:
                    low, high = operand
                    out[key].update({"$gte": low, "$lte": high})
                elif op in COMPARISONS:
                    out[key][op] = list(operand) if isinstance(operand, (list, tuple, set)) else operand
                else:
                    supported = ", ".join((*COMPARISONS, _RANGE))
                    raise ValueError(f"filter on {key!r}: operator {op!r} is not supported (supported: {supported})")
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- vector store


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


def _row(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """A document's metadata as a store row: scalars as fields, the rest as JSON under :data:`JSON_KEY`."""
    metadata = dict(metadata or {})
    if JSON_KEY in metadata:
        raise ValueError(f"metadata key {JSON_KEY!r} is reserved by IsotropeVectorStore")
    row = {key: value for key, value in metadata.items() if _is_scalar(value)}
    rest = {key: value for key, value in metadata.items() if key not in row}
    if rest:
        row[JSON_KEY] = json.dumps(rest, ensure_ascii=False)
    return row


def _document(hit: Hit) -> Document:
    metadata = dict(hit.metadata)
    rest = metadata.pop(JSON_KEY, None)
    if rest is not None:
        metadata.update(json.loads(rest))
    return Document(id=hit.id, page_content=hit.text or "", metadata=metadata)


def _open_collection(uri: str, embedding: IsotropeEmbeddings | None, store_options: Mapping[str, Any]) -> Collection:
    if Collection.exists(uri):
        return Collection.open(uri, encoder=None if embedding is None else embedding.encoder)
    if embedding is None:
        raise FileNotFoundError(f"no isotrope store at {uri}: pass an IsotropeEmbeddings to create one")
    return Collection.create(uri, embedding.encoder, **store_options)


class IsotropeVectorStore(VectorStore):
    """A LangChain ``VectorStore`` over an isotrope collection (``faiss:DIR`` or ``lancedb:DIR``).

    Opens the store at ``uri`` (with ``embedding``'s encoder, which must be the store's) or creates it
    with ``embedding``'s encoder; ``store_options`` go to a new store under the shared option names (e.g. ``index="HNSW32"``).
    Scores are similarities, higher is closer. One writer per store: :meth:`close` releases it.
    """

    def __init__(self, uri: str | os.PathLike[str], embedding: Embeddings | None = None, **store_options: Any) -> None:
        if embedding is not None and not isinstance(embedding, IsotropeEmbeddings):
            raise TypeError(
                f"IsotropeVectorStore keeps its encoder beside the vectors and embeds through it: pass an "
                f"IsotropeEmbeddings, not {type(embedding).__name__}"
            )
        # the FAISS store's SQLite connection belongs to the thread that opened it, and LangChain calls
        # from any thread (async methods run in an executor): every store call runs in this one thread
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isotrope-store")
        self._closed = False
        try:
            self._collection = self._worker.submit(_open_collection, os.fspath(uri), embedding, store_options).result()
        except BaseException:
            self._worker.shutdown()
            raise

    def run(self, function: Callable[[Collection], T]) -> T:
        """``function(collection)`` called in the store's own thread (where its connections live)."""
        return self._worker.submit(function, self._collection).result()

    @property
    def embeddings(self) -> IsotropeEmbeddings:
        """The store's own encoder as LangChain ``Embeddings``."""
        return IsotropeEmbeddings(self._collection.encoder)

    @property
    def encoder_path(self) -> Path:
        """The folder of the encoder kept beside the vectors."""
        return self._collection.path / ENCODER_DIR

    # -- writing --------------------------------------------------------------------
    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        """Upsert texts (encoded by the store's encoder) with their metadata; new ids are uuid4 strings."""
        texts = list(texts)
        if metadatas is not None and len(metadatas) != len(texts):
            raise ValueError(f"{len(metadatas)} metadatas for {len(texts)} texts")
        if ids is not None and len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        given: list[str | None] = list(ids) if ids else [None] * len(texts)
        ids = [id or str(uuid.uuid4()) for id in given]
        rows = [_row(metadata) for metadata in metadatas] if metadatas else [{} for _ in texts]
        batch_size = kwargs.get("batch_size", 64)
        return self.run(lambda collection: collection.add(ids, texts, rows, batch_size=batch_size))

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete by ids and/or a ``filter=`` dict (rows matching both when both are given); unknown ids are ignored."""
        where = to_where(kwargs.get("filter"))
        if ids is None and where is None:
            raise ValueError("delete needs ids or a filter (delete(filter={}) is not taken as 'everything')")
        self.run(lambda collection: collection.delete(ids=ids, where=where))
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The stored documents of ``ids`` (ids not stored are left out), in order."""
        return [_document(hit) for hit in self.run(lambda collection: collection.get(ids)) if hit is not None]

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        uri: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> IsotropeVectorStore:
        """A store at ``uri`` (required: ``faiss:DIR`` or ``lancedb:DIR``) holding ``texts``."""
        if uri is None:
            raise ValueError("from_texts needs uri='faiss:DIR' or 'lancedb:DIR': where the store is kept")
        store = cls(uri, embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store

    def close(self) -> None:
        """Release the store (its writer lock) and its thread."""
        if not self._closed:
            self._closed = True
            self.run(Collection.close)
            self._worker.shutdown()

    def __enter__(self) -> IsotropeVectorStore:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- searching ------------------------------------------------------------------
    def _search(
        self,
        query: str | None,
        vector: Sequence[float] | None,
        k: int,
        filter: Mapping[str, Any] | None,
        mode: str | None,
        alpha: float | None,
        group_by: str | None = None,
    ) -> list[tuple[Document, float]]:
        where = to_where(filter)

        def search(collection: Collection) -> list[Hit]:
            if vector is None:  # Collection.search checks the filter's fields and the mode
                return collection.search(query or "", k=k, where=where, mode=mode, alpha=alpha, group_by=group_by)  # type: ignore[return-value]
            if where:
                check_fields(where, collection.store.metadata_fields())
            array = np.asarray(vector, dtype=np.float32)[None, :]
            return search_store(collection.store, [query or ""], array, k, where=where, mode=mode or "dense", group_by=group_by)[
                0
            ]

        return [(_document(hit), hit.score) for hit in self.run(search)]

    def similarity_search_with_score(
        self,
        query: str,
        k: int = 4,
        filter: Mapping[str, Any] | None = None,
        *,
        mode: str | None = None,
        alpha: float | None = None,
        group_by: str | None = None,
        **kwargs: Any,
    ) -> list[tuple[Document, float]]:
        """The ``k`` best documents with their scores; ``mode`` dense, lexical (BM25) or hybrid (``alpha``
        on the dense side), default the store's calibrated default search; ``group_by`` a metadata field
        keeps the best document per value."""
        return self._search(query, None, k, filter, mode, alpha, group_by)

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        """The ``k`` best documents for ``query`` (keywords as ``similarity_search_with_score``)."""
        return [document for document, _ in self.similarity_search_with_score(query, k, **kwargs)]

    def similarity_search_by_vector(
        self, embedding: list[float], k: int = 4, filter: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> list[Document]:
        """Dense search by a query vector of this store's encoder."""
        return [document for document, _ in self._search(None, embedding, k, filter, "dense", None)]

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Cosine similarity (the stores' shaped, unit-length vectors) mapped onto [0, 1]."""
        return lambda score: min(max((1.0 + score) / 2.0, 0.0), 1.0)


__all__ = ["IsotropeEmbeddings", "IsotropeVectorStore", "to_where"]
