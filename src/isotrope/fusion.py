"""Fusing a dense and a lexical ranking, and the search modes every store shares.

* ``convex``: the candidates are the union of the dense top ``candidates`` and the lexical top
  ``keyword_candidates`` (by default :data:`KEYWORD_SHARE` of ``candidates``); a candidate
  missing from one list gets its exact score on that side (its stored vector's score; its BM25, 0 when it
  shares no query term); each side is z-score normalised over the candidates (``(s - mean) / std``; a side
  whose candidates all score the same gives them 0) and the fused score is ``alpha * dense + (1 - alpha) *
  lexical``;
* ``rrf``: reciprocal-rank fusion, ``sum over lists of 1 / (rrf_k + rank)`` (rank from 1).

Ties keep the order of first appearance, the dense list first. The candidates come from the store's
``hybrid_candidates`` where it has one (rows named by its own keys: one keyword pass, no id lookups, only the
fused top ``k`` read), else from its generic methods (:func:`_candidates`). The defaults were chosen on
SciFact's *train* queries only and then frozen (docs/results/hybrid.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias, TypeVar

import numpy as np

from isotrope.resources import thread_pool, usable_cores
from isotrope.stores.base import Hit, as_vectors, check_k
from isotrope.stores.memory import exact_scores

MODES = ("dense", "lexical", "hybrid")
FUSIONS = ("convex", "rrf")
#: weight of the dense scores in the convex combination (chosen on SciFact train, frozen)
DEFAULT_ALPHA = 0.45
#: the dense list contributes at least this many candidates to the fusion
DEFAULT_CANDIDATES = 200
#: the keyword list's candidates as a share of the dense list's (:func:`keyword_depth`). Of 1, 0.5 and 0.25,
#: the smallest losing at most 0.1 nDCG@10 on SciFact train against 1, at the frozen weight and at each store's
#: calibrated one, with both encoders; a keyword top k costs less the smaller k is (at 1M rows Lance's top 100
#: 7.4 ms against 9.4 for the top 200; docs/results/keyword-depth.md)
KEYWORD_SHARE = 0.5
RRF_K = 60
T = TypeVar("T")
U = TypeVar("U")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown search mode {mode!r}; expected one of {', '.join(MODES)}")
    return mode


def check_alpha(alpha: float | None) -> float:
    value = DEFAULT_ALPHA if alpha is None else alpha
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1]; got {alpha!r}")
    return float(value)


def keyword_depth(candidates: int, k: int) -> int:
    """The keyword list's depth in a hybrid query whose dense list has ``candidates``: :data:`KEYWORD_SHARE` of
    it, at least ``k``."""
    return max(k, round(candidates * KEYWORD_SHARE))


def zscores(scores: np.ndarray) -> np.ndarray:
    """``(s - mean) / std`` in float64 (all 0 when the scores are all equal)."""
    scores = np.asarray(scores, dtype=np.float64)
    std = scores.std() if len(scores) else 0.0
    return np.zeros_like(scores) if std == 0 else (scores - scores.mean()) / std


#: a row as a store's candidate lists name it (hashable): its id, or a key of the store's own (FAISS row key,
#: Lance row id)
Key: TypeAlias = Any
#: a ranking of keys, best first, with their fused scores
Ranking = list[tuple[Key, float]]


class KeyedVectors(NamedTuple):
    """Stored vectors named by :data:`Key`: ``matrix[rows[key]]`` is the vector of ``key``."""

    rows: Mapping[Key, int]
    matrix: np.ndarray

    @classmethod
    def of(cls, keys: Sequence[Key], matrix: np.ndarray) -> KeyedVectors:
        """The vectors ``matrix`` (a row per key) named by ``keys``."""
        return cls(dict(zip(keys, range(len(keys)))), matrix)

    def take(self, keys: Sequence[Key]) -> np.ndarray:
        """The vectors of ``keys``, a row each."""
        return self.matrix[[self.rows[key] for key in keys]]


@dataclass
class Candidates:
    """A store's two candidate lists for each query, rows named by :data:`Key` (ids, or keys of the store's
    own: then only the fused top ``k`` are read as hits). ``dense[i]`` and ``lexical[i]``: query ``i``'s keys,
    best first, and their scores. To complete them (convex fusion): ``dense_bm25[i]``, the BM25 of each
    dense key; ``vectors``, the stored vector of each lexical key its query's dense list lacks. ``hits``
    reads rankings of keys as hits with their text and metadata."""

    dense: list[tuple[list[Key], np.ndarray]]
    lexical: list[tuple[list[Key], np.ndarray]]
    dense_bm25: list[np.ndarray]
    vectors: KeyedVectors
    hits: Callable[[list[Ranking]], list[list[Hit]]]


def _ranked(scores: Mapping[Key, float], k: int) -> Ranking:
    order = sorted(scores, key=lambda i: -scores[i])  # stable: first appearance breaks ties
    return [(i, scores[i]) for i in order[:k]]


def _convex_ranked(union: Sequence[Key], dense: np.ndarray, lexical: np.ndarray, k: int, alpha: float) -> Ranking:
    fused = alpha * zscores(dense) + (1.0 - alpha) * zscores(lexical)
    best = np.argsort(-fused, kind="stable")[:k]  # stable: first appearance breaks ties
    return [(union[i], score) for i, score in zip(best.tolist(), fused[best].tolist())]


def _rrf_ranked(rankings: Sequence[Sequence[Key]], k: int, rrf_k: int = RRF_K) -> Ranking:
    scores: dict[Key, float] = {}
    for ranking in rankings:
        for rank, key in enumerate(ranking, start=1):
            scores[key] = scores.get(key, 0.0) + 1.0 / (rrf_k + rank)
    return _ranked(scores, k)


def _as_hits(ranking: Ranking, rows: Mapping[Key, Hit]) -> list[Hit]:
    return [Hit(str(i), score, rows[i].text, rows[i].metadata) for i, score in ranking]


def convex_fusion(
    candidates: Sequence[Hit], dense: np.ndarray, lexical: np.ndarray, k: int, alpha: float = DEFAULT_ALPHA
) -> list[Hit]:
    """``alpha * zscore(dense) + (1 - alpha) * zscore(lexical)``, best ``k`` of ``candidates`` first
    (``dense`` and ``lexical``: each candidate's exact score on that side)."""
    ranking = _convex_ranked([hit.id for hit in candidates], dense, lexical, k, alpha)
    return _as_hits(ranking, {hit.id: hit for hit in candidates})


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit]], k: int, rrf_k: int = RRF_K) -> list[Hit]:
    """Each id scores the sum over lists of ``1 / (rrf_k + rank)`` (rank from 1), best ``k`` first."""
    first: dict[str, Hit] = {}
    for ranking in rankings:
        for hit in ranking:
            first.setdefault(hit.id, hit)
    return _as_hits(_rrf_ranked([[hit.id for hit in ranking] for ranking in rankings], k, rrf_k), first)


