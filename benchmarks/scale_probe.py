"""What a single query costs in a large FAISS store, part by part (issue 22): the hit rows read through
SQLite's default 256 MB map against the read connection's full map, and recall@10 / latency of
IVF-Flat and IVF-SQ8 over a ladder of probed lists, one and two threads, on the store's own vectors.

Queries are the scale benchmark's held-out sentences (``benchmarks.scale.query_texts``), encoded with
the store's encoder; recall is against exact float32 search over every stored vector.

    python -m benchmarks.scale_probe --store STORE_DIR --data-dir ../shared/data --out FILE.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import print_and_write
from benchmarks.scale import K, query_texts, read_sentences, recall_at_10, stored_vectors


def p50_ms(call: Callable[[int], Any], count: int) -> float:
    for i in range(3):
        call(i)
    times = []
    for i in range(count):
        tick = time.perf_counter()
        call(i)
        times.append(time.perf_counter() - tick)
    return round(1000 * float(np.median(times)), 3)


def main() -> None:
    import faiss

    from isotrope.connectors.faiss_store import FaissStore
    from isotrope.connectors.sqlite_rows import _MMAP_BYTES, _READ_MMAP_BYTES
    from isotrope.search import Collection

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a FaissStore folder written by benchmarks.scale --keep")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--nprobe", default="256,384,512", help="lists probed, comma-separated")
    args = parser.parse_args()
    texts = query_texts(read_sentences(args.data_dir), args.queries)
    with Collection.open(f"faiss:{args.store}") as collection:
        queries = collection.encoder.encode(texts, kind="query").astype(np.float32)
    store = FaissStore(args.store)
    key_array, vectors = stored_vectors(store)
    exact = faiss.IndexFlatIP(store.dim)
    exact.add(vectors)
    truth = key_array[exact.search(queries, K)[1]]
    del exact
    result: dict[str, Any] = {"chunks": len(store), "queries": len(queries), "index": store.index_info()}

    rng = np.random.default_rng(0)
    samples = [np.sort(rng.choice(key_array, K, replace=False)).tolist() for _ in range(len(queries))]
    for name, size in (("default_map", _MMAP_BYTES), ("read_map", _READ_MMAP_BYTES)):
        store._conn.execute(f"PRAGMA mmap_size={size}")
        cold = [samples[i] for i in rng.permutation(len(samples))]
        result[f"hit_rows_{K}_p50_ms_{name}"] = p50_ms(lambda i, cold=cold: store._rows(cold[i % len(cold)]), len(cold))

    # both over the lists (the trained coarse quantizer) of the store's IVF index
    quantizer = faiss.extract_index_ivf(store._index).quantizer
    flat = faiss.IndexIVFFlat(quantizer, store.dim, quantizer.ntotal, faiss.METRIC_INNER_PRODUCT)
    sq8 = faiss.IndexIVFScalarQuantizer(
        quantizer, store.dim, quantizer.ntotal, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
    )
    sq8.train(vectors[np.sort(rng.choice(len(vectors), min(len(vectors), 200_000), replace=False))])
    for index in (flat, sq8):
        index.add(vectors)
    del vectors
    for label, index in (("ivf_flat", flat), ("ivf_sq8", sq8)):
        for nprobe in map(int, args.nprobe.split(",")):
            params = faiss.SearchParametersIVF(nprobe=nprobe)
            found = key_array[index.search(queries, K, params=params)[1]].tolist()
            row: dict[str, Any] = {"recall_at_10": recall_at_10(found, truth)}
            for threads, mode in ((1, 0), (2, 1)):  # two threads: one query's lists split between them
                faiss.omp_set_num_threads(threads)
                index.parallel_mode = mode
                row[f"p50_ms_{threads}_threads"] = p50_ms(
                    lambda i, index=index, params=params: index.search(queries[i % len(queries)][None], K, params=params), 100
                )
            result[f"{label}_nprobe_{nprobe}"] = row
            print(label, nprobe, row, flush=True)
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
