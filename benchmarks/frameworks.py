"""SciFact nDCG@10 through LangChain, LlamaIndex and a plain LanceDB table against `isotrope eval retrieval`,
and (``--timing``) each framework's per-query overhead over ``Collection.search``.

Quality (deterministic): one encoder (``--model``, ``--shape``, fitted on the corpus when it needs it);
the reference is the harness's store evaluation (``isotrope eval retrieval --mode dense --store KIND``:
:func:`~isotrope.evaluate.store_retrieval.eval_through_store`); each framework indexes the same documents
through its own API into a new store of the same kind (metric cosine) and answers every test query with
its retriever's top 10:

* LangChain: ``IsotropeVectorStore.from_texts(...)`` then ``as_retriever(search_kwargs={"k": 10}).invoke(q)``;
* LlamaIndex: ``IngestionPipeline([IsotropeEmbedding], vector_store=IsotropeVectorStore)`` then
  ``VectorStoreIndex.from_vector_store(...).as_retriever(similarity_top_k=10).retrieve(q)``, as LlamaIndex
  runs it (it embeds the query) and with the store's ``is_embedding_query=False`` (the store encodes the text);
* LanceDB: a plain table whose schema uses the registry's ``"isotrope"`` function, ``table.search(q)``
  (exact search: no vector index). ``--kind faiss`` does not apply to it; it is always LanceDB.

Timing (``--timing N``, an idle machine only): a ``--kind`` store of N chunks (SciFact abstracts repeated
under new ids) built once through ``Collection.add`` (``--rows llama_index``: through LlamaIndex's
``IsotropeVectorStore.add``, each row keeping its node in LlamaIndex's format); then, on that one store, the
median seconds per query (each answer dropped, as an application does) of ``Collection.search(q, k=10)``, the LangChain retriever and the LlamaIndex retriever (interleaved
rounds within each group holding the store, :func:`benchmarks.harness.alternate`), and each framework's
overhead in percent (target <= 10 %), against the first ``Collection`` and against ``Collection.search`` on
the framework's own handle. ``--profile N``: where the LlamaIndex retriever's time goes on a store of N
chunks (cProfile: every profiled microsecond per query given to the work shared with ``Collection.search``,
isotrope's adapter or llama-index-core, with the library code each called; the top functions, file:line).

    python -m benchmarks.frameworks --model static:all-MiniLM-L6-v2 [--kind faiss|lancedb] [--out F.json]
    python -m benchmarks.frameworks --model static:all-MiniLM-L6-v2 --timing 100000 --queries 300 --skip-quality
    python -m benchmarks.frameworks --model static:all-MiniLM-L6-v2 --profile 100000 --queries 300 --skip-quality
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import print_and_write
from benchmarks.harness import REPO_ROOT, alternate, set_threads
from isotrope.encoder import ShapedEncoder, default_shape
from isotrope.evaluate.data import BeirDataset, load_beir
from isotrope.evaluate.store_retrieval import beir_documents, eval_through_store, scores_of
from isotrope.search import Collection

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrieval" / "scifact"
K = 10
Run = dict[str, dict[str, float]]


def langchain_run(encoder: ShapedEncoder, dataset: BeirDataset, uri: str) -> Run:
    from isotrope.connectors.langchain import IsotropeEmbeddings, IsotropeVectorStore

    ids, texts = beir_documents(dataset)
    rows: list[dict[str, Any]] = [{"source": doc_id} for doc_id in ids]
    with IsotropeVectorStore.from_texts(texts, IsotropeEmbeddings(encoder), rows, ids=ids, uri=uri, metric="cosine") as store:
        scored = {qid: store.similarity_search_with_score(query, k=K) for qid, query in dataset.queries.items()}
        retriever = store.as_retriever(search_kwargs={"k": K})
        for qid, query in list(dataset.queries.items())[:20]:  # the retriever returns the same documents
            assert [d.id for d in retriever.invoke(query)] == [d.id for d, _ in scored[qid]], qid
    return {qid: {str(d.id): score for d, score in hits} for qid, hits in scored.items()}


def llama_retriever(store: Any) -> Any:
    """The top-``K`` retriever of a ``VectorStoreIndex`` over a LlamaIndex ``IsotropeVectorStore``."""
    from llama_index.core import VectorStoreIndex

    return VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model).as_retriever(similarity_top_k=K)


def llama_index_runs(encoder: ShapedEncoder, dataset: BeirDataset, uri: str, folder: Path) -> dict[str, Run]:
    """The LlamaIndex retriever's run, and its run with ``is_embedding_query=False`` (the store encodes the text)."""
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.schema import TextNode

    from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore

    ids, texts = beir_documents(dataset)
    embedding = IsotropeEmbedding.from_encoder(encoder, folder / "llama-encoder")
    store = IsotropeVectorStore(uri, embed_model=embedding, store_options={"metric": "cosine"})
    nodes = [TextNode(id_=doc_id, text=text) for doc_id, text in zip(ids, texts)]
    IngestionPipeline(transformations=[embedding], vector_store=store).run(nodes=nodes)
    retriever = llama_retriever(store)
    runs = {}
    for name, embeds in (("llama_index", True), ("llama_index_store_embeds", False)):
        store.is_embedding_query = embeds
        runs[name] = {
            qid: {hit.node.node_id: float(hit.score or 0.0) for hit in retriever.retrieve(q)}
            for qid, q in dataset.queries.items()
        }
    store.close()
    return runs


