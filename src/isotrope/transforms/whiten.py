"""Whitening with an eigenvalue power: (x - mean) U_k (S_k + eps)^power.

``power=-0.5`` is full whitening, ``power=0`` a rotation onto the principal axes (PCA),
powers in between temper the spectrum. Outputs are not normalised: put an ``l2`` step
after this one when the metric is cosine or inner product.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from sklearn.covariance import shrunk_covariance

from isotrope.transforms._linalg import matmul, top_eigenpairs
from isotrope.transforms._validation import (
    as_output,
    check_positive_int,
    check_state_array,
    resolve_n_components,
)
from isotrope.transforms.moments import Moments, MomentsTransform

logger = logging.getLogger(__name__)


def _null_directions(values: np.ndarray) -> np.ndarray:
    """Eigenvalues at float32 rounding level of the largest: noise, not a direction to amplify."""
    return values <= values[0] * np.finfo(np.float32).eps


def oas_shrinkage(covariance: np.ndarray, count: int) -> float:
    """The Oracle Approximating Shrinkage coefficient (Chen et al. 2010) from a population covariance,
    as :func:`sklearn.covariance.oas` computes it from the samples (which a moments fit no longer has)."""
    d = covariance.shape[0]
    mu = np.trace(covariance) / d
    alpha = np.mean(covariance**2)
    denominator = (count + 1) * (alpha - mu**2 / d)
    return 1.0 if denominator == 0 else float(min((alpha + mu**2) / denominator, 1.0))


class Whiten(MomentsTransform):
    """Rotate centred vectors onto the covariance eigenvectors and rescale axis i by ``(s_i + eps)^power``.

    Fitted on no more samples than dimensions, the covariance is shrunk toward a multiple of the
    identity with the OAS coefficient, with a warning, so no vector loses the directions the
    sample did not span. Otherwise eigenvalues at numerical zero (data in a hyperplane, as after
    a final LayerNorm) get scale 0 for negative powers, as in a pseudo-inverse, instead of exploding.
    """

    kind = "whiten"
    state_names = ("mean_", "components_", "scale_")

    def __init__(self, power: float = -0.5, n_components: int | None = None, eps: float = 1e-8) -> None:
        if not -0.5 <= power <= 0:
            raise ValueError(f"whiten transform: power must be in [-0.5, 0]; got {power!r}")
        if not eps >= 0:
            raise ValueError(f"whiten transform: eps must be >= 0; got {eps!r}")
        check_positive_int(self.kind, "n_components", n_components, allow_none=True)
        self.power = power
        self.n_components = n_components
        self.eps = eps

    def _fit_from_moments(self, moments: Moments) -> None:
        d = moments.n_features
        k = d if self.n_components is None else resolve_n_components(self.kind, self.n_components, d)
        covariance = moments.covariance()
        values, components = top_eigenpairs(covariance, k)
        values = np.clip(values, 0.0, None)
        if moments.count <= d:
            # fewer samples than dimensions: the covariance would send vectors off the sample's span to
            # zero; shrink it toward a multiple of the identity (Oracle Approximating Shrinkage)
            shrinkage = oas_shrinkage(covariance, moments.count)
            logger.warning(
                "whiten fitted on %d samples in %d dimensions: the covariance is singular; "
                "shrunk toward the identity (OAS shrinkage %.2f)",
                moments.count,
                d,
                shrinkage,
            )
            values, components = top_eigenpairs(shrunk_covariance(covariance, shrinkage), k)
            values = np.clip(values, 0.0, None)
        null = _null_directions(values)
        if null.any() and self.power < 0:
            logger.warning("whiten: %d of %d kept directions have ~zero variance; their scale is set to 0", int(null.sum()), k)
        scale = np.where(null, 1.0, values + self.eps) ** self.power
        if self.power < 0:
            scale[null] = 0.0
        self.mean_ = moments.mean.copy()
        self.components_ = components
        self.scale_ = scale

    def transform(self, X: Any) -> np.ndarray:
        return as_output(matmul(self._check_input(X) - self.mean_, self.components_.T) * self.scale_)

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "mean_", self.mean_, (None,))
        d = self.mean_.shape[0]
        rows = d if self.n_components is None else self.n_components
        check_state_array(self.kind, "components_", self.components_, (rows, d))
        check_state_array(self.kind, "scale_", self.scale_, (self.components_.shape[0],))
