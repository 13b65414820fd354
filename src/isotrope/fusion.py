"""Fusing a dense and a lexical ranking, and the search modes every store shares.

* ``convex``: each list's scores min-max normalised over its candidates for that query
  (a list whose candidates all score the same gives them 1), a hit missing from a list
  gets 0 there, and the fused score is ``alpha * dense + (1 - alpha) * lexical``;
* ``rrf``: reciprocal-rank fusion, ``sum over lists of 1 / (rrf_k + rank)`` (rank from 1).

Ties keep the order of first appearance, the dense list first. The defaults were chosen on
SciFact's *train* queries only and then frozen (docs/RESULTS.md, "Hybrid retrieval").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from isotrope.stores.base import Hit, check_k

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("convex", "rrf")
#: weight of the dense scores in the convex combination (chosen on SciFact train, frozen)
DEFAULT_ALPHA = 0.3
#: each list contributes at least this many candidates to the fusion
DEFAULT_CANDIDATES = 100
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


def _normalised(hits: Sequence[Hit]) -> dict[str, float]:
    if not hits:
        return {}
    scores = np.array([h.score for h in hits], dtype=np.float64)
    low, span = scores.min(), scores.max() - scores.min()
    values = np.ones_like(scores) if span == 0 else (scores - low) / span
    return {hit.id: float(v) for hit, v in zip(hits, values)}


def _ranked(scores: Mapping[str, float], first: Mapping[str, Hit], k: int) -> list[Hit]:
    order = sorted(scores, key=lambda i: -scores[i])  # stable: first appearance breaks ties
    return [Hit(i, scores[i], first[i].text, first[i].metadata) for i in order[:k]]


def _first_seen(rankings: Sequence[Sequence[Hit]]) -> dict[str, Hit]:
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for hit in ranking:
            first.setdefault(hit.id, hit)
    return first


def convex_fusion(dense: Sequence[Hit], lexical: Sequence[Hit], k: int, alpha: float = DEFAULT_ALPHA) -> list[Hit]:
    """``alpha * minmax(dense) + (1 - alpha) * minmax(lexical)``, best ``k`` first."""
    first = _first_seen([dense, lexical])
    d, t = _normalised(dense), _normalised(lexical)
    scores = {i: alpha * d.get(i, 0.0) + (1.0 - alpha) * t.get(i, 0.0) for i in first}
    return _ranked(scores, first, k)


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
    return [convex_fusion(d, t, k, weight) for d, t in zip(dense, lexical)]


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
