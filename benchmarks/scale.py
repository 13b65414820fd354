"""Issue 22: what N chunks cost on one machine (indexing time by stage, peak RSS, disk) and how search
scales per index type, next to the bare library on the same vectors and to LlamaIndex's FaissVectorStore.

Passages are windows of consecutive sentences of ``corpus/general_english_sentences.txt.gz``
(156k sentences): first non-overlapping 3-sentence windows (52k passages), then sliding windows
of 2, 4, 5, 6, ... sentences (stride 1) until N passages exist; past 52k, passages overlap.

    python -m benchmarks.scale --chunks 100000 --data-dir ../shared/data --out benchmarks/results/scale-100k.json
    python -m benchmarks.scale --table RESULT.json ...        # the docs tables
    python -m benchmarks.scale --plot OUT.png RESULT.json ... # time, memory, disk against size (matplotlib)

Indexing runs in a child process per store (its peak RSS is the store's), through
``index_documents`` with the encoder given by ``--encoder DIR`` (a saved, e.g. ``--model fast``,
encoder) or else ``static:all-MiniLM-L6-v2`` with ``whiten-partial`` fitted on 20,000 passages.
Search runs in a second child per store: each index type is built on the store's own vectors
(``FaissStore.optimize(factory)``, ``LanceDBStore.create_index``; ``auto``: the index ingestion built), its
breadth calibrated by the store as at ingestion (index_plan: recall@10 >= 0.95 plus a margin on pseudo-queries
cut from the stored chunks), and the bare library searches the very
index object the store searches, with the same settings (LanceDB ``auto``: the index ingestion built and
calibrated, searched as it is). Single queries alternate store / bare, one query
at a time; batches alternate whole batches. recall@10 is against exact float32 search (IndexFlatIP)
over all stored vectors, with held-out encoded sentences as queries.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import child_main, child_parser, run_child
from benchmarks.harness import MAX_LOAD, SETTLE_S, loaded_by_others, machine_info, wait_for_load

logger = logging.getLogger(__name__)

SENTENCES = "corpus/general_english_sentences.txt.gz"
K = 10
FIT_PASSAGES = 20_000
FIRST_WINDOW = 3
SLIDING_WINDOWS = (2, 4, 5, 6, 7, 8, 9, 10, 11, 12)
ADD_BATCH = 2048
#: the search modes measured cold through Collection.search (dense, keyword, hybrid), beside the bare keyword engine
MODES = "dense,keyword,hybrid"


# -- passages -------------------------------------------------------------------------
def read_sentences(data_dir: str | Path) -> list[str]:
    path = Path(data_dir) / SENTENCES
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.strip() for line in handle if line.strip()]


def passages(sentences: list[str], n: int) -> Iterator[tuple[str, str]]:
    """``(id, text)`` of the first ``n`` passages: disjoint 3-sentence windows, then sliding windows."""
    made = 0
    plans = [(FIRST_WINDOW, FIRST_WINDOW)] + [(size, 1) for size in SLIDING_WINDOWS]
    for size, stride in plans:
        for start in range(0, len(sentences) - size + 1, stride):
            if made >= n:
                return
            yield f"w{size}s{stride}-{start}", " ".join(sentences[start : start + size])
            made += 1
    raise ValueError(f"the corpus makes at most {made} passages with windows {plans}; asked for {n}")


def documents(sentences: list[str], n: int) -> Callable[[], Iterator[Any]]:
    """A fresh, streamed pass over the passages as Documents (one chunk each)."""
    from isotrope.ingest.loaders import Document

    return lambda: (Document(source=pid, text=text) for pid, text in passages(sentences, n))


def query_texts(sentences: list[str], count: int) -> list[str]:
    rng = np.random.default_rng(7)
    return [sentences[i] for i in rng.choice(len(sentences), count, replace=False)]


# -- encoder ----------------------------------------------------------------------------
def prepare_encoder(sentences: list[str], encoder_dir: Path | None, workdir: Path) -> tuple[Path, dict[str, Any]]:
    """A saved encoder folder: the one given, or the static MiniLM table fitted on passages."""
    if encoder_dir is not None:  # the folder's name only: results name no machine paths
        return encoder_dir, {"encoder": encoder_dir.name, "fit_s": 0.0}
    from isotrope.encoder import ShapedEncoder

    start = time.perf_counter()
    encoder = ShapedEncoder.create(model="static:all-MiniLM-L6-v2", shape="whiten-partial")
    encoder.fit([text for _, text in passages(sentences, FIT_PASSAGES)])
    path = encoder.save(workdir / "encoder")
    return path, {
        "encoder": "static:all-MiniLM-L6-v2 + whiten-partial, fitted on 20,000 passages",
        "fit_s": time.perf_counter() - start,
    }


# -- child: index -----------------------------------------------------------------------
def index_child(args: argparse.Namespace) -> dict[str, Any]:
    from isotrope.encoder import ShapedEncoder
    from isotrope.ingest.pipeline import index_documents

    sentences = read_sentences(args.data_dir)
    encoder = ShapedEncoder.load(args.encoder)
    load_before = os.getloadavg()
    start = time.perf_counter()
    report = index_documents(
        documents(sentences, args.chunks),
        f"{args.kind}:{args.path}",
        encoder=encoder,
        chunk_tokens=args.chunk_tokens,
        batch_size=ADD_BATCH,
        show_progress=False,
    )
    wall = time.perf_counter() - start
    disk = sum(f.stat().st_size for f in Path(args.path).rglob("*") if f.is_file())
    return {
        "chunks": report.added,
        "index_wall_s": wall,
        "stages_s": report.seconds,
        "chunks_per_s": report.added / wall,
        "disk_bytes": disk,
        "disk_bytes_per_chunk": disk / report.added,
        "passages": report.documents,
        "chunk_tokens": args.chunk_tokens,
        "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
        # CPU seconds of this process: on a shared machine, close to what the run needs on a free one
        "cpu_s": sum(getattr(resource.getrusage(resource.RUSAGE_SELF), f) for f in ("ru_utime", "ru_stime")),
    }


# -- timing -----------------------------------------------------------------------------
def time_pair(
    ours: Callable[[np.ndarray], Any], bare: Callable[[np.ndarray], Any], queries: np.ndarray, single: int, batch_repeats: int
) -> dict[str, Any]:
    """Single-query and batch latencies of both sides, interleaved; p50/p99 and our overhead."""
    for _ in range(2):  # warm-up
        ours(queries[:1]), bare(queries[:1])
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    for i in range(single):
        q = queries[i % len(queries)][None, :]
        order = (("ours", ours), ("bare", bare)) if i % 2 == 0 else (("bare", bare), ("ours", ours))
        for side, call in order:
            tick = time.perf_counter()
            call(q)
            times[side].append(time.perf_counter() - tick)
    batch: dict[str, list[float]] = {"ours": [], "bare": []}
    for i in range(batch_repeats):
        order = (("ours", ours), ("bare", bare)) if i % 2 == 0 else (("bare", bare), ("ours", ours))
        for side, call in order:
            tick = time.perf_counter()
            call(queries)
            batch[side].append(time.perf_counter() - tick)
    out: dict[str, Any] = {}
    for side in ("ours", "bare"):
        prefix = "" if side == "ours" else "bare_"
        out[f"{prefix}p50_ms_single"] = 1000 * float(np.median(times[side]))
        out[f"{prefix}p99_ms_single"] = 1000 * float(np.percentile(times[side], 99))
        out[f"{prefix}p50_ms_batch"] = 1000 * float(np.median(batch[side]))
        out[f"{prefix}p99_ms_batch"] = 1000 * float(np.percentile(batch[side], 99))
    out["overhead_pct_single"] = 100 * (out["p50_ms_single"] / out["bare_p50_ms_single"] - 1)
    out["overhead_pct_batch"] = 100 * (out["p50_ms_batch"] / out["bare_p50_ms_batch"] - 1)
    return out


def recall_at_10(found: list[list[int]], truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t.tolist())) / K for f, t in zip(found, truth)]))


def single_p50_ms(call: Callable[[np.ndarray], Any], queries: np.ndarray, count: int) -> float:
    call(queries[:1])
    times = []
    for i in range(count):
        tick = time.perf_counter()
        call(queries[i % len(queries)][None, :])
        times.append(time.perf_counter() - tick)
    return 1000 * float(np.median(times))


def encoded_queries(args: argparse.Namespace) -> tuple[list[str], np.ndarray]:
    from isotrope.encoder import ShapedEncoder

    texts = query_texts(read_sentences(args.data_dir), args.queries)
    return texts, ShapedEncoder.load(args.encoder).encode(texts, kind="query").astype(np.float32)


def collection_p50_ms(uri: str, texts: list[str], count: int, **store_options: Any) -> float:
    """Single-query p50 of dense ``Collection.search(text, mode="dense")``: encoding included (a store's
    default search may be hybrid)."""
    from isotrope.search import Collection

    with Collection.open(uri, **store_options) as collection:
        collection.search(texts[0], k=K, mode="dense")
        times = []
        for i in range(count):
            tick = time.perf_counter()
            collection.search(texts[i % len(texts)], k=K, mode="dense")
            times.append(time.perf_counter() - tick)
    return 1000 * float(np.median(times))


def save_partial(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """The index types searched so far, beside the store (kept with ``--keep``): a long run cut short
    still leaves them."""
    Path(f"{args.path}.search.json").write_text(json.dumps(result, indent=2))


# -- child: search FAISS ----------------------------------------------------------------
#: candidates per hit that FaissStore re-ranks from its stored float32 vectors (``refine``), per index type
REFINE = {"ivf_sq8_refine": 4, "ivf_sq4_refine": 8}


def faiss_types(n: int) -> dict[str, str]:
    from isotrope.stores.index_plan import nlist_for

    nlist = nlist_for(n)
    return {
        "flat": "Flat",
        "ivf": f"IVF{nlist},Flat",
        "hnsw": "HNSW32",
        "ivf_sq8": f"IVF{nlist},SQ8",
        "ivf_pq_refine": f"IVF{nlist},PQ48,RFlat",
        "ivf_sq8_refine": f"IVF{nlist},SQ8",
        "ivf_sq4_refine": f"IVF{nlist},SQ4",
    }


def stored_vectors(store: Any) -> tuple[np.ndarray, np.ndarray]:
    """Every key and vector a FaissStore holds, in key order."""
    keys, parts = zip(*store._iter_vectors())
    return np.concatenate(keys), np.concatenate(parts)


def bare_refined(store: Any, factory: str, refine: int) -> tuple[Any, Callable[[np.ndarray], Any]]:
    """faiss's own refinement as the peer of FaissStore ``refine``: the same quantised index with an
    in-RAM float32 copy (``RFlat``, k_factor ``refine``, same nprobe), over the store's vectors in key
    order; returns the index and a search giving store keys."""
    import faiss

    key_array, vectors = stored_vectors(store)
    index = faiss.index_factory(store.dim, factory + ",RFlat", faiss.METRIC_INNER_PRODUCT)
    ivf = faiss.try_extract_index_ivf(index)
    sample = np.random.default_rng(0).choice(len(vectors), min(len(vectors), 64 * ivf.nlist), replace=False)
    index.train(vectors[np.sort(sample)])
    index.add(vectors)
    del vectors
    base = faiss.SearchParametersIVF(nprobe=store.nprobe)
    params = faiss.IndexRefineSearchParameters(k_factor=float(refine), base_index_params=base)
    params.referenced_objects = [base]

    def search(q: np.ndarray) -> Any:
        distances, labels = index.search(q, K, params=params)
        return distances, np.where(labels >= 0, key_array[np.maximum(labels, 0)], -1)

    return index, search


def percentiles_ms(call: Callable[[str], Any], texts: list[str]) -> dict[str, float]:
    times = []
    for text in texts:
        tick = time.perf_counter()
        call(text)
        times.append(1000 * (time.perf_counter() - tick))
    return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99))}


def text_modes(
    uri: str, texts: list[str], modes: list[str], bare: Callable[[Any], Callable[[str], Any]] | None
) -> dict[str, Any]:
    """Dense, keyword and hybrid ``Collection.search(text, mode=...)`` cold (the first queries after open;
    dense and hybrid encode), then the bare keyword engine (``bare(store)``: a call on one text) on the same
    texts, and the other ways of running the hybrid query (:func:`hybrid_variants`)."""
    from isotrope.search import Collection

    out: dict[str, Any] = {}
    with Collection.open(uri) as collection:
        for mode in modes:
            name = "lexical" if mode == "keyword" else mode
            out[mode] = percentiles_ms(lambda text, name=name: collection.search(text, k=K, mode=name), texts)
        if bare is not None and "keyword" in modes:
            out["keyword_bare"] = percentiles_ms(bare(collection.store), texts)
        if "hybrid" in modes:
            out.update(hybrid_variants(collection, texts))
    return out


class TwoPass:
    """A store seen without its ``hybrid_candidates``: hybrid search takes the generic path, the one before
    issue 32's (dense and keyword lists by id, the dense ids' BM25 from ``lexical_scores``, the keyword-only
    ids' vectors from ``vectors``, then the fused hits' rows)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "hybrid_candidates":
            raise AttributeError(name)
        return getattr(self._store, name)


