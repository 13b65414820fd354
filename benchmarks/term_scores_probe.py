"""What the FAISS store's kept term scores cost and save (``isotrope.connectors.fts5_terms``): the same
queries through ``FaissStore.lexical_search`` twice on a fresh handle (the cache fills during the first
pass), then FTS5 ranking them itself; p50 / p90 per pass, k = 200 (a hybrid leg), ids and scores only.

Queries: one a line from ``--queries``, else 200 synthetic ones as ``benchmarks.hybrid_latency`` draws them.

    python -m benchmarks.term_scores_probe --store FAISS_STORE [--queries FILE] [--out F.json]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.common import print_and_write
from isotrope.lexical import fts5_match, query_terms

K = 200


def timed_ms(function: Callable[[str], object], queries: list[str]) -> dict[str, float]:
    times = []
    for query in queries:
        tick = time.perf_counter()
        function(query)
        times.append(1000 * (time.perf_counter() - tick))
    return {"p50 ms": round(float(np.median(times)), 2), "p90 ms": round(float(np.percentile(times, 90)), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a FaissStore folder with its lexical index")
    parser.add_argument("--queries", type=Path, help="one query a line (default: 200 synthetic ones)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from benchmarks.hybrid_latency import make_texts
    from isotrope.connectors.faiss_store import FaissStore

    queries = args.queries.read_text().splitlines() if args.queries else make_texts(200, 5, 10, seed=2)
    store = FaissStore(args.store)

    def cached(query: str) -> object:
        return store.lexical_search([query], K, with_text=False)

    def fts5(query: str) -> object:
        terms = query_terms(query)
        sql = "SELECT rowid, -bm25(items_fts) FROM items_fts WHERE items_fts MATCH ? ORDER BY rank, rowid LIMIT ?"
        return store._db.execute(sql, [fts5_match(terms), K]).fetchall() if terms else []

    first, second = timed_ms(cached, queries), timed_ms(cached, queries)
    kept = store._term_scores
    result = {
        "store": args.store.name,
        "rows": len(store),
        "queries": len(queries),
        "first pass": first,
        "second pass": second,
        "FTS5 ranking the same queries": timed_ms(fts5, queries),
        "terms kept": len(kept._kept),
        "rows kept": kept._rows,
        "MB kept": round(kept._rows * 16 / 1e6, 1),
        "rare terms": len(kept._rare),
        "terms left to FTS5": len(kept._left_out),
    }
    store.close()
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
