"""Fusing a dense and a lexical ranking, and the search modes every store shares.

* ``convex``: the candidates are the union of the dense and the lexical top ``candidates``; a candidate
  missing from one list gets its exact score on that side (its stored vector's score; its BM25 from the
  store's ``lexical_scores``, 0 when it shares no query term); each side is z-score normalised over the
  candidates (``(s - mean) / std``; a side whose candidates all score the same gives them 0) and the
  fused score is ``alpha * dense + (1 - alpha) * lexical``;
* ``rrf``: reciprocal-rank fusion, ``sum over lists of 1 / (rrf_k + rank)`` (rank from 1).

Ties keep the order of first appearance, the dense list first. The defaults were chosen on
SciFact's *train* queries only and then frozen (docs/RESULTS.md, "Hybrid retrieval").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from isotrope.stores.base import Hit, as_vectors, check_k
from isotrope.stores.memory import exact_scores

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("convex", "rrf")
#: weight of the dense scores in the convex combination (chosen on SciFact train, frozen)
DEFAULT_ALPHA = 0.45
#: each list contributes at least this many candidates to the fusion
DEFAULT_CANDIDATES = 200
RRF_K = 60


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
    return mode


def check_alpha(alpha: float | None) -> float:
    value = DEFAULT_ALPHA if alpha is None else alpha
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1]; got {alpha!r}")
    return float(value)


def zscores(scores: np.ndarray) -> np.ndarray:
    """``(s - mean) / std`` in float64 (all 0 when the scores are all equal)."""
    scores = np.asarray(scores, dtype=np.float64)
    std = scores.std() if len(scores) else 0.0
    return np.zeros_like(scores) if std == 0 else (scores - scores.mean()) / std


def _ranked(scores: Mapping[str, float], first: Mapping[str, Hit], k: int) -> list[Hit]:
    order = sorted(scores, key=lambda i: -scores[i])  # stable: first appearance breaks ties
    return [Hit(i, scores[i], first[i].text, first[i].metadata) for i in order[:k]]


def _first_seen(rankings: Sequence[Sequence[Hit]]) -> dict[str, Hit]:
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for hit in ranking:
            first.setdefault(hit.id, hit)
    return first


def convex_fusion(
    candidates: Sequence[Hit], dense: np.ndarray, lexical: np.ndarray, k: int, alpha: float = DEFAULT_ALPHA
) -> list[Hit]:
    """``alpha * zscore(dense) + (1 - alpha) * zscore(lexical)``, best ``k`` of ``candidates`` first
    (``dense`` and ``lexical``: each candidate's exact score on that side)."""
    fused = alpha * zscores(dense) + (1.0 - alpha) * zscores(lexical)
    scores = {hit.id: float(value) for hit, value in zip(candidates, fused)}
    return _ranked(scores, {hit.id: hit for hit in candidates}, k)


def completed_scores(
    store: Any, texts: Sequence[str], vectors: Any, dense: Sequence[Sequence[Hit]], lexical: Sequence[Sequence[Hit]]
) -> list[tuple[list[Hit], np.ndarray, np.ndarray]]:
    """Per query: the union of its two lists (first appearance, dense first) and every candidate's exact
    dense and lexical score, a score missing from a list computed from the store."""
    queries = as_vectors(vectors, store.dim, "queries")
    unions = [list(_first_seen([d, t]).values()) for d, t in zip(dense, lexical)]
    known = [({h.id: h.score for h in d}, {h.id: h.score for h in t}) for d, t in zip(dense, lexical)]
    no_dense = [[h.id for h in union if h.id not in d] for union, (d, _) in zip(unions, known)]
    no_lexical = [[h.id for h in union if h.id not in t] for union, (_, t) in zip(unions, known)]
    wanted = list(dict.fromkeys(i for ids in no_dense for i in ids))
    if store.concurrent_queries:  # the full-text lookups run while the vectors are read
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(store.lexical_scores, list(texts), no_lexical)
            stored = dict(zip(wanted, store.vectors(wanted))) if wanted else {}
            lexical_missing = pending.result()
    else:
        stored = dict(zip(wanted, store.vectors(wanted))) if wanted else {}
        lexical_missing = store.lexical_scores(list(texts), no_lexical)
    out = []
    for q, union, (d, t), d_ids, t_ids, t_found in zip(queries, unions, known, no_dense, no_lexical, lexical_missing):
        if d_ids:
            d = {**d, **dict(zip(d_ids, exact_scores(q[None], np.stack([stored[i] for i in d_ids]), store.metric)[0]))}
        t = {**t, **dict(zip(t_ids, t_found))}
        out.append((union, np.array([d[h.id] for h in union]), np.array([t[h.id] for h in union])))
    return out


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], k: int, rrf_k: int = RRF_K) -> list[Hit]:
    """Each id scores the sum over lists of ``1 / (rrf_k + rank)`` (rank from 1), best ``k`` first."""
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (rrf_k + rank)
    return _ranked(scores, _first_seen(rankings), k)


