"""The transform contract: scikit-learn conventions plus safetensors-friendly state.

Every post-processing step is a :class:`Transform`:

* ``__init__`` stores its parameters and nothing else;
* ``fit(X)`` returns ``self``; fitted attributes end in ``_``;
* ``transform(X)`` maps float32 ``(n, d_in)`` to float32 ``(n, d_out)``;
* ``get_config()`` returns the ``__init__`` parameters (JSON-serialisable);
* ``get_state()`` returns the fitted arrays keyed by attribute name;
* ``from_state(config, state)`` rebuilds a fitted transform without refitting.

Statistics are accumulated in float64; outputs are float32.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from isotrope.errors import NotFittedError

if sys.version_info >= (3, 11):
    from typing import Self
else:  # pragma: no cover - Python 3.10
    from typing_extensions import Self


def check_matrix(X: Any, name: str = "X") -> np.ndarray:
    """Validate a 2-D finite numeric array with at least one row; returned in its own dtype (no copy)."""
    array = np.asarray(X)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n_samples, n_features); got shape {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must be numeric; got dtype {array.dtype}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return array


def as_matrix(X: Any, name: str = "X") -> np.ndarray:
    """Validate a 2-D finite numeric array and return it as float64."""
    return check_matrix(X, name).astype(np.float64, copy=False)


class Transform:
    """Base class of every fitted post-processing step."""

    kind: ClassVar[str]
    #: names of the fitted arrays returned by ``get_state`` (all end in ``_``)
    state_names: ClassVar[tuple[str, ...]] = ()
    #: False for stateless steps (l2): the encoder skips them when fitting
    requires_fit: ClassVar[bool] = True

    def fit(self, X: Any) -> Self:
        raise NotImplementedError

    def transform(self, X: Any) -> np.ndarray:
        raise NotImplementedError

    def fit_transform(self, X: Any) -> np.ndarray:
        return self.fit(X).transform(X)

    # -- configuration and state -------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        """The ``__init__`` parameters, read back from attributes of the same name."""
        params = inspect.signature(type(self).__init__).parameters
        return {name: getattr(self, name) for name in params if name != "self"}

    def get_state(self) -> dict[str, np.ndarray]:
        self.check_is_fitted()
        return {name: np.asarray(getattr(self, name)) for name in self.state_names}

    @classmethod
    def from_state(cls, config: dict[str, Any], state: dict[str, np.ndarray]) -> Self:
        transform = cls(**config)
        missing = [name for name in cls.state_names if name not in state]
        if missing:
            raise ValueError(f"{cls.kind} transform state is missing arrays: {', '.join(missing)}")
        for name in cls.state_names:
            setattr(transform, name, np.asarray(state[name]))
        transform._check_state_shapes()
        return transform

    def _check_state_shapes(self) -> None:
        """Raise ValueError when loaded arrays do not fit together (override per transform)."""

    # -- helpers ------------------------------------------------------------------
    def is_fitted(self) -> bool:
        return all(hasattr(self, name) for name in self.state_names)

    def check_is_fitted(self) -> None:
        if not self.is_fitted():
            raise NotFittedError(f"this {self.kind} transform is not fitted yet: call fit() first")

    def _check_input(self, X: Any) -> np.ndarray:
        """Validate transform input against the fitted dimension; returns float64."""
        self.check_is_fitted()
        array = as_matrix(X)
        expected = self.n_features_in
        if expected is not None and array.shape[1] != expected:
            raise ValueError(f"{self.kind} transform was fitted on {expected} features; got {array.shape[1]}")
        return array

    @property
    def n_features_in(self) -> int | None:
        """Input dimension the transform was fitted on (None when any width is accepted)."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({args})"


def apply_chain(transforms: Sequence[Transform], vectors: Any) -> np.ndarray:
    """``vectors`` shaped by the fitted ``transforms`` in order, float32: the one place a chain is applied."""
    output = np.asarray(vectors, dtype=np.float32)
    for transform in transforms:
        output = transform.transform(output)
    return output
