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

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

import numpy as np

#: metric names every store understands (``"dot"`` is accepted for ``"ip"``)
METRICS = ("ip", "cosine", "l2")


class StoreFormatError(ValueError):
    """Raised when a path does not hold a valid store of the expected kind, or mismatches its arguments."""


@dataclass(frozen=True)
class Hit:
    """One search result: the stored id, its score (higher is closer), text and metadata."""

    id: str
    score: float
    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class VectorStore(Protocol):
    """What every isotrope vector store provides.

    ``add(ids, vectors, texts=None, metadata=None)``
        Insert a batch; an id already stored is replaced (no duplicates).
    ``delete(ids)``
        Remove the given ids; unknown ids are ignored.
    ``search(queries, k, where=None)``
        For each query row, the ``k`` closest hits, best first, restricted to rows
        whose metadata matches ``where`` (see :mod:`isotrope.stores.filters`).
    ``lexical_search(texts, k, where=None)``
        For each query text, the ``k`` best hits by BM25 over the stored texts analyzed by
        :mod:`isotrope.lexical` (only hits sharing a term; scores higher is better).
    ``metadata_fields()``
        The metadata keys some stored row has (filters naming others are errors).
    ``get(ids)``
        A ``Hit`` (score ``nan``) or ``None`` for each id, in order.
    ``contains(ids)``
        The subset of ``ids`` that is stored.
    ``ids(where=None)``
        All stored ids (matching ``where``).
    ``commit()``
        Durable, atomic checkpoint: a process killed before it leaves the previous
        committed state readable.
    ``properties`` / ``set_properties(**kv)``
        A persisted ``dict[str, str]``, committed with the data.
    ``close()``
        Release resources; uncommitted changes are discarded (with a warning).
        As a context manager a store commits on a clean exit, then closes.
    ``index_info()``
        The index type as asked and as built, and its search settings (``{}``: no index to describe).

    Capabilities are declared attributes (each store sets its own; the defaults are the minimal store):

    ``stores_raw_vectors``
        ``add`` takes ``raw_vectors`` (the pre-shaping vectors, kept so a reshape can refit) and
        ``raw_vectors(ids)`` returns them.
    ``concurrent_queries``
        A vector query and a full-text query may run at the same time (hybrid search overlaps them).
    ``appends_new_ids``
        ``add`` takes ``new_ids=True``: the caller knows no id of the batch is stored, and the rows
        are appended without the upsert's lookup (LanceDB: no ``merge_insert`` join over the table).
    """

    dim: int
    metric: str
    stores_raw_vectors: bool = False
    concurrent_queries: bool = False
    appends_new_ids: bool = False

    def add(
        self,
        ids: Sequence[str],
        vectors: Any,
        texts: Sequence[str | None] | None = None,
        metadata: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> None: ...

    def delete(self, ids: Iterable[str]) -> None: ...

    def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None) -> list[list[Hit]]: ...

    def lexical_search(
        self, texts: Sequence[str], k: int, where: Mapping[str, Any] | None = None
    ) -> list[list[Hit]]: ...

    def metadata_fields(self) -> set[str]: ...

    def get(self, ids: Sequence[str]) -> list[Hit | None]: ...

    def contains(self, ids: Iterable[str]) -> set[str]: ...

    def ids(self, where: Mapping[str, Any] | None = None) -> list[str]: ...

    def commit(self) -> None: ...

    @property
    def properties(self) -> dict[str, str]: ...

    def set_properties(self, **kv: str) -> None: ...

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


def dumps_metadata(metadata: Mapping[str, Any]) -> str:
    """Serialise validated metadata to compact JSON (non-ASCII kept as is)."""
    return json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


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
    text_list = [None] * n if texts is None else list(texts)
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
