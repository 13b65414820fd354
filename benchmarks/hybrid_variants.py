"""Fusion variants on SciFact through the FAISS store: chosen on TRAIN queries, every one also reported on TEST.

The dense and the lexical candidate lists (200 each) of every SciFact query are taken once per encoder
from a FAISS store (``isotrope.fusion.search_store``, modes ``dense`` and ``lexical``); each variant then
fuses the same lists:

* ``convex/<norm>/<depth>``: ``alpha * norm(dense) + (1 - alpha) * norm(lexical)`` over the first
  ``depth`` candidates of each list, for ``norm`` = ``minmax`` (the shipped one; a missing hit gets 0),
  ``zscore`` (``(s - mean) / std``; a missing hit gets the list's lowest), ``dbsf`` (distribution-based:
  ``(s - (mean - 3 std)) / (6 std)``, a missing hit 0) and ``max`` (``s / max``, a missing hit 0);
* ``rrf/<rrf_k>``: reciprocal-rank fusion over the first 100 candidates of each list.

The rule, fixed before the run: per encoder family, the variant with the best train nDCG@10 (for the
static family, the best mean over its two encoders); the test figures are printed beside and pick nothing.

    python -m benchmarks.hybrid_variants --data-dir DATA [--cache-dir .cache/isotrope] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.common import print_and_write
from benchmarks.hybrid import fitted
from isotrope.config import EncoderConfig
from isotrope.evaluate.data import BeirDataset, load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.metrics import ndcg_at_k
from isotrope.evaluate.store_retrieval import beir_documents, index_documents
from isotrope.fusion import reciprocal_rank_fusion, search_store
from isotrope.search import Collection
from isotrope.stores.base import Hit

FAMILIES = {
    "transformer": {"all-MiniLM-L6-v2": EncoderConfig(model="all-MiniLM-L6-v2", shape="none")},
    "static": {
        "static:all-MiniLM-L6-v2 whiten-partial": EncoderConfig(model="static:all-MiniLM-L6-v2", shape="whiten-partial"),
        "fast": EncoderConfig(model="fast", shape="whiten-partial"),
    },
}
ALPHAS = tuple(round(0.05 * i, 2) for i in range(1, 20))
NORMS = ("minmax", "zscore", "dbsf", "max")
DEPTHS = (20, 50, 100, 200)
RRF_KS = (1, 5, 10, 20, 40, 60, 100)
Lists = dict[str, tuple[list[Hit], list[Hit]]]


def normalised(scores: np.ndarray, norm: str) -> tuple[np.ndarray, float]:
    """One list's scores normalised by ``norm``, and the value a hit missing from the list gets."""
    if norm == "minmax":
        span = scores.max() - scores.min()
        return (np.ones_like(scores) if span == 0 else (scores - scores.min()) / span), 0.0
    std = scores.std()
    if norm == "zscore":
        z = np.zeros_like(scores) if std == 0 else (scores - scores.mean()) / std
        return z, float(z.min())
    if norm == "dbsf":
        return (np.ones_like(scores) if std == 0 else np.clip((scores - scores.mean() + 3 * std) / (6 * std), 0, 1)), 0.0
    top = scores.max()  # "max"
    return (np.ones_like(scores) if top == 0 else scores / top), 0.0


def convex_runs(dense: Sequence[Hit], lexical: Sequence[Hit], norm: str, k: int = 10) -> list[dict[str, float]]:
    """For each alpha of ALPHAS, the best ``k`` of ``alpha * norm(dense) + (1 - alpha) * norm(lexical)``."""
    ids = list(dict.fromkeys([h.id for h in dense] + [h.id for h in lexical]))
    position = {i: n for n, i in enumerate(ids)}
    sides = []
    for hits in (dense, lexical):
        column = np.zeros(len(ids))
        if hits:
            values, missing = normalised(np.array([h.score for h in hits], dtype=np.float64), norm)
            column[:] = missing
            column[[position[h.id] for h in hits]] = values
        sides.append(column)
    alphas = np.array(ALPHAS)[:, None]
    fused = alphas * sides[0][None, :] + (1 - alphas) * sides[1][None, :]
    order = np.argsort(-fused, axis=1, kind="stable")[:, :k]
    return [{ids[j]: float(fused[a, j]) for j in order[a]} for a in range(len(ALPHAS))]


