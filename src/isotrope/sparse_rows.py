"""Sparse-times-dense products cut into ranges of rows, one range per thread: scipy's sparse products release
the GIL, so a product over every core takes a fraction of one thread's time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from isotrope.resources import thread_pool, usable_cores

if TYPE_CHECKING:
    from scipy import sparse


def shared_workers() -> ThreadPoolExecutor:
    """One thread per usable core, kept for the process (encoding many batches starts none of its own)."""
    return thread_pool("isotrope-rows", usable_cores())


class RowRanges:
    """A CSR matrix cut into ranges of rows holding about equal numbers of nonzeros, multiplied by a dense
    block one range per thread: scipy's sparse products release the GIL, and each row of the result is the
    same floats as in one product (idle, 2 cores: a solve's products take 0.6 of their time in one thread)."""

    def __init__(self, matrix: sparse.csr_matrix, parts: int, workers: ThreadPoolExecutor) -> None:
        cuts = np.searchsorted(matrix.indptr, np.linspace(0, matrix.nnz, parts + 1)[1:-1])
        edges = [0, *np.unique(np.clip(cuts, 0, matrix.shape[0])).tolist(), matrix.shape[0]]
        self.ranges = [(start, stop, matrix[start:stop]) for start, stop in pairwise(edges) if stop > start]
        self.rows, self.dtype = matrix.shape[0], matrix.dtype
        self.workers = workers

    def __matmul__(self, block: np.ndarray) -> np.ndarray:
        out = np.empty((self.rows, block.shape[1]), dtype=np.result_type(block.dtype, self.dtype))

        def product(part: tuple[int, int, sparse.csr_matrix]) -> None:
            start, stop, rows = part
            out[start:stop] = rows @ block

        for done in [self.workers.submit(product, part) for part in self.ranges]:
            done.result()
        return out
