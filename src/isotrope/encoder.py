"""ShapedEncoder: backbone + token weighting + pooling + a chain of fitted transforms."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from isotrope.backbones import Backbone, TextKind, is_static_source, make_backbone
from isotrope.backbones.backends import DEFAULT_BACKEND, with_backend
from isotrope.backbones.base import BATCH_TOKENS, batch_tokens
from isotrope.config import DEFAULT_MODEL as DEFAULT_MODEL  # re-exported: the default backbone
from isotrope.config import EncoderConfig
from isotrope.distill import fast_source
from isotrope.fingerprint import fingerprint
from isotrope.fold import FoldError, fold_encoder
from isotrope.persist import check_fingerprint, read_encoder, rebuilt_as_read, write_encoder
from isotrope.pooling import POOLING_MODES, pool
from isotrope.progress import encoding_progress
from isotrope.sampling import fair_sample as fair_sample  # its old home: still importable from here
from isotrope.sampling import reservoir_sample as reservoir_sample  # its old home: still importable from here
from isotrope.shapes import build_chain, format_shape
from isotrope.teacher_queries import TeacherQueries
from isotrope.transforms import Transform, apply_chain, chain_state
from isotrope.transforms.base import NotFittedError
from isotrope.weighting import TokenCounts, TokenWeighting

if TYPE_CHECKING:
    from isotrope.backbones.static import StaticBackbone

logger = logging.getLogger(__name__)

#: default shapings of `isotrope index` and the demo, by backbone family (measured in docs/RESULTS.md)
DEFAULT_SHAPE = "center"
STATIC_DEFAULT_SHAPE = "whiten-partial"
TEXT_KINDS = ("document", "query")


def default_shape(model: str) -> str:
    """The shaping fitted when none is asked for: mean removal for a transformer (never more than
    half a point from no shaping on a trained model), partial whitening for a static table
    (+10 to +15 points over none)."""
    return STATIC_DEFAULT_SHAPE if is_static_source(model) else DEFAULT_SHAPE


def resolve_config(config: EncoderConfig) -> EncoderConfig:
    """``config`` with the defaults it leaves open filled in as :meth:`ShapedEncoder.create` fills
    them: the shaping (``none``, except for ``fast``, whose recipe includes ``whiten-partial``) and
    the backend (torch)."""
    shape = config.shape
    if shape is None:
        shape = STATIC_DEFAULT_SHAPE if fast_source(config.model) else "none"
    return config.replace(shape=shape, backend=config.backend or DEFAULT_BACKEND)


def with_distilled_shape(config: EncoderConfig, report: dict[str, Any]) -> EncoderConfig:
    """``config`` with the shaping ``--model fast``'s distillation chose (``report["shape"]``,
    :data:`isotrope.distill.SHAPES`) when the recipe is at its default ``whiten-partial``, by that name;
    a chain written out, such as ``whiten(power=-0.25),l2``, is kept."""
    chosen = report.get("shape")
    if chosen is None or config.shape != STATIC_DEFAULT_SHAPE:
        return config
    return config.replace(shape=chosen)


def shape_value(config: EncoderConfig) -> str | list[dict[str, Any]]:
    """The recipe's shaping as :func:`~isotrope.shapes.parse_shape` reads it (``none`` when unset)."""
    shape = config.shape or "none"
    return shape if isinstance(shape, str) else list(shape)


