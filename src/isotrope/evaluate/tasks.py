"""Task runners: STS, retrieval, clustering, classification.

Each runner takes ``encode(texts, kind) -> np.ndarray`` (one row per text; any
scale) and returns the figures papers report, as percentages (x100).

* STS: cosine similarity of the two sentences, Spearman against the gold scores.
* Retrieval (BEIR/MTEB): queries encoded with ``kind="query"``, documents with
  ``kind="document"`` as ``(title + " " + text).strip()``; exact cosine top-k by
  blocked matrix products; metrics as ``trec_eval`` (see :mod:`.metrics`).
* Clustering (MTEB): MiniBatchKMeans (batch 500, k = number of labels) on the
  vectors as returned, V-measure averaged over seeds.
* Classification (SentEval): logistic regression on the vectors as returned, the
  inverse regularisation C chosen by inner stratified CV over SentEval's grid
  2^-2 .. 2^3; outer stratified k-fold accuracy, or test accuracy for a fixed split.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.cluster import MiniBatchKMeans
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, StratifiedKFold

from isotrope.backbones.base import TextKind
from isotrope.evaluate.data import BeirDataset, STSPairs
from isotrope.evaluate.metrics import mrr_at_k, ndcg_at_k, recall_at_k, spearman, v_measure

logger = logging.getLogger(__name__)

Encode = Callable[[list[str], TextKind], np.ndarray]

#: SentEval's grid of logistic-regression C values (sklearn back-end).
SENTEVAL_CS = tuple(2.0**t for t in range(-2, 4))


def _encode(encode: Encode, texts: Sequence[str], kind: TextKind) -> np.ndarray:
    """Call ``encode`` and check the result: float32, one finite row per text."""
    vectors = np.asarray(encode(list(texts), kind), dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(f"encode returned shape {vectors.shape} for {len(texts)} texts (kind={kind!r})")
    if not np.isfinite(vectors).all():
        raise ValueError(f"encode returned NaN or infinite values (kind={kind!r})")
    return vectors


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    """L2-normalise rows; all-zero rows stay zero (cosine 0 with everything)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    if (norms == 0).any():
        logger.warning("%d zero vector(s); their cosine similarities are set to 0", int((norms == 0).sum()))
    return vectors / np.where(norms == 0, 1.0, norms)


# -- STS ---------------------------------------------------------------------------
def eval_sts(encode: Encode, pairs: STSPairs, kind: TextKind = "document") -> float:
    """Spearman x100 between the cosine of each sentence pair and the gold score."""
    if len(pairs) < 2:
        raise ValueError(f"{pairs.name}: need at least 2 pairs")
    vectors = _unit_rows(_encode(encode, [*pairs.sentences1, *pairs.sentences2], kind))
    first, second = vectors[: len(pairs)], vectors[len(pairs) :]
    cosine = np.einsum("ij,ij->i", first.astype(np.float64), second.astype(np.float64))
    return spearman(cosine, pairs.scores)


# -- retrieval ---------------------------------------------------------------------
def document_text(doc: dict[str, str]) -> str:
    """BEIR / MTEB document text: ``(title + " " + text).strip()``."""
    return (doc.get("title", "") + " " + doc["text"]).strip()