def lancedb_run(encoder: ShapedEncoder, dataset: BeirDataset, folder: Path) -> Run:
    import lancedb
    from lancedb.embeddings import get_registry
    from lancedb.pydantic import LanceModel, Vector

    import isotrope.connectors.lancedb_registry  # noqa: F401  registers "isotrope"

    encoder.save(folder / "lance-encoder")
    func = get_registry().get("isotrope").create(encoder=str(folder / "lance-encoder"))

    class Doc(LanceModel):
        doc_id: str
        text: str = func.SourceField()
        vector: Vector(func.ndims()) = func.VectorField()  # type: ignore[valid-type]

    ids, texts = beir_documents(dataset)
    table = lancedb.connect(folder / "lance-db").create_table("scifact", schema=Doc)
    table.add([{"doc_id": doc_id, "text": text} for doc_id, text in zip(ids, texts)])
    run = {}
    for qid, query in dataset.queries.items():
        hits = table.search(query).metric("cosine").limit(K).to_list()
        run[qid] = {hit["doc_id"]: 1.0 - hit["_distance"] for hit in hits}
    return run


def quality(encoder: ShapedEncoder, dataset: BeirDataset, kind: str) -> dict[str, Any]:
    reference = eval_through_store(encoder, dataset, kinds=[kind], modes=["dense"])[kind]["dense"]["ndcg@10"]
    out: dict[str, Any] = {"ndcg@10_eval_retrieval": reference}
    with tempfile.TemporaryDirectory(prefix="isotrope-frameworks-") as tmp:
        folder = Path(tmp)
        runs = {
            "langchain": langchain_run(encoder, dataset, f"{kind}:{folder / 'langchain'}"),
            **llama_index_runs(encoder, dataset, f"{kind}:{folder / 'llama'}", folder),
            "lancedb_registry": lancedb_run(encoder, dataset, folder),
        }
    for name, run in runs.items():
        ndcg = scores_of(run, dataset)["ndcg@10"]
        out[f"ndcg@10_{name}"] = ndcg
        out[f"difference_{name}"] = round(ndcg - reference, 2)
    out["within_0.1"] = all(abs(out[f"difference_{name}"]) <= 0.1 for name in runs)
    return out


def each(search: Callable[[str], Any], queries: list[str]) -> None:
    """``search`` every query, dropping each answer as an application does: a round that kept all its answers
    would let the garbage collector's full passes, which grow with the objects alive, fall on the side
    whose answers hold the most objects (a LlamaIndex node holds more than an isotrope ``Hit``)."""
    for query in queries:
        search(query)


