"""recall@10 and encode-included single-query p50 of ``Collection.search`` on a store kept by the scale
benchmark, with the search settings the store has saved (e.g. after ``isotrope calibrate``), issue 22.

The queries are the scale benchmark's held-out sentences (``benchmarks.scale.query_texts``: disjoint from
a calibration file made with another seed); recall is against exact float32 search over every stored vector.

    python -m benchmarks.scale_recall faiss:STORE_DIR --data-dir ../shared/data --out FILE.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import print_and_write
from benchmarks.scale import K, query_texts, read_sentences


def main() -> None:
    import faiss

    from isotrope.search import Collection

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="faiss:DIR or lancedb:DIR")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--single", type=int, default=100, help="single queries timed")
    args = parser.parse_args()
    texts = query_texts(read_sentences(args.data_dir), args.queries)
    with Collection.open(args.store) as collection:
        store = collection.store
        queries = collection.encoder.encode(texts, kind="query").astype(np.float32)
        ids: list[str] = []
        exact = faiss.IndexFlatIP(store.dim)
        for batch_ids, vectors in store.iter_vectors(65_536):
            ids.extend(batch_ids)
            exact.add(vectors)
        truth = [{ids[j] for j in row} for row in exact.search(queries, K)[1]]
        del exact
        found = collection.search(texts, k=K)
        recall = float(np.mean([len({hit.id for hit in hits} & row) / K for hits, row in zip(found, truth)]))
        collection.search(texts[0], k=K)
        times = []
        for text in texts[: args.single]:
            tick = time.perf_counter()
            collection.search(text, k=K)
            times.append(time.perf_counter() - tick)
        result = {
            "store": args.store.split(":")[0],
            "chunks": len(store),
            "index": store.index_info(),
            "recall_at_10": recall,
            "p50_ms_single_with_encode": 1000 * float(np.median(times)),
        }
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