def hybrid_variants(collection: Any, texts: list[str]) -> dict[str, Any]:
    """The hybrid query, encoding included, through the generic two-pass path (``hybrid_two_pass``) and, in
    a LanceDB store, with its dense candidates' BM25 asked of Lance (a third query) instead of computed from
    the statistics beside the table (``hybrid_third_query``)."""
    from unittest.mock import patch

    from isotrope.connectors.lance_lexical import LanceLexicalIndex
    from isotrope.fusion import search_store

    store = collection.store

    def two_pass(text: str) -> Any:
        vectors = collection.encoder.encode([text], kind="query")
        return search_store(TwoPass(store), [text], vectors, K, alpha=collection.default_search()[1])

    out = {"hybrid_two_pass": percentiles_ms(two_pass, texts)}
    if isinstance(store, LanceLexicalIndex):
        with patch.object(store, "_term_stats", lambda dataset: None):
            out["hybrid_third_query"] = percentiles_ms(lambda text: collection.search(text, k=K, mode="hybrid"), texts)
    return out


def faiss_keyword_bare(store: Any) -> Callable[[str], Any]:
    """The FAISS store's keyword index alone (no hit rows read)."""
    from isotrope.lexical import query_terms

    index = store._keyword_index()
    return lambda text: index.top(query_terms(text), K)