def backbone_config(config: EncoderConfig, device: str = "auto") -> dict[str, Any]:
    """The backbone config (as ``make_backbone`` reads it) of a recipe, or a one-line ValueError
    for options that do not go together.

    ``exclude_special`` defaults to True for static tables (their [CLS]/[SEP] rows carry no
    meaning) and False for transformers. ``token_prepending`` (causal LMs) adds Token Prepending
    over decoder layers ``tp_layers`` (default 1 to a quarter of the depth). ``fast`` /
    ``fast:<teacher>``: a static table distilled from the transformer (default all-MiniLM-L6-v2)
    on a sample of at most ``distill_samples`` fit texts. ``backend``: ``torch``, ``onnx``,
    ``onnx-int8`` or ``onnx-int8-per-channel`` (transformers only).
    """
    model = fast_source(config.model) or config.model
    backend = config.backend or DEFAULT_BACKEND
    static = is_static_source(model)
    for field, default in (("distill_samples", None), ("teacher_queries", False), ("fast_pairs", False)):
        if getattr(config, field) != default and not model.startswith("fast:"):
            raise ValueError(f"{field} applies to the fast model (model 'fast' or 'fast:<teacher>'), not {model!r}")
    if static and backend != "torch":
        raise ValueError(f"backend {backend!r} runs transformers; {model!r} is a static table (use backend 'torch')")
    if config.prompt is not None and static:
        raise ValueError("prompt templates need a transformer backbone, not a static table")
    if config.tp_layers is not None and not config.token_prepending:
        raise ValueError("tp_layers applies only with token_prepending")
    if config.token_prepending and static:
        raise ValueError("token prepending needs a causal language model backbone, not a static table")
    if static:
        backbone: dict[str, Any] = {"type": "static", "source": model}
        if config.max_length:
            backbone["max_length"] = config.max_length
        if config.distill_samples is not None:
            backbone["distill_samples"] = config.distill_samples
        if config.fast_pairs:
            backbone["pairs"] = True
        return backbone
    name, _, extra = model.partition("+")
    if extra and extra != f"context:{name}":
        raise ValueError(f"{model!r}: a transformer can only be joined with its own table, '{name}+context:{name}'")
    layers = list(config.layers) if isinstance(config.layers, tuple) else config.layers
    backbone = {
        "type": "hf",
        "model": name,
        "layers": layers,
        "prompt": config.prompt,
        "max_length": config.max_length,
        "device": device,
        "context": bool(extra),
    }
    if config.token_prepending:
        backbone.update(token_prepending=True, tp_layers=config.tp_layers)
    if backend != "torch":
        backbone["backend"] = backend
    return backbone


def build_backbone(config: EncoderConfig, device: str = "auto") -> Backbone:
    """The backbone of a recipe (without its weighting and shaping)."""
    return make_backbone(backbone_config(config, device))


def check_texts(texts: Any, what: str = "texts") -> list[str]:
    """A non-empty list of non-empty strings, or a ValueError/TypeError naming the bad item."""
    if isinstance(texts, str):
        raise TypeError(f"{what} must be a list of strings, not a single string")
    texts = list(texts)
    if not texts:
        raise ValueError(f"{what} is empty: nothing to encode")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{index}] is {type(text).__name__}, not str")
        if not text.strip():
            raise ValueError(f"{what}[{index}] is an empty string")
    return texts