def candidate_lists(encoder, dataset: BeirDataset, queries: dict[str, str], depth: int = 200) -> Lists:
    ids, texts = beir_documents(dataset)
    vectors = encoder.encode(texts, kind="document")
    query_ids, query_texts = list(queries), list(queries.values())
    with (
        tempfile.TemporaryDirectory(prefix="isotrope-variants-") as tmp,
        Collection.create(f"faiss:{Path(tmp) / 's'}", encoder, metric="cosine") as collection,
    ):
        index_documents(collection, ids, texts, vectors)
        query_vectors = encoder.encode(query_texts, kind="query")
        dense = search_store(collection.store, query_texts, query_vectors, depth, mode="dense")
        lexical = search_store(collection.store, query_texts, None, depth, mode="lexical")
    return {q: (d, t) for q, d, t in zip(query_ids, dense, lexical)}


def ndcg(run: dict[str, dict[str, float]], dataset: BeirDataset) -> float:
    return round(100 * ndcg_at_k({q: run[q] for q in dataset.qrels}, dataset.qrels, 10), 2)


def variants(lists: Lists, splits: dict[str, BeirDataset]) -> dict[str, dict[str, float]]:
    """``variant label -> split -> nDCG@10``."""
    out: dict[str, dict[str, float]] = {}

    def record(label: str, run: dict[str, dict[str, float]]) -> None:
        out[label] = {name: ndcg(run, data) for name, data in splits.items()}

    record("dense", {q: {h.id: h.score for h in d[:100]} for q, (d, _) in lists.items()})
    record("lexical", {q: {h.id: h.score for h in t[:100]} for q, (_, t) in lists.items()})
    for norm in NORMS:
        for depth in DEPTHS:
            per_query = {q: convex_runs(d[:depth], t[:depth], norm) for q, (d, t) in lists.items()}
            for n, alpha in enumerate(ALPHAS):
                record(f"convex/{norm}/{depth}@{alpha}", {q: runs[n] for q, runs in per_query.items()})
    for rrf_k in RRF_KS:
        record(
            f"rrf/{rrf_k}",
            {q: {h.id: h.score for h in reciprocal_rank_fusion([d[:100], t[:100]], 10, rrf_k)} for q, (d, t) in lists.items()},
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="root holding retrieval/scifact")
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/isotrope"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = args.data_dir / "retrieval" / "scifact"
    splits = {name: load_beir(folder, name) for name in ("train", "test")}
    queries = {q: text for data in splits.values() for q, text in data.queries.items()}
    evaluator = Evaluator(cache_dir=args.cache_dir)
    result: dict = {"queries": {name: len(data.queries) for name, data in splits.items()}, "encoders": {}}
    for family, encoders in FAMILIES.items():
        for name, recipe in encoders.items():
            tick = time.perf_counter()
            saved = args.cache_dir / f"hybrid_lists_{name.replace(' ', '_').replace(':', '_')}.json"
            if saved.is_file():  # the lists of an earlier run (ids and scores; the fusion needs nothing else)
                rows = json.loads(saved.read_text())
                lists = {q: tuple([Hit(i, s, "", {}) for i, s in side] for side in pair) for q, pair in rows.items()}
            else:
                lists = candidate_lists(fitted(evaluator, recipe, splits["train"]), splits["train"], queries)
                saved.write_text(json.dumps({q: [[(h.id, h.score) for h in side] for side in pair] for q, pair in lists.items()}))
            result["encoders"][name] = {
                "family": family,
                "variants": variants(lists, splits),
                "seconds": round(time.perf_counter() - tick, 1),
            }
            print(json.dumps({name: result["encoders"][name]["seconds"]}), flush=True)
    result["chosen"] = {}
    for family, encoders in FAMILIES.items():
        tables = [result["encoders"][name]["variants"] for name in encoders]
        fused = [label for label in tables[0] if label not in ("dense", "lexical")]
        train = {label: np.mean([t[label]["train"] for t in tables]) for label in fused}
        best = max(fused, key=lambda label: train[label])
        result["chosen"][family] = {
            "variant": best,
            "train (mean)": round(float(train[best]), 2),
            "test": {name: result["encoders"][name]["variants"][best]["test"] for name in encoders},
        }
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
