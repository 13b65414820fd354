"""``--shape auto``: choose the shaping on the user's own corpus, without labels, and never at a cost.

Evidence. Pseudo-queries come from the corpus itself (a *proxy*, see :data:`PROXIES`): their number
scales with the sample (a tenth of it, at least 200 and at most 1,000 where the texts allow), drawn
across texts over ``n_splits`` seeded splits. In each split a candidate's transforms are fitted on
70 % of the sample, and its pseudo-queries, cut from the other 30 %, are scored by reciprocal rank
at 10 against those held-aside texts. Every candidate is scored on the same pseudo-queries, so the
comparison with the baseline is paired: a percentile bootstrap of the mean per-query difference
gives its 95 % interval.

Rule (conservative). The baseline, the first candidate (``none`` for a transformer, ``center`` for a
static table), is kept unless another candidate's
interval lies wholly above a margin: :data:`TRANSFORMER_MARGIN` MRR@10 points for a trained sentence
encoder (where docs/RESULTS.md shows shaping adds at most a few tenths of a point and the proxies
over-reward whitening), :data:`STATIC_MARGIN` for a static table (where shaping adds 10-15 points),
both doubled (:data:`FALLBACK_MARGIN_FACTOR`) when the evidence comes from the fallback ``masked``
proxy, whose ranking of candidates agrees least with labelled queries, and never below the margin
where that proxy has been seen to disagree with labels (:data:`PROXY_DISAGREEMENT`): such evidence
is marked unreliable and, for a trained encoder, in effect keeps the baseline.
Of the candidates that clear it, the one with the highest lower bound wins, and is fitted on the
whole sample.

Cost. The backbone runs once over the sample (the raw pooled vectors are reused by every
candidate and split, and by the final fit) and once over the pseudo-queries and the texts they
were cut from; candidates only fit and apply their transforms, from one scatter matrix per split.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from isotrope.backbones import is_static_source
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder, build_backbone
from isotrope.pseudo_queries import (
    CONFIDENCE,
    DEFAULT_PROXY,
    FALLBACK_PROXY,
    build_pseudo_queries,
    number_of_queries,
    paired_interval,
    reciprocal_ranks_at_10,
)
from isotrope.shapes import build_chain
from isotrope.transforms.base import Transform, apply_chain
from isotrope.transforms.moments import Moments, MomentsTransform

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)

#: the shaping presets every candidate set tries, simplest first (flow is left out: it trains for minutes)
PRESET_CANDIDATES = ("none", "center", "abtt", "quantile", "whiten-partial", "whiten")
TRANSFORMER_CANDIDATES: tuple[dict[str, Any], ...] = tuple({"shape": shape} for shape in PRESET_CANDIDATES)
#: a static table's baseline is centring (its common direction is an artefact of averaging token rows)
STATIC_CANDIDATES: tuple[dict[str, Any], ...] = tuple(
    {"weights": weights, "shape": shape}
    for weights in ("uniform", "sif")
    for shape in ("center", *(s for s in PRESET_CANDIDATES if s != "center"))
)
#: MRR@10 points (x100) the lower end of a candidate's interval must clear to displace the baseline
TRANSFORMER_MARGIN = 2.0
STATIC_MARGIN = 0.5
#: the margins are multiplied by this under the fallback (masked) proxy, which agrees less with labelled
#: queries than the passage proxy and credits whitening with gains real queries do not show
FALLBACK_MARGIN_FACTOR = 2.0
#: (proxy, static table?) -> the upper end of the interval (MRR@10 points) the proxy gave a candidate that
#: labelled queries scored lower: issue 31, a lower-cased public collection, all-MiniLM-L6-v2, the masked
#: proxy rated whiten-partial +8.18 [4.59, 11.96] over none where the labels gave it -2.23 nDCG@10
PROXY_DISAGREEMENT = {("masked", False): 11.96}


def margin_for(static: bool, proxy: str) -> float:
    """MRR@10 points a candidate must clear, by backbone family and by the proxy that gave the evidence."""
    margin = (STATIC_MARGIN if static else TRANSFORMER_MARGIN) * (FALLBACK_MARGIN_FACTOR if proxy == FALLBACK_PROXY else 1.0)
    return max(margin, PROXY_DISAGREEMENT.get((proxy, static), margin))


def proxy_is_reliable(proxy: str, static: bool) -> bool:
    """Whether a proxy's ranking of candidates has never disagreed with labels beyond its margin's reach."""
    return (proxy, static) not in PROXY_DISAGREEMENT


def conservative_choice(
    per_query: np.ndarray, margin: float, confidence: float = CONFIDENCE, seed: int = 0
) -> tuple[int, list[tuple[float, float, float]]]:
    """Index of the chosen candidate (row 0 is the baseline) and each row's paired comparison with
    the baseline, ``(mean difference, low, high)`` in the units of ``per_query``.

    A candidate other than the baseline is eligible only when the low end of its interval exceeds
    ``margin``; the eligible one with the highest low end wins (the simplest among equals), else
    the baseline."""
    comparisons = [paired_interval(row - per_query[0], confidence, seed=seed) for row in per_query]
    eligible = [i for i, (_, low, _) in enumerate(comparisons) if i > 0 and low > margin]
    if not eligible:
        return 0, comparisons
    return max(eligible, key=lambda i: (comparisons[i][1], -i)), comparisons


@dataclass
class Evidence:
    """Per-query reciprocal ranks (candidates x pseudo-queries, pooled over splits) and what made them."""

    per_query: np.ndarray
    proxy: str
    splits: int
    #: seconds spent on the selection itself (pseudo-queries, their texts, every candidate's fits and
    #: scores), apart from embedding the sample, which fitting the chosen shaping needs anyway
    seconds: float
    #: the same in CPU seconds of this process (a fairer measure on a shared machine)
    cpu_seconds: float = 0.0


def fit_unshaped(encoder: ShapedEncoder, texts: Sequence[str]) -> ShapedEncoder:
    """Fit what an unshaped encoder learns from ``texts`` (a context or distilled table, token weights)
    and nothing else: unlike :meth:`ShapedEncoder.fit_sample` it never folds a ``--model fast`` table,
    so every candidate is fitted on the raw vectors ``--shape PRESET`` is fitted on."""
    if encoder.backbone.needs_fit:
        encoder.backbone.fit(list(texts))
    counts = encoder.count_tokens(texts) if encoder.weighting.needs_corpus else None
    encoder.weighting.fit(encoder.backbone.vocabulary(), encoder.backbone.special_ids(), counts)
    return encoder


def _group_key(candidate: dict[str, Any]) -> str:
    return repr(sorted((key, value) for key, value in candidate.items() if key != "shape"))


def _fit_chain(chain: Sequence[Transform], fit_raw: np.ndarray, moments: Moments) -> None:
    """Fit ``chain`` on ``fit_raw`` as :meth:`ShapedEncoder.fit_transforms` does, with two shortcuts that
    leave every fitted array the same: a first step fitted from moments takes the shared ``moments`` of
    ``fit_raw`` (one scatter matrix per split, not one per candidate), and a step's output on the fit
    sample is computed only when a later step learns from it (not before the final ``l2``)."""
    vectors = fit_raw
    for position, transform in enumerate(chain):
        if position == 0 and isinstance(transform, MomentsTransform):
            transform.fit_moments(moments)
        else:
            transform.fit(vectors)
        if any(later.requires_fit for later in chain[position + 1 :]):
            vectors = transform.transform(vectors)


def gather_evidence(
    texts: Sequence[str],
    base: EncoderConfig,
    candidates: Sequence[dict[str, Any]],
    backbone: Any,
    *,
    proxy: str = DEFAULT_PROXY,
    n_queries: int | None = None,
    n_splits: int = 3,
    holdout_fraction: float = 0.3,
    seed: int = 0,
    raw: dict[str, tuple[ShapedEncoder, np.ndarray]] | None = None,
    min_queries: int = 30,
) -> Evidence:
    """Score every candidate on the same pseudo-queries over ``n_splits`` seeded splits of ``texts``.

    Fewer than ``min_queries`` pseudo-queries raise a ValueError before anything is embedded.

    ``raw`` maps each candidate group (the options other than the shape) to its fitted unshaped
    encoder and the raw vectors of ``texts``; missing groups are embedded here and added to it.
    Per group and split the fit sample's moments and the held-aside documents are computed once
    and shared by the group's candidates, which only fit and apply their transforms.
    """
    started, started_cpu = time.perf_counter(), time.process_time()
    texts = list(texts)
    raw = {} if raw is None else raw
    n_queries = n_queries or number_of_queries(len(texts))
    per_split = -(-n_queries // n_splits)
    splits = []
    for split in range(n_splits):
        order = np.random.default_rng([seed, split]).permutation(len(texts))
        cut = int(len(texts) * (1 - holdout_fraction))
        fit_index, held_index = order[:cut], order[cut:]
        queries = build_pseudo_queries([texts[i] for i in held_index], per_split, proxy, seed=seed * 1000 + split)
        splits.append((fit_index, held_index, queries))
    total = sum(len(queries) for *_, queries in splits)
    if total < max(30, min_queries) or any(len(fit) == 0 for fit, *_ in splits):
        raise ValueError(f"shape 'auto' needs a larger corpus: {len(texts)} texts gave {total} {proxy} pseudo-queries")
    new_queries = [q.text for *_, queries in splits for q in queries]
    new_documents = [q.document for *_, queries in splits for q in queries if q.document is not None]
    groups: dict[str, list[int]] = {}
    for index, candidate in enumerate(candidates):
        groups.setdefault(_group_key(candidate), []).append(index)
    rows: list[list[np.ndarray]] = [[] for _ in candidates]
    sample_seconds, sample_cpu = 0.0, 0.0
    for key, members in groups.items():
        if key not in raw:
            tick, tick_cpu = time.perf_counter(), time.process_time()
            unshaped = ShapedEncoder.create(base.replace(**{**candidates[members[0]], "shape": "none"}), backbone=backbone)
            fit_unshaped(unshaped, texts)
            raw[key] = (unshaped, unshaped.embed_raw(texts))
            sample_seconds += time.perf_counter() - tick
            sample_cpu += time.process_time() - tick_cpu
        unshaped, sample_raw = raw[key]
        query_raw = unshaped.embed_raw(new_queries, kind="query")
        document_raw = unshaped.embed_raw(new_documents) if new_documents else sample_raw[:0]
        query_at, document_at = 0, 0
        for fit_index, held_index, queries in splits:
            fit_raw = sample_raw[fit_index]
            moments = Moments.from_array(fit_raw)
            documents = sample_raw[held_index].copy()
            for query in queries:
                if query.document is not None:
                    documents[query.target] = document_raw[document_at]
                    document_at += 1
            split_queries = query_raw[query_at : query_at + len(queries)]
            query_at += len(queries)
            targets = [q.target for q in queries]
            for index in members:
                chain = build_chain(candidates[index]["shape"])
                _fit_chain(chain, fit_raw, moments)
                rows[index].append(
                    reciprocal_ranks_at_10(apply_chain(chain, split_queries), apply_chain(chain, documents), targets)
                )
    per_query = np.stack([np.concatenate(row) for row in rows])
    return Evidence(
        per_query, proxy, n_splits, time.perf_counter() - started - sample_seconds, time.process_time() - started_cpu - sample_cpu
    )


def choose_shape(
    texts: Sequence[str],
    config: EncoderConfig,
    *,
    candidates: Sequence[dict[str, Any]] | None = None,
    proxy: str = DEFAULT_PROXY,
    n_queries: int | None = None,
    n_splits: int = 3,
    margin: float | None = None,
    seed: int = 0,
    fitted_on: str | None = None,
    backbone: Any = None,
) -> ShapedEncoder:
    """Score ``candidates`` (dicts of :class:`EncoderConfig` fields overriding ``config``; the
    first is the baseline) on label-free pseudo-queries and return an encoder with the candidate the
    conservative rule picks (:func:`conservative_choice`), fitted on all of ``texts``.

    ``proxy`` falls back to :data:`FALLBACK_PROXY` when the texts give too few pseudo-queries
    (one-sentence texts have no passage to cut out). ``margin`` defaults by backbone family. The
    evidence is kept in ``encoder.metadata["auto_shape"]``.
    """
    texts = list(texts)
    margin_given = margin
    static = is_static_source(config.model)
    if candidates is None:
        candidates = STATIC_CANDIDATES if static else TRANSFORMER_CANDIDATES
    base = config.replace(shape=None)
    backbone = backbone or build_backbone(base)
    raw: dict[str, Any] = {}
    wanted = n_queries or number_of_queries(len(texts))
    try:
        needed = min(wanted, len(texts) // 10) if proxy != FALLBACK_PROXY else 0
        evidence = gather_evidence(
            texts,
            base,
            candidates,
            backbone,
            proxy=proxy,
            n_queries=n_queries,
            n_splits=n_splits,
            seed=seed,
            raw=raw,
            min_queries=needed,
        )
    except ValueError as error:
        if proxy == FALLBACK_PROXY:
            raise
        logger.info("auto shape: %s; using the %s proxy", error, FALLBACK_PROXY)
        evidence = gather_evidence(
            texts, base, candidates, backbone, proxy=FALLBACK_PROXY, n_queries=n_queries, n_splits=n_splits, seed=seed, raw=raw
        )
    reliable = proxy_is_reliable(evidence.proxy, static)
    if not reliable:
        logger.warning(
            "auto shape: only the %s proxy could be built from these texts (too few passages of 3+ sentences); "
            "its evidence has disagreed with labels, so the baseline is kept unless a candidate clears %.2f points",
            evidence.proxy,
            margin_for(static, evidence.proxy),
        )
    if margin is None:
        margin = margin_for(static, evidence.proxy)
    chosen, comparisons = conservative_choice(100 * evidence.per_query, margin, seed=seed)
    choice = dict(candidates[chosen])
    unshaped, sample_raw = raw[_group_key(choice)]
    encoder = ShapedEncoder.create(base.replace(**choice), backbone=unshaped.backbone)
    encoder.weighting = unshaped.weighting
    if encoder.needs_corpus:
        encoder.fit_transforms(sample_raw)
    encoder.finish_fit(fitted_on or "texts passed to fit()", len(texts))  # --model fast: one folded table
    results = []
    for candidate, row, (difference, low, high) in zip(candidates, evidence.per_query, comparisons):
        results.append(
            {
                **candidate,
                "mrr@10": round(100 * float(row.mean()), 2),
                "vs_baseline": round(difference, 2),
                "interval": [round(low, 2), round(high, 2)],
            }
        )
        logger.info(
            "auto shape: %s -> MRR@10 %.2f (%+.2f [%.2f, %.2f] vs baseline)",
            candidate,
            results[-1]["mrr@10"],
            difference,
            low,
            high,
        )
    rule = (
        f"keep {format_candidate(candidates[0])} unless another candidate's {100 * CONFIDENCE:g}% paired-bootstrap "
        f"interval of the MRR@10 difference lies above +{margin:g} points "
        f"({'static table' if static else 'trained encoder'} margin"
        f"{', doubled for the masked proxy' if margin_given is None and evidence.proxy == FALLBACK_PROXY else ''}"
        f"{', raised to where it has disagreed with labels' if margin_given is None and not reliable else ''}); "
        "then the highest lower bound wins"
    )
    encoder.metadata["auto_shape"] = {
        "chosen": choice,
        "proxy": evidence.proxy,
        "proxy_reliable": reliable,
        "pseudo_queries": int(evidence.per_query.shape[1]),
        "splits": evidence.splits,
        "margin": margin,
        "rule": rule,
        "candidates": results,
        "seed": seed,
        "selection_seconds": round(evidence.seconds, 1),
        "selection_cpu_seconds": round(evidence.cpu_seconds, 1),
    }
    return encoder


def format_candidate(candidate: dict[str, Any]) -> str:
    """A candidate's settings as one short label (``whiten + 0.25``)."""
    return " + ".join(str(value) for value in candidate.values())
