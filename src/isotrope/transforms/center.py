"""Mean removal: x - mean."""

from __future__ import annotations

from typing import Any

import numpy as np

from isotrope.transforms._validation import as_output, check_state_array
from isotrope.transforms.moments import Moments, MomentsTransform


class Center(MomentsTransform):
    """Subtract the corpus mean."""

    kind = "center"
    state_names = ("mean_",)
    full_moments = False

    def __init__(self) -> None:
        pass

    def _fit_from_moments(self, moments: Moments) -> None:
        self.mean_ = moments.mean.copy()

    def transform(self, X: Any) -> np.ndarray:
        return as_output(self._check_input(X) - self.mean_)

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "mean_", self.mean_, (None,))
