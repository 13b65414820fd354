"""Item 5: search throughput, latency and recall@10 of the stores vs calling faiss / lancedb directly.

Synthetic unit vectors of dimension 384 drawn around random cluster centres (so that
approximate indexes have structure to find); queries are fresh draws from the same
mixture. The exact top 10 (by inner product, with ``faiss.IndexFlatIP``) is the reference
for recall@10.

Our overhead is measured on the *same* index: the bare side reads the FAISS index file the
store committed (``faiss.read_index``) or opens the store's Lance table with ``lancedb``,
and searches it with the same parameters (nprobe / efSearch / nprobes / refine_factor).
The store returns :class:`~isotrope.stores.base.Hit` objects (string id, score, text,
metadata); the bare library returns arrays (faiss) or an Arrow table (lancedb).
"""

from __future__ import annotations

import gc
import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import alternate

logger = logging.getLogger(__name__)

DIM = 384
K = 10
CLUSTERS = 1000
ADD_BATCH = 50_000
SIZES = {
    "quick": {"faiss": (100_000,), "lancedb": (20_000,), "queries": 200, "single": 20},
    "full": {"faiss": (100_000, 1_000_000), "lancedb": (100_000, 1_000_000), "queries": 1000, "single": 200},
}
NPROBE = 16  # FaissStore's default
EF_SEARCH = 128  # FaissStore's default
LANCE_NPROBES = 20  # LanceDBStore's default
LANCE_REFINE = 10  # LanceDBStore's default


def faiss_factories(n: int) -> dict[str, str]:
    """Flat, IVF with about sqrt(n) lists (a power of two), HNSW with 32 links."""
    nlist = 2 ** round(math.log2(math.sqrt(n)))
    return {"flat": "Flat", "ivf": f"IVF{nlist},Flat", "hnsw": "HNSW32"}


# -- data ---------------------------------------------------------------------------
class Mixture:
    """Unit vectors around ``CLUSTERS`` random centres, drawn in blocks (never all at once)."""

    def __init__(self, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.centres = rng.standard_normal((CLUSTERS, DIM), dtype=np.float32)
        self.seed = seed

    def draw(self, n: int, stream: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, stream])
        vectors = self.centres[rng.integers(0, CLUSTERS, n)] + rng.standard_normal((n, DIM), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors

    def blocks(self, n: int, block: int = ADD_BATCH) -> Any:
        """``(start, vectors)`` blocks covering rows 0..n-1 of the database."""
        for index, start in enumerate(range(0, n, block)):
            yield start, self.draw(min(block, n - start), stream=1000 + index)


def exact_top_k(mixture: Mixture, n: int, queries: np.ndarray) -> np.ndarray:
    """Indices of the exact top ``K`` database rows per query (inner product)."""
    import faiss

    index = faiss.IndexFlatIP(DIM)
    for _, vectors in mixture.blocks(n):
        index.add(vectors)
    return index.search(queries, K)[1]


def recall_at_k(found: list[np.ndarray] | np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(map(int, row)) & set(map(int, exact))) / K for row, exact in zip(found, truth)]))


def _ids(start: int, count: int) -> list[str]:
    return [str(i) for i in range(start, start + count)]


# -- one comparison -----------------------------------------------------------------
def compare_search(
    ours: Callable[[np.ndarray], Any], bare: Callable[[np.ndarray], Any], queries: np.ndarray, single: int, repeat: int
) -> dict[str, Any]:
    """Batch throughput and single-query latency of both sides, and our overhead in %."""
    batch = alternate({"isotrope": lambda: ours(queries), "bare": lambda: bare(queries)}, repeat)
    one = queries[:single]
    latency = alternate(
        {
            "isotrope": lambda: [ours(one[i : i + 1]) for i in range(single)],
            "bare": lambda: [bare(one[i : i + 1]) for i in range(single)],
        },
        repeat,
    )
    result = {"batch": {}, "single": {}}
    for side in ("isotrope", "bare"):
        result["batch"][side] = {**batch[side], "queries_per_s": len(queries) / batch[side]["median_s"]}
        result["single"][side] = {**latency[side], "latency_ms": 1000 * latency[side]["median_s"] / single}
    for mode in ("batch", "single"):
        ours, bare_side = result[mode]["isotrope"]["median_s"], result[mode]["bare"]["median_s"]
        result[mode]["overhead_pct"] = 100.0 * (ours / bare_side - 1)
    return result


