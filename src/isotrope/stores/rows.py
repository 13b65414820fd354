"""What every store does the same way with its rows: metadata to and from compact JSON, and id or key
lists cut into statement-sized chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

_decode_json = json.JSONDecoder().raw_decode


def dumps_metadata(metadata: Mapping[str, Any]) -> str:
    """Serialise validated metadata to compact JSON (non-ASCII kept as is)."""
    return json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def load_metadata(value: str | bytes | None) -> dict[str, Any]:
    """A stored metadata JSON object, as :func:`dumps_metadata` wrote it (compact: ``raw_decode`` parses it
    without ``json.loads``'s whitespace passes, at under half the cost); the common empty one is not parsed."""
    if not value or value == "{}":
        return {}
    return _decode_json(value if isinstance(value, str) else value.decode())[0]


def chunks(values: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``values`` in consecutive slices of at most ``size`` (one SQL statement or filter each)."""
    for start in range(0, len(values), size):
        yield values[start : start + size]
