"""L2 normalisation: x / ||x|| (zero vectors stay zero)."""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.transforms._validation import as_output
from isotrope.transforms.base import Self, Transform, as_matrix


class L2(Transform):
    """Scale every row to unit Euclidean norm; stateless, any width."""

    kind = "l2"
    requires_fit = False

    def __init__(self) -> None:
        pass

    def fit(self, X: Any) -> Self:
        as_matrix(X)
        return self

    def transform(self, X: Any) -> np.ndarray:
        array = self._check_input(X)
        norms = np.linalg.norm(array, axis=1, keepdims=True)
        return as_output(np.divide(array, norms, out=np.zeros_like(array), where=norms > 0))
