"""Retrieval through the stores equals the harness's exact search (issue 4).

Indexes the SciFact corpus (one chunk per abstract, truncated by the encoder as the
harness does) into FAISS and LanceDB with all-MiniLM-L6-v2, searches the test queries
through ``Collection.search`` and compares nDCG@10 with ``isotrope eval retrieval``.
The backbone runs once per text thanks to the token-state cache.

    python -m benchmarks.scifact_stores --data-dir DATA [--cache-dir .cache/isotrope] [--out scifact_stores.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.cache import CachedBackbone
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import encode_function
from isotrope.evaluate.metrics import ndcg_at_k
from isotrope.evaluate.tasks import document_text, eval_retrieval
from isotrope.ingest.loaders import Document
from isotrope.ingest.pipeline import index_documents
from isotrope.search import Collection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="root holding retrieval/scifact")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/isotrope"))
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--shape", default="none")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    dataset = load_beir(args.data_dir / "retrieval" / "scifact")
    encoder = ShapedEncoder.create(args.model, shape=args.shape)
    encoder.backbone = CachedBackbone(encoder.backbone, args.cache_dir)
    if encoder.needs_corpus:
        encoder.fit_sample([document_text(doc) for doc in dataset.corpus.values()], fitted_on="SciFact corpus")
    results = {
        "model": args.model,
        "shape": args.shape,
        "harness ndcg@10": round(eval_retrieval(encode_function(encoder), dataset)["ndcg@10"], 2),
    }
    documents = [
        Document(source="corpus.jsonl", text=document_text(doc), metadata={"doc_id": doc_id}, position=i, id=doc_id)
        for i, (doc_id, doc) in enumerate(dataset.corpus.items())
    ]
    query_ids = list(dataset.queries)
    for kind in ("faiss", "lancedb"):
        with tempfile.TemporaryDirectory() as folder:
            uri = f"{kind}:{folder}/store"
            tick = time.perf_counter()
            index_documents(documents, uri, encoder=encoder, chunk_tokens=0, show_progress=False)
            with Collection.open(uri, encoder=encoder) as collection:
                hits = collection.search([dataset.queries[q] for q in query_ids], k=100)
            run = {q: {hit.metadata["doc_id"]: hit.score for hit in row} for q, row in zip(query_ids, hits)}
            results[f"{kind} ndcg@10"] = round(100 * ndcg_at_k(run, dataset.qrels, 10), 2)
            results[f"{kind} seconds"] = round(time.perf_counter() - tick, 1)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
