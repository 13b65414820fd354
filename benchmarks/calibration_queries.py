"""Issue 22: are the stores' calibration queries as hard as real ones? IVF recall@10 against exact search
at each nprobe, for real held-out sentence queries and for calibration queries made from the stored vectors
(index_plan.calibration_set: a stored vector moved by its distance to its n-th nearest other stored vector,
source left out, for several n), next
to the midpoints of two stored vectors used before.

    python -m benchmarks.calibration_queries --store STORE_DIR --data-dir ../shared/data \\
        --out benchmarks/results/calibration-queries-100k.json

STORE_DIR is a FAISS store written by the scale benchmark (``--keep``); the queries are its held-out
sentences encoded with the store's encoder; the IVF index (``--nlist``, default index_plan's rule) is
trained here on the store's vectors.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import time
from pathlib import Path

import numpy as np

from benchmarks.common import machine_info, set_threads
from benchmarks.scale import K, query_texts, read_sentences

NPROBES = (4, 8, 16, 32, 64, 128, 256, 512)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nlist", type=int, help="IVF lists (default: index_plan.nlist_for(n))")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--neighbours",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[1, 3, 10],
        help="ranks of the neighbour whose distance moves a calibration query (index_plan.calibration_set)",
    )
    args = parser.parse_args()
    set_threads(args.threads)
    import faiss

    from isotrope.encoder import ShapedEncoder
    from isotrope.stores import index_plan

    rows = sqlite3.connect(args.store / "store.sqlite").execute("SELECT vector FROM items ORDER BY key").fetchall()
    vectors = np.frombuffer(b"".join(r[0] for r in rows), dtype=np.float32).reshape(len(rows), -1).copy()
    del rows
    n, dim = vectors.shape
    keys = np.arange(n, dtype=np.int64)
    encoder = ShapedEncoder.load(args.store / "encoder")
    real = encoder.encode(query_texts(read_sentences(args.data_dir), args.queries), kind="query").astype(np.float32)
    rng = np.random.default_rng(1)
    chosen = np.sort(rng.choice(n, args.queries, replace=False))
    batches = lambda: ((keys[s : s + 65_536], vectors[s : s + 65_536]) for s in range(0, n, 65_536))  # noqa: E731
    moved = {rank: index_plan.calibration_set(chosen, vectors[chosen], batches, "ip", neighbour=rank) for rank in args.neighbours}
    pairs = rng.choice(n, 2 * args.queries, replace=False)
    midpoints = ((vectors[pairs[: args.queries]] + vectors[pairs[args.queries :]]) / 2).astype(np.float32)
    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    sets = {
        "real held-out sentences": (real, exact.search(real, K)[1], None),
        **{
            f"stored vectors moved by the distance to their neighbour {rank}, source left out": (*moved[rank], chosen)
            for rank in args.neighbours
        },
        "midpoints of two stored vectors (before)": (midpoints, exact.search(midpoints, K)[1], None),
    }
    nlist = args.nlist or index_plan.nlist_for(n)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
    tick = time.perf_counter()
    ivf.train(vectors[np.sort(rng.choice(n, min(n, 39 * nlist), replace=False))])
    ivf.add(vectors)
    build_s = time.perf_counter() - tick
    result = {"store": args.store.name, "n": n, "nlist": nlist, "build_s": build_s, "machine": machine_info(args.threads)}
    for name, (queries, truth, sources) in sets.items():
        recalls = {}
        for nprobe in (p for p in NPROBES if p <= nlist):
            found = ivf.search(queries, K + 1, params=faiss.SearchParametersIVF(nprobe=nprobe))[1]
            found = index_plan.without_sources(found, sources, K) if sources is not None else found[:, :K]
            recalls[nprobe] = index_plan.recall(found, truth)
        result[name] = {"recall_at_10_by_nprobe": recalls}
        print(f"{name[:60]:60s}", " ".join(f"{p}:{r:.3f}" for p, r in recalls.items()))
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
