"""Fusion rules compared offline on exact score matrices (benchmarks/hybrid_scores.py), issue 17.

For every query the candidates are the union of the dense and the lexical top ``depth``. A rule is

* ``completion``: ``list`` (the shipped fusion: each side normalised over its own list, a candidate
  missing from a list gets 0 after min-max, the list's lowest after z-score) or ``exact`` (every candidate's
  exact score on both sides, normalised over the union);
* ``norm``: ``minmax`` or ``zscore``;
* ``weight``: ``fixed`` (``alpha``) or ``peak`` (per query, ``alpha`` rescaled by how far each side's best
  score stands above its other candidates: ``alpha * p_d / (alpha * p_d + (1 - alpha) * p_l)`` with
  ``p = (s_1 - mean) / std`` over the side's own top ``depth``).

The rule is chosen on SciFact's *train* queries only (best mean nDCG@10 over the encoders; the shipped
one is the best with a fixed weight, see docs/results/hybrid.md for why ``peak`` was not adopted);
every other split and set is reported with it.

    python -m benchmarks.hybrid_fusions --scores .cache/scores --data-dir DATA --sets DIR ... --out F.json
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import numpy as np

from benchmarks.common import print_and_write
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.metrics import ndcg_at_k

ALPHAS = tuple(round(0.05 * i, 2) for i in range(1, 20))
DEPTHS = (50, 100, 200)
COMPLETIONS = ("list", "exact")
NORMS = ("minmax", "zscore")
WEIGHTS = ("fixed", "peak")


def top(scores: np.ndarray, depth: int, positive: bool = False) -> np.ndarray:
    order = np.argsort(-scores, kind="stable")[:depth]
    return order[scores[order] > 0] if positive else order


def normalise(values: np.ndarray, norm: str) -> np.ndarray:
    if norm == "minmax":
        span = values.max() - values.min()
        return np.ones_like(values) if span == 0 else (values - values.min()) / span
    std = values.std()
    return np.zeros_like(values) if std == 0 else (values - values.mean()) / std


def peak(values: np.ndarray) -> float:
    std = values.std() if len(values) > 1 else 0.0
    return 0.0 if std == 0 else float((values.max() - values.mean()) / std)


def side(scores: np.ndarray, own: np.ndarray, union: np.ndarray, completion: str, norm: str) -> np.ndarray:
    """One side's normalised value for each candidate of ``union``."""
    if completion == "exact":
        return normalise(scores[union].astype(np.float64), norm)
    out = np.zeros(len(union))
    if len(own) == 0:
        return out
    values = normalise(scores[own].astype(np.float64), norm)
    if norm == "zscore":
        out[:] = values.min()
    position = {int(d): n for n, d in enumerate(own)}
    for n, d in enumerate(union.tolist()):
        if d in position:
            out[n] = values[position[d]]
    return out


def runs_for(dense: np.ndarray, lexical: np.ndarray, doc_ids: np.ndarray, depth: int, completion: str, norm: str, weight: str):
    """``alpha -> query row -> {doc: fused}`` (top 10) for one rule."""
    out = {a: [] for a in ALPHAS}
    for d_row, l_row in zip(dense, lexical):
        d_own, l_own = top(d_row, depth), top(l_row, depth, positive=True)
        union = np.array(list(dict.fromkeys(d_own.tolist() + l_own.tolist())))
        d_val = side(d_row, d_own, union, completion, norm)
        l_val = side(l_row, l_own, union, completion, norm)
        p_d = peak(d_row[d_own].astype(np.float64))
        p_l = peak(l_row[l_own].astype(np.float64)) if len(l_own) else 0.0
        for a in ALPHAS:
            w = a
            if weight == "peak":
                total = a * p_d + (1 - a) * p_l
                w = a if total == 0 else a * p_d / total
            fused = w * d_val + (1 - w) * l_val
            best = np.argsort(-fused, kind="stable")[:10]
            out[a].append({str(doc_ids[union[j]]): float(fused[j]) for j in best})
    return out


def evaluate(path: Path, splits: dict) -> dict:
    data = np.load(path)
    dense, lexical, doc_ids, query_ids = data["dense"], data["lexical"], data["doc_ids"], data["query_ids"]
    row_of = {str(q): n for n, q in enumerate(query_ids)}
    result: dict = {}

    def score(rows: list[dict], name: str) -> float:
        qrels = splits[name].qrels
        return round(100 * ndcg_at_k({q: rows[row_of[q]] for q in qrels}, qrels, 10), 2)

    for label, matrix in (("dense", dense), ("lexical", lexical)):
        rows = []
        for r in matrix:
            best = top(r, 10, positive=label == "lexical")
            rows.append({str(doc_ids[j]): float(r[j]) for j in best})
        result[label] = {name: score(rows, name) for name in splits}
    for depth, completion, norm, weight in itertools.product(DEPTHS, COMPLETIONS, NORMS, WEIGHTS):
        runs = runs_for(dense, lexical, doc_ids, depth, completion, norm, weight)
        for a, rows in runs.items():
            result[f"{completion}/{norm}/{weight}/{depth}@{a}"] = {name: score(rows, name) for name in splits}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scores", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sets", type=Path, nargs="*", default=[])
    parser.add_argument("--encoders", nargs="+", default=["all-MiniLM-L6-v2", "fast"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folders = [args.data_dir / "retrieval" / "scifact", *args.sets]
    result: dict = {}
    for folder in folders:
        splits = {s: load_beir(folder, s) for s in ("train", "test") if (folder / "qrels" / f"{s}.tsv").is_file()}
        for name in args.encoders:
            path = args.scores / f"{folder.name}__{name}.npz"
            if path.is_file():
                result.setdefault(folder.name, {})[name] = evaluate(path, splits)
    table = result.get("scifact", {})
    if table:
        labels = [k for k in next(iter(table.values())) if k not in ("dense", "lexical")]
        mean = {k: float(np.mean([t[k]["train"] for t in table.values()])) for k in labels}
        best = max(labels, key=lambda k: mean[k])
        fixed = max((k for k in labels if "/fixed/" in k), key=lambda k: mean[k])
        result["best rule"] = {"rule": best, "scifact train (mean)": round(mean[best], 2)}
        result["chosen (fixed weight)"] = {"rule": fixed, "scifact train (mean)": round(mean[fixed], 2)}
        ranking = sorted(labels, key=lambda k: -mean[k])[:15]
        result["best on scifact train"] = {k: round(mean[k], 2) for k in ranking}
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
