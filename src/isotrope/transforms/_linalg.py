"""Eigen-decomposition helpers with a deterministic sign convention."""

from __future__ import annotations

import numpy as np
import scipy.linalg


def flip_signs(components: np.ndarray) -> np.ndarray:
    """Make the largest-magnitude entry of every row positive (scikit-learn's ``svd_flip`` on rows)."""
    rows = np.arange(components.shape[0])
    signs = np.sign(components[rows, np.argmax(np.abs(components), axis=1)])
    signs[signs == 0] = 1.0
    return components * signs[:, None]


def top_eigenpairs(matrix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest eigenvalues of a symmetric matrix (descending) and their eigenvectors as rows."""
    d = matrix.shape[0]
    values, vectors = scipy.linalg.eigh(matrix, subset_by_index=[d - k, d - 1])
    return values[::-1].copy(), flip_signs(np.ascontiguousarray(vectors[:, ::-1].T))
