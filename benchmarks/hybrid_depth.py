"""Hybrid search's quality against its candidate depths (issue #32): how many candidates each side must give.

Hybrid search fuses the union of the dense top ``candidates`` and the keyword top ``keyword_candidates``
(``isotrope.fusion``: :data:`~isotrope.fusion.DEFAULT_CANDIDATES` and
:func:`~isotrope.fusion.keyword_depth` of it); the keyword side's cost grows with its depth (its early stop
prunes less the lower the k-th score). A depth is ``DENSE/KEYWORD`` (``100`` alone: 100 a side). For each
retrieval set (BEIR folder) and model, the corpus is indexed into a FAISS store as ``isotrope eval retrieval
--mode hybrid`` does, and hybrid's nDCG@10 is scored at each depth, at the frozen alpha and at the alpha of
the store's own default search (when that is hybrid), with each depth's paired difference from the first
(95 % bootstrap interval). Every split with qrels is scored: SciFact's ``train`` queries are the tuning set
(the fusion defaults were chosen on them), every ``test`` split is report-only. Quality only, deterministic::

    OMP_NUM_THREADS=2 python -m benchmarks.hybrid_depth --data-dir ../shared/data \\
        --sets retrieval/scifact .cache/isotrope/sets/sick-para .cache/isotrope/sets/stsb-para \\
        .cache/isotrope/sets/20ng-topic .cache/isotrope/sets/scifact-lower --models all-MiniLM-L6-v2 fast \\
        --depths 200/200,200/100,100/100,200/50,100/50 --cache-dir .cache/isotrope \\
        --out benchmarks/results/hybrid_depth_keyword.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.config import EncoderConfig
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.metrics import ndcg_at_k
from isotrope.evaluate.store_retrieval import beir_documents, index_documents
from isotrope.evaluate.tasks import document_text
from isotrope.fusion import DEFAULT_ALPHA, search_store
from isotrope.pseudo_queries import paired_interval
from isotrope.search import Collection

DEPTHS = ("200/200", "200/100", "100/100", "200/50", "100/50")
SPLITS = ("train", "test")
K = 10


def parse_depth(depth: str) -> tuple[int, int]:
    """``"200/100"``: 200 dense and 100 keyword candidates; ``"100"``: 100 a side."""
    dense, _, keyword = depth.partition("/")
    return int(dense), int(keyword or dense)


def per_query(
    collection: Collection, dataset: Any, vectors: np.ndarray, mode: str, alpha: float | None = None, depth: str = "0"
) -> np.ndarray:
    """nDCG@10 (x100) of ``mode`` for each judged query (in qrels order; ``vectors``: the dataset's queries
    encoded, in its order), hybrid with the candidates ``depth`` names."""
    query_ids = list(dataset.queries)
    texts = [dataset.queries[q] for q in query_ids]
    dense, keyword = parse_depth(depth)
    hits = search_store(
        collection.store, texts, vectors, K, mode=mode, alpha=alpha, candidates=max(dense, K), keyword_candidates=keyword
    )
    run = {q: {h.id: h.score for h in row} for q, row in zip(query_ids, hits)}
    return np.array([100.0 * ndcg_at_k({q: run.get(q, {})}, {q: judged}, K) for q, judged in dataset.qrels.items()])


def by_depth(collection: Collection, dataset: Any, vectors: np.ndarray, alpha: float, depths: Sequence[str]) -> dict[str, Any]:
    """Hybrid's nDCG@10 at each depth, and each later depth's paired difference from the first (mean and
    95 % bootstrap interval over the queries)."""
    scores = {depth: per_query(collection, dataset, vectors, "hybrid", alpha, depth) for depth in depths}
    first = scores[depths[0]]
    intervals = {d: [round(x, 2) for x in paired_interval(scores[d] - first)] for d in depths[1:]}
    return {"alpha": alpha, **{d: round(float(s.mean()), 2) for d, s in scores.items()}, "interval_vs_first": intervals}


def run(folder: Path, model: str, cache_dir: str | None, depths: Sequence[str]) -> dict[str, Any]:
    """One set and model: per split, dense, lexical and hybrid at each depth (frozen and default alpha)."""
    splits = {s: load_beir(folder, s) for s in SPLITS if (folder / "qrels" / f"{s}.tsv").is_file()}
    corpus = next(iter(splits.values()))
    documents = [text for text in map(document_text, corpus.corpus.values()) if text]
    encoder, _ = Evaluator(cache_dir=cache_dir).fit(EncoderConfig(model=model), documents)
    ids, texts = beir_documents(corpus)
    result: dict[str, Any] = {"set": folder.name, "model": model, "depths": list(depths), "splits": {}}
    with (
        tempfile.TemporaryDirectory(prefix="isotrope-depth-") as tmp,
        Collection.create(f"faiss:{Path(tmp) / 'faiss'}", encoder, metric="cosine") as collection,
    ):
        index_documents(collection, ids, texts, encoder.encode(texts, kind="document"))
        collection.fit_default_search()  # as `isotrope index` does: the store's own choice, no label read
        mode, alpha, _ = collection.default_search()
        result["default_search"] = {"mode": mode, "alpha": alpha}
        alphas = {"frozen": DEFAULT_ALPHA, **({"default": alpha} if mode == "hybrid" else {})}
        for split, dataset in splits.items():
            vectors = encoder.encode(list(dataset.queries.values()), kind="query")  # once for every mode and depth
            row: dict[str, Any] = {
                "queries": len(dataset.queries),
                "role": "tuning" if split == "train" else "report-only",
                **{mode: round(float(per_query(collection, dataset, vectors, mode).mean()), 2) for mode in ("dense", "lexical")},
            }
            for name, value in alphas.items():
                row[f"hybrid_{name}"] = by_depth(collection, dataset, vectors, value, depths)
            result["splits"][split] = row
            print(json.dumps({"set": folder.name, "model": model, "split": split, **row}), flush=True)
    return result


def table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown: set x model x split rows, hybrid's nDCG@10 at each depth and its change from the first (a
    result of the earlier form, one depth a side and ``interval_vs_largest``: from the largest, listed last)."""
    listed = results[0]["depths"] if results else list(DEPTHS)
    depths = [str(d) for d in listed]
    reference = depths[-1] if isinstance(listed[0], int) else depths[0]  # the earlier form: ints, the largest last
    head = " | ".join(f"hybrid @{d}" for d in depths)
    lines = [f"| set | split (role) | encoder | alpha | dense | lexical | {head} |", "|---" * (6 + len(depths)) + "|"]
    for result in results:
        for split, row in result["splits"].items():
            for name in ("frozen", "default"):
                hybrid = row.get(f"hybrid_{name}")
                if hybrid is None or (name == "default" and hybrid["alpha"] == DEFAULT_ALPHA):  # the frozen row's
                    continue
                base = hybrid[reference]
                intervals = hybrid.get("interval_vs_first", hybrid.get("interval_vs_largest", {}))
                cells = [
                    f"{hybrid[d]:.2f}"
                    if d == reference
                    else f"{hybrid[d]:.2f} ({_difference(hybrid[d] - base, intervals.get(d))})"
                    for d in depths
                ]
                lines.append(
                    f"| {result['set']} | {split} ({row['role']}) | {result['model']} | {hybrid['alpha']} ({name}) | "
                    f"{row['dense']:.2f} | {row['lexical']:.2f} | {' | '.join(cells)} |"
                )
    return "\n".join(lines)


def _difference(change: float, interval: Sequence[float] | None) -> str:
    """A depth's change from the reference depth, with its paired interval where the run recorded one."""
    return f"{change:+.2f}" if interval is None else f"{interval[0]:+.2f} [{interval[1]:+.2f}, {interval[2]:+.2f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="the shared data folder (sets named relative to it)")
    parser.add_argument("--sets", nargs="+", required=True, help="BEIR folders (relative to --data-dir, or paths)")
    parser.add_argument("--models", nargs="+", default=["all-MiniLM-L6-v2"])
    parser.add_argument(
        "--depths", default=",".join(DEPTHS), help="DENSE/KEYWORD candidates, comma-separated; the first is the reference"
    )
    parser.add_argument("--cache-dir")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", action="store_true", help="print the table of an existing --out file")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.out.read_text())))
        return
    depths = args.depths.split(",")
    results = []
    for name in args.sets:
        folder = args.data_dir / name if (args.data_dir / name).is_dir() else Path(name)
        for model in args.models:
            results.append(run(folder, model, args.cache_dir, depths))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
