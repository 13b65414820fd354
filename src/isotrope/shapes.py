"""Shaping chains: named presets and a readable spec such as ``center,abtt(3),whiten(power=-0.25),l2``."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

#: preset name -> chain spec. Every preset ends in l2 so inner product equals cosine.
PRESETS: dict[str, str] = {
    "none": "l2",
    "center": "center,l2",
    "abtt": "abtt,l2",
    "whiten": "whiten,l2",
    "whiten-partial": "whiten(power=-0.25),l2",
    "quantile": "quantile,l2",
    "quantile-normal": "quantile(output_distribution='normal'),l2",
    "flow": "flow,l2",
}

_STEP = re.compile(r"\s*([A-Za-z_][\w-]*)\s*(?:\((.*?)\))?\s*(?:,|$)")


def _parse_value(raw: str) -> Any:
    raw = raw.strip()
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # bare words such as normal, uniform


def _parse_arguments(kind: str, text: str) -> dict[str, Any]:
    """``k=v, ...`` or one positional value (bound to the transform's first parameter)."""
    from isotrope.transforms import TRANSFORMS

    arguments: dict[str, Any] = {}
    for position, part in enumerate(p for p in text.split(",") if p.strip()):
        if "=" in part:
            key, value = part.split("=", 1)
            arguments[key.strip()] = _parse_value(value)
        elif position == 0:
            import inspect

            params = [name for name in inspect.signature(TRANSFORMS[kind].__init__).parameters if name != "self"]
            if not params:
                raise ValueError(f"{kind} takes no parameters")
            arguments[params[0]] = _parse_value(part)
        else:
            raise ValueError(f"in {kind}({text}): only the first argument may be positional")
    return arguments


def parse_shape(shape: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn a preset name, a chain spec or a JSON list into ``[{"kind": ..., "config": {...}}, ...]``."""
    from isotrope.transforms import TRANSFORMS

    if shape == "auto":
        raise ValueError(
            "shape 'auto' is chosen from a corpus: use it with `isotrope fit/index/eval`, "
            "or call isotrope.autoshape.choose_shape(texts, options)"
        )
    if isinstance(shape, list):
        steps = shape
    else:
        text = PRESETS.get(shape.strip(), shape).strip()
        if text.startswith("["):
            steps = json.loads(text)
        else:
            steps, position = [], 0
            while position < len(text):
                match = _STEP.match(text, position)
                if match is None or match.end() == position:
                    raise ValueError(f"cannot parse shape {shape!r} at character {position}: {text[position:]!r}")
                kind = match.group(1)
                if kind not in TRANSFORMS:
                    known = ", ".join(sorted(TRANSFORMS))
                    raise ValueError(
                        f"unknown transform {kind!r} in shape {shape!r}; known: {known}; presets: {', '.join(PRESETS)}"
                    )
                steps.append({"kind": kind, "config": _parse_arguments(kind, match.group(2) or "")})
                position = match.end()
    for step in steps:
        if step.get("kind") not in TRANSFORMS:
            raise ValueError(f"unknown transform {step.get('kind')!r} in shape {shape!r}")
        step.setdefault("config", {})
    return steps


def format_shape(steps: list[dict[str, Any]]) -> str:
    """The readable spec of a chain (inverse of ``parse_shape`` for chain specs)."""
    parts = []
    for step in steps:
        args = ", ".join(f"{key}={value!r}" for key, value in step["config"].items())
        parts.append(f"{step['kind']}({args})" if args else step["kind"])
    return ",".join(parts) if parts else "(identity)"


def build_chain(shape: str | list[dict[str, Any]]) -> list[Any]:
    """The unfitted transforms of a shaping, in order (what an encoder of that shape starts from)."""
    from isotrope.transforms import TRANSFORMS

    return [TRANSFORMS[step["kind"]](**step["config"]) for step in parse_shape(shape)]
