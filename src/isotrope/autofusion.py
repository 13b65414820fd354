"""A store's default search, chosen from its own chunks without labels: dense, lexical or hybrid at a weight.

Evidence. Pseudo-queries are made from a seeded sample of the stored chunks by ``--shape auto``'s
proxies (:mod:`isotrope.autoshape`): a sentence cut out of a chunk must find the rest of that chunk
(``passage``), or, where chunks are single sentences, a masked part of a chunk must find the chunk
(``masked``); with ``--model fast``, only from the chunks its fit held aside (:func:`unlearned_chunks`).
Each pseudo-query searches the sample, its own chunk replaced by the rest, by exact
dense scores (the stored vectors, the store's metric), by BM25 (:func:`isotrope.lexical.bm25_matrix`,
the stores' analyzer and Lucene IDF) and by the shipped convex fusion at every weight of
:data:`ALPHAS` (z-scores over the union of each side's top candidates, as :mod:`isotrope.fusion`;
the dense candidates are the same fraction of the sample as :data:`~isotrope.fusion.DEFAULT_CANDIDATES`
are of the store, the keyword ones :func:`~isotrope.fusion.keyword_depth` of them). The score is nDCG@10 of the one relevant chunk.

Rule (never at a cost). The better single side (dense or lexical, by mean) is the fallback. Hybrid's
weight is chosen by cross-fitting over ``n_splits`` seeded folds of the pseudo-queries: each fold is
scored at the weight that is best on the other folds, so the comparison is not flattered by the
choice. Hybrid is the default only when the 95 % paired-bootstrap interval of its per-query gain over
the better single side lies wholly above :data:`MARGIN` points; its weight is then the best on all
pseudo-queries. A weight of 0 or 1 is the single side (mode ``lexical`` or ``dense``).

The ``masked`` proxy cannot decide: its queries share every word with their chunk, so they flatter
BM25 (on sick-para with static:all-MiniLM-L6-v2 they rated lexical 3.6 nDCG@10 above dense where the
labels rate it 4.0 below). Where only it can be built (chunks of one or two sentences) the store keeps
dense, the side every trained encoder here held within 0.5 of the best on such corpora
(docs/results/hybrid-default.md), and the evidence is stored beside that choice.

Cost. Each ``passage`` pseudo-query encodes its sentence and the rest of its chunk: about one chunk's tokens.
A static table (``--model fast``, GloVe) costs nothing and takes :data:`QUERIES`; a transformer takes at
most :data:`COSTLY_SHARE` of the store's chunks (:func:`query_budget`), never fewer than the
:data:`MIN_DECIDING` the ``passage`` proxy needs to be used at all. Fewer pseudo-queries widen the
interval, which only makes the fallback to the better single side likelier: the rule stays safe.

The choice, its evidence and the rule are stored as the store property :data:`PROPERTY` (JSON);
:func:`stored_default` reads it back. A store without it searches :data:`UNCALIBRATED_MODE`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from isotrope.backbones import is_static_source
from isotrope.encoder import ShapedEncoder
from isotrope.fusion import DEFAULT_CANDIDATES, keyword_depth, zscores
from isotrope.lexical import analyze, bm25_matrix
from isotrope.pseudo_queries import CONFIDENCE, DEFAULT_PROXY, FALLBACK_PROXY, PseudoQuery, build_pseudo_queries, paired_interval
from isotrope.stores.memory import exact_scores, top_k

logger = logging.getLogger(__name__)

#: the store property holding the calibrated default search (JSON)
PROPERTY = "default_search"
#: what a store without :data:`PROPERTY` searches (the default before calibration existed)
UNCALIBRATED_MODE = "dense"
#: dense weights tried; 0 and 1 are the single sides
ALPHAS = tuple(round(0.05 * i, 2) for i in range(21))
#: the rank cut the pseudo-queries are scored at (nDCG@10), and the fewest candidates a side
K = 10
#: nDCG@10 points (x100) the low end of hybrid's interval must clear over the better single side
MARGIN = 0.0
#: chunks sampled as the search corpus, and pseudo-queries drawn from them
SAMPLE = 5000
QUERIES = 600
MIN_QUERIES = 30
#: pseudo-queries the ``passage`` proxy must give to be used (fewer: the ``masked`` fallback)
MIN_DECIDING = 2 * MIN_QUERIES
#: a transformer encoder's pseudo-queries at most, as a share of the store's chunks (each costs about a chunk)
COSTLY_SHARE = 0.10


def query_budget(encoder: ShapedEncoder, store_size: int, n_queries: int = QUERIES) -> int:
    """Pseudo-queries to make for a store of ``store_size`` chunks: ``n_queries`` with a static table; with a
    transformer, :data:`COSTLY_SHARE` of the store, at least :data:`MIN_DECIDING`, at most ``n_queries``."""
    if is_static_source(encoder.config.model):
        return n_queries
    return min(n_queries, max(MIN_DECIDING, math.ceil(COSTLY_SHARE * store_size)))


def ndcg_gain(ranks: np.ndarray) -> np.ndarray:
    """nDCG@10 of one relevant document at each 1-based rank (0 beyond 10; ``inf`` = not retrieved)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks <= K, 1.0 / np.log2(np.minimum(ranks, K) + 1.0), 0.0)


