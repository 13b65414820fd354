"""``--shape auto``: choose the shaping on the user's own corpus, without labels.

Pseudo-queries come from the corpus itself (an inverse cloze task: a sentence
taken out of a text is the query, the rest of the text its only relevant
document; a title is the query for its body). Each candidate shaping is fitted
on one part of the sample and scored by pseudo-query MRR@10 on the held-aside
part. Small differences are not trusted: the simplest candidate whose MRR trails
the best one's by at most one standard error (paired over the pseudo-queries) or
one MRR point is chosen, and refitted on the whole sample. Token states are cached,
so the backbone runs once over the sample whatever the number of candidates.
"""

from __future__ import annotations

import logging
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isotrope.backbones import is_static_source
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.chunking import split_sentences

logger = logging.getLogger(__name__)

#: the shaping presets every candidate set tries, simplest first (flow is left out: it trains for minutes)
PRESET_CANDIDATES = ("none", "center", "abtt", "quantile", "whiten-partial", "whiten")
TRANSFORMER_CANDIDATES: tuple[dict[str, Any], ...] = tuple({"shape": shape} for shape in PRESET_CANDIDATES)
STATIC_CANDIDATES: tuple[dict[str, Any], ...] = tuple(
    {"weights": weights, "shape": shape} for weights in ("uniform", "sif") for shape in PRESET_CANDIDATES
)


@dataclass(frozen=True)
class PseudoQuery:
    """A label-free query and the index of its only relevant document."""

    text: str
    document: int


def build_pseudo_queries(
    texts: Sequence[str], n_queries: int = 500, seed: int = 0, min_sentences: int = 3, titles: Sequence[str] | None = None
) -> tuple[list[PseudoQuery], list[str]]:
    """Inverse-cloze pseudo-queries over ``texts`` (or title -> text when ``titles`` are given).

    Returns the queries and the documents they are scored against: every text,
    with each query's sentence removed from its own document (so retrieval must
    rely on meaning, not on the copied words).
    """
    rng = random.Random(seed)
    documents = list(texts)
    order = list(range(len(documents)))
    rng.shuffle(order)
    queries: list[PseudoQuery] = []
    for index in order:
        if len(queries) >= n_queries:
            break
        if titles is not None and titles[index].strip():
            queries.append(PseudoQuery(titles[index].strip(), index))
            continue
        spans = split_sentences(documents[index])
        if len(spans) < min_sentences:
            continue
        start, end = spans[rng.randrange(len(spans))]
        sentence = documents[index][start:end]
        if len(sentence.split()) < 4:
            continue
        queries.append(PseudoQuery(sentence, index))
        documents[index] = (documents[index][:start] + documents[index][end:]).strip()
    return queries, documents


def reciprocal_ranks_at_10(query_vectors: np.ndarray, document_vectors: np.ndarray,
                           relevant: Sequence[int]) -> np.ndarray:
    """Each query's reciprocal rank of its relevant document, 0 beyond the top 10 (cosine)."""
    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    scores = unit(query_vectors) @ unit(document_vectors).T
    target = scores[np.arange(len(relevant)), relevant]
    ranks = (scores > target[:, None]).sum(axis=1) + 1
    return np.where(ranks <= 10, 1.0 / ranks, 0.0)


def mrr_at_10(query_vectors: np.ndarray, document_vectors: np.ndarray, relevant: Sequence[int]) -> float:
    """Mean reciprocal rank of each query's relevant document within the top 10 (cosine)."""
    return float(reciprocal_ranks_at_10(query_vectors, document_vectors, relevant).mean())


#: pseudo-query MRR@10 differences below this are not worth a fitted map, however many queries
MIN_EFFECT = 0.01