def _completed(
    query: np.ndarray,
    metric: str,
    dense: tuple[list[Key], np.ndarray],
    bm25: np.ndarray,
    lexical: tuple[list[Key], np.ndarray],
    vectors: KeyedVectors,
) -> tuple[list[Key], np.ndarray, np.ndarray]:
    """One query's union of its two lists (first appearance, dense first) and every candidate's exact dense
    and lexical score: a lexical-only candidate's dense score from its stored vector, a dense one's BM25
    from ``bm25``."""
    (dense_keys, dense_scores), (lexical_keys, lexical_scores) = dense, lexical
    listed = [*dense_keys, *lexical_keys]
    if not listed:
        return [], np.empty(0), np.empty(0)
    first = np.sort(np.unique(np.asarray(listed), return_index=True)[1])  # each key's first position
    union = [listed[i] for i in first.tolist()]
    from_dense = first < len(dense_keys)
    lexical_only = first[~from_dense] - len(dense_keys)
    dense_side = np.empty(len(first), dtype=np.float64)
    lexical_side = np.empty(len(first), dtype=np.float64)
    dense_side[from_dense] = np.asarray(dense_scores, dtype=np.float64)[first[from_dense]]
    lexical_side[from_dense] = np.asarray(bm25, dtype=np.float64)[first[from_dense]]
    lexical_side[~from_dense] = np.asarray(lexical_scores, dtype=np.float64)[lexical_only]
    if len(lexical_only):
        stored = vectors.take([lexical_keys[i] for i in lexical_only.tolist()])
        dense_side[~from_dense] = exact_scores(query[None], stored, metric)[0]
    return union, dense_side, lexical_side


def _candidates(
    store: Any,
    texts: list[str],
    vectors: Any,
    depth: int,
    keywords: int,
    where: Mapping[str, Any] | None,
    complete: bool,
) -> Candidates:
    """The candidates of a store without ``hybrid_candidates``, named by id: its dense top ``depth`` and lexical
    top ``keywords``, the BM25 of every dense candidate (``lexical_scores``) and the stored vector of every
    lexical one the dense list lacks. Where the store allows, the full-text side runs in a second thread while the
    dense side runs in this one."""

    def dense_side() -> tuple[list[list[Hit]], list[np.ndarray]]:
        dense = store.search(vectors, depth, where=where, with_text=False)
        return dense, store.lexical_scores(texts, [[h.id for h in row] for row in dense]) if complete else []

    def lexical_side() -> list[list[Hit]]:
        return store.lexical_search(texts, keywords, where=where, with_text=False)

    if store.concurrent_queries:
        (dense, bm25), lexical = run_beside(lexical_side, dense_side)
    else:
        dense, bm25 = dense_side()
        lexical = lexical_side()
    missing: dict[Key, None] = {}
    for d, t in zip(dense, lexical):
        found = {h.id for h in d}
        missing.update((h.id, None) for h in t if h.id not in found)
    ids = list(missing) if complete else []
    return Candidates(
        [_keyed(row) for row in dense],
        [_keyed(row) for row in lexical],
        bm25,
        KeyedVectors.of(ids, store.vectors(ids) if ids else np.empty((0, store.dim), np.float32)),
        lambda rankings: _with_text(store, rankings),
    )


