"""Mergeable float64 sufficient statistics, and the base class of transforms fitted from them.

:class:`Moments` holds the count, the mean and the centred scatter matrix (``full``) or
only its diagonal. Two sets of moments merge with the parallel update of Chan, Golub and
LeVeque, so statistics computed per block (per process, per Ray block) reduce exactly to
the statistics of the concatenated data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from isotrope.transforms.base import Self, Transform, as_matrix

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Moments:
    """Count, mean and centred scatter (``sum (x - mean)(x - mean)^T``, or its diagonal)."""

    count: int
    mean: np.ndarray
    scatter: np.ndarray

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"moments need a positive count; got {self.count}")
        if self.mean.ndim != 1:
            raise ValueError(f"moments mean must be 1-D; got shape {self.mean.shape}")
        d = self.mean.shape[0]
        if self.scatter.shape not in ((d,), (d, d)):
            raise ValueError(f"moments scatter has shape {self.scatter.shape}; expected ({d},) or ({d}, {d})")

    @classmethod
    def from_array(cls, X: Any, full: bool = True) -> Moments:
        """Moments of the rows of ``X`` (validated, accumulated in float64)."""
        array = as_matrix(X)
        mean = array.mean(axis=0)
        centred = array - mean
        scatter = centred.T @ centred if full else np.einsum("ij,ij->j", centred, centred)
        return cls(count=array.shape[0], mean=mean, scatter=scatter)

    @property
    def full(self) -> bool:
        """Whether the whole scatter matrix is kept (not only its diagonal)."""
        return self.scatter.ndim == 2

    @property
    def n_features(self) -> int:
        return self.mean.shape[0]

    def merge(self, other: Moments) -> Moments:
        """Moments of the union of both samples."""
        if other.n_features != self.n_features:
            raise ValueError(f"cannot merge moments of {self.n_features} and {other.n_features} features")
        if other.full != self.full:
            raise ValueError("cannot merge full moments with per-dimension moments")
        count = self.count + other.count
        delta = other.mean - self.mean
        weight = self.count * other.count / count
        correction = np.outer(delta, delta) if self.full else delta * delta
        return Moments(
            count=count,
            mean=self.mean + delta * (other.count / count),
            scatter=self.scatter + other.scatter + correction * weight,
        )

    @property
    def has_variance(self) -> bool:
        """Whether the samples differ at all (float32 rounding aside); false for one sample or copies of one."""
        total = float(np.sum(self.variance()))
        return total > float(np.sum(self.mean**2)) * np.finfo(np.float32).eps

    def uncentred(self) -> Moments:
        """The moments about zero: mean 0 and the second-moment scatter ``sum x x^T``."""
        correction = np.outer(self.mean, self.mean) if self.full else self.mean * self.mean
        return Moments(count=self.count, mean=np.zeros_like(self.mean), scatter=self.scatter + correction * self.count)

    def covariance(self) -> np.ndarray:
        """Population covariance (ddof=0); needs full moments."""
        if not self.full:
            raise ValueError("the covariance matrix needs full moments; these keep only per-dimension scatter")
        return self.scatter / self.count

    def variance(self) -> np.ndarray:
        """Population variance of every dimension (ddof=0)."""
        diagonal = np.diagonal(self.scatter) if self.full else self.scatter
        return diagonal / self.count

    def to_state(self) -> dict[str, np.ndarray]:
        """Plain arrays (``count``, ``mean``, ``scatter``) for transport between processes."""
        return {"count": np.asarray(self.count, dtype=np.int64), "mean": self.mean, "scatter": self.scatter}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> Moments:
        missing = [name for name in ("count", "mean", "scatter") if name not in state]
        if missing:
            raise ValueError(f"moments state is missing: {', '.join(missing)}")
        return cls(
            count=int(np.asarray(state["count"]).item()),
            mean=np.asarray(state["mean"], dtype=np.float64),
            scatter=np.asarray(state["scatter"], dtype=np.float64),
        )


class MomentsTransform(Transform):
    """A transform whose fit only needs :class:`Moments`: adds ``partial_fit`` and ``fit_moments``.

    Subclasses implement ``_fit_from_moments`` (setting the fitted attributes, including
    ``mean_``) and say with ``full_moments`` whether they need the whole scatter matrix.
    """

    full_moments: ClassVar[bool] = True

    def fit(self, X: Any) -> Self:
        """Fit from scratch on ``X`` (earlier ``partial_fit`` statistics are dropped)."""
        return self.fit_moments(Moments.from_array(X, full=self.full_moments))

    def partial_fit(self, X: Any) -> Self:
        """Add the rows of ``X`` to the statistics seen so far.

        The fitted attributes are recomputed from the merged statistics when one of them is
        next read (transform, get_state, ...), not after every block: a stream of blocks costs
        one eigendecomposition, not one per block.
        """
        previous: Moments | None = self.__dict__.get("_moments")
        if previous is None:
            return self.fit(X)
        for name in self.state_names:
            self.__dict__.pop(name, None)
        self._moments = previous.merge(Moments.from_array(X, full=previous.full))
        self._pending = self._moments
        return self

    def __getattr__(self, name: str) -> Any:
        """A fitted attribute read after ``partial_fit``: fit them all from the merged statistics now."""
        pending: Moments | None = self.__dict__.get("_pending")
        if pending is None or name not in self.state_names:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._fit_guarded(pending)
        del self._pending
        return self.__dict__[name]

    def fit_moments(self, moments: Moments) -> Self:
        """Fit from statistics already reduced elsewhere (e.g. merged per-block moments)."""
        if self.full_moments and not moments.full:
            raise ValueError(f"{self.kind} transform needs full moments (the scatter matrix); got per-dimension ones")
        self.__dict__.pop("_pending", None)
        self._moments = moments
        self._fit_guarded(moments)
        return self

    def _fit_guarded(self, moments: Moments) -> None:
        if not moments.has_variance:
            # removing the mean would turn every fitted vector to zero: keep them about the origin instead
            logger.warning("%s fitted on %d sample(s) without variance: the mean is not removed", self.kind, moments.count)
            moments = moments.uncentred()
        self._fit_from_moments(moments)

    def _fit_from_moments(self, moments: Moments) -> None:
        raise NotImplementedError

    @property
    def n_features_in(self) -> int | None:
        return int(self.mean_.shape[0])
