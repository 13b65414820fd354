"""Backbones turn texts into token states: transformers or static token tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from isotrope.backbones.base import Backbone, TextKind, TokenBatch
from isotrope.backbones.resolve import require_transformers
from isotrope.backbones.static import PACKAGED_GLOVE

__all__ = ["Backbone", "TextKind", "TokenBatch", "is_static_source", "make_backbone"]


def is_static_source(model: str) -> bool:
    """True for names that denote static token tables (joined by '+') rather than a transformer."""
    return all(_is_static_part(part.lower()) for part in model.split("+"))


def _is_static_part(part: str) -> bool:
    return (
        part.startswith(("static:", "random:", "context:", "fast:"))
        or part in (PACKAGED_GLOVE, "fast")
        or part.endswith((".txt", ".vec", ".txt.gz", ".vec.gz"))
    )


def make_backbone(
    config: dict[str, Any], state: dict[str, np.ndarray] | None = None, folder: str | Path | None = None
) -> Backbone:
    """Build a backbone from its config (as returned by ``get_config``), its saved arrays and, for a
    folded table, the encoder folder holding its ``tokenizer.json``."""
    options = {key: value for key, value in config.items() if key != "type"}
    kind = config.get("type")
    if kind == "folded":
        from isotrope.backbones.folded import FoldedBackbone

        return FoldedBackbone.from_saved(options, state or {}, folder)
    if state:
        options["state"] = state
    if kind == "hf":
        require_transformers(f"the transformer {config.get('model')!r}")
        from isotrope.backbones.hf import HFBackbone

        return HFBackbone(**options)
    if kind == "static":
        from isotrope.backbones.static import StaticBackbone

        return StaticBackbone(**options)
    raise ValueError(f"unknown backbone type {kind!r}; expected 'hf', 'static' or 'folded'")