def _keyed(hits: Sequence[Hit]) -> tuple[list[Key], np.ndarray]:
    return [h.id for h in hits], np.array([h.score for h in hits], dtype=np.float64)


def run_beside(second: Callable[[], T], first: Callable[[], U]) -> tuple[U, T]:
    """``first()`` in this thread while ``second()`` runs in a :func:`worker_pool` thread; both results. The
    worker is done before this returns or raises (whichever side raised), so none of its reads runs beside the
    caller's next call."""
    pending = worker_pool().submit(second)
    try:
        here = first()
    finally:
        wait([pending])
    return here, pending.result()


def worker_pool() -> ThreadPoolExecutor:
    """The threads hybrid searches run their full-text side in, beside the dense side."""
    return thread_pool("isotrope-hybrid", max(2, usable_cores()))


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
    keyword_candidates: int | None = None,
) -> list[list[Hit]]:
    """One ranked list per query from any store: dense (``vectors``), lexical (``texts``) or both fused.

    ``vectors`` may be None in lexical mode. Hybrid fuses the dense top ``candidates`` and the lexical top
    ``keyword_candidates`` (None: :func:`keyword_depth` of ``candidates``), each at least ``k``.
    ``group_by`` keeps the best hit per value of that metadata field, searching deeper until each query has
    ``k`` groups or the store is exhausted. A store with ``hybrid_candidates(texts, vectors, depth,
    keywords, where, complete)`` gives its own :class:`Candidates`.
    """
    check_mode(mode)
    k = check_k(k)
    if group_by is not None:
        return _grouped(store, texts, vectors, k, where, mode, alpha, fusion, candidates, keyword_candidates, group_by)
    if mode == "dense":
        return store.search(vectors, k, where=where)
    if mode == "lexical":
        return store.lexical_search(list(texts), k, where=where)
    if fusion not in FUSIONS:
        raise ValueError(f"unknown fusion {fusion!r}; expected one of {', '.join(FUSIONS)}")
    weight = check_alpha(alpha)
    depth = max(k, candidates)
    keywords = keyword_depth(candidates, k) if keyword_candidates is None else max(k, keyword_candidates)
    queries = as_vectors(vectors, store.dim, "queries")
    if len(texts) != len(queries):
        raise ValueError(f"got {len(texts)} query texts but {len(queries)} query vectors")
    # the candidate lists carry keys and scores; the text and metadata are read for the fused top k only
    complete = fusion == "convex"
    if hasattr(store, "hybrid_candidates"):
        found = store.hybrid_candidates(list(texts), queries, depth, keywords, where, complete)
    else:
        found = _candidates(store, list(texts), queries, depth, keywords, where, complete)
    if not complete:
        return found.hits([_rrf_ranked([d[0], t[0]], k) for d, t in zip(found.dense, found.lexical)])
    rankings = [
        _convex_ranked(*_completed(q, store.metric, d, bm25, t, found.vectors), k, weight)
        for q, d, bm25, t in zip(queries, found.dense, found.dense_bm25, found.lexical)
    ]
    return found.hits(rankings)


def _with_text(store: Any, rankings: list[Ranking]) -> list[list[Hit]]:
    """The ranked ids as hits with their stored text and metadata (one ``get`` for all of them)."""
    wanted = list(dict.fromkeys(str(i) for ranking in rankings for i, _ in ranking))
    stored = dict(zip(wanted, store.get(wanted)))
    return [
        [Hit(row.id, score, row.text, row.metadata) for i, score in ranking if (row := stored[str(i)]) is not None]
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
    keyword_candidates: int | None,
    field: str,
) -> list[list[Hit]]:
    total = max(len(store), 1)
    fetch = max(4 * k, 50)
    while True:
        depth = min(fetch, total)
        hits = search_store(
            store,
            texts,
            vectors,
            depth,
            where,
            mode,
            alpha,
            fusion,
            max(candidates, depth),
            keyword_candidates=keyword_candidates,
        )
        grouped = [best_per_group(row, field, k) for row in hits]
        if depth >= total or all(len(g) == k or len(row) < depth for g, row in zip(grouped, hits)):
            return grouped
        fetch *= 4
