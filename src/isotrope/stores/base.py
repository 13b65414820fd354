"""The vector-store contract shared by the in-memory, FAISS and LanceDB stores.

A store maps string ids to one vector each, plus an optional text and a flat
metadata dict of JSON scalars (str, int, float, bool or None). ``add`` is an
upsert by id; ``search`` returns hits best first, with scores where higher is
closer whatever the metric:

* ``"ip"``: the inner product;
* ``"cosine"``: the cosine similarity;
* ``"l2"``: minus the squared Euclidean distance.

Changes become durable at ``commit()``; ``properties`` is a small persisted
``dict[str, str]`` (encoder fingerprint, model name, ...) committed with the data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from isotrope.errors import StoreCapabilityError
from isotrope.errors import StoreFormatError as StoreFormatError  # its old home: still importable from here
from isotrope.stores.rows import dumps_metadata as dumps_metadata  # its old home: still importable from here

#: metric names every store understands (``"dot"`` is accepted for ``"ip"``)
METRICS = ("ip", "cosine", "l2")
#: the metric of a new store when none is given, in every store: every shaping preset ends in ``l2``, so the
#: inner product ranks as cosine does without normalising each vector again, and a chain without ``l2`` keeps
#: the norms it chose. An existing store keeps the metric recorded when it was created.
DEFAULT_METRIC = "ip"


@dataclass(frozen=True)
class Hit:
    """One search result: the stored id, its score (higher is closer), text and metadata."""

    id: str
    score: float
    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class VectorStore(Protocol):
    """What every isotrope vector store provides (memory, FAISS and LanceDB; tests/test_store_contract.py
    runs the same cases on each).

    Writing

    ``add(ids, vectors, texts=None, metadata=None)``
        Insert a batch; an id already stored is replaced (no duplicates). A store that keeps raw
        vectors (``stores_raw_vectors``) also takes ``raw_vectors=`` (the pre-shaping vectors).
    ``delete(ids)``
        Remove the given ids from dense and lexical search; unknown ids are ignored.
    ``commit()``
        Durable, atomic checkpoint: a process killed before it leaves the previous
        committed state readable; the lexical index is exact after it.
    ``properties`` / ``set_properties(**kv)``
        A persisted ``dict[str, str]``, committed with the data.
    ``close()``
        Release resources; uncommitted changes are discarded (with a warning) where a store has
        any (FAISS; every LanceDB write is already a committed table version).
        As a context manager a store commits on a clean exit, then closes.

    Searching

    ``search(queries, k, where=None, with_text=True)``
        For each query row, the ``k`` closest hits, best first, restricted to rows
        whose metadata matches ``where`` (see :mod:`isotrope.stores.filters`).
        ``with_text=False``: the hits carry id and score only (text ``""``, metadata ``{}``),
        for a caller that keeps a few of many hits and reads those with ``get``.
    ``lexical_search(texts, k, where=None, with_text=True)``
        For each query text, the ``k`` best hits by BM25 over the stored texts analyzed by
        :mod:`isotrope.lexical` (only hits sharing a term; scores higher is better). Hybrid
        search fuses the two lists (:func:`isotrope.fusion.search_store`, any store).
    ``lexical_scores(texts, ids)``
        For each query text, the BM25 score ``lexical_search`` gives each of its ids (0 for a row
        sharing no term), as one float64 array: hybrid search completes its candidates' scores with it.
    ``hybrid_candidates(texts, vectors, depth, keywords, where, complete)`` (optional)
        Hybrid search's two candidate lists (the dense top ``depth``, the keyword top ``keywords``) and what
        completes them, as a
        :class:`isotrope.fusion.Candidates`, rows named by the store's own keys so that only the fused
        top ``k`` are read as hits (FAISS: row keys, the keyword top and the dense candidates' BM25 from
        one scoring of the postings; LanceDB: Lance row ids). A store without it gets the generic path
        (``search``, ``lexical_search``, ``lexical_scores``, ``vectors``, ``get``), with the same results.
    ``metadata_fields()``
        The metadata keys some stored row has (a filter naming another is an error:
        :func:`isotrope.stores.filters.check_fields`).

    Reading

    ``len(store)``
        The number of stored rows.
    ``get(ids)``
        A ``Hit`` (score ``nan``) or ``None`` for each id, in order.
    ``contains(ids)``
        The subset of ``ids`` that is stored.
    ``ids(where=None)``
        All stored ids (matching ``where``).
    ``vectors(ids)`` / ``iter_vectors(batch_size)``
        The stored vectors of ids (a cosine store may keep them normalised); all of them in
        ``(ids, vectors)`` batches.
    ``raw_vectors(ids)`` / ``iter_raw(batch_size)``
        The same for the pre-shaping vectors, where ``stores_raw_vectors``
        (else :class:`~isotrope.errors.StoreCapabilityError`).

    Describing

    ``encoder_fingerprint``
        The fingerprint of the encoder that shaped the stored vectors (the ``fingerprint``
        property a :class:`~isotrope.search.Collection` records; ``None`` for a bare store). The
        encoder itself lives beside the store's files (:mod:`isotrope.stores.layout`).
    ``index_info()``
        The index type as asked and as built, and its search settings (``{}``: no index to describe).
    ``has_lexical_index`` / ``build_lexical_index()``
        Whether the lexical index exists (a store written before it had none); build it.
    ``optimize()``
        Rebuild or compact the store's indexes for its current size (nothing to do by default).
    ``calibrate(target=None, queries=None)``
        Set the approximate index's search breadth from the recall it reaches on ``queries`` (vectors of
        queries like the user's); ``{}`` for an exact store.
    ``check_index(index)`` (static)
        Refuse an ``index`` option the store cannot build (before a store is created, so before fitting).
    ``deferred_index()``
        A context for a bulk load: inside it writes and commits build no ANN index; the first commit
        after it builds the one the final size calls for, once (nothing to defer by default).

    Capabilities are declared attributes (each store sets its own; the defaults are the minimal store):

    ``stores_raw_vectors``
        ``add`` takes ``raw_vectors`` and ``raw_vectors``/``iter_raw`` return them; the store
        is then also a :class:`ReshapableStore` (its shaping can be refitted in place).
    ``concurrent_queries``
        A vector query and a full-text query may run at the same time (hybrid search overlaps them).
    ``appends_new_ids``
        ``add`` takes ``new_ids=True``: the caller knows no id of the batch is stored, and the rows
        are appended without the upsert's lookup (LanceDB: no ``merge_insert`` join over the table).

    Set by the caller:

    ``calibration_queries``
        None, or a function giving query vectors like real ones (or None) that ``calibrate()`` without
        ``queries`` uses when an index is built: a :class:`~isotrope.search.Collection` sets it to
        pseudo-queries cut from the stored chunks; without it, the queries are made from stored vectors.
    """

    dim: int
    metric: str
    stores_raw_vectors: bool = False
    concurrent_queries: bool = False
    appends_new_ids: bool = False
    calibration_queries: Callable[[], np.ndarray | None] | None = None

    def add(
        self,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str | None] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None: ...

    def delete(self, ids: Iterable[str]) -> None: ...

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]: ...

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None, with_text: bool = True
    ) -> list[list[Hit]]: ...

    def lexical_scores(self, texts: Sequence[str], ids: Sequence[Sequence[str]]) -> list[np.ndarray]: ...

    def metadata_fields(self) -> set[str]: ...

    def get(self, ids: Sequence[str]) -> list[Hit | None]: ...

    def contains(self, ids: Iterable[str]) -> set[str]: ...

    def ids(self, where: Mapping[str, Any] | None = None) -> list[str]: ...

    def vectors(self, ids: Sequence[str]) -> np.ndarray: ...

    def iter_vectors(self, batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray]]:
        """All stored ``(ids, vectors)`` in batches of at most ``batch_size`` rows."""
        all_ids = self.ids()
        for start in range(0, len(all_ids), batch_size):
            chunk = all_ids[start : start + batch_size]
            yield chunk, self.vectors(chunk)

    def raw_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """The stored pre-shaping vectors of ``ids`` (only where ``stores_raw_vectors``)."""
        raise StoreCapabilityError(f"{type(self).__name__} keeps no raw vectors")

    def iter_raw(self, batch_size: int = 4096) -> Iterator[tuple[list[str], np.ndarray]]:
        """All stored ``(ids, raw_vectors)`` in batches (only where ``stores_raw_vectors``)."""
        raise StoreCapabilityError(f"{type(self).__name__} keeps no raw vectors")

    def commit(self) -> None: ...

    @property
    def properties(self) -> dict[str, str]: ...

    def set_properties(self, **kv: str) -> None: ...

    @property
    def encoder_fingerprint(self) -> str | None:
        """The fingerprint of the encoder whose vectors the store holds (``None``: not recorded)."""
        return self.properties.get("fingerprint")

    @property
    def has_lexical_index(self) -> bool:
        """Whether lexical search is served by an index already (a store that analyzes on write always is)."""
        return True

    def build_lexical_index(self) -> None:
        """Build the lexical index of a store written before it had one (nothing to do by default)."""

    def optimize(self) -> None:
        """Rebuild or compact the indexes for the store's current size (nothing to do by default)."""

    def calibrate(self, target: float | None = None, queries: Any = None) -> dict[str, str]:
        """Set the approximate index's search breadth to the smallest reaching ``target`` recall@10 on
        ``queries`` (query vectors like the user's), saved at the next commit; the settings chosen ({}: an
        exact store, nothing to calibrate)."""
        return {}

    @staticmethod
    def check_index(index: str) -> None:
        """Refuse an ``index`` option (:mod:`isotrope.stores.options`) this store cannot build, before any
        work; an exact store takes "flat" and "auto" (exact at every size)."""
        if index not in ("flat", "auto"):
            raise ValueError(f"this store searches exactly: index must be 'flat' or 'auto'; got {index!r}")

    def deferred_index(self) -> AbstractContextManager[None]:
        """A bulk load that builds the ANN index (and, where a store defers it, brings its keyword index up to
        date) once, at the first commit after it (nothing to defer by default)."""
        return nullcontext()

    def close(self) -> None: ...

    def __len__(self) -> int: ...

    def index_info(self) -> dict[str, Any]:
        return {}

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.commit()
        self.close()


