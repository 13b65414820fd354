"""Candidate keyword engines for the FAISS store, side by side on the scale benchmark's passages.

Each engine indexes the same analyzed texts (:func:`isotrope.lexical.index_text`) and answers the
same real sentence queries (their distinct terms OR-ed); its top 10 is compared with the exact BM25
(:mod:`isotrope.lexical`'s formula, float64, over the live rows) with ties allowed at the 10th score.
Engines: ``store`` (the FAISS store's :class:`~isotrope.connectors.keyword_index.KeywordIndex`, exact),
``tantivy`` (Lucene BM25, block-max WAND; one-byte length norms), ``lance`` (a pylance side table
with Lance's inverted index) and ``bm25s`` (precomputed sparse scores; no incremental update).
Also measured: an upsert/delete of 1,000 rows, then the agreement again (tantivy and Lance keep
deleted rows in their statistics until segments merge). Timings are only meaningful on an idle
machine::

    python -m benchmarks.keyword_engines --chunks 1000000 --data-dir ../shared/data --out benchmarks/results/keyword_engines_1m.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.fusion import DEFAULT_CANDIDATES, keyword_depth
from isotrope.lexical import K1, B, index_text, query_terms

from .scale import passages, query_texts, read_sentences

K = 10
HYBRID_DEPTH = keyword_depth(DEFAULT_CANDIDATES, K)  # the keyword candidates of a hybrid query
CHANGED = 1000  # rows deleted and re-added by the update measurement
ENGINES = ("store", "tantivy", "lance", "bm25s")


class Exact:
    """Exact BM25 over a term x row count matrix, with a live-row mask (the reference)."""

    def __init__(self, texts: Sequence[str]) -> None:
        from sklearn.feature_extraction.text import CountVectorizer

        vectorizer = CountVectorizer(analyzer=str.split, dtype=np.float64)
        self.counts = vectorizer.fit_transform(texts).T.tocsr()  # term x row
        self.vocabulary = vectorizer.vocabulary_
        self.lengths = np.asarray(self.counts.sum(axis=0)).ravel()
        self.live = self.lengths > 0

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        live = self.live
        n_docs = float(live.sum())
        norm = K1 * (1 - B + B * self.lengths / (self.lengths[live].sum() / n_docs))
        scores = np.zeros(len(self.lengths))
        for term in dict.fromkeys(terms):
            row = self.vocabulary.get(term)
            if row is None:
                continue
            start, end = self.counts.indptr[row], self.counts.indptr[row + 1]
            keys, tf = self.counts.indices[start:end], self.counts.data[start:end]
            keep = live[keys]
            keys, tf = keys[keep], tf[keep]
            if len(keys) == 0:
                continue
            idf = np.log1p((n_docs - len(keys) + 0.5) / (len(keys) + 0.5))
            scores[keys] += idf * tf * (K1 + 1) / (tf + norm[keys])
        return scores

    def top(self, terms: Sequence[str], k: int = K) -> list[int]:
        scores = self.scores(terms)
        best = np.argpartition(-scores, k)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [int(i) for i in best if scores[i] > 0]


def agrees(found: Sequence[int], scores: np.ndarray, k: int = K, rtol: float = 1e-6) -> bool:
    """Whether ``found`` is an exact top k: everything scoring above the k-th is in it, and nothing below it."""
    expected = np.sort(scores[scores > 0])[::-1][:k]
    if len(found) != len(expected):
        return False
    if len(expected) == 0:
        return True
    kth = expected[-1]
    above = set(np.flatnonzero(scores > kth * (1 + rtol)).tolist())
    got = scores[list(found)]
    return above <= set(found) and bool((got >= kth * (1 - rtol)).all())


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = call()
    return out, time.perf_counter() - start


class Store:
    """The FAISS store's keyword index (rows keyed by position)."""

    def __init__(self, texts: Sequence[str], path: Path) -> None:
        from isotrope.connectors.keyword_index import KeywordIndex

        batches = (list(enumerate(texts))[i : i + 65_536] for i in range(0, len(texts), 65_536))
        self.index = KeywordIndex.build(([(key, text.split()) for key, text in batch] for batch in batches), 0)
        self.index.save(path.parent).rename(path.with_suffix(".npz"))
        self.file_bytes = path.with_suffix(".npz").stat().st_size

    def top(self, terms: Sequence[str]) -> list[int]:
        return self.index.top(terms, K)[0].tolist()

    def update(self, keys: Sequence[int], texts: Sequence[str]) -> None:
        self.index.upsert((key, text.split()) for key, text in zip(keys, texts))
        self.index.merge()