def _keep_best(indices: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k highest scores (lowest column first among equal scores), column order kept."""
    if scores.shape[1] <= k:
        return indices, scores
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]
    above, tied = scores > kth, scores == kth
    keep = above | (tied & (np.cumsum(tied, axis=1) <= k - above.sum(axis=1, keepdims=True)))
    return indices[keep].reshape(-1, k), scores[keep].reshape(-1, k)


def top_k(
    queries: np.ndarray, documents: np.ndarray, k: int, query_block: int = 256, document_block: int = 65536
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k inner products, ``(indices, scores)`` of shape (n_queries, k), best first.

    Computed in (query_block x document_block) tiles so memory stays bounded.
    Equal scores go to the lower document index, both at the cut-off and in the
    final order, so the result does not depend on the block sizes.
    """
    k = min(k, documents.shape[0])
    all_indices = np.empty((queries.shape[0], k), dtype=np.int64)
    all_scores = np.empty((queries.shape[0], k), dtype=np.float32)
    for q_start in range(0, queries.shape[0], query_block):
        block = queries[q_start : q_start + query_block]
        best_idx = np.empty((block.shape[0], 0), dtype=np.int64)
        best_val = np.empty((block.shape[0], 0), dtype=np.float32)
        for d_start in range(0, documents.shape[0], document_block):
            scores = block @ documents[d_start : d_start + document_block].T
            columns = np.broadcast_to(np.arange(d_start, d_start + scores.shape[1]), scores.shape)
            # earlier blocks hold lower indices, so candidates stay in ascending index order
            best_idx, best_val = _keep_best(
                np.concatenate([best_idx, columns], axis=1), np.concatenate([best_val, scores], axis=1), k
            )
        order = np.argsort(-best_val, axis=1, kind="stable")
        rows = slice(q_start, q_start + block.shape[0])
        all_indices[rows] = np.take_along_axis(best_idx, order, axis=1)
        all_scores[rows] = np.take_along_axis(best_val, order, axis=1)
    return all_indices, all_scores


def eval_retrieval(
    encode: Encode, dataset: BeirDataset, k_values: Sequence[int] = (10, 100), query_block: int = 256, document_block: int = 65536
) -> dict:
    """nDCG@k, recall@k and MRR@k (x100) for every k in ``k_values``, plus the run.

    The run holds the ``max(k_values)`` best documents per query by cosine. The
    corpus is scored in descending document-id order, so equal scores at the
    cut-off keep the documents trec_eval would rank first.
    """
    if not dataset.queries or not dataset.corpus:
        raise ValueError("retrieval needs at least one query and one document")
    depth = max(k_values)
    # empty documents (published collections have them) cannot be retrieved, empty queries retrieve
    # nothing: both are left out of the encoding and counted; an empty query scores 0
    doc_ids = [d for d in sorted(dataset.corpus, reverse=True) if document_text(dataset.corpus[d])]
    query_ids = [q for q in dataset.queries if dataset.queries[q].strip()]
    empty = {"empty_documents": len(dataset.corpus) - len(doc_ids), "empty_queries": len(dataset.queries) - len(query_ids)}
    if any(empty.values()):
        logger.warning("retrieval: %d empty documents and %d empty queries are not encoded", *empty.values())
    if not query_ids or not doc_ids:
        raise ValueError("retrieval needs at least one non-empty query and one non-empty document")
    logger.info("encoding %d documents and %d queries", len(doc_ids), len(query_ids))
    documents = _unit_rows(_encode(encode, [document_text(dataset.corpus[d]) for d in doc_ids], "document"))
    queries = _unit_rows(_encode(encode, [dataset.queries[q] for q in query_ids], "query"))
    if queries.shape[1] != documents.shape[1]:
        raise ValueError(f"query dim {queries.shape[1]} differs from document dim {documents.shape[1]}")
    indices, scores = top_k(queries, documents, depth, query_block, document_block)
    run: dict[str, dict[str, float]] = {qid: {} for qid in dataset.queries}
    run.update(
        {
            qid: {doc_ids[j]: float(s) for j, s in zip(row_idx, row_val)}
            for qid, row_idx, row_val in zip(query_ids, indices.tolist(), scores.tolist())
        }
    )
    result: dict = dict(empty)
    for k in sorted(set(k_values)):
        result[f"ndcg@{k}"] = 100.0 * ndcg_at_k(run, dataset.qrels, k)
        result[f"recall@{k}"] = 100.0 * recall_at_k(run, dataset.qrels, k)
        result[f"mrr@{k}"] = 100.0 * mrr_at_k(run, dataset.qrels, k)
    result["run"] = run
    return result


# -- clustering --------------------------------------------------------------------
def eval_clustering(
    encode: Encode,
    texts: Sequence[str],
    labels: Sequence,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    kind: TextKind = "document",
    batch_size: int = 500,
) -> dict:
    """MTEB-style clustering: V-measure x100 of MiniBatchKMeans, mean and std over seeds."""
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    if not seeds:
        raise ValueError("need at least one seed")
    vectors = _encode(encode, texts, kind)
    n_clusters = len(set(labels))
    scores = []
    for seed in seeds:
        model = MiniBatchKMeans(n_clusters=n_clusters, batch_size=batch_size, n_init="auto", random_state=seed)
        scores.append(v_measure(labels, model.fit_predict(vectors)))
    return {"v_measure": float(np.mean(scores)), "v_measure_std": float(np.std(scores)), "per_seed": scores}


# -- classification ----------------------------------------------------------------
def _classifier(inner_folds: int, seed: int, Cs: Sequence[float]) -> GridSearchCV:
    return GridSearchCV(
        LogisticRegression(max_iter=1000),
        {"C": list(Cs)},
        scoring="accuracy",
        cv=StratifiedKFold(inner_folds, shuffle=True, random_state=seed),
    )


def eval_classification(
    encode: Encode,
    texts: Sequence[str],
    labels: Sequence[int],
    folds: int = 10,
    seed: int = 0,
    test_texts: Sequence[str] | None = None,
    test_labels: Sequence[int] | None = None,
    kind: TextKind = "document",
    inner_folds: int = 5,
    Cs: Sequence[float] = SENTEVAL_CS,
) -> dict:
    """SentEval-style accuracy x100 of logistic regression on the encoded texts.

    Without a test set: stratified ``folds``-fold cross-validation (mean and std
    over folds). With ``test_texts``/``test_labels``: train on all of ``texts`` and
    score the test set. In both cases C is chosen by ``inner_folds``-fold CV on
    the training part.
    """
    if len(texts) != len(labels):
        raise ValueError(f"{len(texts)} texts but {len(labels)} labels")
    if (test_texts is None) != (test_labels is None):
        raise ValueError("pass both test_texts and test_labels, or neither")
    X, y = _encode(encode, texts, kind), np.asarray(labels)
    if test_texts is not None and test_labels is not None:
        if len(test_texts) != len(test_labels):
            raise ValueError(f"{len(test_texts)} test texts but {len(test_labels)} test labels")
        model = _classifier(inner_folds, seed, Cs).fit(X, y)
        accuracy = 100.0 * model.score(_encode(encode, test_texts, kind), np.asarray(test_labels))
        return {"accuracy": float(accuracy), "C": float(model.best_params_["C"])}
    scores = []
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, y):
        model = _classifier(inner_folds, seed, Cs).fit(X[train], y[train])
        scores.append(100.0 * model.score(X[test], y[test]))
    return {"accuracy": float(np.mean(scores)), "accuracy_std": float(np.std(scores)), "per_fold": scores}
