"""Per-dimension standardisation: (x - mean) / std."""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.transforms._validation import as_output, check_state_array
from isotrope.transforms.moments import Moments, MomentsTransform


class ZScore(MomentsTransform):
    """Centre every dimension and divide by its standard deviation.

    Dimensions whose standard deviation is below ``eps`` are only centred (their scale is
    set to 1, as scikit-learn's StandardScaler does for constant features).
    """

    kind = "zscore"
    state_names = ("mean_", "scale_")
    full_moments = False

    def __init__(self, eps: float = 1e-8) -> None:
        if not eps >= 0:
            raise ValueError(f"zscore transform: eps must be >= 0; got {eps!r}")
        self.eps = eps

    def _fit_from_moments(self, moments: Moments) -> None:
        scale = np.sqrt(moments.variance())
        scale[scale < self.eps] = 1.0
        self.mean_ = moments.mean.copy()
        self.scale_ = scale

    def transform(self, X: Any) -> np.ndarray:
        return as_output((self._check_input(X) - self.mean_) / self.scale_)

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "mean_", self.mean_, (None,))
        check_state_array(self.kind, "scale_", self.scale_, self.mean_.shape)
        if not (self.scale_ > 0).all():
            raise ValueError(f"{self.kind} transform state scale_ must be positive")