def build_timing_store(encoder: ShapedEncoder, dataset: BeirDataset, uri: str, size: int, rows: str = "isotrope") -> None:
    """A store of ``size`` chunks (SciFact abstracts repeated under new ids). ``rows="isotrope"``: written through
    ``Collection.add``, as ``isotrope index`` writes them; ``"llama_index"``: ``TextNode``s with their source
    document, embedded by ``IsotropeEmbedding`` and written by LlamaIndex's ``IsotropeVectorStore.add``, as an
    ingestion pipeline writes them (each row keeps the node in LlamaIndex's format, rebuilt on every hit)."""
    ids, texts = beir_documents(dataset)
    parts = [range(start, min(start + 4096, size)) for start in range(0, size, 4096)]
    if rows == "llama_index":
        from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode

        from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore

        with tempfile.TemporaryDirectory(prefix="isotrope-frameworks-encoder-") as tmp:
            embedding = IsotropeEmbedding.from_encoder(encoder, Path(tmp) / "encoder")
            store = IsotropeVectorStore(uri, embed_model=embedding, store_options={"metric": "cosine"}, autocommit=False)
            for part in parts:
                source = [RelatedNodeInfo(node_id=ids[i % len(ids)]) for i in part]
                nodes = [
                    TextNode(
                        id_=f"{ids[i % len(ids)]}-{i}", text=texts[i % len(texts)], relationships={NodeRelationship.SOURCE: doc}
                    )
                    for i, doc in zip(part, source)
                ]
                store.add(embedding(nodes))
            store.persist()
            store.collection.optimize()
            store.close()
        return
    with Collection.create(uri, encoder, metric="cosine") as collection:
        for part in parts:
            collection.add([f"{ids[i % len(ids)]}-{i}" for i in part], [texts[i % len(texts)] for i in part], commit=False)
        collection.commit()
        collection.optimize()


def llama_sides(store: Any, queries: list[str]) -> dict[str, Callable[[], Any]]:
    """Rounds to interleave on one LlamaIndex store handle: ``Collection.search`` on the store's own collection,
    the retriever as LlamaIndex runs it (it embeds the query), and with ``is_embedding_query=False``
    (the store encodes the query text)."""
    retriever = llama_retriever(store)

    def retrieve(embeds: bool) -> None:
        store.is_embedding_query = embeds
        each(retriever.retrieve, queries)

    return {
        "collection_same_handle": lambda: each(lambda q: store.collection.search(q, k=K), queries),
        "llama_index": lambda: retrieve(True),
        "llama_index_store_embeds": lambda: retrieve(False),
    }


def timing(
    encoder: ShapedEncoder, dataset: BeirDataset, kind: str, size: int, n_queries: int, repeat: int, rows: str
) -> dict[str, Any]:
    from isotrope.connectors.langchain import IsotropeVectorStore as LangChainStore
    from isotrope.connectors.llama_index import IsotropeVectorStore as LlamaStore

    queries = list(dataset.queries.values())[:n_queries]
    with tempfile.TemporaryDirectory(prefix="isotrope-frameworks-timing-") as tmp:
        uri = f"{kind}:{Path(tmp) / 'store'}"
        build_timing_store(encoder, dataset, uri, size, rows)
        sides = {}
        with Collection.open(uri) as collection:
            sides.update(alternate({"collection": lambda: each(lambda q: collection.search(q, k=K), queries)}, repeat))
        with LangChainStore(uri) as store:
            retriever = store.as_retriever(search_kwargs={"k": K})
            langchain = {
                "collection_langchain_handle": lambda: store.run(lambda c: each(lambda q: c.search(q, k=K), queries)),
                "langchain": lambda: each(retriever.invoke, queries),
            }
            sides.update(alternate(langchain, repeat))
        llama_store = LlamaStore(uri)
        sides.update(alternate(llama_sides(llama_store, queries), repeat))
        llama_store.close()

    per_query = {name: result["median_s"] / len(queries) for name, result in sides.items()}
    baselines = {
        "langchain": "collection_langchain_handle",
        "llama_index": "collection_same_handle",
        "llama_index_store_embeds": "collection_same_handle",
    }
    return {
        "chunks": size,
        "rows": rows,
        "queries": len(queries),
        "repeat": repeat,
        "ms_per_query": {name: round(1000 * value, 3) for name, value in per_query.items()},
        "overhead_percent": {name: round(100 * (per_query[name] / per_query["collection"] - 1), 1) for name in baselines},
        "overhead_percent_same_handle": {
            name: round(100 * (per_query[name] / per_query[base] - 1), 1) for name, base in baselines.items()
        },
        "note": "Collection.open, the LangChain group and the LlamaIndex group hold the store in turn (the "
        "single-writer lock); within each group, rounds are interleaved with Collection.search on that group's "
        "own handle (overhead_percent_same_handle); run on an idle machine",
    }


