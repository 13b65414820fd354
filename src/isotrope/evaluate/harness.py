"""Build an encoder for an evaluation, fit it on the declared corpus, run a task, label the result.

Every result says what the shaping was fitted on. Fitting on the evaluation
texts themselves happens only when asked (``transductive=True``) and is labelled.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from isotrope.backbones import is_static_source
from isotrope.backbones.base import TextKind, TokenizedBackbone
from isotrope.backbones.static import StaticBackbone, teacher_backend
from isotrope.config import EncoderConfig
from isotrope.corpus import iter_texts
from isotrope.distill import fast_source
from isotrope.encoder import ShapedEncoder, build_backbone, resolve_config
from isotrope.evaluate.cache import CachedBackbone
from isotrope.isotropy import isotropy_report
from isotrope.sampling import reservoir_sample

logger = logging.getLogger(__name__)

#: a fit corpus: a text/.jsonl file, a list of texts, or None (only for encoders that learn nothing)
FitCorpus = str | Path | Sequence[str] | None


@dataclass
class Evaluator:
    """Builds and fits encoders for recipes (:class:`EncoderConfig`), sharing loaded backbones and a
    token-state cache.

    Transformer backbones are wrapped in :class:`CachedBackbone` when ``cache_dir`` is
    set (static tables are cheap lookups and are not cached). A backbone with fitted
    state (a ``context:`` table) is shared only between recipes fitted on the same texts.
    """

    cache_dir: str | Path | None = None
    fit_samples: int = 20_000
    seed: int = 0
    #: a saved, fitted encoder (``--encoder``): evaluated as it is, never refitted
    encoder: ShapedEncoder | None = None
    #: progress bars while fitting and encoding (``isotrope eval``: a transformer over a BEIR corpus takes minutes)
    show_progress: bool = False
    _backbones: dict[str, Any] = field(default_factory=dict)
    _samples: dict[str, list[str]] = field(default_factory=dict)

    def fit(
        self,
        config: EncoderConfig,
        corpus: FitCorpus,
        eval_texts: Sequence[str] = (),
        transductive: bool = False,
        context_corpus: str | Path | None = None,
        corpus_name: str = "the retrieval corpus",
    ) -> tuple[ShapedEncoder, str]:
        """A fitted encoder and a description of what it was fitted on (``corpus_name`` names a list of texts).

        ``context_corpus`` (a text file) gives the backbone's context tables their own
        corpus; weights and transforms are still fitted on ``corpus``.
        """
        if self.encoder is not None:
            return self.encoder, "saved encoder: " + str(self.encoder.metadata.get("fit", {}).get("fitted_on", "?"))
        if corpus is None and transductive:
            texts, fitted_on = list(dict.fromkeys(eval_texts)), "TRANSDUCTIVE: the evaluation texts"
        elif corpus is None:
            texts, fitted_on = None, ""
        elif isinstance(corpus, (str, Path)):
            texts, fitted_on = self._sample_file(corpus), str(corpus)
        else:
            texts, fitted_on = reservoir_sample(corpus, self.fit_samples, self.seed), corpus_name
        config = resolve_config(config)
        if config.shape == "auto":
            return self._auto(config, texts, fitted_on)
        table_on = ""
        if context_corpus is not None:
            if "context:" not in config.model:
                raise ValueError(f"a context corpus is for context tables; model {config.model!r} has none")
            table_texts = self._sample_file(context_corpus)
            encoder = self.build(config, table_texts)
            if encoder.backbone.needs_fit:
                encoder.backbone.fit(table_texts)
            table_on = f"; context table: {context_corpus} ({len(table_texts)} texts)"
        else:
            encoder = self.build(config, texts)
        tables_from_corpus = ("context:" in config.model or bool(fast_source(config.model))) and context_corpus is None
        if not encoder.needs_corpus and not tables_from_corpus:
            return encoder, table_on.removeprefix("; ") or "nothing (no fitted statistics)"
        if texts is None:
            raise ValueError(
                f"model {config.model!r} / shaping {config.shape!r} / weights {config.weights!r} needs a "
                "fit corpus: pass --fit-corpus FILE (or --transductive to fit on the evaluation texts, "
                "labelled as such)"
            )
        fitted_on = f"{fitted_on} ({len(texts)} texts){table_on}"
        encoder.fit_sample(texts, fitted_on=fitted_on, show_progress=self.show_progress)
        return encoder, fitted_on

    def _auto(self, config: EncoderConfig, texts: Sequence[str] | None, fitted_on: str) -> tuple[ShapedEncoder, str]:
        """``--shape auto``: pick the shaping by pseudo-query MRR on the fit corpus (never on labels)."""
        from isotrope.autoshape import choose_shape

        if texts is None:
            raise ValueError("--shape auto chooses from a corpus: pass --fit-corpus FILE (or 'corpus' for retrieval)")
        fitted_on = f"{fitted_on} ({len(texts)} texts)"
        encoder = choose_shape(texts, config, fitted_on=fitted_on, seed=self.seed, backbone=self._backbone(config, texts))
        return encoder, f"{fitted_on}; auto chose {encoder.metadata['auto_shape']['chosen']}"

    def build(self, config: EncoderConfig, fit_texts: Sequence[str] | None = None) -> ShapedEncoder:
        """``ShapedEncoder.create`` with the backbone reused across recipes (and cached on disk)."""
        return ShapedEncoder.create(config, backbone=self._backbone(config, fit_texts))

    def _sample_file(self, path: str | Path) -> list[str]:
        key = str(Path(path).resolve())
        if key not in self._samples:
            self._samples[key] = reservoir_sample(iter_texts(path), self.fit_samples, self.seed)
        return self._samples[key]

    def _backbone(self, config: EncoderConfig, fit_texts: Sequence[str] | None) -> Any:
        key = repr(resolve_config(config).backbone_key())
        if "context:" in config.model or fast_source(config.model):  # tables from the fit texts: one per sample
            key += hashlib.sha256("\0".join(fit_texts or ()).encode()).hexdigest()
        if key not in self._backbones:
            backbone = build_backbone(config)
            if self.cache_dir and not is_static_source(config.model):
                backbone = CachedBackbone(cast(TokenizedBackbone, backbone), self.cache_dir)
            elif self.cache_dir and backbone.needs_fit and fit_texts:
                # context and distilled tables computed through the cached transformer (its token states are reused)
                cast(StaticBackbone, backbone).fit(
                    fit_texts,
                    teacher=lambda name: self._backbone(EncoderConfig(model=name, backend=teacher_backend()), None),
                    show_progress=True,
                )
            self._backbones[key] = backbone
        return self._backbones[key]


def encode_function(encoder: ShapedEncoder, show_progress: bool = False) -> Callable[[list[str], TextKind], np.ndarray]:
    return lambda texts, kind: encoder.encode(texts, kind=kind, show_progress=show_progress)


def isotropy_of(encoder: ShapedEncoder, texts: Sequence[str]) -> dict[str, float]:
    """Isotropy metrics of the encoder's vectors for ``texts``; texts that get a zero vector (no
    token in a static table's vocabulary) have no direction and are left out, and counted."""
    vectors = encoder.encode(list(texts))
    nonzero = np.linalg.norm(vectors, axis=1) > 0
    if not nonzero.all():
        logger.warning("isotropy: %d of %d texts have a zero vector and are left out", (~nonzero).sum(), len(texts))
    return {**isotropy_report(vectors[nonzero]), "zero_vectors": int((~nonzero).sum())}
