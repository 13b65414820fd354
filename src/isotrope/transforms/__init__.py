"""Post-processing transforms and the closed table that resolves them by ``kind``.

Transforms are imported on first use: loading an encoder whose chain is only ``l2`` (a folded
encoder) imports neither scikit-learn (``quantile``) nor torch (``flow``).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

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
    "make_transform",
]