def bench_faiss(
    mixture: Mixture, n: int, queries: np.ndarray, truth: np.ndarray, single: int, repeat: int, workdir: Path, gpu: bool = False
) -> dict[str, Any]:
    """FaissStore vs the bare faiss index it committed, for each index type (flat and IVF only on a GPU)."""
    import faiss

    from isotrope.connectors.faiss_store import FaissStore

    results = {}
    for name, factory in faiss_factories(n).items():
        if gpu and name == "hnsw":  # faiss has no GPU HNSW
            continue
        path = workdir / f"faiss-{name}-{n}"
        store = FaissStore(path, dim=DIM, index=factory, metric="ip", nprobe=NPROBE, ef=EF_SEARCH, use_gpu=gpu)
        start = time.perf_counter()
        for begin, vectors in mixture.blocks(n):
            store.add(_ids(begin, len(vectors)), vectors)
        store.commit()
        build_s = time.perf_counter() - start
        bare_index = faiss.read_index(str(path / "index.faiss"))
        params = {
            "flat": None,
            "ivf": faiss.SearchParametersIVF(nprobe=NPROBE),
            "hnsw": faiss.SearchParametersHNSW(efSearch=EF_SEARCH),
        }[name]
        if gpu:
            bare_index, params = faiss.index_cpu_to_all_gpus(bare_index), None
            if name == "ivf":
                faiss.GpuParameterSpace().set_index_parameter(bare_index, "nprobe", NPROBE)

        def ours(q: np.ndarray, store: FaissStore = store) -> list:
            return store.search(q, K)

        def bare(q: np.ndarray, bare_index: Any = bare_index, params: Any = params) -> tuple:
            return bare_index.search(q, K, params=params)

        found = [[int(hit.id) for hit in hits] for hits in ours(queries)]
        bare_keys = bare(queries)[1]  # faiss keys are SQLite row keys (1-based, in insertion order)
        results[name] = {
            "factory": factory,
            "build_s": build_s,
            "recall@10": recall_at_k(found, truth),
            "recall@10_bare": recall_at_k(bare_keys - 1, truth),
            **compare_search(ours, bare, queries, single, repeat),
        }
        logger.info("search faiss %s n=%d: overhead %.1f%%", name, n, results[name]["batch"]["overhead_pct"])
        store.close()
        del store, bare_index, ours, bare
        gc.collect()
        shutil.rmtree(path, ignore_errors=True)
    return results


def bench_lancedb(
    mixture: Mixture, n: int, queries: np.ndarray, truth: np.ndarray, single: int, repeat: int, workdir: Path
) -> dict[str, Any]:
    import lancedb

    from isotrope.connectors.lancedb_store import LanceDBStore

    path = workdir / f"lancedb-{n}"
    store = LanceDBStore(path, dim=DIM, metric="ip", index="flat", nprobe=LANCE_NPROBES, refine=LANCE_REFINE)
    start = time.perf_counter()
    for begin, vectors in mixture.blocks(n):
        store.add(_ids(begin, len(vectors)), vectors)
    build_s = time.perf_counter() - start
    table = lancedb.connect(path).open_table(store.table_name)
    results = {}
    for name in ("flat", "ivf_pq"):
        if name == "ivf_pq":
            start = time.perf_counter()
            store.create_index()
            build_s += time.perf_counter() - start
            table.checkout_latest()

        def ours(q: np.ndarray) -> list:
            return store.search(q, K)

        def bare(q: np.ndarray, indexed: bool = name != "flat") -> Any:
            query = (
                table.search(q[0] if len(q) == 1 else list(q), vector_column_name="vector")
                .distance_type("dot")
                .limit(K)
                .select(["id", "text", "metadata", "_distance"])
            )
            if indexed:
                query = query.nprobes(LANCE_NPROBES).refine_factor(LANCE_REFINE)
            return query.to_arrow()

        found = [[int(hit.id) for hit in hits] for hits in ours(queries)]
        results[name] = {
            "build_s": build_s,
            "recall@10": recall_at_k(found, truth),
            **compare_search(ours, bare, queries, single, repeat),
        }
        logger.info("search lancedb %s n=%d: overhead %.1f%%", name, n, results[name]["batch"]["overhead_pct"])
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return results


def run(*, quick: bool, repeat: int, workdir: str | Path | None = None, gpu: bool = False) -> dict[str, Any]:
    """Every store and index type at every size: queries/s, latency, recall@10 and our overhead.

    ``gpu``: FAISS only (flat and IVF), the store and the bare index both on all GPUs.
    """
    sizes = SIZES["quick" if quick else "full"]
    mixture = Mixture()
    queries = mixture.draw(sizes["queries"], stream=1)
    results: dict[str, Any] = {
        "dim": DIM,
        "k": K,
        "queries": len(queries),
        "single_queries": sizes["single"],
        "repeat": repeat,
        "faiss": {},
        "lancedb": {},
        "settings": {
            "nprobe": NPROBE,
            "efSearch": EF_SEARCH,
            "lancedb_nprobes": LANCE_NPROBES,
            "lancedb_refine_factor": LANCE_REFINE,
        },
    }
    with tempfile.TemporaryDirectory(prefix="isotrope-search-", dir=workdir) as tmp:
        for n in sorted(set(sizes["faiss"]) | (set() if gpu else set(sizes["lancedb"]))):
            truth = exact_top_k(mixture, n, queries)
            setup = (mixture, n, queries, truth, sizes["single"], repeat, Path(tmp))
            if n in sizes["faiss"]:
                results["faiss"][str(n)] = bench_faiss(*setup, gpu=gpu)
            if n in sizes["lancedb"] and not gpu:
                results["lancedb"][str(n)] = bench_lancedb(*setup)
    return results