def _rank(scores: np.ndarray, target: int) -> float:
    return float(1 + np.count_nonzero(scores > scores[target]))


def pseudo_query_ranks(dense: np.ndarray, lexical: np.ndarray, targets: Sequence[int], candidates: int) -> np.ndarray:
    """Rank of each query's target (rows: queries; columns: dense, lexical, then each of :data:`ALPHAS`'
    convex fusions) given every query's exact ``dense`` and ``lexical`` scores over the sample."""
    out = np.full((len(targets), 2 + len(ALPHAS)), np.inf)
    dense_top = top_k(dense, candidates)
    lexical_top = top_k(lexical, keyword_depth(candidates, K))
    weights = np.array(ALPHAS)[:, None]
    for row, target in enumerate(targets):
        d, t = dense[row], lexical[row]
        out[row, 0] = _rank(d, target)
        if t[target] > 0:
            out[row, 1] = _rank(np.where(t > 0, t, -np.inf), target)
        union = np.array(list(dict.fromkeys([*dense_top[row], *(i for i in lexical_top[row] if t[i] > 0)])))
        where = np.flatnonzero(union == target)
        if len(where):
            fused = weights * zscores(d[union])[None, :] + (1.0 - weights) * zscores(t[union])[None, :]
            out[row, 2:] = 1 + np.count_nonzero(fused > fused[:, where], axis=1)
    return out