def search_faiss_child(args: argparse.Namespace) -> dict[str, Any]:
    import faiss
    from llama_index.core.vector_stores.types import VectorStoreQuery
    from llama_index.vector_stores.faiss import FaissVectorStore

    from isotrope.connectors.faiss_index import params_for
    from isotrope.search import Collection

    texts, queries = encoded_queries(args)
    path = Path(args.path)
    result: dict[str, Any] = {"text_modes": text_modes(f"faiss:{path}", texts, args.modes.split(","), faiss_keyword_bare)}
    result["p50_ms_single_with_encode_auto"] = collection_p50_ms(f"faiss:{path}", texts, args.single)
    collection = Collection.open(f"faiss:{path}")  # each index built below calibrates as ingestion's does (pseudo-queries)
    store = collection.store
    result["auto_index"] = store.index_info()
    key_of = dict(store._conn.execute("SELECT id, key FROM items"))
    exact = faiss.IndexIDMap2(faiss.IndexFlatIP(store.dim))
    for keys, vectors in store._iter_vectors():
        exact.add_with_ids(vectors, keys)
    truth = exact.search(queries, K)[1]
    del exact
    for name in args.types.split(","):
        tick = time.perf_counter()
        if name == "auto":  # the index ingestion built and calibrated, as it is (first: the others replace it)
            factory = store.index_factory
        else:
            factory = faiss_types(len(store))[name]
            store.optimize(factory, refine=REFINE.get(name, 0))
        build_s = time.perf_counter() - tick
        store.nprobe = args.nprobe or store.nprobe
        # the very index object the store searches: two copies of one index differ by up to 20 % in
        # speed on this machine (where their memory landed), which would swamp the store's own cost
        bare_index = store._index
        params = params_for(bare_index, None, store.nprobe, store.ef)
        bare_ivf = faiss.try_extract_index_ivf(bare_index)

        def ours(q: np.ndarray) -> Any:
            return store.search(q, K)

        def bare(q: np.ndarray, bare_index: Any = bare_index, params: Any = params, bare_ivf: Any = bare_ivf) -> Any:
            if bare_ivf is not None:  # as the store does: one query's lists are scanned by all threads
                bare_ivf.parallel_mode = 1 if len(q) == 1 else 0
            return bare_index.search(q, K, params=params)

        extra: dict[str, Any] = {}
        if name in REFINE:  # the peer is faiss's RFlat refinement, which keeps a float32 copy in RAM
            bare_index, bare = bare_refined(store, factory, REFINE[name])
            extra["bare"] = f"{factory},RFlat k_factor={REFINE[name]} (float32 copy in RAM)"
            extra["bare_index_bytes"] = (path / "index.faiss").stat().st_size + 4 * store.dim * len(store)
        found = [[key_of[hit.id] for hit in hits] for hits in ours(queries)]
        index_bytes = (path / "index.faiss").stat().st_size
        row: dict[str, Any] = {
            "factory": factory,
            "build_s": build_s,
            **store.index_info(),
            **extra,
            "index_bytes": index_bytes,
            "index_fraction_of_flat": index_bytes / (len(store) * (4 * store.dim + 8)),
            "recall_at_10": recall_at_10(found, truth),
            "bare_recall_at_10": recall_at_10(bare(queries)[1].tolist(), truth),
            **time_pair(ours, bare, queries, args.single, args.batch_repeats),
            "p50_ms_single_with_encode": collection_p50_ms(f"faiss:{path}", texts, args.single, nprobe=store.nprobe),
        }
        if name in ("flat", "ivf"):
            ivf = faiss.try_extract_index_ivf(bare_index)
            if ivf is not None:
                ivf.nprobe = store.nprobe
            llama = FaissVectorStore(faiss_index=bare_index)
            row["llama_index_p50_ms_single"] = single_p50_ms(
                lambda q, llama=llama: llama.query(VectorStoreQuery(query_embedding=q[0].tolist(), similarity_top_k=K)),
                queries,
                args.single,
            )
        result[name] = row
        save_partial(args, result)
        logger.warning(
            "faiss %s: %s",
            name,
            {k: row[k] for k in ("recall_at_10", "p50_ms_single", "overhead_pct_single", "overhead_pct_batch")},
        )
    collection.close()
    return result