class ShapedEncoder:
    """One fitted, immutable-once-fitted sentence encoder.

    Build with :meth:`create` from an :class:`~isotrope.config.EncoderConfig`, fit with
    :meth:`fit`, then :meth:`encode`; :meth:`save`/:meth:`load` keep it as ``isotrope.json`` (the
    recipe, the spec, the fingerprint) + ``state.safetensors``.
    """

    def __init__(
        self,
        backbone: Backbone,
        pooling: str = "mean",
        weighting: TokenWeighting | None = None,
        transforms: Sequence[Transform] = (),
        batch_size: int = 64,
        metadata: dict[str, Any] | None = None,
        max_batch_tokens: int | None = BATCH_TOKENS,
        config: EncoderConfig | None = None,
        query_teacher: TeacherQueries | None = None,
    ) -> None:
        if pooling not in POOLING_MODES:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLING_MODES)}")
        self.backbone = backbone
        self.pooling = pooling
        self.weighting = weighting or TokenWeighting()
        self.transforms = list(transforms)
        self.batch_size = int(batch_size)
        #: padded tokens per batch: short texts go in big batches, long ones in small
        self.max_batch_tokens = max_batch_tokens
        self.metadata: dict[str, Any] = dict(metadata or {})
        #: the recipe this encoder was built from (None: read back from its spec when asked)
        self._config = config
        #: ``--teacher-queries``: queries also through the teacher of a fast table (set when it is fitted)
        self.query_teacher = query_teacher
        self._fingerprint: str | None = None  # computed once per fitted state (see fingerprint)
        if not hasattr(self.weighting, "weights_") and not self.weighting.needs_corpus:
            self.weighting.fit(backbone.vocabulary(), backbone.special_ids())

    @classmethod
    def create(
        cls,
        config: EncoderConfig | str | None = None,
        *,
        device: str = "auto",
        batch_size: int = 64,
        backbone: Backbone | None = None,
        **fields: Any,
    ) -> ShapedEncoder:
        """An unfitted encoder from its recipe: ``create(EncoderConfig(...))``.

        ``create("all-MiniLM-L6-v2", shape="center")`` and ``create(model=..., shape=...)`` build the
        :class:`~isotrope.config.EncoderConfig` from its fields (``fields`` also override those of a
        given config). ``device`` and ``batch_size`` say where and how it runs; ``backbone`` reuses an
        already built backbone of the same recipe.
        """
        if isinstance(config, EncoderConfig):
            config = config.replace(**fields) if fields else config
        else:
            config = EncoderConfig.from_dict({**({"model": config} if config is not None else {}), **fields})
        config = resolve_config(config)
        static = is_static_source(config.model)
        settings = backbone_config(config, device)  # checks the options even when a backbone is reused
        backbone = backbone or make_backbone(settings)
        weighting = TokenWeighting(
            scheme=config.weights,
            frequencies=config.frequencies,
            drop_top=config.drop_top,
            exclude_special=static if config.exclude_special is None else config.exclude_special,
            exclude_punctuation=config.exclude_punctuation,
        )
        transforms = build_chain(shape_value(config))
        return cls(
            backbone, config.pooling, weighting, transforms, batch_size, max_batch_tokens=batch_tokens(backbone), config=config
        )

    # -- description ----------------------------------------------------------------
    @property
    def config(self) -> EncoderConfig:
        """The recipe this encoder was built from (read back from its spec for an encoder assembled
        from parts, or loaded from a folder saved before recipes were stored)."""
        return self._config if self._config is not None else EncoderConfig.from_spec(self.spec)

    @property
    def spec(self) -> dict[str, Any]:
        """Everything that defines the fitted encoder except its arrays (canonical JSON form; the
        fingerprint covers it): the recipe resolved for this backbone, with the fitted chain's settings."""
        spec = {
            "backbone": self.backbone.get_config(),
            "weighting": self.weighting.get_config(),
            "pooling": {"mode": self.pooling},
            "transforms": [{"kind": t.kind, "config": t.get_config()} for t in self.transforms],
        }
        if self.query_teacher is not None:
            spec["query_teacher"] = self.query_teacher.get_config()
        return spec

    @property
    def shape(self) -> str:
        """The fitted transform chain as a spec string (``center,l2``)."""
        return format_shape(self.spec["transforms"])

    def get_state(self) -> dict[str, np.ndarray]:
        """All fitted arrays, keyed as in state.safetensors."""
        self.check_is_fitted()
        state = {f"backbone.{name}": array for name, array in self.backbone.get_state().items()}
        state.update({f"weighting.{name}": array for name, array in self.weighting.get_state().items()})
        state.update({f"transforms.{name}": array for name, array in chain_state(self.transforms).items()})
        if self.query_teacher is not None:
            state.update({f"query_teacher.{name}": array for name, array in self.query_teacher.get_state().items()})
        return state

    @property
    def fingerprint(self) -> str:
        """sha256 over the encoder's spec and arrays: equal fingerprints encode alike, bit for bit. Computed
        once per fitted state: fitting again (``fit``, ``fit_transforms``, ``finish_fit``) computes it anew."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.spec, self.get_state())
        return self._fingerprint

    @property
    def dim(self) -> int:
        """Output dimension (after the transforms; the backbone's until they are fitted)."""
        if not self.transforms or not self.is_fitted():
            return self.backbone.dim
        return int(self.apply_transforms(np.zeros((1, self.backbone.dim), dtype=np.float32)).shape[1])

    @property
    def tokenizer(self) -> Any:
        """The backbone's tokenizer (a ``tokenizers`` or transformers tokenizer)."""
        return self.backbone.tokenizer

    @property
    def needs_corpus(self) -> bool:
        """Whether fitting learns anything from texts (token statistics or a stateful transform)."""
        return (
            self.backbone.needs_fit or self.weighting.needs_corpus or any(transform.requires_fit for transform in self.transforms)
        )

    def is_fitted(self) -> bool:
        """Whether the weighting and every transform are fitted (the encoder can encode)."""
        return not self.backbone.needs_fit and hasattr(self.weighting, "weights_") and all(t.is_fitted() for t in self.transforms)

    def check_is_fitted(self) -> None:
        """Raise :class:`~isotrope.errors.NotFittedError` naming the steps not fitted yet."""
        if not self.is_fitted():
            pending = [t.kind for t in self.transforms if not t.is_fitted()]
            if self.backbone.needs_fit:
                pending.insert(0, "the context table")
            if not hasattr(self.weighting, "weights_"):
                pending.insert(0, f"{self.weighting.scheme} weighting")
            raise NotFittedError(f"encoder is not fitted ({', '.join(pending)} need a corpus): call fit(texts) first")

    # -- fitting --------------------------------------------------------------------
    def fit(
        self,
        texts: Iterable[str],
        *,
        max_samples: int = 100_000,
        seed: int = 0,
        fitted_on: str | None = None,
        show_progress: bool = False,
    ) -> ShapedEncoder:
        """Fit token weights, then each transform in order, on (a sample of) ``texts``.

        Streams of any length are reservoir-sampled down to ``max_samples``.
        ``fitted_on`` names the corpus in the saved metadata.
        """
        self.fit_sample(reservoir_sample(texts, max_samples, seed), fitted_on=fitted_on, show_progress=show_progress)
        self.metadata["fit"]["seed"] = seed
        return self

    def fit_sample(self, texts: Sequence[str], *, fitted_on: str | None = None, show_progress: bool = False) -> np.ndarray | None:
        """Fit on exactly ``texts``; returns their raw vectors when the chain needed them (for reuse)."""
        sample = check_texts(texts, "fit texts")
        self._fingerprint = None
        if self.backbone.needs_fit:
            self.backbone.fit(sample, show_progress=show_progress)
        self.adopt_distilled_shape()
        counts = self.count_tokens(sample) if self.weighting.needs_corpus else None
        self.weighting.fit(self.backbone.vocabulary(), self.backbone.special_ids(), counts)
        raw = None
        if any(transform.requires_fit for transform in self.transforms):
            raw = self.embed_raw(sample, show_progress=show_progress)
            self.fit_transforms(raw)
        if self.finish_fit(fitted_on or "texts passed to fit()", len(sample)):
            return None  # raw vectors of the unfolded chain do not apply to the folded encoder
        return raw

    def adopt_distilled_shape(self) -> None:
        """``--model fast``: take the shaping its distillation chose with the table, where the recipe
        left it at its default (:func:`with_distilled_shape`)."""
        if self._config is None:
            return
        config = with_distilled_shape(self._config, getattr(self.backbone, "distill_report", {}))
        if config.shape == self._config.shape:
            return
        logger.info("fast: shaping %s, as the distillation chose", config.shape)
        self.transforms = build_chain(shape_value(config))
        self._config = config
        self._fingerprint = None

    def finish_fit(self, fitted_on: str, n_texts: int) -> bool:
        """Record the fit in the metadata once every part is fitted; ``--model fast`` also folds the
        chain into its table. Returns whether it did (the raw vectors of the unfolded chain then no
        longer apply)."""
        self.metadata["fit"] = {"fitted_on": fitted_on, "n_texts": n_texts}
        self._fingerprint = None  # the parts were fitted (here or by the caller: autoshape, Ray)
        source = str(self.backbone.get_config().get("source", ""))
        if source.startswith("fast:"):
            report = self.metadata["distill"] = cast("StaticBackbone", self.backbone).distill_report  # fast: sources are static
            if self._config is not None and self._config.teacher_queries:
                backend = report.get("teacher_backend") or DEFAULT_BACKEND
                self.query_teacher = TeacherQueries.of_chain(source.split(":", 1)[1], backend, self.transforms)
            return self._fold_in_place()
        return False

    def _fold_in_place(self) -> bool:
        """``--model fast``: become the folded encoder (one table: tokenize, gather, mean, L2), when the
        chain folds; returns whether it did."""
        try:
            folded = fold_encoder(self)
        except FoldError as error:
            logger.info("fast: the chain is kept unfolded: %s", error)
            return False
        self.backbone, self.weighting, self.transforms = folded.backbone, folded.weighting, folded.transforms
        self.metadata = folded.metadata
        self._fingerprint = None  # the unfolded encoder's (folding reads it)
        return True

    def count_tokens(self, texts: Sequence[str]) -> TokenCounts:
        """Token statistics of ``texts`` in the backbone's vocabulary."""
        counts = TokenCounts(self.backbone.vocab_size)
        for start in range(0, len(texts), 1024):
            counts = counts.merge(
                TokenCounts.from_token_ids(self.backbone.token_ids(list(texts[start : start + 1024])), counts.counts.size)
            )
        return counts

    def fit_transforms(self, raw: np.ndarray) -> ShapedEncoder:
        """Fit the chain on raw (pooled, untransformed) vectors, each step on the previous output."""
        vectors = np.asarray(raw, dtype=np.float32)
        self._fingerprint = None
        for transform in self.transforms:
            vectors = transform.fit(vectors).transform(vectors)
        return self

    # -- encoding -------------------------------------------------------------------
    def embed_raw(
        self,
        texts: Sequence[str],
        kind: TextKind = "document",
        batch_size: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Pooled vectors before the transform chain, float32 (n, backbone.dim)."""
        texts = check_texts(texts)
        if kind not in TEXT_KINDS:
            raise ValueError(f"kind must be 'document' or 'query'; got {kind!r}")
        if not hasattr(self.weighting, "weights_"):
            self.check_is_fitted()
        output = np.empty((len(texts), self.backbone.dim), dtype=np.float32)
        pool_mean = getattr(self.backbone, "pool_mean", None)
        if pool_mean is not None and self.pooling == "mean":  # a static table: no padded batches
            step = max(batch_size or self.batch_size, 1024)
            with encoding_progress(len(texts), show_progress) as progress:
                for begin in range(0, len(texts), step):
                    output[begin : begin + step] = pool_mean(texts[begin : begin + step], self.weighting.weights_)
                    progress.update(len(texts[begin : begin + step]))
            return output
        batches = self.backbone.iter_batches(texts, kind, batch_size or self.batch_size, self.max_batch_tokens)
        with encoding_progress(len(texts), show_progress) as progress:
            for index, batch in batches:
                weights = self.weighting.token_weights(batch.input_ids)
                output[index] = pool(batch.states, batch.attention_mask, self.pooling, weights, batch.target_index)
                progress.update(len(index))
        return output

    def apply_transforms(self, raw: np.ndarray) -> np.ndarray:
        """Shape raw vectors with the fitted chain."""
        return apply_chain(self.transforms, raw)

    def encode(
        self,
        texts: Sequence[str],
        kind: TextKind = "document",
        batch_size: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Shaped vectors, float32 (n, dim); ``kind="query"`` applies the query prefix if any."""
        self.check_is_fitted()
        vectors = self.apply_transforms(self.embed_raw(texts, kind, batch_size, show_progress))
        if kind == "query" and self.query_teacher is not None:
            return self.query_teacher.mix(texts, vectors)
        return vectors

    # -- persistence ----------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the encoder folder (``isotrope.json`` + ``state.safetensors``) atomically."""
        return write_encoder(
            path,
            self.spec,
            self.get_state(),
            self.metadata,
            getattr(self.backbone, "save_files", None),
            config=self.config.to_dict(),
        )

    @classmethod
    def load(cls, path: str | Path, device: str = "auto", backend: str | None = None) -> ShapedEncoder:
        """A saved encoder; ``backend`` runs it on another runtime than the one it was saved with.

        Its recomputed fingerprint (with the saved backend) must equal the saved one.
        """
        parts = read_encoder(path, device=device, backend=backend)
        config = parts.config if backend is None else parts.config.replace(backend=backend)
        encoder = cls(
            parts.backbone,
            parts.pooling,
            parts.weighting,
            parts.transforms,
            metadata=parts.document.get("metadata"),
            max_batch_tokens=batch_tokens(parts.backbone),
            config=config,
            query_teacher=parts.query_teacher,
        )
        spec, state = with_backend(encoder.spec, parts.saved_backend), encoder.get_state()
        computed = parts.document["fingerprint"] if rebuilt_as_read(spec, state, parts) else fingerprint(spec, state)
        check_fingerprint(path, parts.document, computed)
        if backend is None:  # runs as saved: the fingerprint just checked is its own
            encoder._fingerprint = computed
        return encoder

    def fingerprint_as(self, backend: str) -> str:
        """The fingerprint this encoder would have with ``backend`` (same everything else)."""
        return fingerprint(with_backend(self.spec, backend), self.get_state())

    def __repr__(self) -> str:
        backbone = self.backbone.get_config()
        name = backbone.get("model") or backbone.get("source")
        return f"ShapedEncoder(model={name!r}, pooling={self.pooling!r}, shape={self.shape!r}, fitted={self.is_fitted()})"
