"""Hybrid query latency against dense at N chunks, and the lexical index's share of ingestion (issue 17).

Synthetic chunks: 40-120 words drawn by Zipf frequency from wordfreq's 30,000 most frequent English
words (realistic term statistics), random unit 384-d vectors (what MiniLM writes; a flat index's cost
does not depend on their content). Each store is written twice in 4,096-chunk commits, once as
shipped and once with the analyzer returning no terms (no lexical rows): the difference is what the
lexical index costs. Ingestion = embedding + store writes; embedding is timed with the cheapest
encoder (``static:all-MiniLM-L6-v2``, on every chunk) and with all-MiniLM-L6-v2 (on ``--minilm-sample``
chunks, scaled to N). Queries: 5-10 words of the same distribution, one at a time, k = 10.

Peers on the same data in the same run: LanceDB's own hybrid query (``table.search(query_type="hybrid")``
over the store's table and its full-text index, with its default ``RRFReranker`` and with
``LinearCombinationReranker``), and LlamaIndex's ``QueryFusionRetriever`` (``relative_score``: min-max
scores weighted 0.3 / 0.7, as isotrope's default) over ``BM25Retriever`` (llama-index-retrievers-bm25,
bm25s in memory) and a vector retriever on the same store, ``DEFAULT_CANDIDATES`` each side, as isotrope fuses.
``--queries-only``: isotrope's query rows only, with the hybrid query's parts (its two legs at the candidate
depth, its two completion lookups and the final hits' text) timed alone. ``--warmup N``: N other queries of
the same distribution searched (hybrid) before the timed rows, as a serving process has.

    python -m benchmarks.hybrid_latency [--chunks 100000] [--queries 200] [--queries-only] [--warmup N] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest.mock import patch

import numpy as np

import isotrope.connectors.faiss_store as faiss_module
import isotrope.connectors.lance_lexical as lance_lexical_module
import isotrope.connectors.lancedb_store as lance_module
import isotrope.connectors.sqlite_lexical as sqlite_lexical_module
from benchmarks.common import print_and_write
from isotrope.fusion import DEFAULT_ALPHA, DEFAULT_CANDIDATES, keyword_depth, search_store
from isotrope.lexical import query_terms

DIM = 384
BATCH = 4096
#: the keyword candidates of a hybrid query of 10 hits
KEYWORDS = keyword_depth(DEFAULT_CANDIDATES, 10)


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
def without_terms() -> Iterator[None]:
    """The stores as if they had no lexical index: the analyzer yields no terms."""
    with ExitStack() as stack:
        stack.enter_context(patch.object(sqlite_lexical_module, "analyze", lambda text: []))
        for module in (lance_module, lance_lexical_module):
            stack.enter_context(patch.object(module, "index_text", lambda text: ""))
        yield


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


def interleaved_p50_ms(first, second, queries) -> tuple[float, float]:
    """p50 of two functions timed alternately on each query (a load change hits both alike)."""
    times: tuple[list[float], list[float]] = ([], [])
    for query in queries:
        for function, out in ((first, times[0]), (second, times[1])):
            tick = time.perf_counter()
            function(query)
            out.append(time.perf_counter() - tick)
    return tuple(round(1000 * float(np.median(t)), 2) for t in times)  # type: ignore[return-value]


def encode_seconds(model: str, texts: list[str], total: int) -> float:
    """Seconds ``model`` (no shaping) takes to embed ``texts``, scaled to ``total`` chunks."""
    from isotrope.encoder import ShapedEncoder

    encoder = ShapedEncoder.create(model, shape="none")
    tick = time.perf_counter()
    encoder.encode(texts, kind="document")
    return round((time.perf_counter() - tick) * total / len(texts), 1)


def lancedb_hybrid(store, reranker):
    """LanceDB's own hybrid query on the store's table: vector leg + full-text leg on its ``terms`` index."""
    from lancedb.query import FullTextOperator, MatchQuery

    table = store.lancedb_table()

    def query(pair):
        terms = " ".join(query_terms(pair[0]))
        builder = table.search(query_type="hybrid", vector_column_name="vector", fts_columns="terms")
        text = MatchQuery(terms, "terms", operator=FullTextOperator.OR)
        return builder.vector(pair[1]).text(text).distance_type("cosine").limit(10).rerank(reranker).to_arrow()

    return query


def bm25_retriever(texts: list[str], candidates: int):
    """LlamaIndex's ``BM25Retriever`` over the chunks (its own English stemmer and stop words); build seconds."""
    from llama_index.core.schema import TextNode

    try:
        from llama_index.retrievers.bm25 import BM25Retriever
    except ImportError as error:
        raise SystemExit(
            "the hybrid topic's peer needs llama-index-retrievers-bm25: make bench-peer-env (or pip install -e '.[bench-peers]')"
        ) from error
    tick = time.perf_counter()
    nodes = [TextNode(id_=f"c{i}", text=text) for i, text in enumerate(texts)]
    retriever = BM25Retriever.from_defaults(nodes=nodes, similarity_top_k=candidates, language="en")
    return retriever, round(time.perf_counter() - tick, 1)