# -- child: search LanceDB --------------------------------------------------------------
def lancedb_keyword_bare(store: Any) -> Callable[[str], Any]:
    """LanceDB's own full-text query on the store's table: ``table.search(terms, query_type="fts")`` over
    the analyzed ``terms`` column (its index splits on spaces), the hit rows read as the store reads them."""
    from isotrope.connectors.lance_lexical import TERMS
    from isotrope.lexical import query_terms

    table = store.lancedb_table()
    return lambda text: (
        table.search(" ".join(query_terms(text)), query_type="fts", fts_columns=TERMS)
        .limit(K)
        .select(["id", "text", "metadata"])
        .to_arrow()
    )


def lancedb_hybrid_bare(path: Path, encoder_dir: Path) -> Callable[[str], Any]:
    """LanceDB's own hybrid query (``query_type="hybrid"``, its default RRF reranker) on the store's table,
    the query encoded as the store's hybrid search encodes it, with the store's vector search settings."""
    from isotrope.connectors.lance_index import LANCE_DISTANCE
    from isotrope.connectors.lance_lexical import TERMS
    from isotrope.connectors.lancedb_store import LanceDBStore
    from isotrope.encoder import ShapedEncoder
    from isotrope.lexical import query_terms

    store, encoder = LanceDBStore(path), ShapedEncoder.load(encoder_dir)
    table, settings = store.lancedb_table(), store._index_settings(K, True)

    def search(text: str) -> Any:
        vector, terms = encoder.encode([text], kind="query")[0], " ".join(query_terms(text))
        if not terms:  # LanceDB refuses a hybrid query without text: a query of stop words searches by vector
            query = table.search(vector, vector_column_name="vector")
        else:
            query = table.search(query_type="hybrid", vector_column_name="vector", fts_columns=TERMS).vector(vector).text(terms)
        query = query.distance_type(LANCE_DISTANCE[store.metric]).limit(K).select(["id", "text", "metadata"])
        for name, value in settings.items():
            query = getattr(query, name)(value)
        return query.to_arrow()

    return search


