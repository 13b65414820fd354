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
from isotrope.stores.memory import exact_scores, top_k

from .lance_rows import to_numpy


class HeldVectors:
    """One table version's row ids and vectors (float32; unit length for ``cosine``), held while the table
    stays that version; ``metric`` is the store's (``ip``, ``cosine``, ``l2``)."""

    def __init__(self, metric: str, limit: int = index_plan.EXACT_BELOW) -> None:
        self.metric, self.limit = metric, limit
        self._key: tuple[str, int] | None = None
        self._rows: np.ndarray | None = None  # Lance row ids, table order
        self._vectors: np.ndarray | None = None

    def nearest(self, dataset: Any, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The row ids and Lance distances of ``query``'s ``k`` nearest rows of ``dataset`` (closest first,
        ties in table order), or None when the table has more rows than :attr:`limit` (the caller scans it)."""
        if not self._hold(dataset):
            return None
        assert self._rows is not None and self._vectors is not None
        q = np.asarray(query, dtype=np.float32)[None, :]
        if self.metric == "cosine":  # the held vectors are unit already: the query alone is normalised
            q = q / max(float(np.linalg.norm(q)), float(np.finfo(np.float32).tiny))
        scores = exact_scores(q, self._vectors, "ip" if self.metric == "cosine" else self.metric, np.float32)
        top = top_k(scores, k)[0]
        return self._rows[top], (-scores[0, top] if self.metric == "l2" else 1 - scores[0, top])

    def _hold(self, dataset: Any) -> bool:
        """Read ``dataset``'s vectors unless they are held already; False when it is too large."""
        key = (dataset.uri, dataset.version)
        if key == self._key:
            return self._vectors is not None
        self._key, self._rows, self._vectors = key, None, None
        if dataset.count_rows() > self.limit:
            return False
        table = dataset.to_table(columns=["id", "vector"], with_row_id=True)
        vectors = to_numpy(table.column("vector"), table.schema.field("vector").type.list_size, table.column("id"), "vector")
        if self.metric == "cosine":
            vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.finfo(np.float32).tiny)
        self._rows, self._vectors = table.column("_rowid").to_numpy(), vectors
        return True
