"""All-but-the-top (Mu & Viswanath 2018): remove the mean and the top principal directions."""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.transforms._linalg import removable_directions
from isotrope.transforms._validation import (
    as_output,
    check_positive_int,
    check_state_array,
    resolve_n_components,
)
from isotrope.transforms.moments import Moments, MomentsTransform


class ABTT(MomentsTransform):
    """``x~ = x - mean``; ``x~ - sum_i (u_i . x~) u_i`` over the top principal directions ``u_i``.

    ``n_components=None`` removes ``max(1, round(d / 100))`` directions. A sample too small to
    span them (every direction with variance removed would leave the fitted vectors at zero)
    removes fewer, with a warning; the unused rows of ``components_`` are zero.
    """

    kind = "abtt"
    state_names = ("mean_", "components_")

    def __init__(self, n_components: int | None = None) -> None:
        check_positive_int(self.kind, "n_components", n_components, allow_none=True)
        self.n_components = n_components

    def _fit_from_moments(self, moments: Moments) -> None:
        k = resolve_n_components(self.kind, self._n_components_for(moments.n_features), moments.n_features)
        self.mean_ = moments.mean.copy()
        self.components_ = removable_directions(self.kind, moments.covariance(), k, moments.count)

    def transform(self, X: Any) -> np.ndarray:
        centred = self._check_input(X) - self.mean_
        return as_output(centred - (centred @ self.components_.T) @ self.components_)

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "mean_", self.mean_, (None,))
        d = self.mean_.shape[0]
        check_state_array(self.kind, "components_", self.components_, (self._n_components_for(d), d))

    def _n_components_for(self, n_features: int) -> int:
        """The number of removed directions: ``n_components`` or ``max(1, round(d / 100))``."""
        return max(1, round(n_features / 100)) if self.n_components is None else self.n_components