def search_lancedb_child(args: argparse.Namespace) -> dict[str, Any]:
    import faiss
    import lancedb
    from lancedb.index import HnswSq, IvfPq

    from isotrope.connectors.lance_rows import to_numpy as _to_numpy
    from isotrope.search import Collection
    from isotrope.stores import index_plan

    texts, queries = encoded_queries(args)
    path = Path(args.path)
    modes = args.modes.split(",")
    result: dict[str, Any] = {"text_modes": text_modes(f"lancedb:{path}", texts, modes, lancedb_keyword_bare)}
    if "hybrid" in modes:
        result["text_modes"]["hybrid_bare"] = percentiles_ms(lancedb_hybrid_bare(path, args.encoder), texts)
    result["p50_ms_single_with_encode_auto"] = collection_p50_ms(f"lancedb:{path}", texts, args.single)
    collection = Collection.open(f"lancedb:{path}")  # each index built below calibrates as ingestion's does (pseudo-queries)
    store = collection.store
    result["auto_index"] = store.index_info()
    ids: list[str] = []
    exact = faiss.IndexFlatIP(store.dim)
    for batch in store._dataset().to_batches(columns=["id", "vector"], batch_size=65_536):
        ids.extend(batch.column("id").to_pylist())
        exact.add(_to_numpy(batch.column("vector"), store.dim, batch.column("id"), "vector"))
    truth = exact.search(queries, K)[1]
    position = {i: p for p, i in enumerate(ids)}
    del exact
    table = lancedb.connect(path).open_table(store.table_name)
    distance = {"ip": "dot", "cosine": "cosine", "l2": "l2"}[store.metric]
    n = len(store)
    for name in args.types.split(","):
        tick = time.perf_counter()
        if name == "auto":  # the index ingestion built and calibrated, as it is
            pass
        elif name == "flat":
            for name_, _, columns in store._indices():
                if "vector" in columns:
                    store._writable().drop_index(name_)
            store._vector_index = False
        else:
            plan = index_plan.lancedb_ivf_pq_for(max(n, index_plan.EXACT_BELOW), store.dim)
            config = IvfPq(distance_type=distance, **plan) if name == "ivf_pq" else HnswSq(distance_type=distance)
            store.create_index(config)
            store.calibrate()
        build_s = time.perf_counter() - tick
        table.checkout_latest()
        indexed = store.vector_index is not None

        def ours(q: np.ndarray) -> Any:
            return store.search(q, K)

        def bare(q: np.ndarray, indexed: bool = indexed) -> Any:
            query = (
                table.search(q[0] if len(q) == 1 else list(q), vector_column_name="vector")
                .distance_type(distance)
                .limit(K)
                .select(["id", "text", "metadata", "_distance"])
            )
            for setting, value in store._index_settings(K, True).items():  # the store's breadth: nprobes, refine, ef
                query = getattr(query, setting)(value)
            return query.to_arrow()

        found = [[position[hit.id] for hit in hits] for hits in ours(queries)]
        bare_found: list[list[int]] = [[] for _ in queries]
        answers = bare(queries)
        for query_index, row_id in zip(answers.column("query_index").to_pylist(), answers.column("id").to_pylist()):
            bare_found[query_index].append(position[row_id])
        row = {
            "build_s": build_s,
            **store.index_info(),
            "recall_at_10": recall_at_10(found, truth),
            "bare_recall_at_10": recall_at_10(bare_found, truth),
            **time_pair(ours, bare, queries, args.single, args.batch_repeats),
        }
        result[name] = row
        save_partial(args, result)
        logger.warning(
            "lancedb %s: %s",
            name,
            {k: row[k] for k in ("recall_at_10", "p50_ms_single", "overhead_pct_single", "overhead_pct_batch")},
        )
    collection.close()
    return result


