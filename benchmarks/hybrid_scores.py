"""Every query's exact dense and lexical score over every document, for choosing a fusion offline (issue 17).

For each retrieval set and encoder: the corpus is indexed into a FAISS store (the store code), the
lexical scores are the store's ``lexical_search`` over the whole corpus (FTS5 ``bm25()``, negated; 0 for a
document matching no query term), the dense scores the cosine of the encoder's query and document vectors
(what the exact store returns). Written as ``<out>/<set>__<encoder>.npz`` (``dense``, ``lexical``:
queries x documents; ``doc_ids``, ``query_ids``), one file per pair, skipped when present.

    python -m benchmarks.hybrid_scores --sets DIR [DIR ...] [--cache-dir .cache/isotrope] --out DIR
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.hybrid import SET_ENCODERS, fitted
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.store_retrieval import beir_documents, index_documents
from isotrope.search import Collection


def unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=Path, nargs="+", required=True, help="BEIR folders")
    parser.add_argument("--encoders", nargs="+", default=list(SET_ENCODERS), choices=list(SET_ENCODERS))
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/isotrope"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    evaluator = Evaluator(cache_dir=args.cache_dir)
    for name in args.encoders:
        for folder in args.sets:
            target = args.out / f"{folder.name}__{name}.npz"
            if target.is_file():
                continue
            tick = time.perf_counter()
            splits = [s for s in ("train", "test") if (folder / "qrels" / f"{s}.tsv").is_file()]
            datasets = [load_beir(folder, s) for s in splits]
            queries = {q: t for d in datasets for q, t in d.queries.items()}
            encoder = fitted(evaluator, SET_ENCODERS[name], datasets[-1])
            ids, texts = beir_documents(datasets[-1])
            docs = encoder.encode(texts, kind="document")
            query_ids, query_texts = list(queries), list(queries.values())
            dense = unit(encoder.encode(query_texts, kind="query")) @ unit(docs).T
            lexical = np.zeros_like(dense)
            position = {i: n for n, i in enumerate(ids)}
            with (
                tempfile.TemporaryDirectory(prefix="isotrope-scores-") as tmp,
                Collection.create(f"faiss:{Path(tmp) / 's'}", encoder, metric="cosine") as collection,
            ):
                index_documents(collection, ids, texts, docs)
                for row, hits in enumerate(collection.store.lexical_search(query_texts, len(ids))):
                    for hit in hits:
                        lexical[row, position[hit.id]] = hit.score
            np.savez_compressed(
                target,
                dense=dense.astype(np.float32),
                lexical=lexical.astype(np.float32),
                doc_ids=np.array(ids),
                query_ids=np.array(query_ids),
            )
            print(f"{target}: {len(query_ids)} queries x {len(ids)} documents, {time.perf_counter() - tick:.0f} s", flush=True)


if __name__ == "__main__":
    main()
