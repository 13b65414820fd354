"""Exact nearest rows of a small Lance table, from its vectors held in memory.

A table without an ANN index is searched exactly; through Lance's scanner every query reads and decodes
the whole vector column again (at 10,000 x 384 rows about 20 ms a query, nearly all of it in the scan).
Below :data:`isotrope.stores.index_plan.EXACT_BELOW` rows (at most 77 MB of float32 at 384 dimensions) the
column is read once per table version, with its row ids, and each query is one matrix product (well under
a millisecond at 10,000 rows). Distances are Lance's: cosine ``1 - cos``, dot ``1 - x.y``, l2 the squared
distance; ties keep the rows' table order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.stores import index_plan

from .lance_rows import to_numpy


class HeldVectors:
    """One table version's row ids and vectors (float32), held while the table stays that version."""

    def __init__(self, limit: int = index_plan.EXACT_BELOW) -> None:
        self.limit = limit
        self._key: tuple[str, int] | None = None
        self._rows: np.ndarray | None = None  # Lance row ids, table order
        self._vectors: np.ndarray | None = None
        self._norms: np.ndarray | None = None

    def nearest(self, dataset: Any, query: np.ndarray, k: int, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The row ids and distances of ``query``'s ``k`` nearest rows of ``dataset`` (closest first), or
        None when the table has more rows than :attr:`limit` (the caller scans it)."""
        if not self._hold(dataset):
            return None
        assert self._rows is not None and self._vectors is not None and self._norms is not None
        q = np.asarray(query, dtype=np.float32)
        if metric == "l2":
            distances = self._norms**2 - 2 * (self._vectors @ q) + float(q @ q)
        elif metric == "cosine":
            distances = 1 - (self._vectors @ q) / np.maximum(self._norms * np.linalg.norm(q), np.finfo(np.float32).tiny)
        else:
            distances = 1 - self._vectors @ q
        k = min(k, len(distances))
        top = np.argpartition(distances, k - 1)[:k] if 0 < k < len(distances) else np.arange(len(distances))
        top = top[np.lexsort((top, distances[top]))]  # by distance, then table order
        return self._rows[top], distances[top].astype(np.float32)

    def _hold(self, dataset: Any) -> bool:
        """Read ``dataset``'s vectors unless they are held already; False when it is too large."""
        key = (dataset.uri, dataset.version)
        if key == self._key:
            return self._vectors is not None
        self._key, self._rows, self._vectors, self._norms = key, None, None, None
        if dataset.count_rows() > self.limit:
            return False
        table = dataset.to_table(columns=["id", "vector"], with_row_id=True)
        dim = table.schema.field("vector").type.list_size
        self._rows = table.column("_rowid").to_numpy()
        self._vectors = to_numpy(table.column("vector"), dim, table.column("id"), "vector")
        self._norms = np.linalg.norm(self._vectors, axis=1)
        return True
