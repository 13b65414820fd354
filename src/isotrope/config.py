"""EncoderConfig: the one typed recipe of a shaped encoder.

The CLI builds it from its options, ``ShapedEncoder.create`` builds an encoder from it, the
evaluation harness and sweeps run it, and ``isotrope.json`` stores it under ``"config"``. It
holds what a user chooses; the fitted encoder's full description (resolved layer indices, the
fitted chain's parameters, its arrays) is the encoder's ``spec``, which the fingerprint covers.

``None`` in ``shape``, ``backend`` and ``exclude_special`` leaves the choice to the default of
where the recipe is used (``ShapedEncoder.create`` fills them in; ``index_documents`` fits the
recommended shaping when none is asked for). This module imports nothing heavy: the CLI loads it
for every command.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from isotrope.errors import ConfigError
from isotrope.shapes import format_shape

DEFAULT_MODEL = "all-MiniLM-L6-v2"

#: a shaping: a preset name, a chain such as ``center,abtt(3),l2``, or its JSON form (a list of steps)
ShapeSpec = str | tuple[dict[str, Any], ...]
#: hidden states to pool: ``last``, ``first_last``, an index, ``"0,6"`` or a sequence of indices
LayerSpec = str | int | tuple[int, ...]


@dataclass(frozen=True)
class EncoderConfig:
    """What an encoder is built from: backbone, token weighting, pooling, shaping and runtime."""

    #: a Hugging Face name or path, ``fast``/``fast:<teacher>``, ``static:<model>``, ``random:<model>``,
    #: ``glove-6b-50d``, a word-vector file, or tables joined with ``+`` (``static:M+context:M``)
    model: str = DEFAULT_MODEL
    #: preset, chain or JSON steps; None: the default of where the recipe is used
    shape: ShapeSpec | None = None
    pooling: str = "mean"
    layers: LayerSpec = "last"
    #: a template with ``{text}`` (transformers only)
    prompt: str | None = None
    #: tokens per text (None: the model's own limit)
    max_length: int | None = None
    #: token weighting: uniform, idf, sif, usif
    weights: str = "uniform"
    #: where the weighting's token frequencies come from: corpus, wordfreq or a ``word count`` file
    frequencies: str = "corpus"
    #: drop the N most frequent tokens
    drop_top: int = 0
    #: None: True for a static table, False for a transformer
    exclude_special: bool | None = None
    exclude_punctuation: bool = False
    #: causal LMs: Token Prepending over decoder layers ``tp_layers`` (``"START:END"`` or a pair)
    token_prepending: bool = False
    tp_layers: str | tuple[int, int] | None = None
    #: ``fast``: texts the teacher runs on (None: 10000)
    distill_samples: int | None = None
    #: ``fast``: queries also through the teacher (:mod:`isotrope.teacher_queries`); documents through the table alone
    teacher_queries: bool = False
    #: ``fast``: the table may also hold rows for the corpus's frequent token pairs (:mod:`isotrope.token_pairs`)
    fast_pairs: bool = False
    #: torch, onnx, onnx-int8, onnx-int8-per-channel (None: torch for a new encoder)
    backend: str | None = None

    def __post_init__(self) -> None:
        for name in ("model", "frequencies"):  # paths are kept as text (the recipe is JSON)
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
        for name in ("shape", "layers", "tp_layers"):  # sequences as tuples: equal after a JSON round trip
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for spec in fields(self):
            _check_field(spec.name, getattr(self, spec.name))

    # -- conversions ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (sequences as lists)."""
        return {spec.name: _jsonable(getattr(self, spec.name)) for spec in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        """The recipe of ``data``; fields it leaves out take their defaults. An unknown or ill-typed
        field is a one-line :class:`ConfigError` naming it."""
        if not isinstance(data, dict):
            raise ConfigError(f"encoder config must be a JSON object, not {type(data).__name__}")
        unknown = sorted(set(data) - FIELDS)
        if unknown:
            raise ConfigError(f"encoder config: unknown field {unknown[0]!r}; fields are {', '.join(sorted(FIELDS))}", unknown[0])
        return cls(**data)

    def replace(self, **changes: Any) -> EncoderConfig:
        """A copy with ``changes`` (checked like :meth:`from_dict`)."""
        unknown = sorted(set(changes) - FIELDS)
        if unknown:
            raise ConfigError(f"encoder config: unknown field {unknown[0]!r}; fields are {', '.join(sorted(FIELDS))}", unknown[0])
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> EncoderConfig:
        """The recipe read back from an encoder's spec (``isotrope.json`` of a folder saved before the
        recipe was stored, or an encoder assembled from parts). Resolved values (layer indices, the
        model's own max length) stand where the recipe may have left a default."""
        backbone, weighting = spec["backbone"], spec["weighting"]
        options: dict[str, Any] = {}
        if backbone.get("type") == "hf":
            model = backbone["model"]
            options.update(
                model=f"{model}+context:{model}" if backbone.get("context") else model,
                layers=backbone.get("layers", "last"),
                prompt=backbone.get("prompt"),
                token_prepending=bool(backbone.get("token_prepending")),
                tp_layers=backbone.get("tp_layers"),
                backend=backbone.get("backend") or "torch",
            )
        else:  # static tables and folded ones (``folded:<source>``)
            options.update(model=backbone["source"], distill_samples=backbone.get("distill_samples"), backend="torch")
            options.update(teacher_queries="query_teacher" in spec, fast_pairs=backbone.get("pairs", False))
        return cls(
            **options,
            max_length=backbone.get("max_length"),
            shape=format_shape(spec["transforms"]),
            pooling=spec["pooling"]["mode"],
            weights=weighting["scheme"],
            frequencies=weighting.get("frequencies", "corpus"),
            drop_top=weighting.get("drop_top", 0),
            exclude_special=weighting.get("exclude_special"),
            exclude_punctuation=weighting.get("exclude_punctuation", False),
        )

    def backbone_key(self) -> tuple[Any, ...]:
        """The fields that decide the backbone (encoders equal in these share one backbone)."""
        return tuple(getattr(self, name) for name in BACKBONE_FIELDS)

    # -- description ------------------------------------------------------------------
    def label(self) -> str:
        """A short readable name: the model, then every field that differs from its default."""
        parts = [self.model, f"pool={self.pooling}"]
        if self.distill_samples:
            parts.append(f"distill_samples={self.distill_samples}")
        if self.teacher_queries:
            parts.append("teacher-queries")
        if self.fast_pairs:
            parts.append("fast-pairs")
        if self.layers != "last":
            parts.append(f"layers={_text(self.layers)}")
        if self.prompt:
            parts.append("prompt")
        if self.max_length:
            parts.append(f"max_length={self.max_length}")
        if self.token_prepending:
            parts.append("tp" + (f"={_text(self.tp_layers)}" if self.tp_layers is not None else ""))
        if self.weights != "uniform":
            parts.append(f"w={self.weights}" + (f"[{Path(self.frequencies).name}]" if self.frequencies != "corpus" else ""))
        if self.drop_top:
            parts.append(f"drop_top={self.drop_top}")
        if self.exclude_special:
            parts.append("no-special")
        if self.exclude_punctuation:
            parts.append("no-punct")
        parts.append(f"shape={_shape_text(self.shape)}")
        if self.backend not in (None, "torch"):
            parts.append(f"backend={self.backend}")
        return " ".join(parts)


FIELDS = frozenset(spec.name for spec in fields(EncoderConfig))
#: the fields the backbone is built from (the rest is weighting, pooling and shaping)
BACKBONE_FIELDS = (
    "model",
    "layers",
    "prompt",
    "max_length",
    "token_prepending",
    "tp_layers",
    "distill_samples",
    "fast_pairs",
    "backend",
)

_NONE = type(None)
#: field -> the types it may hold (bool is never taken for an int)
_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "shape": (str, tuple, _NONE),
    "pooling": (str,),
    "layers": (str, int, tuple),
    "prompt": (str, _NONE),
    "max_length": (int, _NONE),
    "weights": (str,),
    "frequencies": (str,),
    "drop_top": (int,),
    "exclude_special": (bool, _NONE),
    "exclude_punctuation": (bool,),
    "token_prepending": (bool,),
    "tp_layers": (str, tuple, _NONE),
    "distill_samples": (int, _NONE),
    "teacher_queries": (bool,),
    "fast_pairs": (bool,),
    "backend": (str, _NONE),
}
_LOWEST = {"max_length": 1, "drop_top": 0, "distill_samples": 1}