def llama_index_fusion(store, bm25, candidates: int):
    """LlamaIndex ``QueryFusionRetriever`` over ``bm25`` and a vector retriever on ``store``."""
    from llama_index.core.llms import MockLLM
    from llama_index.core.retrievers import BaseRetriever, QueryFusionRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    class StoreRetriever(BaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            hits = store.search(np.asarray(query_bundle.embedding, dtype=np.float32)[None], candidates)[0]
            return [NodeWithScore(node=TextNode(id_=h.id, text=h.text), score=h.score) for h in hits]

    fusion = QueryFusionRetriever(
        [StoreRetriever(), bm25],
        similarity_top_k=10,
        num_queries=1,
        use_async=False,
        llm=MockLLM(),
        mode="relative_score",
        retriever_weights=[DEFAULT_ALPHA, 1 - DEFAULT_ALPHA],
    )

    def query(pair):
        return fusion.retrieve(QueryBundle(pair[0], embedding=[float(x) for x in pair[1]]))

    return query


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--minilm-sample", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=0, help="hybrid queries of another seed before the timed rows")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--queries-only", action="store_true", help="only the isotrope query latencies (no embedding, cost or peer rows)"
    )
    args = parser.parse_args(argv)
    from lancedb.rerankers import LinearCombinationReranker, RRFReranker

    texts = make_texts(args.chunks, 40, 120, seed=0)
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((args.chunks, DIM)).astype(np.float32)
    query_texts = make_texts(args.queries, 5, 10, seed=2)
    query_vectors = rng.standard_normal((args.queries, DIM)).astype(np.float32)
    pairs = list(zip(query_texts, query_vectors))
    warmup = list(zip(make_texts(args.warmup, 5, 10, seed=3), rng.standard_normal((args.warmup, DIM)).astype(np.float32)))
    result: dict = {"chunks": args.chunks, "queries": args.queries, "warmup queries": args.warmup}
    if not args.queries_only:
        result["embedding seconds (scaled to all chunks)"] = embedding = {
            "static:all-MiniLM-L6-v2": encode_seconds("static:all-MiniLM-L6-v2", texts, args.chunks),
            "all-MiniLM-L6-v2": encode_seconds("all-MiniLM-L6-v2", texts[: args.minilm_sample], args.chunks),
        }
        bm25, result["LlamaIndex BM25Retriever build seconds"] = bm25_retriever(texts, DEFAULT_CANDIDATES)
    for kind in ("faiss", "lancedb"):
        with tempfile.TemporaryDirectory() as folder:
            row = result[kind] = {}
            if not args.queries_only:
                with without_terms():
                    plain, plain_seconds = write(kind, Path(folder) / "plain", texts, vectors)
                    plain.close()
            store, seconds = write(kind, Path(folder) / "store", texts, vectors)
            row["write seconds"] = round(seconds, 1)
            for text, vector in warmup:
                search_store(store, [text], vector[None], 10, mode="hybrid")
            if not args.queries_only:
                lexical = seconds - plain_seconds
                row["write seconds, no lexical index"] = round(plain_seconds, 1)
                row["lexical share of the writes"] = round(lexical / seconds, 3)
                for model, embed in embedding.items():
                    row[f"lexical share of ingestion, {model}"] = round(lexical / (seconds + embed), 3)
            row["lexical p50 ms"] = p50_ms(lambda q, store=store: store.lexical_search([q[0]], 10), pairs)
            row["dense p50 ms"], row["hybrid p50 ms"] = interleaved_p50_ms(
                lambda q, store=store: store.search(q[1][None], 10),
                lambda q, store=store: search_store(store, [q[0]], q[1][None], 10, mode="hybrid"),
                pairs,
            )
            row["hybrid / dense"] = round(row["hybrid p50 ms"] / row["dense p50 ms"], 2)
            if args.queries_only:  # where the hybrid query's time goes: its legs and its completion lookups
                row[f"dense k={DEFAULT_CANDIDATES}, ids and scores p50 ms"] = p50_ms(
                    lambda q, store=store: store.search(q[1][None], DEFAULT_CANDIDATES, with_text=False), pairs
                )
                row[f"lexical k={KEYWORDS}, ids and scores p50 ms"] = p50_ms(
                    lambda q, store=store: store.lexical_search([q[0]], KEYWORDS, with_text=False), pairs
                )
                legs = [
                    (
                        store.search(q[1][None], DEFAULT_CANDIDATES, with_text=False)[0],
                        store.lexical_search([q[0]], KEYWORDS, with_text=False)[0],
                    )
                    for q in pairs
                ]  # the ids each query's completion looks up (LanceDB: remembered from these searches)
                row[f"BM25 of the {DEFAULT_CANDIDATES} dense candidates p50 ms"] = p50_ms(
                    lambda i, store=store, legs=legs: store.lexical_scores([pairs[i][0]], [[h.id for h in legs[i][0]]]),
                    range(len(pairs)),
                )
                row["vectors of the lexical candidates p50 ms"] = p50_ms(
                    lambda i, store=store, legs=legs: store.vectors([h.id for h in legs[i][1]]), range(len(pairs))
                )
                row["text of the final 10 p50 ms"] = p50_ms(
                    lambda i, store=store, legs=legs: store.get([h.id for h in legs[i][0][:10]]), range(len(pairs))
                )
                store.close()
                print(json.dumps({kind: row}), flush=True)
                continue
            if kind == "lancedb":
                row["LanceDB hybrid (RRFReranker) p50 ms"] = p50_ms(lancedb_hybrid(store, RRFReranker()), pairs)
                linear = LinearCombinationReranker(weight=DEFAULT_ALPHA)
                row["LanceDB hybrid (LinearCombinationReranker) p50 ms"] = p50_ms(lancedb_hybrid(store, linear), pairs)
            row["LlamaIndex QueryFusionRetriever p50 ms"] = p50_ms(llama_index_fusion(store, bm25, DEFAULT_CANDIDATES), pairs)
            store.close()
        print(json.dumps({kind: result[kind]}), flush=True)
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