def pseudo_queries(
    texts: Sequence[str], n_queries: int, seed: int, sources: Collection[int] | None = None
) -> tuple[list[PseudoQuery], str]:
    """At most ``n_queries`` pseudo-queries cut from ``texts`` and the proxy that cut them: ``passage`` where
    enough texts have a sentence to cut out, else ``masked``; a ValueError below :data:`MIN_QUERIES`."""
    pool = len(texts) if sources is None else len(sources)
    queries = build_pseudo_queries(texts, n_queries, DEFAULT_PROXY, seed=seed, sources=sources)
    if len(queries) >= min(MIN_DECIDING, max(MIN_QUERIES, pool // 10)):
        return queries, DEFAULT_PROXY
    queries = build_pseudo_queries(texts, n_queries, FALLBACK_PROXY, seed=seed, sources=sources)
    if len(queries) < MIN_QUERIES:
        raise ValueError(
            f"calibrating the default search needs more text: {len(texts)} chunks gave {len(queries)} pseudo-queries"
        )
    return queries, FALLBACK_PROXY


def unlearned_chunks(texts: Sequence[str], encoder: ShapedEncoder) -> list[int] | None:
    """Indices of ``texts`` whose sentences a ``--model fast`` table was not fitted to map to them (the chunks
    its fit held aside, :func:`isotrope.distill.distill_table`), when enough are sampled to cut pseudo-queries
    from; else None (every text). Its pseudo-query rows taught the table each fit chunk's own sentences, which
    would flatter dense on pseudo-queries cut from those chunks."""
    from isotrope.distill import text_key

    held = set(encoder.metadata.get("distill", {}).get("held_aside_chunks", ()))
    sources = [i for i, text in enumerate(texts) if text_key(text) in held] if held else []
    if len(sources) < MIN_QUERIES * 2:
        if held:
            logger.info("default search: %d of the fast fit's held-aside chunks sampled; cutting from every chunk", len(sources))
        return None
    return sources


def fit_default_search(
    texts: Sequence[str],
    vectors: np.ndarray,
    encoder: ShapedEncoder,
    metric: str,
    store_size: int | None = None,
    n_queries: int = QUERIES,
    n_splits: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """Choose the default search (mode and dense weight) on pseudo-queries from ``texts`` (a sample of
    the stored chunks, ``vectors`` their stored vectors); the choice with its evidence and rule.
    ``n_queries``: the most pseudo-queries, fewer with a transformer on a small store (:func:`query_budget`)."""
    started, started_cpu = time.perf_counter(), time.process_time()
    texts = list(texts)
    size = max(store_size or len(texts), len(texts))
    sources = unlearned_chunks(texts, encoder)
    budget = query_budget(encoder, size, n_queries)
    try:
        queries, proxy = pseudo_queries(texts, budget, seed, sources)
    except ValueError as error:
        logger.info("default search: %s; keeping %s", error, UNCALIBRATED_MODE)
        return {
            "mode": UNCALIBRATED_MODE,
            "alpha": None,
            "rule": f"{error}: {UNCALIBRATED_MODE} kept",
            "store_chunks": store_size,
        }
    query_vectors = encoder.encode([q.text for q in queries], kind="query")
    rests = [(i, q.document) for i, q in enumerate(queries) if q.document is not None]
    terms = [analyze(t) for t in texts]
    query_terms = [analyze(q.text) for q in queries]
    targets = [q.target for q in queries]
    dense = exact_scores(query_vectors, vectors, metric)
    lexical = bm25_matrix(terms, query_terms)
    if rests:
        rows = np.array([i for i, _ in rests])
        cols = np.array([targets[i] for i in rows])
        rest_vectors = encoder.encode([d for _, d in rests], kind="document")
        dense[rows, cols] = exact_scores(query_vectors[rows], rest_vectors, metric)[np.arange(len(rows)), np.arange(len(rows))]
        rest_bm25 = bm25_matrix(terms, [query_terms[i] for i in rows], [analyze(d) for _, d in rests])
        lexical[rows, cols] = rest_bm25[np.arange(len(rows)), np.arange(len(rows))]
    candidates = max(K, min(len(texts), round(DEFAULT_CANDIDATES * len(texts) / size)))
    gains = 100 * ndcg_gain(pseudo_query_ranks(dense, lexical, targets, candidates))
    choice = choose(gains, proxy, n_splits, seed)
    choice.update(
        {
            "proxy": proxy,
            "pseudo_queries": len(queries),
            "query_budget": budget,
            "sample_chunks": len(texts),
            "query_chunks": "every sampled chunk" if sources is None else f"{len(sources)} held aside from the fast fit",
            "store_chunks": size,
            "candidates": candidates,
            "keyword_candidates": keyword_depth(candidates, K),
            "seed": seed,
            "seconds": round(time.perf_counter() - started, 2),
            "cpu_seconds": round(time.process_time() - started_cpu, 2),
        }
    )
    logger.info("default search: %s", describe(choice))
    return choice


def choose(gains: np.ndarray, proxy: str, n_splits: int = 3, seed: int = 0) -> dict[str, Any]:
    """The rule (module docstring) on per-query nDCG@10 points: columns dense, lexical, then :data:`ALPHAS`."""
    means = gains.mean(axis=0)
    single = 0 if means[0] >= means[1] else 1
    hybrid = gains[:, 2:]
    folds = np.random.default_rng(seed).permutation(len(gains)) % n_splits
    crossed = np.empty(len(gains))
    for fold in range(n_splits):
        rest = folds != fold
        crossed[~rest] = hybrid[~rest, int(np.argmax(hybrid[rest].mean(axis=0)))]
    difference, low, high = paired_interval(crossed - gains[:, single], seed=seed)
    best = int(np.argmax(hybrid.mean(axis=0)))
    alpha = ALPHAS[best]
    use_hybrid = low > MARGIN and 0.0 < alpha < 1.0 and proxy != FALLBACK_PROXY
    mode = "hybrid" if use_hybrid else ("dense", "lexical")[single] if proxy != FALLBACK_PROXY else UNCALIBRATED_MODE
    rule = (
        f"hybrid at the pseudo-queries' best dense weight if the {100 * CONFIDENCE:g}% paired-bootstrap interval "
        f"of its cross-fitted ({n_splits} folds) nDCG@10 gain over the better single side lies above +{MARGIN:g} "
        "points, else the better single side"
    )
    if proxy == FALLBACK_PROXY:
        rule = f"{UNCALIBRATED_MODE}: the {proxy} proxy (chunks too short to cut a sentence from) flatters BM25 and cannot decide"
    return {
        "mode": mode,
        "alpha": alpha if use_hybrid else None,
        "rule": rule,
        "ndcg@10": {
            "dense": round(float(means[0]), 2),
            "lexical": round(float(means[1]), 2),
            **{f"hybrid@{a:g}": round(float(m), 2) for a, m in zip(ALPHAS, hybrid.mean(axis=0))},
        },
        "hybrid_vs_" + ("dense", "lexical")[single]: {
            "gain": round(difference, 2),
            "interval": [round(low, 2), round(high, 2)],
            "cross_fitted_ndcg@10": round(float(crossed.mean()), 2),
        },
        "margin": MARGIN,
    }


def describe(choice: Mapping[str, Any]) -> str:
    """One line: the mode chosen and why."""
    mode = choice["mode"] + (f" (alpha {choice['alpha']:g})" if choice.get("alpha") is not None else "")
    comparison = next((value for key, value in choice.items() if key.startswith("hybrid_vs_")), None)
    if comparison is None:
        return mode
    side = next(key for key in choice if key.startswith("hybrid_vs_"))[len("hybrid_vs_") :]
    return (
        f"{mode}: on {choice['pseudo_queries']} {choice['proxy']} pseudo-queries hybrid gains "
        f"{comparison['gain']:+.2f} [{comparison['interval'][0]:.2f}, {comparison['interval'][1]:.2f}] nDCG@10 over {side}"
    )


def sample_chunks(store: Any, size: int = SAMPLE, seed: int = 0) -> tuple[list[str], list[str]]:
    """The ids and texts of a seeded sample of at most ``size`` of a store's non-empty chunks."""
    ids = sorted(store.ids())
    random.Random(seed).shuffle(ids)
    texts: list[str] = []
    chosen: list[str] = []
    for start in range(0, len(ids), size):
        for hit in store.get(ids[start : start + size]):
            if hit is not None and hit.text and hit.text.strip() and len(chosen) < size:
                chosen.append(hit.id)
                texts.append(hit.text)
        if len(chosen) >= size:
            break
    return chosen, texts


def sample_store(store: Any, size: int = SAMPLE, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """A seeded sample of a store's non-empty chunks: their texts and stored vectors."""
    chosen, texts = sample_chunks(store, size, seed)
    return texts, store.vectors(chosen) if chosen else np.empty((0, store.dim), dtype=np.float32)


def stored_default(properties: Mapping[str, str]) -> tuple[str, float | None, dict[str, Any] | None]:
    """``(mode, alpha, choice)`` a store's searches use when the caller names no mode (``choice`` None:
    never calibrated, :data:`UNCALIBRATED_MODE`)."""
    text = properties.get(PROPERTY)
    if not text:
        return UNCALIBRATED_MODE, None, None
    choice = json.loads(text)
    return choice["mode"], choice.get("alpha"), choice
