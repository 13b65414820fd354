"""Hybrid retrieval on SciFact through the stores (issue 17): tune the fusion on TRAIN, report on TEST.

``tune``: the SciFact *train* queries (the test split is never read), hybrid nDCG@10 through a
FAISS store for each alpha of a grid and for reciprocal-rank fusion, per encoder; the default
frozen in :mod:`isotrope.fusion` is the alpha with the best mean over the encoders.
``test``: dense / lexical / hybrid nDCG@10 on the *test* queries in both stores with the frozen
defaults (the two encoders above and ``--model fast``), beside bm25s (English Snowball stemmer and stop words) as the peer baseline.
``sets``: the held-out sets (BEIR folders, e.g. from benchmarks/build_retrieval_sets.py), each on its test
qrels with the frozen defaults: dense / lexical / hybrid in both stores for all-MiniLM-L6-v2 and
``--model fast`` (distilled on that set's corpus), one set at a time.

    python -m benchmarks.hybrid tune --data-dir DATA [--cache-dir .cache/isotrope] [--out F.json]
    python -m benchmarks.hybrid test --data-dir DATA [--cache-dir .cache/isotrope] [--out F.json]
    python -m benchmarks.hybrid sets --sets DIR [DIR ...] [--cache-dir .cache/isotrope] [--out F.json]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks.common import print_and_write
from isotrope.config import EncoderConfig
from isotrope.evaluate.data import BeirDataset, load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.metrics import ndcg_at_k
from isotrope.evaluate.store_retrieval import beir_documents, eval_through_store

ENCODERS = {
    "all-MiniLM-L6-v2": EncoderConfig(model="all-MiniLM-L6-v2", shape="none"),
    "static:all-MiniLM-L6-v2 whiten-partial": EncoderConfig(model="static:all-MiniLM-L6-v2", shape="whiten-partial"),
}
SET_ENCODERS = {
    "all-MiniLM-L6-v2": EncoderConfig(model="all-MiniLM-L6-v2", shape="none"),
    "fast": EncoderConfig(model="fast", shape="whiten-partial"),
}
ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def fitted(evaluator: Evaluator, recipe: EncoderConfig, dataset: BeirDataset):
    _, texts = beir_documents(dataset)
    return evaluator.fit(recipe, texts)[0]


def bm25s_baseline(dataset: BeirDataset) -> float:
    """nDCG@10 of bm25s (Lucene BM25, k1 1.2, b 0.75) with PyStemmer's English stemmer and English stop words."""
    import bm25s
    import Stemmer

    ids, texts = beir_documents(dataset)
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
    query_ids = list(dataset.queries)
    tokens = bm25s.tokenize([dataset.queries[q] for q in query_ids], stopwords="en", stemmer=stemmer, show_progress=False)
    docs, scores = retriever.retrieve(tokens, k=100, show_progress=False)
    run = {q: {ids[d]: float(s) for d, s in zip(row_d, row_s)} for q, row_d, row_s in zip(query_ids, docs, scores)}
    return round(100 * ndcg_at_k(run, dataset.qrels, 10), 2)


def tune(dataset: BeirDataset, evaluator: Evaluator) -> dict:
    out: dict = {"split": "train", "queries": len(dataset.queries), "encoders": {}}
    for name, recipe in ENCODERS.items():
        encoder = fitted(evaluator, recipe, dataset)
        result = eval_through_store(encoder, dataset, ["faiss"], ["dense", "lexical", "hybrid"], ALPHAS, ("convex", "rrf"))
        out["encoders"][name] = {label: s["ndcg@10"] for label, s in result["faiss"].items()}
    mean = {a: sum(e[f"hybrid@{a}"] for e in out["encoders"].values()) / len(ENCODERS) for a in ALPHAS}
    out["mean hybrid ndcg@10 by alpha"] = {str(a): round(v, 2) for a, v in mean.items()}
    out["chosen alpha"] = max(ALPHAS, key=lambda a: mean[a])
    return out


def test(dataset: BeirDataset, evaluator: Evaluator) -> dict:
    out: dict = {"split": "test", "queries": len(dataset.queries), "bm25s ndcg@10": bm25s_baseline(dataset)}
    for name, recipe in {**ENCODERS, "fast": SET_ENCODERS["fast"]}.items():
        encoder = fitted(evaluator, recipe, dataset)
        tick = time.perf_counter()
        result = eval_through_store(
            encoder, dataset, ["faiss", "lancedb"], ["dense", "lexical", "hybrid"], fusions=("convex", "rrf")
        )
        out[name] = {kind: {label: s["ndcg@10"] for label, s in modes.items()} for kind, modes in result.items()}
        out[name]["seconds"] = round(time.perf_counter() - tick, 1)
    return out


#: hybrid is also recorded at these weights (``hybrid@A``), to show how flat the optimum is; ``hybrid@None``
#: is the frozen default of the encoder's family, the figure reported
GRID = tuple(round(0.1 * i, 1) for i in range(1, 10))


def held_out(folders: list[Path], evaluator: Evaluator, out: Path | None) -> dict:
    """Each set's test qrels, both encoders, both stores, the frozen defaults (written after every set)."""
    result: dict = {}
    for folder in folders:
        dataset = load_beir(folder, "test")
        row: dict = {"queries": len(dataset.queries), "documents": len(dataset.corpus)}
        for name, recipe in SET_ENCODERS.items():
            tick = time.perf_counter()
            encoder = fitted(evaluator, recipe, dataset)
            scores = eval_through_store(
                encoder, dataset, ["faiss", "lancedb"], ["dense", "lexical", "hybrid"], alphas=(None, *GRID)
            )
            row[name] = {kind: {label: s["ndcg@10"] for label, s in modes.items()} for kind, modes in scores.items()}
            row[name]["seconds"] = round(time.perf_counter() - tick, 1)
        result[folder.name] = row
        print_and_write(result, out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("tune", "test", "sets"))
    parser.add_argument("--data-dir", type=Path, help="root holding retrieval/scifact (tune, test)")
    parser.add_argument("--sets", type=Path, nargs="+", default=[], help="BEIR folders (sets)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/isotrope"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.step == "sets":
        held_out(args.sets, Evaluator(cache_dir=args.cache_dir), args.out)
        return
    if args.data_dir is None:
        parser.error(f"{args.step} needs --data-dir")
    dataset = load_beir(args.data_dir / "retrieval" / "scifact", "train" if args.step == "tune" else "test")
    evaluator = Evaluator(cache_dir=args.cache_dir)
    result = (tune if args.step == "tune" else test)(dataset, evaluator)
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
