"""isotrope: shaped sentence encoders and the vector stores that keep them.

from isotrope import EncoderConfig, ShapedEncoder, Collection, index_documents
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "EncoderConfig": "isotrope.config",
    "ShapedEncoder": "isotrope.encoder",
    "Collection": "isotrope.search",
    "EncoderMismatchError": "isotrope.errors",
    "IsotropeError": "isotrope.errors",
    "index_documents": "isotrope.ingest.pipeline",
    "IngestPlan": "isotrope.ingest.plan",
    "choose_shape": "isotrope.autoshape",
    "Hit": "isotrope.stores.base",
}
__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    """Import on first use: ``import isotrope`` stays cheap (torch loads only when needed)."""
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'isotrope' has no attribute {name!r}")
