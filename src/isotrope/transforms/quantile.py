"""Per-dimension quantile map to a centred uniform or a standard normal distribution.

A thin wrapper over scikit-learn's :class:`~sklearn.preprocessing.QuantileTransformer`;
its ``quantiles_`` and ``references_`` are the state. Uniform outputs are shifted by
-0.5 so that they are centred on zero.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from sklearn.preprocessing import QuantileTransformer
from sklearn.utils import check_random_state, resample

from isotrope.transforms._validation import as_output, check_positive_int, check_state_array
from isotrope.transforms.base import Self, Transform, check_matrix


class Quantile(Transform):
    """Map every dimension through its empirical CDF, then to ``output_distribution``."""

    kind = "quantile"
    state_names = ("quantiles_", "references_")
    _estimator: QuantileTransformer

    def __init__(
        self,
        output_distribution: Literal["uniform", "normal"] = "uniform",
        n_quantiles: int = 1000,
        subsample: int | None = 100_000,
        random_state: int | None = 0,
    ) -> None:
        if output_distribution not in ("uniform", "normal"):
            raise ValueError(
                f"quantile transform: output_distribution must be 'uniform' or 'normal'; got {output_distribution!r}"
            )
        check_positive_int(self.kind, "n_quantiles", n_quantiles)
        check_positive_int(self.kind, "subsample", subsample, allow_none=True)
        if subsample is not None and n_quantiles > subsample:
            raise ValueError(f"quantile transform: n_quantiles={n_quantiles} is larger than subsample={subsample}")
        self.output_distribution = output_distribution
        self.n_quantiles = n_quantiles
        self.subsample = subsample
        self.random_state = random_state

    def fit(self, X: Any) -> Self:
        """scikit-learn's fit (the same subsample, references and monotone quantiles), with the
        per-column percentiles read off one sort of each column (numpy's nanpercentile takes a
        partition per quantile and column: minutes for 1,000 quantiles of 384 columns)."""
        array = self._subsample(X)
        # sklearn clips n_quantiles to the sample count itself, but warns; clip here without the warning
        references = np.linspace(0, 1, min(self.n_quantiles, array.shape[0]), endpoint=True)
        self.references_ = references
        self.quantiles_ = np.maximum.accumulate(_linear_percentiles(np.sort(array, axis=0), references * 100))
        self._estimator = type(self).from_state(self.get_config(), self.get_state())._estimator
        return self

    def _subsample(self, X: Any) -> np.ndarray:
        """The rows scikit-learn's fit would keep (the same draw), as float64: only they are converted,
        so memory does not grow with the number of rows beyond ``subsample``."""
        array = check_matrix(X)
        if self.subsample is not None and self.subsample < array.shape[0]:
            rows = resample(
                np.arange(array.shape[0]),
                replace=False,
                n_samples=self.subsample,
                random_state=check_random_state(self.random_state),
            )
            array = array[rows]
        return array.astype(np.float64, copy=False)

    def transform(self, X: Any) -> np.ndarray:
        array = self._check_input(X)
        output = self._estimator.transform(array)
        if self.output_distribution == "uniform":
            output -= 0.5
        return as_output(output)

    @classmethod
    def from_state(cls, config: dict[str, Any], state: dict[str, np.ndarray]) -> Self:
        transform = super().from_state(config, state)
        estimator = transform._make_estimator(transform.references_.shape[0])
        estimator.quantiles_ = np.asarray(transform.quantiles_, dtype=np.float64)
        estimator.references_ = np.asarray(transform.references_, dtype=np.float64)
        estimator.n_quantiles_ = transform.references_.shape[0]
        estimator.n_features_in_ = transform.quantiles_.shape[1]
        transform._estimator = estimator
        return transform

    def _make_estimator(self, n_quantiles: int) -> QuantileTransformer:
        return QuantileTransformer(
            n_quantiles=n_quantiles,
            output_distribution=self.output_distribution,
            subsample=self.subsample,
            random_state=self.random_state,
        )

    @property
    def n_features_in(self) -> int | None:
        return int(self.quantiles_.shape[1])

    def _check_state_shapes(self) -> None:
        check_state_array(self.kind, "quantiles_", self.quantiles_, (None, None))
        check_state_array(self.kind, "references_", self.references_, (self.quantiles_.shape[0],))
        if self.quantiles_.shape[0] > self.n_quantiles:
            raise ValueError(
                f"quantile transform state has {self.quantiles_.shape[0]} quantiles; config allows {self.n_quantiles}"
            )


def _linear_percentiles(sorted_columns: np.ndarray, percents: np.ndarray) -> np.ndarray:
    """``np.percentile(x, percents, axis=0)`` (method "linear", same arithmetic) of column-sorted ``x``."""
    n = sorted_columns.shape[0]
    q = np.true_divide(percents, 100)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    gamma = (virtual - previous)[:, None]
    previous = np.clip(previous.astype(np.intp), 0, n - 1)
    below, above = sorted_columns[previous], sorted_columns[np.clip(previous + 1, 0, n - 1)]
    difference = above - below
    return np.where(gamma >= 0.5, above - difference * (1 - gamma), below + difference * gamma)