# -- driver ---------------------------------------------------------------------------------
CHILDREN = {"index": index_child, "search-faiss": search_faiss_child, "search-lancedb": search_lancedb_child}
DEFAULT_TYPES = {"faiss": "auto,flat,ivf,hnsw,ivf_sq8,ivf_sq8_refine,ivf_sq4_refine", "lancedb": "auto,flat,ivf_pq,ivf_hnsw_sq"}


def run(
    chunks: int,
    data_dir: str,
    out: Path,
    encoder: Path | None,
    stores: list[str],
    threads: int,
    search_threads: int,
    queries: int,
    single: int,
    batch_repeats: int,
    workdir: str | None,
    keep: bool,
    types: dict[str, str] | None = None,
    chunk_tokens: int = 256,
    nprobe: int | None = None,
    modes: str = MODES,
    command: str = "python -m benchmarks.scale",
) -> dict[str, Any]:
    types = {**DEFAULT_TYPES, **(types or {})}
    result: dict[str, Any] = {
        "command": command,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "chunks": chunks,
        "k": K,
        "queries": queries,
        "single_queries": single,
        "passages": f"windows of consecutive sentences of {SENTENCES}: disjoint "
        f"{FIRST_WINDOW}-sentence windows, then sliding windows of "
        f"{', '.join(map(str, SLIDING_WINDOWS))} sentences",
        "machine": {**machine_info(), "threads": threads, "search_threads": search_threads},
        "stores": {},
    }
    if workdir:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="isotrope-scale-", dir=workdir))
    try:
        sentences = read_sentences(data_dir)
        encoder_dir, result["encoder"] = prepare_encoder(sentences, encoder, tmp)
        del sentences
        for kind in stores:
            path = tmp / f"{kind}-{chunks}"
            common = [
                "--data-dir",
                str(data_dir),
                "--encoder",
                str(encoder_dir),
                "--kind",
                kind,
                "--path",
                str(path),
                "--chunks",
                str(chunks),
                "--queries",
                str(queries),
                "--single",
                str(single),
                "--batch-repeats",
                str(batch_repeats),
                "--chunk-tokens",
                str(chunk_tokens),
                *(["--nprobe", str(nprobe)] if nprobe else []),
            ]
            # each child starts once the previous one's threads have left the load average
            logger.warning("indexing %d chunks into %s (load %s)", chunks, kind, wait_for_load())
            indexing = run_child("benchmarks.scale", ["--child", "index", *common], threads)
            logger.warning("%s: %s", kind, indexing)
            load = wait_for_load()
            logger.warning("searching %s (load %s)", kind, load)
            search = run_child(
                "benchmarks.scale",
                ["--child", f"search-{kind}", "--types", types[kind], "--modes", modes, *common],
                search_threads,
            )
            search["load_average_at_start"] = load
            result["stores"][kind] = {"indexing": indexing, "search": search}
            result["loaded"] = result.get("loaded", False) or any(
                [
                    indexing["load_average_before_after"][0] > MAX_LOAD,
                    load[0] > MAX_LOAD,
                    *map(loaded_by_others, (indexing, search)),
                ]
            )
            out.write_text(json.dumps(result, indent=2))
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    # once the run's own threads have left the 1-minute average; still above MAX_LOAD, something else runs
    end = wait_for_load(timeout_s=SETTLE_S)
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in end]
    result["loaded"] = result.get("loaded", False) or end[0] > MAX_LOAD
    out.write_text(json.dumps(result, indent=2))
    return result