def simplest_close_to_best(per_query: Sequence[np.ndarray],
                           min_effect: float = MIN_EFFECT) -> tuple[int, list[float | None]]:
    """Index of the first (simplest) candidate whose mean trails the best's by at most one standard
    error (of the paired per-query differences) or ``min_effect``; and each candidate's deficit in
    standard errors (None where the differences do not vary)."""
    best = int(np.argmax([scores.mean() for scores in per_query]))
    gaps, close = [], []
    for scores in per_query:
        difference = per_query[best] - scores
        error = difference.std(ddof=1) / np.sqrt(len(difference))
        gaps.append(float(difference.mean() / error) if error > 0 else None if difference.any() else 0.0)
        close.append(difference.mean() <= max(error, min_effect))
    return close.index(True), gaps


def choose_shape(
    texts: Sequence[str],
    options: dict[str, Any],
    *,
    candidates: Sequence[dict[str, Any]] | None = None,
    n_queries: int = 500,
    holdout_fraction: float = 0.3,
    seed: int = 0,
    titles: Sequence[str] | None = None,
    fitted_on: str | None = None,
    backbone: Any = None,
) -> ShapedEncoder:
    """Score ``candidates`` (dicts of ``ShapedEncoder.create`` options overriding ``options``, simplest
    first) by pseudo-query MRR@10 and return an encoder with the simplest one close to the best
    (:func:`simplest_close_to_best`), fitted on all of ``texts``.

    The scores of every candidate are kept in ``encoder.metadata["auto_shape"]``. A ``backbone``
    given by the caller (one with its own token-state cache, say) is used as is; otherwise the
    model's backbone is wrapped in a temporary cache for the duration of the selection.
    """
    from isotrope.evaluate.cache import CachedBackbone

    texts = list(texts)
    model = options.get("model", "all-MiniLM-L6-v2")
    if candidates is None:
        candidates = STATIC_CANDIDATES if is_static_source(model) else TRANSFORMER_CANDIDATES
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(texts))
    cut = int(len(texts) * (1 - holdout_fraction))
    fit_part = [texts[i] for i in order[:cut]]
    held = [texts[i] for i in order[cut:]]
    held_titles = [titles[i] for i in order[cut:]] if titles is not None else None
    queries, documents = build_pseudo_queries(held, n_queries, seed, titles=held_titles)
    if len(queries) < 10 or not fit_part:
        raise ValueError(f"--shape auto needs a larger corpus: {len(texts)} texts gave {len(queries)} pseudo-queries")
    base = {key: value for key, value in options.items() if key != "shape"}
    results, per_query = [], []
    with tempfile.TemporaryDirectory(prefix="isotrope-auto-") as cache_dir:
        owned = backbone is None
        if owned:
            backbone = CachedBackbone(ShapedEncoder.create(**{**base, "shape": "none"}).backbone, cache_dir)
        for candidate in candidates:
            encoder = ShapedEncoder.create(**{**base, **candidate}, backbone=backbone)
            if encoder.needs_corpus:
                encoder.fit_sample(fit_part)
            per_query.append(reciprocal_ranks_at_10(encoder.encode([q.text for q in queries], kind="query"),
                                                    encoder.encode(documents), [q.document for q in queries]))
            results.append({**candidate, "mrr@10": round(100 * float(per_query[-1].mean()), 2)})
            logger.info("auto shape: %s -> MRR@10 %.2f", candidate, results[-1]["mrr@10"])
        chosen, gaps = simplest_close_to_best(per_query)
        for row, gap in zip(results, gaps):
            row["standard_errors_below_best"] = gap if gap is None else round(gap, 2)
        choice = dict(candidates[chosen])
        encoder = ShapedEncoder.create(**{**base, **choice}, backbone=backbone)
        encoder.fit_sample(texts, fitted_on=fitted_on)
        if owned:
            encoder.backbone = backbone.backbone  # fitted from cached states; encode with the real backbone
            backbone.close()
    rule = f"simplest within one standard error or {100 * MIN_EFFECT:g} MRR point of the best"
    encoder.metadata["auto_shape"] = {"chosen": choice, "rule": rule, "candidates": results,
                                      "pseudo_queries": len(queries), "held_aside_texts": len(held), "seed": seed}
    return encoder