def search_store(
    store: Any,
    texts: Sequence[str],
    vectors: Any,
    k: int,
    where: Mapping[str, Any] | None = None,
    mode: str = "hybrid",
    alpha: float | None = None,
    fusion: str = "convex",
    candidates: int = DEFAULT_CANDIDATES,
    group_by: str | None = None,
) -> list[list[Hit]]:
    """One ranked list per query from any store: dense (``vectors``), lexical (``texts``) or both fused.

    ``vectors`` may be None in lexical mode. ``group_by`` keeps the best hit per value of that metadata
    field, searching deeper until each query has ``k`` groups or the store is exhausted.
    """
    check_mode(mode)
    k = check_k(k)
    if group_by is not None:
        return _grouped(store, texts, vectors, k, where, mode, alpha, fusion, candidates, group_by)
    if mode == "dense":
        return store.search(vectors, k, where=where)
    if mode == "lexical":
        return store.lexical_search(list(texts), k, where=where)
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}; expected one of {', '.join(FUSIONS)}")
    weight = check_alpha(alpha)
    depth = max(k, candidates)
    if store.concurrent_queries:  # the lexical query runs while the dense one does
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(store.lexical_search, list(texts), depth, where)
            dense = store.search(vectors, depth, where=where)
            lexical = pending.result()
    else:
        dense = store.search(vectors, depth, where=where)
        lexical = store.lexical_search(list(texts), depth, where=where)
    if len(dense) != len(lexical):
        raise ValueError(f"got {len(lexical)} query texts but {len(dense)} query vectors")
    if fusion == "rrf":
        return [reciprocal_rank_fusion([d, t], k) for d, t in zip(dense, lexical)]
    return [convex_fusion(c, d, t, k, weight) for c, d, t in completed_scores(store, texts, vectors, dense, lexical)]


def best_per_group(hits: Sequence[Hit], field: str, k: int) -> list[Hit]:
    """The first (best) hit of each value of metadata ``field`` (hits without it are their own group)."""
    seen: set[Any] = set()
    out: list[Hit] = []
    for hit in hits:
        key = hit.metadata.get(field, ("id", hit.id))
        if key not in seen:
            seen.add(key)
            out.append(hit)
            if len(out) == k:
                break
    return out


def _grouped(
    store: Any,
    texts: Sequence[str],
    vectors: Any,
    k: int,
    where: Mapping[str, Any] | None,
    mode: str,
    alpha: float | None,
    fusion: str,
    candidates: int,
    field: str,
) -> list[list[Hit]]:
    total = max(len(store), 1)
    fetch = max(4 * k, 50)
    while True:
        depth = min(fetch, total)
        hits = search_store(store, texts, vectors, depth, where, mode, alpha, fusion, max(candidates, depth))
        grouped = [best_per_group(row, field, k) for row in hits]
        if depth >= total or all(len(g) == k or len(row) < depth for g, row in zip(grouped, hits)):
            return grouped
        fetch *= 4
