"""Metrics, isotropy measures and task runners against hand-computed or brute-force references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from isotrope.evaluate.data import BeirDataset, STSPairs
from isotrope.evaluate.metrics import mrr_at_k, ndcg_at_k, rank_documents, recall_at_k, spearman, v_measure
from isotrope.evaluate.tasks import (
    document_text,
    eval_classification,
    eval_clustering,
    eval_retrieval,
    eval_sts,
    top_k,
)
from isotrope.isotropy import effective_rank, isotropy_report, mean_cosine, partition_ratio

# -- nDCG / recall / MRR -------------------------------------------------------------

QRELS = {"q1": {"d1": 2, "d2": 1, "d3": 0, "d4": 2}}
RUN = {"q1": {"d1": 0.9, "d2": 0.8, "d3": 0.7, "d5": 0.6, "d4": 0.5}}


def test_ndcg_graded_by_hand():
    # ranking d1(2) d2(1) d3(0) d5(unjudged) d4(2); ideal gains 2, 2, 1
    dcg5 = 2 / math.log2(2) + 1 / math.log2(3) + 2 / math.log2(6)
    idcg5 = 2 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(RUN, QRELS, k=5) == pytest.approx(dcg5 / idcg5, abs=1e-12)
    dcg2 = 2 / math.log2(2) + 1 / math.log2(3)
    idcg2 = 2 / math.log2(2) + 2 / math.log2(3)
    assert ndcg_at_k(RUN, QRELS, k=2) == pytest.approx(dcg2 / idcg2, abs=1e-12)
    assert ndcg_at_k(RUN, QRELS, k=1) == pytest.approx(1.0)


def test_ndcg_matches_sklearn_when_run_covers_the_judged_documents():
    rng = np.random.default_rng(0)
    run, qrels, expected = {}, {}, []
    for q in range(20):
        docs = [f"d{i}" for i in range(30)]
        grades = rng.integers(0, 3, size=30)
        grades[0] = 2  # at least one relevant document
        scores = rng.permutation(30) / 30.0  # distinct scores, no ties
        qrels[f"q{q}"] = {d: int(g) for d, g in zip(docs, grades)}
        run[f"q{q}"] = {d: float(s) for d, s in zip(docs, scores)}
        expected.append(ndcg_score(grades[None, :], scores[None, :], k=10))
    assert ndcg_at_k(run, qrels, k=10) == pytest.approx(np.mean(expected), abs=1e-12)


def test_recall_and_mrr_by_hand():
    # relevant (grade >= 1): d1, d2, d4
    assert recall_at_k(RUN, QRELS, k=1) == pytest.approx(1 / 3)
    assert recall_at_k(RUN, QRELS, k=4) == pytest.approx(2 / 3)
    assert recall_at_k(RUN, QRELS, k=5) == pytest.approx(1.0)
    late = {"q1": {"d3": 0.9, "d5": 0.8, "d2": 0.7}}
    assert mrr_at_k(late, QRELS, k=10) == pytest.approx(1 / 3)
    assert mrr_at_k(late, QRELS, k=2) == 0.0
    assert mrr_at_k(RUN, QRELS, k=10, relevance_level=2) == pytest.approx(1.0)
    assert recall_at_k(RUN, QRELS, k=4, relevance_level=2) == pytest.approx(1 / 2)


def test_ties_are_broken_by_descending_docid_like_trec_eval():
    qrels = {"q": {"a": 1}}
    # a, b, c tie: trec_eval ranks c, b, a -> a at rank 3, whatever the insertion order
    for run in ({"q": {"a": 0.5, "b": 0.5, "c": 0.5}}, {"q": {"c": 0.5, "a": 0.5, "b": 0.5}}):
        assert rank_documents(run["q"]) == ["c", "b", "a"]
        assert mrr_at_k(run, qrels, k=10) == pytest.approx(1 / 3)
        assert ndcg_at_k(run, qrels, k=3) == pytest.approx(1 / math.log2(4))
        assert recall_at_k(run, qrels, k=2) == 0.0
    # scores equal at float32 precision tie too (trec_eval stores float sim)
    assert rank_documents({"a": 0.5 + 1e-12, "b": 0.5}) == ["b", "a"]
    assert rank_documents({"a": 0.5 + 1e-3, "b": 0.5}) == ["a", "b"]


def test_queries_without_hits_count_zero_and_extra_run_queries_are_ignored():
    qrels = {"q1": {"d1": 1}, "q2": {"d9": 1}}
    run = {"q1": {"d1": 1.0, "d2": 0.5}, "q3": {"d9": 1.0}}  # q2 retrieved nothing
    assert ndcg_at_k(run, qrels, k=10) == pytest.approx(0.5)
    assert recall_at_k(run, qrels, k=10) == pytest.approx(0.5)
    assert mrr_at_k(run, qrels, k=10) == pytest.approx(0.5)
    # a query whose judged documents are all grade 0 scores 0 too
    assert ndcg_at_k({"q": {"d": 1.0}}, {"q": {"d": 0}}, k=10) == 0.0


def test_retrieval_metric_errors():
    with pytest.raises(ValueError, match="qrels are empty"):
        ndcg_at_k(RUN, {}, k=10)
    with pytest.raises(ValueError, match="k must be"):
        recall_at_k(RUN, QRELS, k=0)
    with pytest.raises(ValueError, match="'d2'"):
        mrr_at_k({"q1": {"d1": 1.0, "d2": float("nan")}}, QRELS)


# -- Spearman / V-measure -----------------------------------------------------------


def test_spearman_by_hand_with_tied_gold():
    # gold ranks 1, 2, 3.5, 5, 3.5; deviations (-2,-1,0,1,2) and (-2,-1,.5,2,.5)
    expected = 100 * 8 / math.sqrt(10 * 9.5)
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(expected, abs=1e-10)
    assert spearman([0.1, 0.3, 0.2], [1, 3, 2]) == pytest.approx(100.0)
    assert spearman([3, 2, 1], [1, 2, 3]) == pytest.approx(-100.0)
    with pytest.raises(ValueError, match="equal length"):
        spearman([1, 2], [1, 2, 3])


def test_v_measure_by_hand():
    assert v_measure([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(100.0)
    assert v_measure([0, 0, 1, 1], [0, 0, 0, 0]) == pytest.approx(0.0)
    # clusters {0,0,1} and {1}: H(C|K) = 3/4 H(2/3,1/3), H(K|C) = 1/2 H(1/2,1/2)
    h_c_given_k = 0.75 * -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    h_c = math.log(2)
    h_k = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    homogeneity, completeness = 1 - h_c_given_k / h_c, 1 - 0.5 * math.log(2) / h_k
    expected = 100 * 2 * homogeneity * completeness / (homogeneity + completeness)
    assert v_measure([0, 0, 1, 1], [0, 0, 0, 1]) == pytest.approx(expected, abs=1e-10)


# -- isotropy ------------------------------------------------------------------------


def test_mean_cosine_extremes_and_brute_force():
    assert mean_cosine(np.eye(6)) == pytest.approx(0.0, abs=1e-12)
    assert mean_cosine(np.tile([[0.3, -1.2, 2.0]], (5, 1))) == pytest.approx(1.0, abs=1e-12)
    X = np.random.default_rng(1).normal(size=(40, 7)) + 0.5
    unit = X / np.linalg.norm(X, axis=1, keepdims=True)
    cosines = unit @ unit.T
    brute = (cosines.sum() - np.trace(cosines)) / (40 * 39)
    assert mean_cosine(X.astype(np.float32)) == pytest.approx(brute, abs=1e-6)
    with pytest.raises(ValueError, match="row 2"):
        mean_cosine(np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))


def test_effective_rank():
    assert effective_rank(np.eye(8)) == pytest.approx(8.0)
    assert effective_rank(np.outer(np.arange(1, 6), [1.0, 2.0, -1.0])) == pytest.approx(1.0)
    X = np.random.default_rng(2).normal(size=(30, 10)) * np.linspace(0.1, 3, 10)
    for M in (X, X.T):  # tall and wide
        s = np.linalg.svd(M, compute_uv=False)
        p = s / s.sum()
        assert effective_rank(M) == pytest.approx(np.exp(-(p * np.log(p)).sum()), rel=1e-9)


def test_partition_ratio_isotropic_vs_shifted_and_brute_force():
    rng = np.random.default_rng(3)
    gaussian = rng.normal(size=(20000, 5))
    assert partition_ratio(gaussian) > 0.9
    shifted = gaussian + np.array([5.0, 0, 0, 0, 0])
    assert partition_ratio(shifted) < 0.01
    X = rng.normal(size=(200, 4)) + 0.3
    _, vectors = np.linalg.eigh(X.T @ X)
    Z = np.exp(X @ vectors).sum(axis=0)
    assert partition_ratio(X) == pytest.approx(Z.min() / Z.max(), rel=1e-10)
    # log-space: large norms must not overflow
    assert 0.0 <= partition_ratio(X * 1000.0) <= 1.0


def test_isotropy_report_keys():
    report = isotropy_report(np.eye(4))
    assert report == pytest.approx({"n_vectors": 4, "dim": 4, "mean_cosine": 0.0, "partition_ratio": 1.0, "effective_rank": 4.0})


# -- task runners ---------------------------------------------------------------------


def test_top_k_matches_brute_force_with_ties_and_blocks():
    rng = np.random.default_rng(4)
    documents = rng.integers(-2, 3, size=(97, 3)).astype(np.float32)  # many exact ties
    queries = rng.integers(-2, 3, size=(13, 3)).astype(np.float32)
    scores = queries @ documents.T
    # brute force: score descending, then lower index
    expected = np.array([sorted(range(97), key=lambda j: (-row[j], j))[:10] for row in scores])
    for q_block, d_block in ((256, 65536), (4, 7), (1, 1)):
        indices, values = top_k(queries, documents, 10, query_block=q_block, document_block=d_block)
        np.testing.assert_array_equal(indices, expected)
        np.testing.assert_array_equal(values, np.take_along_axis(scores, expected, axis=1))
    assert top_k(queries, documents[:3], 10)[0].shape == (13, 3)


def _bag_of_words(vocabulary: list[str]):
    def encode(texts: list[str], kind: str) -> np.ndarray:
        assert kind in ("query", "document")
        return np.array([[t.lower().split().count(w) for w in vocabulary] for t in texts], dtype=np.float32)

    return encode


def test_eval_retrieval_with_a_bag_of_words_encoder():
    corpus = {
        "1": {"title": "Cats", "text": "cats purr"},
        "2": {"title": "", "text": "dogs bark"},
        "3": {"title": "Birds", "text": "birds sing"},
    }
    assert document_text(corpus["1"]) == "Cats cats purr" and document_text(corpus["2"]) == "dogs bark"
    dataset = BeirDataset(corpus, {"a": "cats", "b": "birds", "c": "fish"}, {"a": {"1": 1}, "b": {"3": 2, "2": 1}, "c": {"2": 1}})
    encode = _bag_of_words(["cats", "dogs", "birds", "purr", "sing", "bark"])
    result = eval_retrieval(encode, dataset, k_values=(1, 10))
    assert set(result["run"]) == {"a", "b", "c"} and len(result["run"]["a"]) == 3
    # a: perfect; b: 3 first (cos>0), then 2 and 1 tie at 0 -> trec order "2" before "1";
    # c: "fish" is a zero vector, all scores 0 -> order 3, 2, 1 -> relevant "2" at rank 2
    ndcg_b = (2 + 1 / math.log2(3)) / (2 + 1 / math.log2(3))
    assert result["ndcg@10"] == pytest.approx(100 * (1 + ndcg_b + 1 / math.log2(3)) / 3)
    assert result["mrr@10"] == pytest.approx(100 * (1 + 1 + 0.5) / 3)
    assert result["recall@1"] == pytest.approx(100 * (1 + 0.5 + 0) / 3)


def test_eval_sts_is_spearman_of_cosines():
    encode = _bag_of_words(["a", "b", "c"])
    pairs = STSPairs("toy", ["a", "a", "a b", "c"], ["a a", "b", "a", "c b"], [5.0, 0.0, 3.5, 3.0])
    cosines = [1.0, 0.0, 1 / math.sqrt(2), 1 / math.sqrt(2)]
    assert eval_sts(encode, pairs) == pytest.approx(spearman(cosines, pairs.scores))
    with pytest.raises(ValueError, match="shape"):
        eval_sts(lambda texts, kind: np.zeros((1, 3)), pairs)


def test_eval_clustering_and_classification_on_separable_data():
    rng = np.random.default_rng(5)
    centres = {"x": np.array([10.0, 0, 0]), "y": np.array([0, 10.0, 0]), "z": np.array([0, 0, 10.0])}
    texts = [f"{label} {i}" for label in centres for i in range(30)]
    labels = [label for label in centres for _ in range(30)]

    def encode(batch: list[str], kind: str) -> np.ndarray:
        return np.stack([centres[t.split()[0]] + rng.normal(scale=0.1, size=3) for t in batch]).astype(np.float32)

    clustering = eval_clustering(encode, texts, labels, seeds=(0, 1))
    assert clustering["v_measure"] == pytest.approx(100.0) and len(clustering["per_seed"]) == 2
    numeric = [sorted(centres).index(label) for label in labels]
    cv = eval_classification(encode, texts, numeric, folds=3, inner_folds=2, Cs=(0.5, 2.0))
    assert cv["accuracy"] == pytest.approx(100.0) and len(cv["per_fold"]) == 3
    split = eval_classification(encode, texts, numeric, test_texts=["x 0", "z 1"], test_labels=[0, 2], inner_folds=2, Cs=(1.0,))
    assert split["accuracy"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="both"):
        eval_classification(encode, texts, numeric, test_texts=["x 0"])