@runtime_checkable
class ReshapableStore(VectorStore, Protocol):
    """A store that keeps raw vectors (``stores_raw_vectors``) and can rewrite its shaped vectors
    in one atomic version (:func:`isotrope.reshape.reshape_store`), rolled back if a reshape is killed.

    ``version`` / ``restore(version)``
        The current table version; make an earlier one the latest again.
    ``update_vectors(ids, vectors)`` / ``rewrite_vectors(batches)``
        Replace the shaped vectors of stored ids (texts, metadata and raw vectors stay);
        ``rewrite_vectors`` streams ``(ids, vectors)`` batches into ONE new version.
    """

    raw_dim: int | None

    @property
    def version(self) -> int: ...

    def restore(self, version: int) -> None: ...

    def update_vectors(self, ids: Sequence[str], vectors: Any) -> None: ...

    def rewrite_vectors(self, batches: Iterable[tuple[Sequence[str], Any]]) -> None: ...


def check_metric(metric: str) -> str:
    """Return the canonical metric name, or raise naming the accepted ones."""
    name = {"dot": "ip", "inner_product": "ip"}.get(metric, metric)
    if name not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return name


def as_vectors(vectors: Any, dim: int, name: str = "vectors") -> np.ndarray:
    """Validate a ``(n, dim)`` finite numeric array (a single row is promoted) and return it as float32."""
    array = np.asarray(vectors)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != dim:
        raise ValueError(f"{name} must have shape (n, {dim}); got {np.shape(vectors)}")
    if array.dtype.kind not in "iufc":  # np.number's kinds, tested without issubdtype (on every search)
        raise ValueError(f"{name} must be numeric; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    if not np.isfinite(array).all():
        row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
        raise ValueError(f"{name} row {row} contains NaN or infinite values")
    return array


def check_k(k: int) -> int:
    """Validate the number of neighbours requested."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer; got {k!r}")
    return int(k)


def as_ids(ids: Iterable[str], name: str = "ids") -> list[str]:
    """Validate a list of string ids (a bare string is rejected: it is a sequence of characters)."""
    if isinstance(ids, str):
        raise TypeError(f"{name} must be a sequence of strings, not a single string {ids!r}")
    out = list(ids)
    for i, value in enumerate(out):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}[{i}] must be a non-empty string; got {value!r}")
    return out


def check_metadata(metadata: Mapping[str, Any] | None, id: str) -> dict[str, Any]:
    """Validate one row's metadata: a flat dict with string keys and JSON scalar values."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata of id {id!r} must be a dict; got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise ValueError(f"metadata of id {id!r} has a non-string key {key!r}")
        if value is not None and not isinstance(value, (str, bool, int, float)):
            raise ValueError(
                f"metadata {key!r} of id {id!r} must be a str, int, float, bool or None; "
                f"got {type(value).__name__} (store lists and objects as JSON strings)"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"metadata {key!r} of id {id!r} is not finite: {value!r}")
    return dict(metadata)


@dataclass(frozen=True)
class Batch:
    """A validated batch for ``add``."""

    ids: list[str]
    vectors: np.ndarray
    texts: list[str | None]
    metadata: list[dict[str, Any]]


def check_batch(
    ids: Sequence[str],
    vectors: Any,
    texts: Sequence[str | None] | None,
    metadata: Sequence[Mapping[str, Any] | None] | None,
    dim: int,
) -> Batch:
    """Validate the arguments of ``add``: lengths agree, ids are unique strings, vectors are ``(n, dim)``."""
    id_list = as_ids(ids)
    array = as_vectors(vectors, dim)
    n = len(id_list)
    if array.shape[0] != n:
        raise ValueError(f"got {n} ids but {array.shape[0]} vectors")
    if len(set(id_list)) != n:
        duplicate = next(i for i, count in Counter(id_list).items() if count > 1)
        raise ValueError(f"id {duplicate!r} appears more than once in one batch")
    text_list: list[str | None] = [None] * n if texts is None else list(texts)
    if len(text_list) != n:
        raise ValueError(f"got {n} ids but {len(text_list)} texts")
    for i, text in zip(id_list, text_list):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"text of id {i!r} must be a string or None; got {type(text).__name__}")
    meta_list = [None] * n if metadata is None else list(metadata)
    if len(meta_list) != n:
        raise ValueError(f"got {n} ids but {len(meta_list)} metadata dicts")
    return Batch(id_list, array, text_list, [check_metadata(m, i) for i, m in zip(id_list, meta_list)])


def check_properties(kv: Mapping[str, Any]) -> dict[str, str]:
    """Properties are string keys and string values."""
    for key, value in kv.items():
        if not isinstance(value, str):
            raise ValueError(f"property {key!r} must be a string; got {type(value).__name__}")
    return dict(kv)