def _check_field(name: str, value: Any) -> None:
    allowed = _TYPES[name]
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        expected = " or ".join({_NONE: "null", tuple: "list"}.get(kind, kind.__name__) for kind in allowed)
        raise ConfigError(f"encoder config: {name} must be {expected}, got {value!r}", name)
    if isinstance(value, str) and not value and name != "prompt":
        raise ConfigError(f"encoder config: {name} is empty", name)
    if isinstance(value, int) and not isinstance(value, bool) and name in _LOWEST and value < _LOWEST[name]:
        raise ConfigError(f"encoder config: {name} must be at least {_LOWEST[name]}, got {value}", name)
    if (
        name in ("layers", "tp_layers")
        and isinstance(value, tuple)
        and not all(isinstance(item, int) and not isinstance(item, bool) for item in value)
    ):
        raise ConfigError(f"encoder config: {name} must hold layer indices, got {list(value)!r}", name)
    if name == "shape" and isinstance(value, tuple) and not all(isinstance(step, dict) for step in value):
        raise ConfigError(f'encoder config: shape steps must be objects like {{"kind": "center"}}, got {list(value)!r}', name)


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _shape_text(shape: ShapeSpec | None) -> str:
    if shape is None or isinstance(shape, str):
        return str(shape)
    return format_shape(list(shape))
