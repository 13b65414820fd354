"""Post-processing transforms and the closed table that resolves them by ``kind``."""

from __future__ import annotations

from typing import Any

from isotrope.transforms.abtt import ABTT
from isotrope.transforms.base import NotFittedError, Transform
from isotrope.transforms.center import Center
from isotrope.transforms.flow import FlowTransform
from isotrope.transforms.l2 import L2
from isotrope.transforms.moments import Moments, MomentsTransform
from isotrope.transforms.pca import PCA
from isotrope.transforms.quantile import Quantile
from isotrope.transforms.sif_removal import SIFRemoval
from isotrope.transforms.whiten import Whiten
from isotrope.transforms.zscore import ZScore

TRANSFORMS: dict[str, type[Transform]] = {
    cls.kind: cls
    for cls in (
        Center,
        ZScore,
        ABTT,
        SIFRemoval,
        Whiten,
        PCA,
        Quantile,
        FlowTransform,
        L2,
    )
}


def make_transform(kind: str, **config: Any) -> Transform:
    """Build an unfitted transform of ``kind`` from its ``__init__`` parameters."""
    try:
        cls = TRANSFORMS[kind]
    except KeyError:
        raise ValueError(f"unknown transform kind {kind!r}; known kinds: {', '.join(sorted(TRANSFORMS))}") from None
    return cls(**config)


__all__ = [
    "ABTT",
    "L2",
    "PCA",
    "TRANSFORMS",
    "Center",
    "Moments",
    "MomentsTransform",
    "NotFittedError",
    "Quantile",
    "SIFRemoval",
    "Transform",
    "Whiten",
    "ZScore",
    "make_transform",
]
