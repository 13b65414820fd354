"""The fingerprint of an encoder: sha256 over its canonical spec and its arrays."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def fingerprint(spec: dict[str, Any], state: dict[str, np.ndarray]) -> str:
    """sha256 over the canonical spec and every array's name, dtype, shape and bytes."""
    digest = hashlib.sha256(canonical_json(spec).encode())
    for name in sorted(state):
        array = np.ascontiguousarray(state[name])
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data)  # the buffer itself: no copy of a large table
    return digest.hexdigest()
