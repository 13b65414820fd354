"""Principal component projection: (x - mean) U_k."""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.transforms._linalg import matmul, top_eigenpairs
from isotrope.transforms._validation import (
    as_output,
    check_positive_int,
    check_state_array,
    resolve_n_components,
)
from isotrope.transforms.moments import Moments, MomentsTransform


class PCA(MomentsTransform):
    """Project centred vectors on the top ``n_components`` eigenvectors of the covariance.

    ``components_`` has one direction per row, its largest-magnitude entry positive
    (scikit-learn's sign convention).
    """

    kind = "pca"
    state_names = ("mean_", "components_")

    def __init__(self, n_components: int) -> None:
        check_positive_int(self.kind, "n_components", n_components)
        self.n_components = n_components

    def _fit_from_moments(self, moments: Moments) -> None:
        k = resolve_n_components(self.kind, self.n_components, moments.n_features)
        _, components = top_eigenpairs(moments.covariance(), k)
        self.mean_ = moments.mean.copy()
        self.components_ = components

    def transform(self, X: Any) -> np.ndarray:
        return as_output(matmul(self._check_input(X) - self.mean_, self.components_.T))

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "mean_", self.mean_, (None,))
        check_state_array(self.kind, "components_", self.components_, (self.n_components, self.mean_.shape[0]))
