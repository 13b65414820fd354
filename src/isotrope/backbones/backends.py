"""Which runtime computes a transformer's token states, and when vectors of two runtimes may meet.

``torch`` runs the Hugging Face model; ``onnx`` runs its ONNX export in ONNX Runtime (float32, the
same vectors within rounding); ``onnx-int8`` and ``onnx-int8-per-channel`` run a dynamically
quantised copy (int8 weights: faster, slightly different vectors).

A saved encoder records its backend and numeric class in its backbone config, so both are part of
the fingerprint (a torch encoder records neither: absent means ``torch``/``fp32``, which keeps
encoders saved before backends existed valid). Policy for a store written with one backend and
searched or appended to with another (:func:`check_backend_switch`):

* same numeric class (``torch`` <-> ``onnx``, both float32): allowed with a warning; the vectors
  agree to cosine >= 0.9999 (tests/test_onnx.py);
* different numeric class (float32 <-> int8, or per-tensor <-> per-channel int8): refused; int8
  vectors differ from float32 ones by about 1 % and would silently degrade the ranking.
"""

from __future__ import annotations

import logging
from typing import Any

from isotrope.errors import BackendMismatchError

logger = logging.getLogger(__name__)

#: backend name -> numeric class of the vectors it computes
NUMERIC_CLASS = {"torch": "fp32", "onnx": "fp32", "onnx-int8": "int8", "onnx-int8-per-channel": "int8-per-channel"}
BACKENDS = tuple(NUMERIC_CLASS)
DEFAULT_BACKEND = "torch"


def check_backend(backend: str) -> str:
    """``backend`` if it is a known name, else a one-line ValueError listing the choices."""
    if backend not in NUMERIC_CLASS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def backend_fields(backend: str) -> dict[str, str]:
    """What a backbone config records about its backend (nothing for the default torch/fp32)."""
    if check_backend(backend) == DEFAULT_BACKEND:
        return {}
    return {"backend": backend, "numeric": NUMERIC_CLASS[backend]}


def recorded_backend(backbone_config: dict[str, Any]) -> str:
    """The backend a saved backbone config was written with."""
    return backbone_config.get("backend") or DEFAULT_BACKEND


def with_backend(spec: dict[str, Any], backend: str) -> dict[str, Any]:
    """A copy of an encoder spec as it reads with ``backend`` (to compare fingerprints across backends)."""
    backbone = {key: value for key, value in spec["backbone"].items() if key not in ("backend", "numeric")}
    if backbone.get("type") == "hf":
        backbone.update(backend_fields(backend))
    return {**spec, "backbone": backbone}


def check_backend_switch(written: str, used: str, where: str) -> None:
    """Apply the mixing policy above: warn for float32 <-> float32, refuse a change of numeric class."""
    if written == used:
        return
    if NUMERIC_CLASS[written] != NUMERIC_CLASS[used]:
        raise BackendMismatchError(
            f"{where} holds {NUMERIC_CLASS[written]} vectors from backend {written!r}; backend {used!r} computes "
            f"{NUMERIC_CLASS[used]} vectors: use backend {written!r} (or re-index into a new store)"
        )
    logger.warning(
        "%s was written with backend %r and is used with %r: both are %s, vectors agree to cosine >= 0.9999",
        where,
        written,
        used,
        NUMERIC_CLASS[used],
    )
