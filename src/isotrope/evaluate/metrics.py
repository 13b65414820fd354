"""Evaluation metrics: Spearman, V-measure, and graded retrieval metrics.

Retrieval metrics follow ``trec_eval`` as wrapped by ``pytrec_eval`` (what BEIR
and MTEB report):

* a run ``{qid: {docid: score}}`` is ranked per query by score descending, scores
  taken at float32 precision (trec_eval stores ``float sim``), and ties are
  broken by document id in *descending* string order (trec_eval's
  ``comp_sim_docno`` is ``strcmp(docno2, docno1)``); the order in which the
  run lists documents never matters;
* nDCG@k uses gain = relevance grade (linear, as ``ndcg_cut``), discount
  ``log2(rank + 1)``, and the ideal ranking built from the qrels' grades;
* recall@k and MRR@k count a document as relevant when its grade is at least
  ``relevance_level`` (pytrec_eval's default 1);
* scores are averaged over every query in the qrels (trec_eval ``-c``): a query
  absent from the run, or without a relevant document, scores 0.

Retrieval metrics return fractions in [0, 1]; ``spearman`` and ``v_measure``
return percentages (x100), the scale the papers report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy import stats
from sklearn.metrics import v_measure_score

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def spearman(predicted: Sequence[float] | np.ndarray, gold: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation x100 (average ranks for ties, as scipy)."""
    predicted, gold = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if predicted.ndim != 1 or predicted.shape != gold.shape:
        raise ValueError(f"spearman needs two 1-D arrays of equal length; got {predicted.shape} and {gold.shape}")
    if predicted.size < 2:
        raise ValueError("spearman needs at least 2 pairs")
    return float(stats.spearmanr(predicted, gold).statistic) * 100.0


def v_measure(labels_true: Sequence, labels_pred: Sequence) -> float:
    """V-measure x100 (scikit-learn, beta = 1)."""
    if len(labels_true) != len(labels_pred):
        raise ValueError(f"v_measure needs equal lengths; got {len(labels_true)} and {len(labels_pred)}")
    return float(v_measure_score(labels_true, labels_pred)) * 100.0


def rank_documents(scores: Mapping[str, float]) -> list[str]:
    """Document ids in trec_eval order: float32 score descending, then docid descending."""
    ids = list(scores)
    values = np.asarray([scores[i] for i in ids], dtype=np.float64)
    if not np.isfinite(values).all():
        bad = ids[int(np.flatnonzero(~np.isfinite(values))[0])]
        raise ValueError(f"run score of document {bad!r} is not finite")
    order = sorted(zip(ids, values.astype(np.float32).tolist()), key=lambda item: item[0], reverse=True)
    order.sort(key=lambda item: item[1], reverse=True)  # stable: ties keep docid-descending order
    return [doc for doc, _ in order]


def _mean_over_qrels(run: Run, qrels: Qrels, k: int, per_query: Callable[[list[str], Mapping[str, int]], float]) -> float:
    if k < 1:
        raise ValueError(f"cutoff k must be >= 1; got {k}")
    if not qrels:
        raise ValueError("qrels are empty")
    total = 0.0
    for qid, judged in qrels.items():
        ranked = rank_documents(run[qid])[:k] if qid in run else []
        total += per_query(ranked, judged)
    return total / len(qrels)


def ndcg_at_k(run: Run, qrels: Qrels, k: int = 10) -> float:
    """Mean nDCG@k with graded gains (trec_eval ``ndcg_cut.k``)."""

    def one(ranked: list[str], judged: Mapping[str, int]) -> float:
        ideal_gains = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
        ideal = sum(g / np.log2(i + 2) for i, g in enumerate(ideal_gains))
        if ideal == 0:
            return 0.0
        dcg = sum(judged.get(doc, 0) / np.log2(i + 2) for i, doc in enumerate(ranked) if judged.get(doc, 0) > 0)
        return float(dcg / ideal)

    return _mean_over_qrels(run, qrels, k, one)


def recall_at_k(run: Run, qrels: Qrels, k: int = 100, relevance_level: int = 1) -> float:
    """Mean recall@k: relevant documents in the top k over all relevant documents."""

    def one(ranked: list[str], judged: Mapping[str, int]) -> float:
        relevant = {doc for doc, grade in judged.items() if grade >= relevance_level}
        return len(relevant.intersection(ranked)) / len(relevant) if relevant else 0.0

    return _mean_over_qrels(run, qrels, k, one)


def mrr_at_k(run: Run, qrels: Qrels, k: int = 10, relevance_level: int = 1) -> float:
    """Mean reciprocal rank of the first relevant document within the top k (0 if none)."""

    def one(ranked: list[str], judged: Mapping[str, int]) -> float:
        for rank, doc in enumerate(ranked, start=1):
            if judged.get(doc, 0) >= relevance_level:
                return 1.0 / rank
        return 0.0

    return _mean_over_qrels(run, qrels, k, one)
