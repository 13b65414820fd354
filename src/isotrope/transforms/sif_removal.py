"""SIF common-component removal (Arora et al. 2017): x - (u . x) u for the top singular vectors u."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from isotrope.transforms._linalg import removable_directions
from isotrope.transforms._validation import (
    as_output,
    check_positive_int,
    check_state_array,
    resolve_n_components,
)
from isotrope.transforms.base import Self, Transform, as_matrix

logger = logging.getLogger(__name__)


class SIFRemoval(Transform):
    """Remove the projection on the first ``n_components`` right singular vectors of the uncentred data."""

    kind = "sif_removal"
    state_names = ("components_",)

    def __init__(self, n_components: int = 1) -> None:
        check_positive_int(self.kind, "n_components", n_components)
        self.n_components = n_components

    def fit(self, X: Any) -> Self:
        array = as_matrix(X)
        n_samples, n_features = array.shape
        k = resolve_n_components(self.kind, self.n_components, n_features)
        if n_samples - k <= 1:
            logger.warning(
                "sif_removal fitted on %d samples removing %d directions: the fitted vectors become collinear",
                n_samples,
                k,
            )
        # right singular vectors of X = eigenvectors of the (uncentred) Gram matrix X^T X
        self.components_ = removable_directions(self.kind, array.T @ array, k, n_samples)
        return self

    def transform(self, X: Any) -> np.ndarray:
        array = self._check_input(X)
        return as_output(array - (array @ self.components_.T) @ self.components_)

    @property
    def n_features_in(self) -> int | None:
        return int(self.components_.shape[1])

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "components_", self.components_, (self.n_components, None))
