"""Checks shared by the transforms: parameters, loaded state arrays, output dtype."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def check_positive_int(kind: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    """Raise ValueError unless ``value`` is a positive int (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        expected = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"{kind} transform: {name} must be {expected}; got {value!r}")


def resolve_n_components(kind: str, n_components: int, n_features: int) -> int:
    """Check that ``n_components`` fits the data dimension and return it as int."""
    if n_components > n_features:
        raise ValueError(f"{kind} transform: n_components={n_components} is larger than the {n_features} input features")
    return int(n_components)


def check_state_array(kind: str, name: str, array: np.ndarray, shape: tuple[int | None, ...]) -> None:
    """Raise ValueError unless ``array`` is a finite numeric array of ``shape`` (None = any length)."""
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{kind} transform state {name} must be numeric; got dtype {array.dtype}")
    if array.ndim != len(shape) or any(want is not None and got != want for got, want in zip(array.shape, shape)):
        wanted = "(" + ", ".join("*" if want is None else str(want) for want in shape) + ")"
        raise ValueError(f"{kind} transform state {name} has shape {array.shape}; expected {wanted}")
    if not np.isfinite(array).all():
        raise ValueError(f"{kind} transform state {name} contains NaN or infinite values")


def as_output(X: np.ndarray) -> np.ndarray:
    """The float32, C-contiguous form every transform returns."""
    return np.ascontiguousarray(X, dtype=np.float32)
