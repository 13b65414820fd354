"""Post-processing transforms and the closed table that resolves them by ``kind``.

Transforms are imported on first use: loading an encoder whose chain is only ``l2`` (a folded
encoder) imports neither scikit-learn (``quantile``) nor torch (``flow``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from isotrope.transforms.base import NotFittedError, Transform, apply_chain

#: kind -> "module:class"; the module is imported when the kind is first looked up
_REGISTRY = {
    "center": "center:Center",
    "zscore": "zscore:ZScore",
    "abtt": "abtt:ABTT",
    "sif_removal": "sif_removal:SIFRemoval",
    "whiten": "whiten:Whiten",
    "pca": "pca:PCA",
    "quantile": "quantile:Quantile",
    "flow": "flow:FlowTransform",
    "l2": "l2:L2",
}
#: names exported by this package -> "module:attribute"
_EXPORTS = {
    **{path.split(":")[1]: path for path in _REGISTRY.values()},
    "Moments": "moments:Moments",
    "MomentsTransform": "moments:MomentsTransform",
}


def _resolve(path: str) -> Any:
    module, name = path.split(":")
    return getattr(importlib.import_module(f"isotrope.transforms.{module}"), name)


class _Registry(Mapping[str, "type[Transform]"]):
    """``TRANSFORMS[kind]`` imports the transform's module on first lookup."""

    def __getitem__(self, kind: str) -> type[Transform]:
        try:
            return _resolve(_REGISTRY[kind])
        except ImportError as error:  # flow needs torch, which a folded-encoder install leaves out
            raise ImportError(f"the {kind} transform needs {error.name}: pip install 'isotrope[transformers]'") from None

    def __iter__(self) -> Iterator[str]:
        return iter(_REGISTRY)

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __contains__(self, kind: object) -> bool:
        return kind in _REGISTRY


TRANSFORMS: Mapping[str, type[Transform]] = _Registry()


def make_transform(kind: str, **config: Any) -> Transform:
    """Build an unfitted transform of ``kind`` from its ``__init__`` parameters."""
    if kind not in TRANSFORMS:
        raise ValueError(f"unknown transform kind {kind!r}; known kinds: {', '.join(sorted(TRANSFORMS))}")
    return TRANSFORMS[kind](**config)


def chain_state(transforms: Sequence[Transform]) -> dict[str, np.ndarray]:
    """A fitted chain's arrays keyed ``<index>.<name>`` (as ``state.safetensors`` keeps them under a prefix)."""
    return {f"{index}.{name}": array for index, step in enumerate(transforms) for name, array in step.get_state().items()}


def chain_from_state(
    steps: Sequence[dict[str, Any]], state: Mapping[str, np.ndarray], where: str = "transforms"
) -> list[Transform]:
    """The fitted chain of spec ``steps`` (``{"kind": ..., "config": ...}``) with the arrays of :func:`chain_state`;
    a ValueError names the step (``where[index]``) of an unknown kind."""
    chain = []
    for index, step in enumerate(steps):
        kind = step.get("kind")
        if not isinstance(kind, str) or kind not in TRANSFORMS:
            raise ValueError(f"{where}[{index}] has unknown kind {kind!r}")
        prefix = f"{index}."
        arrays = {name[len(prefix) :]: array for name, array in state.items() if name.startswith(prefix)}
        chain.append(TRANSFORMS[kind].from_state(step.get("config", {}), arrays))
    return chain


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return _resolve(_EXPORTS[name])
    raise AttributeError(f"module 'isotrope.transforms' has no attribute {name!r}")


__all__ = [
    "ABTT",
    "L2",
    "PCA",
    "TRANSFORMS",
    "Center",
    "FlowTransform",
    "Moments",
    "MomentsTransform",
    "NotFittedError",
    "Quantile",
    "SIFRemoval",
    "Transform",
    "Whiten",
    "ZScore",
    "apply_chain",
    "chain_from_state",
    "chain_state",
    "make_transform",
]