class Tantivy:
    def __init__(self, texts: Sequence[str], path: Path) -> None:
        import tantivy

        builder = tantivy.SchemaBuilder()
        builder.add_integer_field("key", stored=True, indexed=True, fast=True)
        builder.add_text_field("terms", tokenizer_name="spaces", index_option="freq")
        self.schema = builder.build()
        path.mkdir()
        self.index = tantivy.Index(self.schema, path=str(path))
        self.index.register_tokenizer("spaces", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build())
        self.tantivy = tantivy
        writer = self.index.writer(heap_size=256_000_000, num_threads=1)
        for key, text in enumerate(texts):
            if text:
                writer.add_document(tantivy.Document(key=key, terms=text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()

    def top(self, terms: Sequence[str]) -> list[int]:
        t = self.tantivy
        query = t.Query.boolean_query(
            [(t.Occur.Should, t.Query.term_query(self.schema, "terms", term)) for term in dict.fromkeys(terms)]
        )
        hits = self.searcher.search(query, K).hits
        return [self.searcher.doc(address)["key"][0] for _, address in hits]

    def update(self, keys: Sequence[int], texts: Sequence[str]) -> None:
        t = self.tantivy
        writer = self.index.writer(heap_size=64_000_000, num_threads=1)
        for key in keys:
            writer.delete_documents_by_term("key", key)
        for key, text in zip(keys, texts):
            if text:
                writer.add_document(t.Document(key=key, terms=text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()


class Lance:
    def __init__(self, texts: Sequence[str], path: Path) -> None:
        import lance
        import pyarrow as pa

        keys = [i for i, text in enumerate(texts) if text]
        table = pa.table({"key": pa.array(keys, pa.int64()), "terms": pa.array([texts[i] for i in keys], pa.string())})
        self.path = str(path)
        self.dataset = lance.write_dataset(table, self.path)
        self._index()

    def _index(self) -> None:
        self.dataset.create_scalar_index(
            "terms",
            "INVERTED",
            base_tokenizer="whitespace",
            with_position=False,
            lower_case=False,
            stem=False,
            remove_stop_words=False,
            ascii_folding=False,
            max_token_length=None,
            replace=True,
        )

    def top(self, terms: Sequence[str]) -> list[int]:
        found = self.dataset.to_table(columns=["key", "_score"], full_text_query=" ".join(dict.fromkeys(terms)), limit=K)
        return found.column("key").to_pylist()

    def update(self, keys: Sequence[int], texts: Sequence[str]) -> None:
        import lance
        import pyarrow as pa

        self.dataset.delete(f"key IN ({','.join(map(str, keys))})")
        table = pa.table({"key": pa.array(list(keys), pa.int64()), "terms": pa.array(list(texts), pa.string())})
        self.dataset = lance.write_dataset(table, self.path, mode="append")
        self.dataset.optimize.optimize_indices()
        self.dataset = lance.dataset(self.path)


class Bm25s:
    def __init__(self, texts: Sequence[str], path: Path) -> None:
        import bm25s

        self.keys = [i for i, text in enumerate(texts) if text]
        self.retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        self.retriever.index([texts[i].split() for i in self.keys], show_progress=False)
        self.texts = texts

    def top(self, terms: Sequence[str]) -> list[int]:
        known = [t for t in dict.fromkeys(terms) if t in self.retriever.vocab_dict]
        if not known:
            return []
        ids = [self.retriever.vocab_dict[t] for t in known]
        scores = self.retriever.get_scores(ids)
        best = np.argpartition(-scores, K)[:K]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [self.keys[i] for i in best if scores[i] > 0]

    def update(self, keys: Sequence[int], texts: Sequence[str]) -> None:  # no incremental update: a rebuild
        replaced = dict(zip(keys, texts))
        self.__init__([replaced.get(i, t) for i, t in enumerate(self.texts)], Path())  # type: ignore[misc]


class _Lines(logging.Handler):
    """Collects the arguments of the store index's debug lines: (k, terms, postings, top n asked per segment)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.args: list[tuple[Any, ...]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.args.append(tuple(record.args or ()))  # type: ignore[arg-type]


def at_depth(index: Any, exact: Exact, terms: list[list[str]], k: int) -> dict[str, Any]:
    """The store's index asked for each query's top ``k`` (a keyword query's depth, or a hybrid query's):
    p50 / p99 ms, how many equal the exact BM25 top ``k``, and the top n its compiled pass asked (0: every
    posting scored in NumPy)."""
    from isotrope.connectors import keyword_index

    logger, lines = keyword_index.logger, _Lines()
    level = logger.level
    times, agree = [], 0
    logger.addHandler(lines)
    logger.setLevel(logging.DEBUG)
    try:
        for query in terms:
            (found, _), seconds = timed(lambda query=query: index.top(query, k))
            times.append(seconds * 1000)
            agree += agrees(found.tolist(), exact.scores(query), k)
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    asked = np.array([max(line[3], default=0) for line in lines.args if line])
    return {
        "p50_ms": float(np.percentile(times, 50)),
        "p99_ms": float(np.percentile(times, 99)),
        f"top{k}_exact": agree,
        "top_n_median": float(np.median(asked)) if len(asked) else 0.0,
        "top_n_most": int(asked.max(initial=0)),
    }


def measure(name: str, engine: Any, exact: Exact, terms: list[list[str]]) -> dict[str, Any]:
    times, agree = [], 0
    for query in terms:
        found, seconds = timed(lambda query=query: engine.top(query))
        times.append(seconds * 1000)
        agree += agrees(found, exact.scores(query))
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "top10_exact": agree}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--workdir")
    parser.add_argument("--depths", default=f"{K},{HYBRID_DEPTH}", help="the top k the store's index is timed at")
    args = parser.parse_args(argv)
    depths = [int(d) for d in args.depths.split(",")]
    sentences = read_sentences(args.data_dir)
    texts, analyze_s = timed(lambda: [index_text(text) for _, text in passages(sentences, args.chunks)])
    terms = [query_terms(q) for q in query_texts(sentences, args.queries)]
    exact, exact_s = timed(lambda: Exact(texts))
    result: dict[str, Any] = {
        "chunks": args.chunks,
        "queries": len(terms),
        "analyze_s": analyze_s,
        "exact_s": exact_s,
        "engines": {},
    }
    rng = np.random.default_rng(3)
    changed = sorted(rng.choice(len(texts), CHANGED, replace=False).tolist())
    moved = [texts[(key + 1) % len(texts)] for key in changed]  # each changed row takes its neighbour's text
    replaced = dict(zip(changed, moved))
    updated = Exact([replaced.get(i, t) for i, t in enumerate(texts)])  # the reference after the update
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for name in args.engines.split(","):  # one engine in memory at a time
            build = {"store": Store, "tantivy": Tantivy, "lance": Lance, "bm25s": Bm25s}[name]
            engine, build_s = timed(lambda build=build, name=name: build(texts, Path(tmp) / name))
            row = {"build_s": build_s, **measure(name, engine, exact, terms)}
            row["file_bytes"] = getattr(engine, "file_bytes", None)
            if name == "store":  # the top k a keyword query asks and the one a hybrid query asks
                row["depths"] = {k: at_depth(engine.index, exact, terms, k) for k in depths}
            _, row["update_1000_s"] = timed(lambda engine=engine: engine.update(changed, moved))
            row["top10_exact_after_update"] = sum(agrees(engine.top(q), updated.scores(q)) for q in terms)
            del engine
            result["engines"][name] = row
            print(name, row, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
