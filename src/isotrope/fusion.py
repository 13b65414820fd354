"""Fusing a dense and a lexical ranking, and the search modes every store shares.

* ``convex``: the candidates are the union of the dense and the lexical top ``candidates``; a candidate
  missing from one list gets its exact score on that side (its stored vector's score; its BM25 from the
  store's ``lexical_scores``, 0 when it shares no query term); each side is z-score normalised over the
  candidates (``(s - mean) / std``; a side whose candidates all score the same gives them 0) and the
  fused score is ``alpha * dense + (1 - alpha) * lexical``;
* ``rrf``: reciprocal-rank fusion, ``sum over lists of 1 / (rrf_k + rank)`` (rank from 1).

Ties keep the order of first appearance, the dense list first. The defaults were chosen on
SciFact's *train* queries only and then frozen (docs/results/hybrid.md).
"""

from __future__ import annotations

import functools
import os
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
    store: Any,
    vectors: Any,
    dense: Sequence[Sequence[Hit]],
    dense_bm25: Sequence[np.ndarray],
    lexical: Sequence[Sequence[Hit]],
    lexical_vectors: Mapping[str, np.ndarray],
) -> list[tuple[list[Hit], np.ndarray, np.ndarray]]:
    """Per query: the union of its two lists (first appearance, dense first) and every candidate's exact
    dense and lexical score: ``dense_bm25`` holds the BM25 of each dense candidate, ``lexical_vectors``
    the stored vector of each lexical one (a lexical-only candidate's dense score is computed from it)."""
    queries = as_vectors(vectors, store.dim, "queries")
    out = []
    for q, ds, bm25, t in zip(queries, dense, dense_bm25, lexical):
        union = list(_first_seen([ds, t]).values())
        d = {h.id: h.score for h in ds}
        missing = [h.id for h in t if h.id not in d]
        if missing:
            d.update(zip(missing, exact_scores(q[None], np.stack([lexical_vectors[i] for i in missing]), store.metric)[0]))
        lex = {h.id: h.score for h in t} | dict(zip((h.id for h in ds), bm25))
        out.append((union, np.array([d[h.id] for h in union]), np.array([lex[h.id] for h in union])))
    return out


def _candidates(
    store: Any, texts: list[str], vectors: Any, depth: int, where: Mapping[str, Any] | None, complete: bool
) -> tuple[list[list[Hit]], list[list[Hit]], list[np.ndarray], dict[str, np.ndarray]]:
    """The dense and the lexical top ``depth`` (ids and scores) and, to ``complete`` them, the BM25 of every
    dense candidate and the stored vector of every lexical one missing from the dense list.

    A store with ``lexical_candidates`` gets the lexical top and the dense candidates' BM25 from one pass
    after the dense search; otherwise, where the store allows, the full-text side runs in a second thread
    while the dense side runs in this one."""
    if complete and hasattr(store, "lexical_candidates"):
        dense = store.search(vectors, depth, where=where, with_text=False)
        _check_count(texts, dense)
        lexical, bm25 = store.lexical_candidates(texts, depth, [[h.id for h in row] for row in dense], where=where)
        return dense, lexical, bm25, _missing_vectors(store, dense, lexical)

    def dense_side() -> tuple[list[list[Hit]], list[np.ndarray]]:
        dense = store.search(vectors, depth, where=where, with_text=False)
        return dense, store.lexical_scores(texts, [[h.id for h in row] for row in dense]) if complete else []

    def lexical_side() -> list[list[Hit]]:
        return store.lexical_search(texts, depth, where=where, with_text=False)

    if store.concurrent_queries:
        pending = _pool().submit(lexical_side)
        dense, bm25 = dense_side()
        lexical = pending.result()
    else:
        dense, bm25 = dense_side()
        lexical = lexical_side()
    _check_count(lexical, dense)
    return dense, lexical, bm25, _missing_vectors(store, dense, lexical) if complete else {}


def _check_count(texts: Sequence[Any], dense: Sequence[Any]) -> None:
    if len(dense) != len(texts):
        raise ValueError(f"got {len(texts)} query texts but {len(dense)} query vectors")


def _missing_vectors(store: Any, dense: Sequence[Sequence[Hit]], lexical: Sequence[Sequence[Hit]]) -> dict[str, np.ndarray]:
    """The stored vector of each lexical candidate its query's dense list lacks (its dense score is computed)."""
    ids: dict[str, None] = {}
    for d, t in zip(dense, lexical):
        found = {h.id for h in d}
        ids.update((h.id, None) for h in t if h.id not in found)
    return dict(zip(ids, store.vectors(list(ids)))) if ids else {}


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    """The threads hybrid searches run their full-text side in (kept: starting a thread per query costs
    about a millisecond)."""
    return ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1), thread_name_prefix="isotrope-hybrid")


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
    # the candidate lists carry ids and scores; the text and metadata are read for the fused top k only
    dense, lexical, bm25, lexical_vectors = _candidates(store, list(texts), vectors, depth, where, fusion == "convex")
    if fusion == "rrf":
        return _with_text(store, [reciprocal_rank_fusion([d, t], k) for d, t in zip(dense, lexical)])
    completed = completed_scores(store, vectors, dense, bm25, lexical, lexical_vectors)
    return _with_text(store, [convex_fusion(c, d, t, k, weight) for c, d, t in completed])


def _with_text(store: Any, rankings: list[list[Hit]]) -> list[list[Hit]]:
    """The hits with their stored text and metadata (one ``get`` for all of them)."""
    wanted = list(dict.fromkeys(hit.id for ranking in rankings for hit in ranking))
    stored = dict(zip(wanted, store.get(wanted)))
    return [
        [Hit(hit.id, hit.score, row.text, row.metadata) for hit in ranking if (row := stored[hit.id]) is not None]
        for ranking in rankings
    ]


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