#: code that does the work Collection.search does too (the query's encoding, the store search)
_SHARED = (
    "/src/isotrope/",
    "_store.py",
    "_rows.py",
    "faiss/",
    "lance/",
    "lancedb/",
    "pyarrow/",
    "tokenizers/",
    "transformers/",
    "threadpoolctl",
    "torch/",
)
SHARED = "shared with Collection.search (encode, store search)"
ADAPTER = "isotrope's LlamaIndex adapter (connectors/llama_index.py)"
LLAMA_INDEX = "llama-index-core (retriever, schema, callbacks, instrumentation)"
LOOP = "benchmark loop"

Function = tuple[str, int, str]  # cProfile's (file, line, name)


def _owner(filename: str) -> str | None:
    """Who owns code in ``filename``; None for code that works for its caller (the standard library, pydantic,
    numpy, wrapt, C built-ins), whose time goes to whoever called it."""
    if filename.endswith("connectors/llama_index.py"):
        return ADAPTER
    if filename.endswith("benchmarks/frameworks.py"):
        return LOOP
    if any(part in filename for part in _SHARED):
        return SHARED
    if "site-packages/llama_index" in filename:  # llama_index.core and llama_index_instrumentation
        return LLAMA_INDEX
    return None


def _anchors(stats: dict[Function, Any]) -> Callable[[Function], dict[Function, float]]:
    """For each function, the owned functions its time goes to, as weights summing to 1: itself when it is owned,
    else its callers' anchors weighted by the time each call edge carried (cProfile's per-caller cumulative time);
    a recursive cycle of unowned code goes to the owned code that entered it. Empty when no owned code is found."""
    memo: dict[tuple[Function, frozenset[Function]], dict[Function, float]] = {}

    def anchors(func: Function, visiting: frozenset[Function] = frozenset()) -> dict[Function, float]:
        if _owner(func[0]) is not None or func not in stats:
            return {func: 1.0}
        key = (func, visiting)
        if key not in memo:
            inner = visiting | {func}
            out: dict[Function, float] = {}
            for caller, edge in stats[func][4].items():
                if caller not in inner:
                    for anchor, weight in anchors(caller, inner).items():
                        out[anchor] = out.get(anchor, 0.0) + weight * edge[3]
            total = sum(out.values())
            memo[key] = {anchor: weight / total for anchor, weight in out.items()} if total > 0 else {}
        return memo[key]

    return anchors


def attribute(stats: dict[Function, Any]) -> dict[Function, float]:
    """Every profiled second, given to an owned function: its own self time, plus the self time of the unowned code
    it called (split between callers by the self time each call edge carried, then up by cumulative time)."""
    anchors = _anchors(stats)
    seconds: dict[Function, float] = {}
    for func, (_, _, self_time, _, callers) in stats.items():
        if _owner(func[0]) is not None or not callers:
            seconds[func] = seconds.get(func, 0.0) + self_time
            continue
        for caller, edge in callers.items():
            for anchor, weight in (anchors(caller) or {func: 1.0}).items():
                seconds[anchor] = seconds.get(anchor, 0.0) + edge[2] * weight
    return seconds


