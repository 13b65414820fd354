"""LlamaIndex adapters: an embedding model and a vector store backed by isotrope.

* :class:`IsotropeEmbedding` embeds with a fitted :class:`~isotrope.encoder.ShapedEncoder`:
  texts as ``kind="document"``, queries as ``kind="query"``. Its pydantic fields are the
  encoder's folder and fingerprint, so it pickles without torch (``IngestionPipeline``
  with ``num_workers > 1``), each process reloads the encoder on first use, and
  ``to_dict()`` (the key of LlamaIndex's ingestion cache) differs for every shaping.
* :class:`IsotropeVectorStore` is a LlamaIndex vector store over an isotrope collection
  (``faiss:DIR`` or ``lancedb:DIR``): the store keeps the encoder that wrote it and
  refuses another one.

How nodes are stored: the node id is the store id, the node's text is the store's text,
and the metadata row holds

* every metadata value that is a JSON scalar (str, int, float, bool, None), filterable;
* ``ref_doc_id`` (the source document, when the node has one) and ``_node_id``;
* ``_node_content`` / ``_node_type``: the whole node without text and embedding, in
  LlamaIndex's own format (:func:`~llama_index.core.vector_stores.utils.node_to_metadata_dict`),
  from which queries rebuild nodes with their relationships and templates.

Metadata values that are not JSON scalars (lists, dicts) are kept exactly inside
``_node_content`` (query engines see them) but cannot be filtered on; the store logs a
warning the first time it meets each such key. User keys named like the reserved keys
above are kept in the node but not as filterable columns.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding, mean_agg
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import Dispatcher, NullEventHandler, NullSpanHandler, get_dispatcher
from llama_index.core.schema import BaseNode, MetadataMode, TextNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from isotrope.backbones import TextKind
from isotrope.encoder import DEFAULT_MODEL, ShapedEncoder, default_shape
from isotrope.fusion import search_store
from isotrope.persist import read_spec
from isotrope.search import Collection, EncoderMismatchError, parse_store_uri
from isotrope.shapes import format_shape
from isotrope.stores.base import Hit
from isotrope.stores.filters import check_fields
from isotrope.stores.layout import ENCODER_DIR

logger = logging.getLogger(__name__)


def _pointer_path(persist_path: str) -> str:
    """``.../<namespace>__vector_store.json`` -> ``.../<namespace>__isotrope_store.json``: not a name LlamaIndex
    loads as a SimpleVectorStore (which would silently hold no vectors)."""
    folder, name = os.path.split(persist_path)
    return os.path.join(folder, name.removesuffix("vector_store.json") + "isotrope_store.json")


#: one lock for lazy encoder loads (a lock is not picklable, so it is not an attribute)
_LOAD_LOCK = threading.Lock()

NODE_CONTENT_KEY = "_node_content"
NODE_TYPE_KEY = "_node_type"
NODE_ID_KEY = "_node_id"
REF_DOC_ID_KEY = "ref_doc_id"
RESERVED_KEYS = (NODE_CONTENT_KEY, NODE_TYPE_KEY, NODE_ID_KEY, REF_DOC_ID_KEY)


# --------------------------------------------------------------------------- embedding


class _EncoderHooks(ABC):
    """``BaseEmbedding``'s hooks, encoding with :attr:`encoder`.

    They are defined here, outside :class:`IsotropeEmbedding`'s own class body, because LlamaIndex's
    ``DispatcherSpanMixin`` wraps every hook a subclass body defines for an abstract method in a span of its
    own. The public ``get_query_embedding`` / ``get_text_embedding_batch`` already open a span and send
    their start and end events around the hook; the second, nested span told an observer nothing new and
    cost every query an ``inspect.signature``, a ``uuid4`` and the span handlers' enter and exit.
    """

    @property
    @abstractmethod
    def encoder(self) -> ShapedEncoder:
        """The fitted encoder."""

    def _encode(self, texts: list[str], kind: TextKind) -> list[Embedding]:
        return self.encoder.encode(texts, kind=kind).tolist()

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query], "query")[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text], "document")[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._encode(list(texts), "document")

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


def _instrumentation_listens() -> bool:
    """Whether an event or span handler other than LlamaIndex's null ones is reachable from the dispatcher that
    ``BaseEmbedding.get_query_embedding`` reports to (its own, or one it propagates to, up to the root)."""
    dispatcher: Dispatcher | None = get_dispatcher(BaseEmbedding.__module__)
    while dispatcher is not None:
        if any(type(handler) is not NullEventHandler for handler in dispatcher.event_handlers):
            return True
        if any(type(handler) is not NullSpanHandler for handler in dispatcher.span_handlers):
            return True
        dispatcher = dispatcher.parent if dispatcher.propagate else None
    return False


@functools.cache
def _overrides(cls: type[BaseEmbedding], method: str) -> bool:
    """Whether ``cls`` or a base class below ``BaseEmbedding`` defines ``method`` again."""
    return next(base for base in cls.__mro__ if method in base.__dict__) is not BaseEmbedding


def _aggregate(embeddings: list[Embedding], agg_fn: Callable[..., Embedding] | None) -> Embedding:
    """``agg_fn`` (LlamaIndex's ``mean_agg`` by default) of the query embeddings; one embedding is its own mean."""
    if agg_fn is None and len(embeddings) == 1:
        return embeddings[0]
    return (agg_fn or mean_agg)(embeddings)


class IsotropeEmbedding(_EncoderHooks, BaseEmbedding):
    """A LlamaIndex embedding model backed by a fitted isotrope encoder saved in a folder.

    Build it with :meth:`from_encoder`, :meth:`from_nodes` (fit on LlamaIndex nodes),
    :meth:`from_store`, or ``IsotropeEmbedding(encoder_path)``. The encoder is loaded on
    first use; a folder whose fingerprint differs from ``fingerprint`` is an error.
    LlamaIndex's optional ``embeddings_cache`` is keyed by text alone: give each encoder its own.
    """

    encoder_path: str = Field(description="Folder of the fitted encoder (isotrope.json + state.safetensors).")
    fingerprint: str = Field(description="sha256 fingerprint of the encoder; part of the ingestion-cache key.")
    device: str = Field(default="auto", description="Device the encoder is loaded on.")
    embed_batch_size: int = Field(
        default=64,
        gt=0,
        le=2048,
        description="Texts per encode call; the encoder splits them into length-sorted batches of its own size.",
    )

    _encoder: ShapedEncoder | None = PrivateAttr(default=None)

    def __init__(self, encoder_path: str | os.PathLike[str], **kwargs: Any) -> None:
        spec = read_spec(os.fspath(encoder_path))
        expected = kwargs.pop("fingerprint", None)
        if expected is not None and expected != spec["fingerprint"]:
            raise EncoderMismatchError(f"{encoder_path} holds encoder {spec['fingerprint']}, not the expected {expected}")
        backbone = spec["backbone"]
        name = backbone.get("model") or backbone.get("source")
        kwargs.setdefault("model_name", f"isotrope:{name}:{format_shape(spec['transforms'])}")
        super().__init__(encoder_path=str(encoder_path), fingerprint=spec["fingerprint"], **kwargs)

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this embedding under."""
        return "IsotropeEmbedding"

    # -- construction ---------------------------------------------------------------
    @classmethod
    def from_encoder(cls, encoder: ShapedEncoder, path: str | os.PathLike[str], **kwargs: Any) -> IsotropeEmbedding:
        """Save a fitted ``encoder`` to ``path`` (replacing what is there) and embed with it."""
        encoder.save(os.fspath(path))
        embedding = cls(path, **kwargs)
        embedding._encoder = encoder
        return embedding

    @classmethod
    def from_nodes(
        cls,
        nodes: Sequence[BaseNode],
        path: str | os.PathLike[str],
        model: str = DEFAULT_MODEL,
        shape: str | list[dict[str, Any]] | None = None,
        *,
        max_samples: int = 100_000,
        seed: int = 0,
        **create_options: Any,
    ) -> IsotropeEmbedding:
        """Fit an encoder on the text LlamaIndex will embed for ``nodes`` (or documents), save it to ``path``.

        ``create_options`` are the other :class:`~isotrope.config.EncoderConfig` fields (pooling, layers,
        weights, ...) and ``device``/``batch_size`` of :meth:`ShapedEncoder.create`.
        """
        texts = [text for node in nodes if (text := node.get_content(metadata_mode=MetadataMode.EMBED)).strip()]
        if not texts:
            raise ValueError(f"none of the {len(nodes)} nodes has text to fit the encoder on")
        encoder = ShapedEncoder.create(model, shape=shape or default_shape(model), **create_options)
        encoder.fit(texts, max_samples=max_samples, seed=seed, fitted_on=f"{len(texts)} LlamaIndex nodes")
        return cls.from_encoder(encoder, path)

    @classmethod
    def from_store(cls, uri: str | os.PathLike[str], **kwargs: Any) -> IsotropeEmbedding:
        """The embedding of the encoder kept in an isotrope store (``faiss:DIR``, ``lancedb:DIR``)."""
        _, path = parse_store_uri(os.fspath(uri))
        return cls(path / ENCODER_DIR, **kwargs)

    # -- the encoder ----------------------------------------------------------------
    @property
    def encoder(self) -> ShapedEncoder:
        """The fitted encoder, loaded from ``encoder_path`` on first use (once per process)."""
        encoder = self._encoder  # read once: a private attribute goes through pydantic's __getattr__
        if encoder is None:
            with _LOAD_LOCK:
                encoder = self._encoder
                if encoder is None:
                    saved = read_spec(self.encoder_path)["fingerprint"]
                    if saved != self.fingerprint:
                        raise EncoderMismatchError(
                            f"{self.encoder_path} now holds encoder {saved}, not {self.fingerprint}: "
                            "the folder was replaced after this embedding was created"
                        )
                    encoder = self._encoder = ShapedEncoder.load(self.encoder_path, device=self.device)
        return encoder

    # -- queries --------------------------------------------------------------------
    def _observed(self, method: str) -> bool:
        """Whether ``BaseEmbedding``'s query embedding ``method`` would do more than call the hook: consult a cache
        or a rate limiter, send its events, callbacks and span to a handler, or be a subclass's override."""
        return bool(
            self.embeddings_cache is not None
            or self.rate_limiter is not None
            or self.callback_manager.handlers
            or _overrides(type(self), method)
            or _instrumentation_listens()
        )

    def get_agg_embedding_from_queries(self, queries: list[str], agg_fn: Callable[..., Embedding] | None = None) -> Embedding:
        """The aggregate (mean) embedding of ``queries``: what a retriever searches with (one query, or HyDE's
        ``custom_embedding_strs``). Equal to LlamaIndex's own; when nothing observes the embedding calls (no
        cache, rate limiter, callback handler or instrumentation handler), the hook is called directly,
        without ``get_query_embedding``'s span, events and callbacks that no one would see."""
        if self._observed("get_query_embedding"):
            return super().get_agg_embedding_from_queries(queries, agg_fn)
        return _aggregate([self._get_query_embedding(query) for query in queries], agg_fn)

    async def aget_agg_embedding_from_queries(
        self, queries: list[str], agg_fn: Callable[..., Embedding] | None = None
    ) -> Embedding:
        """:meth:`get_agg_embedding_from_queries` for async retrievers."""
        if self._observed("aget_query_embedding"):
            return await super().aget_agg_embedding_from_queries(queries, agg_fn)
        return _aggregate([await self._aget_query_embedding(query) for query in queries], agg_fn)

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the fields only; the encoder (torch weights) is reloaded from its folder."""
        light = self.model_copy()
        light._encoder = None
        return super(IsotropeEmbedding, light).__getstate__()


# --------------------------------------------------------------------------- filters

_OPERATORS = {
    FilterOperator.EQ: "$eq",
    FilterOperator.NE: "$ne",
    FilterOperator.GT: "$gt",
    FilterOperator.GTE: "$gte",
    FilterOperator.LT: "$lt",
    FilterOperator.LTE: "$lte",
    FilterOperator.IN: "$in",
    FilterOperator.NIN: "$nin",
}
#: exact negations under isotrope's semantics (a missing field matches $ne and $nin only)
_NEGATIONS = {"$eq": "$ne", "$ne": "$eq", "$in": "$nin", "$nin": "$in"}


def _leaf(item: MetadataFilter) -> dict[str, Any]:
    operator = FilterOperator(item.operator)
    if operator not in _OPERATORS:
        supported = ", ".join(op.value for op in _OPERATORS)
        raise ValueError(
            f"metadata filter on {item.key!r}: operator {operator.value!r} is not supported by "
            f"IsotropeVectorStore (supported: {supported}; AND/OR/NOT and nested filters)"
        )
    value = list(item.value) if isinstance(item.value, (list, tuple)) else item.value
    return {item.key: {_OPERATORS[operator]: value}}


def _negate(where: dict[str, Any]) -> dict[str, Any]:
    """The exact negation of a translated filter (De Morgan), or a ValueError for ordering operators."""
    if "$and" in where:
        return {"$or": [_negate(child) for child in where["$and"]]}
    if "$or" in where:
        return {"$and": [_negate(child) for child in where["$or"]]}
    ((key, ops),) = where.items()
    ((op, value),) = ops.items()
    if op not in _NEGATIONS:
        raise ValueError(
            f"metadata filter on {key!r}: NOT over {op} is not supported (a missing field matches "
            f"neither a comparison nor its opposite); use ==, !=, in or nin under NOT"
        )
    return {key: {_NEGATIONS[op]: value}}


def to_where(filters: MetadataFilters | None) -> dict[str, Any] | None:
    """Translate LlamaIndex ``MetadataFilters`` (nested, AND/OR/NOT) to isotrope's filter dict.

    Supported operators: ``== != > >= < <= in nin``; any other raises ``ValueError`` instead of
    being ignored. ``NOT`` (none of the filters matches) is supported over ``== != in nin``.
    Returns None for no filters.
    """
    if filters is None or not filters.filters:
        return None
    children = []
    for item in filters.filters:
        child = to_where(item) if isinstance(item, MetadataFilters) else _leaf(item)
        if child is not None:
            children.append(child)
    if not children:
        return None
    condition = FilterCondition(filters.condition or FilterCondition.AND)
    if condition == FilterCondition.OR:
        return {"$or": children}
    if condition == FilterCondition.NOT:
        return {"$and": [_negate(child) for child in children]}
    return {"$and": children}


def _in(key: str, values: Sequence[str] | None) -> dict[str, Any] | None:
    """``key`` in ``values``; None (no restriction) when ``values`` is None, nothing when it is empty."""
    return None if values is None else {key: {"$in": list(values)}}


def _all_of(*parts: dict[str, Any] | None) -> dict[str, Any] | None:
    kept = [part for part in parts if part]
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else {"$and": kept}


# --------------------------------------------------------------------------- vector store


def _is_scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, bool, int))


def _node(hit: Hit) -> BaseNode:
    """The node of a stored row: rebuilt from LlamaIndex's own format, or (a row written by ``isotrope index``
    or another framework) a ``TextNode`` of the row's id, text and metadata.

    A ``TextNode`` (what LlamaIndex's node parsers make) is rebuilt as ``metadata_dict_to_node`` does
    (``TextNode.from_json``, then its text set), with the text given to the constructor instead of assigned
    afterwards: the same node, validated once rather than twice."""
    if NODE_CONTENT_KEY not in hit.metadata:
        return TextNode(id_=hit.id, text=hit.text or "", metadata=dict(hit.metadata))
    if hit.text is None or hit.metadata.get(NODE_TYPE_KEY) != TextNode.class_name():
        return metadata_dict_to_node(hit.metadata, hit.text)
    fields = json.loads(hit.metadata[NODE_CONTENT_KEY])
    fields.pop("class_name", None)
    fields["text"] = hit.text
    return TextNode(**fields)


_MODES: dict[VectorStoreQueryMode, str | None] = {
    VectorStoreQueryMode.DEFAULT: None,  # the store's calibrated default search
    VectorStoreQueryMode.TEXT_SEARCH: "lexical",
    VectorStoreQueryMode.HYBRID: "hybrid",
}


class IsotropeVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store over an isotrope collection, with the encoder that wrote it.

    ``IsotropeVectorStore(uri, embed_model)`` opens the store at ``uri`` (``faiss:DIR`` or
    ``lancedb:DIR``) or creates it with ``embed_model``'s encoder; an ``embed_model`` whose
    fingerprint differs from the store's raises :class:`EncoderMismatchError`. Query with
    :attr:`embed_model` (the store's own encoder). Scores are similarities, higher is closer.

    ``verify_vectors``: ``add`` re-encodes the first node of each call with the store's
    encoder and refuses the batch unless its embedding matches (cosine >= 0.99), which
    catches embeddings from another model or shaping of the same dimension.
    ``autocommit``: commit after every ``add`` / ``delete`` (else call :meth:`persist`).
    ``store_options`` (new stores only): passed to the store under the shared option names
    (:mod:`isotrope.stores.options`), e.g. ``index="HNSW32"``
    or ``metric="cosine"``.
    ``is_embedding_query`` (LlamaIndex's own field, default True): False lets retrievers pass the query text
    without embedding it, and the store encodes it with its own encoder: the same vector, without its round
    trip through a list, but a query's ``custom_embedding_strs`` (HyDE) are then not used; an ``embedding`` the
    caller puts in the ``QueryBundle`` still is. (With True, :class:`IsotropeEmbedding` already skips
    LlamaIndex's embedding span, events and callbacks when no handler would see them.)
    """

    stores_text: bool = True
    flat_metadata: bool = False
    uri: str = Field(description="faiss:DIR or lancedb:DIR")
    fingerprint: str = Field(description="Fingerprint of the encoder that wrote the store.")
    verify_vectors: bool = True
    autocommit: bool = True

    _collection: Collection = PrivateAttr()
    _warned_keys: set[str] = PrivateAttr(default_factory=set)

    def __init__(
        self,
        uri: str | os.PathLike[str],
        embed_model: IsotropeEmbedding | None = None,
        *,
        store_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        uri = str(uri)
        expected = kwargs.pop("fingerprint", None)
        if embed_model is not None and not isinstance(embed_model, IsotropeEmbedding):
            raise TypeError(f"embed_model must be an IsotropeEmbedding; got {type(embed_model).__name__}")
        if Collection.exists(uri):
            collection = Collection.open(uri, encoder=None if embed_model is None else embed_model.encoder)
        elif embed_model is None:
            raise FileNotFoundError(f"no isotrope store at {uri}: pass embed_model to create one")
        else:
            collection = Collection.create(uri, embed_model.encoder, **dict(store_options or {}))
        recorded = collection.store.properties["fingerprint"]
        if expected is not None and expected != recorded:
            collection.close()
            raise EncoderMismatchError(f"store {uri} holds encoder {recorded}, not the expected {expected}")
        super().__init__(uri=uri, fingerprint=recorded, **kwargs)
        self._collection = collection

    @classmethod
    def class_name(cls) -> str:
        """The name LlamaIndex serializes this vector store under."""
        return "IsotropeVectorStore"

    @staticmethod
    def exists(uri: str | os.PathLike[str]) -> bool:
        """Whether ``uri`` already holds an isotrope store (opening it needs no ``embed_model``)."""
        return Collection.exists(os.fspath(uri))

    @property
    def client(self) -> Any:
        """The underlying isotrope store (``FaissStore`` or ``LanceDBStore``)."""
        return self._collection.store

    @property
    def collection(self) -> Collection:
        """The isotrope collection (store and encoder) behind this vector store."""
        return self._collection

    @property
    def embed_model(self) -> IsotropeEmbedding:
        """An embedding model with this store's encoder (shares the loaded encoder)."""
        embedding = IsotropeEmbedding(self._collection.path / ENCODER_DIR)
        embedding._encoder = self._collection.encoder
        return embedding

    # -- writing --------------------------------------------------------------------
    def _row_metadata(self, node: BaseNode) -> dict[str, Any]:
        content = node_to_metadata_dict(node, remove_text=True, flat_metadata=False)
        row: dict[str, Any] = {}
        for key, value in node.metadata.items():
            if key in RESERVED_KEYS:
                continue
            if _is_scalar(value):
                row[key] = value
            elif key not in self._warned_keys:
                self._warned_keys.add(key)
                logger.warning(
                    "metadata %r of node %s is a %s: kept with the node but not filterable "
                    "(only str, int, float, bool and None values are)",
                    key,
                    node.node_id,
                    type(value).__name__,
                )
        row[NODE_CONTENT_KEY] = content[NODE_CONTENT_KEY]
        row[NODE_TYPE_KEY] = content[NODE_TYPE_KEY]
        row[NODE_ID_KEY] = node.node_id
        if node.ref_doc_id is not None:
            row[REF_DOC_ID_KEY] = node.ref_doc_id
        return row

    def add(self, nodes: Sequence[BaseNode], **add_kwargs: Any) -> list[str]:
        """Upsert nodes (with their embeddings) in one batch; returns their ids."""
        nodes = list(nodes)
        if not nodes:
            return []
        missing = next((node.node_id for node in nodes if node.embedding is None), None)
        if missing is not None:
            raise ValueError(f"node {missing} has no embedding: embed nodes before adding them")
        vectors = np.asarray([node.get_embedding() for node in nodes], dtype=np.float32)
        dim = self._collection.store.dim
        if vectors.ndim != 2 or vectors.shape[1] != dim:
            raise ValueError(f"embeddings have shape {vectors.shape}; this store holds {dim}-d vectors")
        ids = [node.node_id for node in nodes]
        if self.verify_vectors:  # the vectors were made from the text with its embed-mode metadata
            embedded = [node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]
            self._collection.check_vectors(ids, embedded, vectors)
        texts = [node.get_content(metadata_mode=MetadataMode.NONE) for node in nodes]
        rows = [self._row_metadata(node) for node in nodes]
        return self._collection.add(ids, texts, rows, vectors=vectors, verify=False, commit=self.autocommit)

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of the document ``ref_doc_id``."""
        self._delete_where({REF_DOC_ID_KEY: ref_doc_id})

    def delete_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
        **delete_kwargs: Any,
    ) -> None:
        """Delete the given nodes, those matching ``filters``, or those that are both."""
        where = to_where(filters)
        if where is None and node_ids is None:
            raise ValueError("delete_nodes needs node_ids or non-empty filters (clear() deletes everything)")
        self._collection.delete(ids=node_ids, where=where, commit=self.autocommit)

    def clear(self) -> None:
        """Delete every node."""
        self._delete_where(None)

    def _delete_where(self, where: dict[str, Any] | None) -> None:
        self._collection.delete(where=where or {}, commit=self.autocommit)

    def _maybe_commit(self) -> None:
        if self.autocommit:
            self._collection.store.commit()

    def persist(self, persist_path: str | None = None, fs: Any = None) -> None:
        """Commit pending writes; with a ``persist_path`` (``StorageContext.persist``), also record beside it
        where the vectors are (``<namespace>__isotrope_store.json``), for :meth:`from_persist_dir`.

        The data lives at ``uri``, not at ``persist_path``: no ``SimpleVectorStore`` file is written, so
        the plain ``StorageContext.from_defaults(persist_dir=...)`` (without ``vector_store``) cannot
        rebuild this index; LlamaIndex then raises ``KeyError: 'default'``.
        """
        self._collection.store.commit()
        if persist_path is None:
            return
        import fsspec

        fs = fs or fsspec.filesystem("file")
        pointer = _pointer_path(persist_path)
        parent = os.path.dirname(pointer)
        if parent:
            fs.makedirs(parent, exist_ok=True)
        with fs.open(pointer, "w") as handle:
            json.dump({"uri": self.uri, "fingerprint": self.fingerprint}, handle)

    @classmethod
    def from_persist_dir(
        cls, persist_dir: str | os.PathLike[str], namespace: str = "default", **kwargs: Any
    ) -> IsotropeVectorStore:
        """Reopen the store that ``StorageContext.persist(persist_dir)`` recorded, checking its fingerprint.

        LlamaIndex's convention for stores that keep their own data (as ``FaissVectorStore``)::

            store = IsotropeVectorStore.from_persist_dir(DIR)
            context = StorageContext.from_defaults(vector_store=store, persist_dir=DIR)
            index = load_index_from_storage(context, embed_model=store.embed_model)
        """
        path = _pointer_path(os.path.join(os.fspath(persist_dir), f"{namespace}__vector_store.json"))
        try:
            with open(path) as handle:
                pointer = json.load(handle)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} not found: {persist_dir} holds no persisted IsotropeVectorStore (persist a StorageContext that has one)"
            ) from None
        return cls(pointer["uri"], fingerprint=pointer["fingerprint"], **kwargs)

    def close(self) -> None:
        """Commit and release the store."""
        self._collection.store.commit()
        self._collection.close()

    # -- reading --------------------------------------------------------------------
    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """Top ``similarity_top_k`` nodes, restricted by ``filters``, ``doc_ids`` and ``node_ids``.

        ``DEFAULT``: the store's calibrated default search (``isotrope info``; dense, the query embedding
        or ``query_str`` encoded as a query, for a store never calibrated or a query with no text); ``TEXT_SEARCH``: BM25 over
        the stored texts for ``query_str``; ``HYBRID``: both fused, ``alpha`` weighing the dense side
        (1: dense only). A ``group_by`` keyword (e.g. ``"source"``) keeps the best node per value.
        """
        if query.mode not in _MODES:
            raise ValueError(
                f"IsotropeVectorStore supports the query modes {', '.join(m.value for m in _MODES)}, not {query.mode.value!r}"
            )
        collection = self._collection
        mode, alpha = _MODES[query.mode], query.alpha if query.mode == VectorStoreQueryMode.HYBRID else None
        if mode is None:  # an embedding without its text can only be searched densely
            mode, alpha, _ = collection.default_search() if query.query_str else ("dense", None, None)
        if mode != "dense" and not query.query_str:
            raise ValueError(f"query mode {query.mode.value!r} needs query_str")
        vector = None
        if mode != "lexical":
            if query.query_embedding is not None:
                vector = np.asarray(query.query_embedding, dtype=np.float32)
            elif query.query_str:
                vector = collection.encoder.encode([query.query_str], kind="query")[0]
            else:
                raise ValueError("the query has neither query_embedding nor query_str")
            vector = vector[None, :]
        user_where = to_where(query.filters)
        if user_where:
            check_fields(user_where, collection.store.metadata_fields())
        where = _all_of(
            user_where,
            _in(REF_DOC_ID_KEY, query.doc_ids or None),  # an empty list is "no restriction" here:
            _in(NODE_ID_KEY, query.node_ids or None),  # VectorStoreIndex passes [] for text-storing stores
        )
        hits = search_store(
            collection.store,
            [query.query_str or ""],
            vector,
            query.similarity_top_k,
            where=where,
            mode=mode,
            alpha=alpha,
            group_by=kwargs.get("group_by"),
        )[0]
        return VectorStoreQueryResult(
            nodes=[_node(hit) for hit in hits],
            similarities=[hit.score for hit in hits],
            ids=[hit.id for hit in hits],
        )

    def get_nodes(
        self,
        node_ids: list[str] | None = None,
        filters: MetadataFilters | None = None,
    ) -> list[BaseNode]:
        """Stored nodes by id and/or filter (all nodes when both are None)."""
        store = self._collection.store
        where = to_where(filters)
        if node_ids is None:
            ids = store.ids(where=where)
        else:  # a node's id is its store id (also in stores not written through LlamaIndex); in the order asked for
            found = set(store.contains(node_ids))
            if where is not None:
                found &= set(store.ids(where=where))
            ids = [node_id for node_id in node_ids if node_id in found]
        return [_node(hit) for hit in store.get(ids) if hit is not None]


__all__ = ["EncoderMismatchError", "IsotropeEmbedding", "IsotropeVectorStore", "to_where"]
