"""Backbones turn texts into token states: transformers or static token tables."""

from __future__ import annotations

from typing import Any

from isotrope.backbones.base import Backbone, TextKind, TokenBatch
from isotrope.backbones.static import PACKAGED_GLOVE

__all__ = ["Backbone", "TextKind", "TokenBatch", "make_backbone", "is_static_source"]


def is_static_source(model: str) -> bool:
    """True for names that denote a static token table rather than a transformer."""
    lowered = model.lower()
    return lowered.startswith(("static:", "random:")) or lowered == PACKAGED_GLOVE or lowered.endswith(
        (".txt", ".vec", ".txt.gz", ".vec.gz")
    )


def make_backbone(config: dict[str, Any]) -> Backbone:
    """Build a backbone from its config (as returned by ``get_config``)."""
    options = {key: value for key, value in config.items() if key != "type"}
    kind = config.get("type")
    if kind == "hf":
        from isotrope.backbones.hf import HFBackbone

        return HFBackbone(**options)
    if kind == "static":
        from isotrope.backbones.static import StaticBackbone

        return StaticBackbone(**options)
    raise ValueError(f"unknown backbone type {kind!r}; expected 'hf' or 'static'")
