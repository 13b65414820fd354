"""Hybrid query latency against dense at N chunks, and the lexical index's share of the store writes (issue 17).

Synthetic chunks: 40-120 words drawn by Zipf frequency from wordfreq's 30,000 most frequent English
words (realistic term statistics), random unit 384-d vectors (what MiniLM writes; a flat index's cost
does not depend on their content). Each store is written twice in 4,096-chunk commits, once as
shipped and once with the analyzer returning no terms (no lexical rows): the difference is what the
lexical index costs. Queries: 5-10 words of the same distribution, one at a time, k = 10.

    python -m benchmarks.hybrid_latency [--chunks 100000] [--queries 200] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

import isotrope.connectors.faiss_store as faiss_module
import isotrope.connectors.lancedb_store as lance_module
from benchmarks.common import print_and_write
from isotrope.fusion import search_store
from isotrope.lexical import index_text

DIM = 384
BATCH = 4096


def make_texts(n: int, low: int, high: int, seed: int) -> list[str]:
    from wordfreq import top_n_list, word_frequency

    words = top_n_list("en", 30_000)
    p = np.array([word_frequency(w, "en") for w in words])
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=n)
    drawn = rng.choice(len(words), size=int(lengths.sum()), p=p / p.sum())
    out, start = [], 0
    for length in lengths:
        out.append(" ".join(words[j] for j in drawn[start : start + length]))
        start += length
    return out


def open_store(kind: str, path: Path):
    if kind == "faiss":
        return faiss_module.FaissStore(path, dim=DIM, metric="cosine")
    return lance_module.LanceDBStore(path, dim=DIM, metric="cosine")


@contextmanager
def without_terms():
    """The stores as if they had no lexical index: the analyzer yields no terms."""
    saved = faiss_module.index_text, lance_module.index_text
    faiss_module.index_text = lance_module.index_text = lambda text: ""
    try:
        yield
    finally:
        faiss_module.index_text, lance_module.index_text = saved


def write(kind: str, path: Path, texts: list[str], vectors: np.ndarray):
    tick = time.perf_counter()
    store = open_store(kind, path)
    for start in range(0, len(texts), BATCH):
        part = slice(start, start + BATCH)
        store.add([f"c{i}" for i in range(start, start + len(texts[part]))], vectors[part], texts[part])
        store.commit()
    return store, time.perf_counter() - tick


def p50_ms(function, queries) -> float:
    times = []
    for query in queries:
        tick = time.perf_counter()
        function(query)
        times.append(time.perf_counter() - tick)
    return round(1000 * float(np.median(times)), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    texts = make_texts(args.chunks, 40, 120, seed=0)
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((args.chunks, DIM)).astype(np.float32)
    query_texts = make_texts(args.queries, 5, 10, seed=2)
    query_vectors = rng.standard_normal((args.queries, DIM)).astype(np.float32)
    tick = time.perf_counter()
    for text in texts:
        index_text(text)
    result: dict = {"chunks": args.chunks, "queries": args.queries, "analysis seconds": round(time.perf_counter() - tick, 1)}
    for kind in ("faiss", "lancedb"):
        with tempfile.TemporaryDirectory() as folder:
            with without_terms():
                plain, plain_seconds = write(kind, Path(folder) / "plain", texts, vectors)
                plain.close()
            store, seconds = write(kind, Path(folder) / "store", texts, vectors)
            pairs = list(zip(query_texts, query_vectors))
            result[kind] = {
                "write seconds, no lexical index": round(plain_seconds, 1),
                "write seconds": round(seconds, 1),
                "lexical share of the writes": round((seconds - plain_seconds) / seconds, 3),
                "dense p50 ms": p50_ms(lambda q, store=store: store.search(q[1][None], 10), pairs),
                "lexical p50 ms": p50_ms(lambda q, store=store: store.lexical_search([q[0]], 10), pairs),
                "hybrid p50 ms": p50_ms(lambda q, store=store: search_store(store, [q[0]], q[1][None], 10, mode="hybrid"), pairs),
            }
            result[kind]["hybrid / dense"] = round(result[kind]["hybrid p50 ms"] / result[kind]["dense p50 ms"], 2)
            store.close()
        print(json.dumps({kind: result[kind]}), flush=True)
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