def markdown(results: list[dict[str, Any]]) -> str:
    """The docs tables: indexing per size and store, then search per size, store and index type."""
    lines = [
        "| chunks | store | index wall s | embed s | write s | chunks/s | peak RSS MB | disk B/chunk |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for kind, data in result["stores"].items():
            ix = data["indexing"]
            lines.append(
                f"| {result['chunks']:,} | {kind} | {ix['index_wall_s']:.1f} | {ix['stages_s']['embed']:.1f} | "
                f"{ix['stages_s']['write']:.1f} | {ix['chunks_per_s']:.0f} | {ix['peak_rss_mb']:.0f} | "
                f"{ix['disk_bytes_per_chunk']:.0f} |"
            )
    lines += [
        "",
        "| chunks | store | index | settings | build s | recall@10 | p50 ms single | bare p50 ms | "
        "overhead single % | overhead batch % | LlamaIndex p50 ms |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for kind, data in result["stores"].items():
            for name, row in data["search"].items():
                if not isinstance(row, dict) or "recall_at_10" not in row:
                    continue
                settings = ", ".join(
                    f"{key}={row[key]}"
                    for key in ("nlist", "nprobe", "ef", "ef_search", "num_partitions", "num_sub_vectors", "nprobes")
                    if key in row
                )
                llama = row.get("llama_index_p50_ms_single")
                index = row.get("factory", name) + (f" + refine x{row['refine']} (bare: RFlat)" if row.get("refine") else "")
                lines.append(
                    f"| {result['chunks']:,} | {kind} | {index} | {settings} | "
                    f"{row['build_s']:.1f} | {row['recall_at_10']:.3f} | {row['p50_ms_single']:.2f} | "
                    f"{row['bare_p50_ms_single']:.2f} | {row['overhead_pct_single']:+.1f} | "
                    f"{row['overhead_pct_batch']:+.1f} | {'' if llama is None else f'{llama:.2f}'} |"
                )
    lines += [
        "",
        "| chunks | store | mode (cold: first queries after open) | p50 ms | p99 ms | bare keyword p50 ms | bare p99 ms |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for result in results:
        for kind, data in result["stores"].items():
            modes = data["search"].get("text_modes", {})
            bare = modes.get("keyword_bare")
            for mode in ("dense", "keyword", "hybrid", "hybrid_third_query", "hybrid_two_pass"):
                if mode in modes:
                    peer = f"{bare['p50_ms']:.2f} | {bare['p99_ms']:.2f}" if bare and mode == "keyword" else " | "
                    lines.append(
                        f"| {result['chunks']:,} | {kind} | {mode} | {modes[mode]['p50_ms']:.2f} | {modes[mode]['p99_ms']:.2f} | {peer} |"
                    )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    """Indexing time, peak RSS and disk per chunk against the number of chunks, per store (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("index_wall_s", "indexing wall time (s)"),
        ("peak_rss_mb", "peak RSS while indexing (MB)"),
        ("disk_bytes_per_chunk", "disk per chunk (bytes)"),
    )
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for axis, (key, label) in zip(axes, panels):
        for kind in ("faiss", "lancedb"):
            points = sorted((r["chunks"], r["stores"][kind]["indexing"][key]) for r in results if kind in r["stores"])
            if points:
                axis.plot(*zip(*points), marker="o", label=kind)
        axis.set_xscale("log")
        if key == "disk_bytes_per_chunk":
            axis.set_ylim(bottom=0)
        else:
            axis.set_yscale("log")
        axis.set_xlabel("chunks")
        axis.set_title(label, fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    figure.suptitle("isotrope scale benchmark (2 shared cores; the load of each run is in docs/SCALING.md)", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> None:
    if sys.argv[1:2] == ["--table"]:
        print(markdown([json.loads(Path(p).read_text()) for p in sys.argv[2:]]))
        return
    if sys.argv[1:2] == ["--plot"]:  # --plot OUT.png RESULT.json ...
        plot([json.loads(Path(p).read_text()) for p in sys.argv[3:]], Path(sys.argv[2]))
        return
    if "--child" in sys.argv:
        parser = child_parser("one step of the scale benchmark")
        parser.add_argument("--child", choices=sorted(CHILDREN), required=True)
        for name in ("--data-dir", "--kind", "--path", "--types"):
            parser.add_argument(name)
        parser.add_argument("--modes", default=MODES)
        parser.add_argument("--encoder", type=Path)
        for name in ("--chunks", "--queries", "--single", "--batch-repeats", "--chunk-tokens", "--nprobe"):
            parser.add_argument(name, type=int)
        child_main(parser, lambda args: CHILDREN[args.child](args))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, required=True)
    parser.add_argument("--data-dir", required=True, help="the shared data folder (holds corpus/)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--encoder", type=Path, help="a saved encoder folder (e.g. fitted with --model fast)")
    parser.add_argument("--stores", default="faiss,lancedb")
    parser.add_argument("--threads", type=int, default=2, help="threads for indexing")
    parser.add_argument(
        "--search-threads",
        type=int,
        default=1,
        help="threads for search (1: on a shared machine, OpenMP hand-offs dominate small searches)",
    )
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--single", type=int, default=200, help="single queries timed per side")
    parser.add_argument("--batch-repeats", type=int, default=5)
    parser.add_argument("--workdir", help="where the stores are written (a temporary folder inside it)")
    parser.add_argument("--keep", action="store_true", help="keep the stores")
    parser.add_argument(
        "--chunk-tokens", type=int, default=256, help="token budget per chunk (index_documents' default; 0: a chunk per passage)"
    )
    parser.add_argument("--faiss-types", default=DEFAULT_TYPES["faiss"], help="FAISS index types to search")
    parser.add_argument("--lancedb-types", default=DEFAULT_TYPES["lancedb"], help="LanceDB index types to search")
    parser.add_argument("--nprobe", type=int, help="FAISS IVF lists probed, instead of the calibrated breadth")
    parser.add_argument("--modes", default=MODES, help="search modes measured (dense always runs): dense,keyword,hybrid")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    run(
        args.chunks,
        args.data_dir,
        args.out,
        args.encoder,
        args.stores.split(","),
        args.threads,
        args.search_threads,
        args.queries,
        args.single,
        args.batch_repeats,
        args.workdir,
        args.keep,
        {"faiss": args.faiss_types, "lancedb": args.lancedb_types},
        args.chunk_tokens,
        args.nprobe,
        args.modes,
        " ".join(["python -m benchmarks.scale", *(argv if argv is not None else sys.argv[1:])]),
    )


if __name__ == "__main__":
    main()
