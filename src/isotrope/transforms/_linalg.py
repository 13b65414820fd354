"""Linear-algebra helpers: eigenpairs with a deterministic sign convention; small products and
decompositions on one BLAS thread, where a thread pool costs more than it gains."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from functools import cache
from typing import Any

import numpy as np
import scipy.linalg
from threadpoolctl import ThreadpoolController

logger = logging.getLogger(__name__)

#: products with fewer multiply-adds run on one BLAS thread: waking the BLAS pool costs more than it
#: saves there (on a busy machine, 16 ms instead of 0.3 ms for 8 x 384 @ 384 x 384)
SMALL_PRODUCT = 1 << 24
#: symmetric matrices up to this order are decomposed on one BLAS thread: OpenBLAS's threaded
#: eigensolver took 2.5 s for 384 x 384 on two busy cores, against 0.06 s on one
SMALL_EIGH = 1024


def flip_signs(components: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (scikit-learn's ``svd_flip`` on rows)."""
    rows = np.arange(components.shape[0])
    signs = np.sign(components[rows, np.argmax(np.abs(components), axis=1)])
    signs[signs == 0] = 1.0
    return components * signs[:, None]


def top_eigenpairs(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenvalues of a symmetric matrix (descending) and their eigenvectors as rows.

    Matrices up to ``SMALL_EIGH`` rows are decomposed on one BLAS thread.
    """
    d = matrix.shape[0]
    with _one_blas_thread() if d <= SMALL_EIGH else nullcontext():
        values, vectors = scipy.linalg.eigh(matrix, subset_by_index=[d - k, d - 1])
    return values[::-1].copy(), flip_signs(np.ascontiguousarray(vectors[:, ::-1].T))


def removable_directions(kind: str, matrix: np.ndarray, k: int, count: int) -> np.ndarray:
    """The top ``k`` eigenvectors of ``matrix`` to remove from vectors, leaving one direction with variance.

    Removing every direction a small sample spans would turn its vectors to zero: only the
    top ``spanned - 1`` are kept, the other rows are zero, with a warning.
    """
    d = matrix.shape[0]
    values, components = top_eigenpairs(matrix, min(k + 1, d))
    spanned = int(np.sum(values > values[0] * np.finfo(np.float32).eps)) if values[0] > 0 else 0
    components = components[:k].copy()
    keep = min(k, max(spanned - 1, 0))
    if keep < k:
        logger.warning(
            "%s fitted on %d sample(s): removing %d of %d directions (the sample spans %s)",
            kind,
            count,
            keep,
            k,
            spanned if spanned <= k else f"more than {k}",
        )
        components[keep:] = 0.0
    return components


@cache
def _blas_threads() -> ThreadpoolController:
    """The BLAS libraries loaded now (numpy's and scipy's), found once: finding them takes milliseconds."""
    return ThreadpoolController().select(user_api="blas")


def _one_blas_thread() -> AbstractContextManager[Any]:
    return _blas_threads().limit(limits=1)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of 2-D arrays, on one BLAS thread when the product is smaller than ``SMALL_PRODUCT``."""
    if a.shape[0] * a.shape[1] * b.shape[1] >= SMALL_PRODUCT:
        return a @ b
    with _one_blas_thread():
        return a @ b