def profile_llama(store: Any, queries: list[str], top: int = 25) -> dict[str, Any]:
    """Where the LlamaIndex retriever's time goes, from cProfile over ``queries`` (after one untimed pass): every
    profiled microsecond per query, given to its owner (:func:`_owner`: the work ``Collection.search`` does too,
    isotrope's adapter, llama-index-core) with the unowned library code each called (:func:`attribute`), and the
    ``top`` owned functions outside the shared work, each as file:line with what it called. Shares are meaningful
    on a loaded machine; the profiler's own cost per call inflates the many small calls."""
    retriever = llama_retriever(store)

    each(retriever.retrieve, queries)
    profiler = cProfile.Profile()
    profiler.runcall(each, retriever.retrieve, queries)
    stats: dict[Function, Any] = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    n = len(queries)
    seconds = attribute(stats)
    total = sum(seconds.values())
    owners: dict[str, float] = {}
    for func, spent in seconds.items():
        owner = _owner(func[0]) or "unattributed"
        owners[owner] = owners.get(owner, 0.0) + spent
    adapter_calls_into_llama_index = sum(
        edge[3]
        for func, entry in stats.items()
        if _owner(func[0]) == LLAMA_INDEX
        for caller, edge in entry[4].items()
        if _owner(caller[0]) == ADAPTER
    )
    functions = sorted(
        ((spent, func) for func, spent in seconds.items() if _owner(func[0]) in (ADAPTER, LLAMA_INDEX)), reverse=True
    )
    us = lambda seconds: round(1e6 * seconds / n, 1)  # noqa: E731
    share = lambda seconds: round(100 * seconds / total, 1)  # noqa: E731
    return {
        "queries": n,
        "profiled_us_per_query": us(total),
        "by_owner": {
            owner: {"profiled_us_per_query": us(t), "share_percent": share(t)}
            for owner, t in sorted(owners.items(), key=lambda item: -item[1])
        },
        "llama_index_code_called_by_the_adapter_us_per_query": us(adapter_calls_into_llama_index),
        "top_functions": [
            {
                "function": f"{file.split('site-packages/')[-1].removeprefix(f'{REPO_ROOT}/')}:{line}({name})",
                "owner": _owner(file),
                "calls_per_query": round(stats[(file, line, name)][1] / n, 1),
                "us_per_query_with_what_it_called": us(spent),
                "share_percent": share(spent),
            }
            for spent, (file, line, name) in functions[:top]
        ],
    }


def profile(encoder: ShapedEncoder, dataset: BeirDataset, kind: str, size: int, n_queries: int, rows: str) -> dict[str, Any]:
    from isotrope.connectors.llama_index import IsotropeVectorStore as LlamaStore

    with tempfile.TemporaryDirectory(prefix="isotrope-frameworks-profile-") as tmp:
        uri = f"{kind}:{Path(tmp) / 'store'}"
        build_timing_store(encoder, dataset, uri, size, rows)
        store = LlamaStore(uri)
        try:
            return {"chunks": size, "rows": rows, **profile_llama(store, list(dataset.queries.values())[:n_queries])}
        finally:
            store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    parser.add_argument("--model", default="static:all-MiniLM-L6-v2")
    parser.add_argument("--shape", help="the shaping (default: the model family's, fitted on the corpus)")
    parser.add_argument("--kind", choices=("faiss", "lancedb"), default="faiss", help="the isotrope store kind")
    parser.add_argument("--timing", type=int, metavar="N", help="also time per-query overhead on a store of N chunks")
    parser.add_argument("--queries", type=int, default=300, help="queries per timed round")
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per side")
    parser.add_argument("--profile", type=int, metavar="N", help="profile the LlamaIndex retriever on a store of N chunks")
    parser.add_argument(
        "--rows",
        choices=("isotrope", "llama_index"),
        default="isotrope",
        help="how the timing or profile store is written: Collection.add, or LlamaIndex's IsotropeVectorStore.add",
    )
    parser.add_argument("--skip-quality", action="store_true", help="the timing or profile only")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the JSON result here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    set_threads(args.threads)

    dataset = load_beir(args.data, "test")
    encoder = ShapedEncoder.create(args.model, shape=args.shape or default_shape(args.model))
    if encoder.needs_corpus:
        encoder.fit(beir_documents(dataset)[1], fitted_on="SciFact corpus")
    result: dict[str, Any] = {"model": args.model, "shape": encoder.shape, "kind": args.kind, "queries": len(dataset.queries)}
    if not args.skip_quality:
        result["quality"] = quality(encoder, dataset, args.kind)
    if args.timing:
        result["timing"] = timing(encoder, dataset, args.kind, args.timing, args.queries, args.repeat, args.rows)
    if args.profile:
        result["llama_index_profile"] = profile(encoder, dataset, args.kind, args.profile, args.queries, args.rows)
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
