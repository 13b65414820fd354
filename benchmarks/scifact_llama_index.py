"""SciFact nDCG@10 through LlamaIndex against the evaluation harness, with one encoder.

LlamaIndex side: every corpus document becomes a ``TextNode`` (id = BEIR doc id, text =
``document_text``), an ``IngestionPipeline([IsotropeEmbedding], vector_store=IsotropeVectorStore)``
embeds and stores them, and ``VectorStoreIndex.from_vector_store(...).as_retriever(similarity_top_k=10)``
answers every test query. Harness side: :func:`isotrope.evaluate.tasks.eval_retrieval`.

The corpus is encoded once: by default the harness reuses the document vectors the pipeline
computed (the same encoder, in LlamaIndex's batches) and encodes the queries itself;
``--reencode`` makes the harness encode the corpus again on its own.

    python benchmarks/scifact_llama_index.py [--data DIR] [--store faiss|lancedb] [--reencode]
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
from llama_index.core import VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.schema import TextNode

from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore
from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.metrics import ndcg_at_k
from isotrope.evaluate.tasks import document_text, eval_retrieval

#: the project's data checkout beside the repository (``../shared/data``)
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "retrieval" / "scifact"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--shape", default="none", help="a shaping fitted on the corpus when it needs fitting")
    parser.add_argument("--store", choices=("faiss", "lancedb"), default="faiss")
    parser.add_argument("--reencode", action="store_true", help="the harness encodes the corpus again itself")
    parser.add_argument("--output", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    dataset = load_beir(args.data, "test")
    doc_ids = list(dataset.corpus)
    texts = [document_text(dataset.corpus[d]) for d in doc_ids]
    print(f"SciFact: {len(doc_ids)} documents, {len(dataset.queries)} test queries")

    with tempfile.TemporaryDirectory() as tmp:
        encoder = ShapedEncoder.create(args.model, shape=args.shape)
        if encoder.needs_corpus:
            encoder.fit(texts, fitted_on="SciFact corpus")
        embedding = IsotropeEmbedding.from_encoder(encoder, Path(tmp) / "encoder")
        store = IsotropeVectorStore(f"{args.store}:{tmp}/store", embed_model=embedding)

        tick = time.perf_counter()
        nodes = [TextNode(id_=doc_id, text=text) for doc_id, text in zip(doc_ids, texts)]
        nodes = IngestionPipeline(transformations=[embedding], vector_store=store).run(nodes=nodes, show_progress=True)
        index_s = time.perf_counter() - tick
        print(f"indexed {len(nodes)} nodes through IngestionPipeline in {index_s:.0f}s")

        tick = time.perf_counter()
        retriever = VectorStoreIndex.from_vector_store(store, embed_model=embedding).as_retriever(similarity_top_k=10)
        run = {
            qid: {hit.node.node_id: float(hit.score) for hit in retriever.retrieve(query)}
            for qid, query in dataset.queries.items()
        }
        llama_ndcg = 100.0 * ndcg_at_k(run, dataset.qrels, 10)
        retrieve_s = time.perf_counter() - tick

        vectors = {text: np.asarray(node.embedding, dtype=np.float32) for text, node in zip(texts, nodes)}

        def encode(batch: list[str], kind: str) -> np.ndarray:
            if kind == "document" and not args.reencode:
                return np.stack([vectors[text] for text in batch])
            return encoder.encode(batch, kind=kind)

        tick = time.perf_counter()
        harness = eval_retrieval(encode, dataset, k_values=(10,))
        harness_s = time.perf_counter() - tick

    figures = {
        "model": args.model,
        "shape": args.shape,
        "store": args.store,
        "reencode": args.reencode,
        "ndcg@10_llama_index": round(llama_ndcg, 3),
        "ndcg@10_harness": round(harness["ndcg@10"], 3),
        "difference": round(llama_ndcg - harness["ndcg@10"], 3),
        "index_s": round(index_s, 1),
        "retrieve_s": round(retrieve_s, 1),
        "harness_s": round(harness_s, 1),
    }
    print(f"nDCG@10 LlamaIndex retriever (top-10): {llama_ndcg:.2f}")
    print(f"nDCG@10 evaluation harness:             {harness['ndcg@10']:.2f}")
    print(json.dumps(figures))
    if args.output:
        args.output.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
