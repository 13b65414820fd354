"""Which vector index fits a store of n rows, and the search breadth that reaches the target recall.

The rules (``--index auto``, the default):

- below :data:`EXACT_BELOW` rows, exact search (FAISS ``Flat``; LanceDB without an ANN index):
  a brute-force query over 50,000 x 384 float32 costs about 2 ms on one core;
- from there on, FAISS ``IVF{nlist},Flat`` with ``nlist`` = sqrt(n) rounded to a power of two
  (at least 64). faiss's usual advice is 4 to 16 sqrt(n); sqrt(n) keeps the k-means training
  (39 sample points per list) to seconds on two cores at a million rows, and the breadth is
  then calibrated, so recall does not depend on it. LanceDB builds ``IVF_PQ`` with
  ``num_partitions`` = sqrt(n) and ``num_sub_vectors`` = dim / 8 (refined with the exact vectors);
- the search breadth (FAISS ``nprobe`` / HNSW ``efSearch``, LanceDB ``nprobes``) is the smallest
  of a doubling ladder whose recall@10 against exact search, over :data:`CALIBRATION_QUERIES`
  queries made from the stored vectors, is at least :data:`TARGET_RECALL` plus
  :data:`CALIBRATION_MARGIN`. A query is the midpoint of two random stored vectors
  (:func:`calibration_queries`): a stored vector itself is too easy a query (an HNSW node is
  linked to its neighbours; an IVF point sits in its own list), a midpoint is not in the index.
  It is measured when the index is built and saved with it; ``--nprobe`` / ``--ef`` override it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

EXACT_BELOW = 50_000
TARGET_RECALL = 0.95
CALIBRATION_MARGIN = 0.03
CALIBRATION_QUERIES = 200
CALIBRATION_K = 10
NPROBE_LADDER = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
EF_LADDER = (16, 32, 64, 128, 256, 512, 1024)
#: an auto index is rebuilt by commit() once the store has grown this many times past its build size
REBUILD_GROWTH = 4


def nlist_for(n: int) -> int:
    """IVF lists for n rows: sqrt(n) rounded to a power of two, at least 64."""
    return max(64, 2 ** round(math.log2(math.sqrt(max(n, 1)))))


def faiss_factory_for(n: int) -> str:
    """The FAISS index_factory string ``--index auto`` builds for n rows."""
    return "Flat" if n < EXACT_BELOW else f"IVF{nlist_for(n)},Flat"


def lancedb_index_for(n: int, dim: int) -> dict[str, int] | None:
    """The IVF_PQ parameters ``--index auto`` builds for n rows of dimension dim (None: exact search)."""
    if n < EXACT_BELOW:
        return None
    sub = next(s for s in (dim // 8, dim // 4, dim // 2, dim, 1) if s >= 1 and dim % s == 0)
    return {"num_partitions": max(1, round(math.sqrt(n))), "num_sub_vectors": sub}


def exact_neighbours(queries: np.ndarray, batches: Iterable[tuple[np.ndarray, np.ndarray]], k: int, metric: str) -> np.ndarray:
    """Keys of the exact top ``k`` per query over ``(keys, vectors)`` batches, scored in float64."""
    from isotrope.stores.memory import exact_scores, top_k

    best_keys = np.full((len(queries), 0), -1, dtype=np.int64)
    best_scores = np.full((len(queries), 0), -np.inf)
    for keys, vectors in batches:
        scores = np.concatenate([best_scores, exact_scores(queries, vectors, metric)], axis=1)
        all_keys = np.concatenate([best_keys, np.broadcast_to(keys, (len(queries), len(keys)))], axis=1)
        chosen = top_k(scores, k)
        rows = np.arange(len(queries))[:, None]
        best_keys, best_scores = all_keys[rows, chosen], scores[rows, chosen]
    return best_keys


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


def calibration_queries(vectors: np.ndarray) -> np.ndarray:
    """Midpoints of consecutive pairs of ``vectors`` (2m stored vectors give m queries)."""
    half = len(vectors) // 2
    return ((vectors[:half] + vectors[half : 2 * half]) / 2).astype(np.float32)
