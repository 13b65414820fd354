"""Which vector index fits a store of n rows, and the search breadth that reaches the target recall.

The rules (``--index auto``, the default):

- below :data:`EXACT_BELOW` rows, exact search (FAISS ``Flat``; LanceDB without an ANN index):
  a brute-force query over 50,000 x 384 float32 costs about 2 ms on one core;
- from there on, FAISS ``IVF{nlist},SQ8`` with ``nlist`` = 4 sqrt(n) rounded to a power of two
  (at least 64, and at least 39 training points per list), the low end of faiss's advice (4 to
  16 sqrt(n)), and 8 sqrt(n) from :data:`FINER_LISTS_FROM` rows: more lists make each probe cheaper,
  so the calibrated breadth scans fewer vectors, but more lists also cost more to train and to fill
  (:func:`nlist_for` gives the measurements). The k-means training takes 39 sample points per list
  (at most 200,000) and at most faiss's 10 iterations, fewer where the work would pass
  :data:`KMEANS_WORK` (:func:`kmeans_iterations`), and then starts from a two-level clustering instead
  of random rows (:func:`two_level_start`). Its 8-bit codes
  (:data:`IVF_CODES`) scan a quarter of float32's bytes per probe for a little recall at equal
  breadth (100k passages, the same lists, real queries: 0.957 against 0.968 at 256 of 1,024), so
  the breadth reaching 0.95 scans a third of the bytes (256 lists of codes against 192 of floats).
  LanceDB builds ``IVF_HNSW_SQ``: one HNSW graph (8-bit scalar-quantized vectors, refined with the
  exact ones) per :data:`HNSW_PARTITION_ROWS` rows, the graphs built in parallel and every one searched
  (``nprobes`` = partitions), so only ``ef`` sets the breadth. Its IVF_PQ (``num_partitions`` =
  sqrt(n), ``num_sub_vectors`` = dim / 8) reached only 0.943 at a million passages, at 256 of
  1,041 partitions (a quarter of the table per query): these overlapping passages spread a query's
  neighbours over many IVF lists;
- the search breadth (FAISS ``nprobe`` / HNSW ``efSearch``, LanceDB ``nprobes`` / ``ef``) is measured when
  the index is built and saved with it (``--nprobe`` / ``--ef`` override it): the smallest of the
  :func:`finer` ladder whose recall@10 against exact search reaches :data:`TARGET_RECALL` plus
  :data:`PSEUDO_QUERY_MARGIN` (negative) on up to :data:`INDEX_QUERIES` pseudo-queries cut from the stored
  chunks (a sentence cut out of a chunk, encoded as a query: the store's
  :attr:`~isotrope.stores.base.VectorStore.calibration_queries`, which a Collection sets), their
  source chunk kept among the neighbours (as a real query's sentence stands in stored chunks).
  A store without text (vectors only) calibrates on queries made from its stored vectors instead:
  the smallest of the doubling ladder reaching :data:`TARGET_RECALL` plus :data:`CALIBRATION_MARGIN`,
  a query being a random stored vector moved, in a random direction orthogonal to it, by its
  distance to its :data:`CALIBRATION_NEIGHBOUR`-th nearest other stored vector
  (:func:`calibration_set`), that stored vector left out of both the exact and the searched
  neighbours. Those are harder than real queries at 100,000 passages and far easier on a million
  overlapping ones (every passage has near-duplicates): calibrated to 0.98 they chose 4 times the
  breadth real queries need at 100k and too little at 1M (real 0.945). Pseudo-queries are a little
  harder than real ones at both sizes (0.01 to 0.05 at equal breadth): asked for the target itself they
  picked one or two steps of the finer ladder above what real queries need (FAISS 384 lists where 256 do
  at 100k, 512 where 384 do at 1M; LanceDB ef 192 where 128 does at 100k, 384 where 128 does at 1M), so
  they are asked for 0.01 less (docs/SCALING.md, "Index rules").

Queries like the user's calibrate best: ``isotrope calibrate STORE QUERIES`` (``Collection.calibrate``)
encodes them, takes their exact top 10 over the stored vectors, and sets the smallest breadth of the
:func:`finer` ladder reaching :data:`TARGET_RECALL` on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

EXACT_BELOW = 50_000
TARGET_RECALL = 0.95
CALIBRATION_MARGIN = 0.03
#: recall above the target asked of pseudo-queries cut from the stored chunks: 0.01 below it, as they are a little
#: harder than real sentence queries (0.01 to 0.05 less recall at equal breadth at 100k and 1M, both stores: at 0.94
#: every store measured picks a breadth where real queries reach 0.957 or more, at 0.93 FAISS at 1M 0.945;
#: docs/SCALING.md, "Index rules"). At 1M the harder ones are sentences cut from within a multi-sentence line of the
#: benchmark's sentence file, of which every real query is a whole line
PSEUDO_QUERY_MARGIN = -0.01
#: what a breadth was calibrated on (``calibrated_on`` in ``index_info()``)
STORED_VECTORS, PSEUDO_QUERIES, GIVEN_QUERIES = "stored vectors", "pseudo-queries", "queries"
CALIBRATION_QUERIES = 200
#: pseudo-queries an index is calibrated on at build: on a million passages 200 of them, drawn with five seeds,
#: picked FAISS nprobe 256 to 1024 and 192 to 512 on two builds; 1,000, drawn with three, picked 512, 512, 512 and
#: 384, 512, 384, and LanceDB ef 384 three times where 200 picked 768 (docs/SCALING.md, "Index rules"). Their exact
#: top 10 over a million rows and the breadths tried cost 40-50 s more than 200's in each store
INDEX_QUERIES = 1000
#: query x row scores an exact search computes at a time (8M: 64 MB in float64, 1,000 queries against 8,388 rows)
SCORE_BLOCK = 1 << 23
CALIBRATION_K = 10
#: how an auto FAISS IVF index stores its vectors: 8-bit scalar quantization, a quarter of float32's bytes scanned per probe
IVF_CODES = "SQ8"
#: rows from which an auto FAISS index takes 8 sqrt(n) lists instead of 4 sqrt(n) (see :func:`nlist_for`)
FINER_LISTS_FROM = 500_000
#: k-means work (sample points x lists x iterations) an IVF training may do: what 4,096 lists cost on their
#: 159,744 points at faiss's 10 iterations (88 s on a 2-core Intel Xeon)
KMEANS_WORK = 39 * 4096 * 4096 * 10
#: fewest and most k-means iterations an IVF training takes (the most: faiss's default for IVF)
KMEANS_ITERATIONS = (4, 10)
#: a calibration query is moved as far from its stored vector as that vector's this-th nearest neighbour
CALIBRATION_NEIGHBOUR = 10
NPROBE_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
EF_LADDER = (16, 32, 64, 128, 256, 512, 1024)
#: LanceDB IVF_HNSW_SQ: rows per partition (one HNSW graph each) and the graphs' build settings. At 1,083,961 rows,
#: 3 graphs against the 5 of 262,144 rows a graph, the same 200 real queries in one process: ef 384 0.9625 recall@10
#: at 8.96 ms against 0.964 at 12.47 ms, ef 256 0.941 at 7.69 against 0.951 at 10.66 (docs/SCALING.md); 2 graphs
#: (1,048,576 rows) raised the indexing peak to 4.29 GB
HNSW_PARTITION_ROWS = 524_288
HNSW_BUILD = {"m": 16, "ef_construction": 100}
#: an auto index is rebuilt by commit() once the store has grown this many times past its build size
REBUILD_GROWTH = 4


def outgrown(n: int, built_rows: int) -> bool:
    """Whether an auto index built at ``built_rows`` rows is due for a rebuild at ``n`` rows (every store
    follows the plan by this rule; 0 built rows: not known, never due by growth)."""
    return built_rows > 0 and n >= REBUILD_GROWTH * built_rows


def finer(ladder: Sequence[int]) -> tuple[int, ...]:
    """The ladder with 1.5 times each step between it and the next (8, 12, 16, 24, ...): calibrating on
    the user's own queries needs no margin, so the breadth can stop between two doublings."""
    return tuple(sorted({*ladder, *(3 * v // 2 for v in ladder[:-1] if v > 1)}))


def nlist_for(n: int) -> int:
    """IVF lists for n rows: 4 sqrt(n) rounded to a power of two (8 sqrt(n) from :data:`FINER_LISTS_FROM`
    rows), at most the power of two that leaves 39 training points per list (below about 24,000 rows), at
    least 64.

    Measured on the scale benchmark's passages, its 200 real queries, bare faiss on one thread (an Intel
    Xeon): at 1,083,961 rows 8,192 lists reach recall@10 0.951 at nprobe 256 in 3.3 ms where 4,096 need
    nprobe 384 and 7.9 ms (the build's calibration, its pseudo-queries harder than real queries, picks nprobe 512
    there: 0.9535 at 5.5 ms); at its first 108,000 rows 2,048 lists gain nothing over 1,024 (0.9595 at 1.36 ms
    against 0.954 at 1.42) and take four times as long to train (docs/SCALING.md, "Index rules").
    """
    n = max(n, 1)
    per_root = 8 if n >= FINER_LISTS_FROM else 4
    return max(64, min(2 ** round(math.log2(per_root * math.sqrt(n))), 2 ** math.floor(math.log2(max(n / 39, 1)))))


def kmeans_iterations(points: int, nlist: int) -> int:
    """k-means iterations for training ``nlist`` lists on ``points`` sample points: faiss's 10 while the
    work stays within :data:`KMEANS_WORK`, down to 4 beyond it. 8,192 lists on 200,000 points at 4
    iterations: recall@10 0.9505 against 0.954 at nprobe 256 on a million rows, trained in 93 against
    225 s (docs/SCALING.md, "Index rules")."""
    fewest, most = KMEANS_ITERATIONS
    return max(fewest, min(most, round(KMEANS_WORK / max(points * nlist, 1))))


def two_level_start(points: int, nlist: int) -> bool:
    """Whether k-means for ``nlist`` lists on ``points`` sample points starts from a two-level clustering
    (sqrt(nlist) clusters, each split in proportion to its points) instead of faiss's random sample rows:
    where :func:`kmeans_iterations` cuts the iterations below faiss's 10, too few to move far from a random
    start. 8,192 lists on 200,000 points at 4 iterations, on a million rows, real queries at nprobe 384:
    recall@10 0.958-0.9615 from two levels (three trainings) against 0.9485-0.9665 from random rows (three):
    as good on average, a fifth of the spread, trained in 98 against 93 s; at 10 iterations (1,024 lists at
    100,000 rows) the two starts are alike (docs/SCALING.md, "Index rules")."""
    return kmeans_iterations(points, nlist) < KMEANS_ITERATIONS[1]


def faiss_factory_for(n: int) -> str:
    """The FAISS index_factory string ``--index auto`` builds for n rows."""
    return "Flat" if n < EXACT_BELOW else f"IVF{nlist_for(n)},{IVF_CODES}"


def lancedb_ivf_pq_for(n: int, dim: int) -> dict[str, int]:
    """LanceDB IVF_PQ parameters for n rows of dimension dim: sqrt(n) partitions, dim / 8 sub-vectors."""
    sub = next(s for s in (dim // 8, dim // 4, dim // 2, dim, 1) if s >= 1 and dim % s == 0)
    return {"num_partitions": max(1, round(math.sqrt(n))), "num_sub_vectors": sub}


def lancedb_index_for(n: int, dim: int) -> dict[str, Any] | None:
    """The index ``--index auto`` builds for n rows (None: exact search): ``type`` (the store's index
    name) and the ``lancedb.index`` config's parameters."""
    if n < EXACT_BELOW:
        return None
    return {"type": "hnsw_sq", "num_partitions": math.ceil(n / HNSW_PARTITION_ROWS), **HNSW_BUILD}


def exact_neighbours(queries: np.ndarray, batches: Iterable[tuple[np.ndarray, np.ndarray]], k: int, metric: str) -> np.ndarray:
    """Keys of the exact top ``k`` per query over ``(keys, vectors)`` batches, scored in float64."""
    return exact_top(queries, batches, k, metric)[0]


def exact_top(
    queries: np.ndarray, batches: Iterable[tuple[np.ndarray, np.ndarray]], k: int, metric: str, dtype: type = np.float64
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and scores (computed in ``dtype``) of the exact top ``k`` per query over ``(keys, vectors)`` batches, best
    first; at most :data:`SCORE_BLOCK` query-row scores at a time."""
    from isotrope.stores.memory import exact_scores, top_k

    best_keys = np.full((len(queries), 0), -1, dtype=np.int64)
    best_scores = np.full((len(queries), 0), -np.inf)
    rows = np.arange(len(queries))[:, None]
    step = max(1, SCORE_BLOCK // max(len(queries), 1))
    for batch_keys, batch_vectors in batches:
        for start in range(0, len(batch_keys), step):
            keys, vectors = batch_keys[start : start + step], batch_vectors[start : start + step]
            scores = np.concatenate([best_scores, exact_scores(queries, vectors, metric, dtype)], axis=1)
            all_keys = np.concatenate([best_keys, np.broadcast_to(keys, (len(queries), len(keys)))], axis=1)
            chosen = top_k(scores, k)
            best_keys, best_scores = all_keys[rows, chosen], scores[rows, chosen]
    return best_keys, best_scores


def recall(found: Sequence[Sequence[int]] | np.ndarray, truth: np.ndarray) -> float:
    """Mean share of each truth row found in the matching row of ``found``."""
    shares = [len(set(map(int, f)) & set(map(int, t))) / max(len(t), 1) for f, t in zip(found, truth)]
    return float(np.mean(shares)) if shares else 1.0


def calibrate(
    ladder: Sequence[int],
    search: Callable[[int], Sequence[Sequence[int]] | np.ndarray],
    truth: np.ndarray,
    target: float = TARGET_RECALL + CALIBRATION_MARGIN,
) -> tuple[int, float]:
    """The smallest setting of ``ladder`` whose results reach ``target`` recall (else the largest), and its recall."""
    value, reached = ladder[-1], 0.0
    for setting in ladder:
        reached = recall(search(setting), truth)
        value = setting
        if reached >= target:
            break
    return value, reached


def calibration_set(
    keys: np.ndarray,
    vectors: np.ndarray,
    batches: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]],
    metric: str,
    neighbour: int = CALIBRATION_NEIGHBOUR,
) -> tuple[np.ndarray, np.ndarray]:
    """Calibration queries made from the stored ``vectors`` (with their ``keys``) and their exact top
    :data:`CALIBRATION_K` neighbours' keys, the source vector left out; ``batches()`` gives a fresh pass
    over every stored ``(keys, vectors)``.

    Each query is its vector moved by the distance to its ``neighbour``-th nearest other stored vector,
    in a random direction orthogonal to it, and scaled back to its length: as far from the store as a
    query that is not in it. Search results are compared after :func:`without_sources`.
    """
    vectors = np.asarray(vectors, dtype=np.float64)
    if metric == "cosine":
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    near = exact_top(vectors.astype(np.float32), batches(), neighbour + 1, metric, np.float32)  # a scale only
    other = np.array([[score for key, score in zip(*row) if key != source][neighbour - 1] for *row, source in zip(*near, keys)])
    lengths = np.linalg.norm(vectors, axis=1)
    squared = -other if metric == "l2" else 2 * lengths**2 - 2 * other  # |v - u|^2, taking |u| = |v| for ip
    distance = np.sqrt(np.maximum(squared, 0.0))
    direction = np.random.default_rng(2).standard_normal(vectors.shape)
    direction -= (direction * vectors).sum(axis=1, keepdims=True) / np.maximum(lengths**2, 1e-300)[:, None] * vectors
    direction /= np.maximum(np.linalg.norm(direction, axis=1, keepdims=True), 1e-300)
    moved = vectors + distance[:, None] * direction
    moved *= (lengths / np.maximum(np.linalg.norm(moved, axis=1), 1e-300))[:, None]
    queries = moved.astype(np.float32)
    truth = without_sources(exact_top(queries, batches(), CALIBRATION_K + 1, metric)[0], keys, CALIBRATION_K)
    return queries, truth


def calibration_queries(queries: Any, pseudo: Callable[[], np.ndarray | None] | None) -> tuple[Any, str]:
    """The queries a store calibrates on and what they are: ``queries`` given (the user's), else those
    ``pseudo()`` makes (a store's :attr:`~isotrope.stores.base.VectorStore.calibration_queries`: pseudo-queries
    cut from its chunks), else None: queries made from the stored vectors (a store without text)."""
    if queries is not None:
        return queries, GIVEN_QUERIES
    made = None if pseudo is None else pseudo()
    return (made, PSEUDO_QUERIES) if made is not None else (None, STORED_VECTORS)


def calibrate_breadth(
    ladder: Sequence[int],
    keys: np.ndarray,
    sample: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    batches: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]],
    search: Callable[[np.ndarray, int, int], Sequence[Sequence[int]] | np.ndarray],
    metric: str,
    target: float | None = None,
    queries: np.ndarray | None = None,
    source: str = GIVEN_QUERIES,
) -> tuple[int, float]:
    """The smallest search breadth of ``ladder`` reaching ``target`` recall@10 against exact search, and the
    recall it reaches: the procedure every store's ``calibrate`` follows, the store supplying its engine's calls.

    ``keys``: the key of every stored row; ``sample(chosen)``: the ``(keys, vectors)`` of the chosen keys;
    ``batches()``: a fresh pass over every stored ``(keys, vectors)``; ``search(queries, k, breadth)``: the
    keys the store finds for each query at that breadth, as its searches do.
    Without ``queries``: :data:`CALIBRATION_QUERIES` queries made from stored vectors (:func:`calibration_set`,
    seeded), the ladder as given, target :data:`TARGET_RECALL` plus :data:`CALIBRATION_MARGIN`. With
    ``queries`` (vectors of queries like the user's): the recall on them, the :func:`finer` ladder, target
    :data:`TARGET_RECALL`, plus :data:`PSEUDO_QUERY_MARGIN` where ``source`` is :data:`PSEUDO_QUERIES`.
    """
    k = CALIBRATION_K
    if queries is None:
        chosen = np.sort(np.random.default_rng(1).choice(keys, min(CALIBRATION_QUERIES, len(keys)), replace=False))
        sources, stored = sample(chosen)
        q, truth = calibration_set(sources, stored, batches, metric)
        goal = TARGET_RECALL + CALIBRATION_MARGIN if target is None else target
        return calibrate(ladder, lambda value: without_sources(search(q, k + 1, value), sources, k), truth, goal)
    truth = exact_neighbours(queries, batches(), k, metric)
    margin = PSEUDO_QUERY_MARGIN if source == PSEUDO_QUERIES else 0.0
    goal = TARGET_RECALL + margin if target is None else target
    return calibrate(finer(ladder), lambda value: search(queries, k, value), truth, goal)


def without_sources(found: Sequence[Sequence[int]] | np.ndarray, sources: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` keys of each row of ``found`` other than that row's source key (-1 pads a short row)."""
    rows = np.full((len(found), k), -1, dtype=np.int64)
    for i, (keys, source) in enumerate(zip(found, sources)):
        kept = [int(key) for key in keys if key != source][:k]
        rows[i, : len(kept)] = kept
    return rows
