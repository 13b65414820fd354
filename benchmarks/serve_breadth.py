"""In process, what one store search costs behind ``isotrope serve``: recall@10 and time per query
at several search breadths, and 8 queries searched as one batch against one by one.

    python -m benchmarks.serve_breadth --data-dir ../shared/data --store faiss:/tmp/serve-bench/static-hnsw \
        --breadth 64,128,256,1024
    python -m benchmarks.serve_breadth --data-dir ../shared/data --store lancedb:/tmp/serve-bench/static

Queries are held-out sentences (after the stored ``--chunks``), encoded by the store's encoder;
the truth is the exact top 10 in float64 NumPy over every stored vector. ``--breadth`` sets
``nprobe`` (IVF) or ``ef`` (HNSW) of a FAISS store; without it the store's own setting.
One thread (BLAS, OpenMP, torch), as ``isotrope serve`` runs.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.common import cpu_model, git_commit, print_and_write, set_threads, store_label
from benchmarks.serve import read_sentences


def best_of(repeats: int, function) -> float:
    """The fastest of ``repeats`` calls, in milliseconds (the least disturbed by other processes)."""
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        function()
        times.append(time.perf_counter() - tick)
    return min(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--chunks", type=int, default=100_000, help="stored sentences; the queries come after them")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--breadth", default="", help="comma-separated nprobe / efSearch values (FAISS stores)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_threads(1)

    from isotrope.search import Collection
    from isotrope.stores.memory import exact_scores, top_k

    queries = read_sentences(args.data_dir, args.chunks + args.queries)[args.chunks :]
    with Collection.open(args.store) as collection:
        store = collection.store
        ids = store.ids()
        truth = top_k(
            exact_scores(
                np.asarray(collection.encoder.encode(queries, kind="query"), dtype=np.float64),
                np.asarray(store.vectors(ids), dtype=np.float64),
                store.metric,
            ),
            10,
        )
        truth_ids = [{ids[j] for j in row} for row in truth]
        vectors = collection.encoder.encode(queries, kind="query")
        setting = "ef" if "ef" in store.index_info() else "nprobe"
        rows = []
        for breadth in [int(b) for b in args.breadth.split(",") if b] or [None]:
            if breadth is not None:
                setattr(store, setting, breadth)
            tick = time.perf_counter()
            hits = store.search(vectors, 10)
            per_query = (time.perf_counter() - tick) / len(queries) * 1000
            recall = float(np.mean([len({h.id for h in found} & expected) / 10 for found, expected in zip(hits, truth_ids)]))
            batch = best_of(3, lambda: store.search(vectors[:8], 10))
            singles = best_of(3, lambda: [store.search(vectors[i : i + 1], 10) for i in range(8)])
            rows.append(
                {
                    "breadth": breadth,
                    "index": store.index_info(),
                    "recall@10": round(recall, 4),
                    "ms_per_query_in_a_batch_of_all": round(per_query, 2),
                    "ms_8_as_one_batch": round(batch, 2),
                    "ms_8_one_by_one": round(singles, 2),
                }
            )
    print_and_write(
        {
            "store": store_label(args.store),
            "queries": len(queries),
            "rows": rows,
            "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "load_average": list(os.getloadavg())},
            "commit": git_commit(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
