"""Isotropy measures of a set of vectors (rows of ``X``), computed in float64.

* mean pairwise cosine over distinct pairs, exactly, in O(n d): with unit rows
  ``x̂_i`` and ``s = Σ x̂_i``, ``Σ_{i≠j} x̂_i·x̂_j = ‖s‖² − Σ ‖x̂_i‖²``;
* the partition-function ratio of Mu & Viswanath (2018),
  ``I(W) = min_c Z(c) / max_c Z(c)`` with ``Z(c) = Σ_w exp(cᵀw)`` over the
  eigenvectors ``c`` of ``WᵀW`` (1 = isotropic), evaluated with log-sum-exp;
* effective rank (Roy & Vetterli 2007): ``exp(H(p))`` with ``p`` the singular
  values divided by their sum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.special import logsumexp

from isotrope.transforms.base import as_matrix

_BLOCK_ROWS = 8192


def mean_cosine(X: Any) -> float:
    """Mean cosine similarity over all pairs of distinct rows (self-pairs excluded)."""
    X = as_matrix(X)
    n = X.shape[0]
    if n < 2:
        raise ValueError(f"mean_cosine needs at least 2 rows; got {n}")
    norms = np.linalg.norm(X, axis=1)
    if (norms == 0).any():
        raise ValueError(f"row {int(np.flatnonzero(norms == 0)[0])} of X is a zero vector; its cosine is undefined")
    unit = X / norms[:, None]
    total = unit.sum(axis=0)
    return float((total @ total - np.einsum("ij,ij->", unit, unit)) / (n * (n - 1)))


def _gram_eigh(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending, clipped at 0) and eigenvectors of ``XᵀX``."""
    values, vectors = np.linalg.eigh(X.T @ X)
    return np.clip(values, 0.0, None), vectors


def _partition_ratio(X: np.ndarray, directions: np.ndarray) -> float:
    log_z = np.full(directions.shape[1], -np.inf)
    for start in range(0, X.shape[0], _BLOCK_ROWS):
        log_z = np.logaddexp(log_z, logsumexp(X[start : start + _BLOCK_ROWS] @ directions, axis=0))
    return float(np.exp(log_z.min() - log_z.max()))


def partition_ratio(X: Any) -> float:
    """Mu & Viswanath's I(W) = min_c Z(c) / max_c Z(c) over eigenvectors c of WᵀW, in (0, 1]."""
    X = as_matrix(X)
    return _partition_ratio(X, _gram_eigh(X)[1])


def _effective_rank(squared_singular_values: np.ndarray) -> float:
    singular = np.sqrt(squared_singular_values)
    if singular.sum() == 0:
        raise ValueError("effective rank of an all-zero matrix is undefined")
    p = singular[singular > 0] / singular.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


def effective_rank(X: Any) -> float:
    """Roy & Vetterli's effective rank: exp of the entropy of the normalised singular values."""
    X = as_matrix(X)
    gram = X @ X.T if X.shape[0] < X.shape[1] else X.T @ X
    return _effective_rank(np.clip(np.linalg.eigvalsh(gram), 0.0, None))


def isotropy_report(X: Any) -> dict[str, float]:
    """All three measures of ``X`` (uncentred, as given) plus its shape."""
    X = as_matrix(X)
    squared, vectors = _gram_eigh(X)
    return {
        "n_vectors": int(X.shape[0]),
        "dim": int(X.shape[1]),
        "mean_cosine": mean_cosine(X),
        "partition_ratio": _partition_ratio(X, vectors),
        "effective_rank": _effective_rank(squared),
    }
