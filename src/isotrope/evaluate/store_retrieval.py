"""Retrieval evaluated through the store code: the BEIR corpus indexed into a temporary store, queried by mode.

What is measured is what ``isotrope search`` returns: the same store classes, the same lexical
analyzer and index, the same fusion. Documents are ``(title + " " + text).strip()``, one
chunk each, with their id as ``source``; vectors are stored with the cosine metric.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.data import BeirDataset
from isotrope.evaluate.metrics import mrr_at_k, ndcg_at_k, recall_at_k
from isotrope.evaluate.tasks import document_text
from isotrope.fusion import check_mode, search_store
from isotrope.search import Collection

logger = logging.getLogger(__name__)

_BATCH = 512
#: the mode label scoring the default search, calibrated on the indexed corpus without labels
AUTO = "auto"


def beir_documents(dataset: BeirDataset) -> tuple[list[str], list[str]]:
    """Ids and texts of the non-empty documents (empty ones are counted and left out)."""
    pairs = [(doc_id, document_text(doc)) for doc_id, doc in sorted(dataset.corpus.items())]
    empty = sum(1 for _, text in pairs if not text.strip())
    if empty:
        logger.warning("%d empty documents are not indexed", empty)
    pairs = [(doc_id, text) for doc_id, text in pairs if text.strip()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def index_documents(collection: Collection, ids: Sequence[str], texts: Sequence[str], vectors: Any) -> None:
    """Add the documents (each id as its ``source``) in batches, then commit. ``vectors`` are the
    collection encoder's vectors of ``texts``, encoded once for every store the harness fills."""
    for start in range(0, len(ids), _BATCH):
        part = slice(start, start + _BATCH)
        rows = [{"source": i} for i in ids[part]]
        collection.add(ids[part], texts[part], rows, vectors=vectors[part], verify=start == 0, commit=False)
    collection.commit()


def run_modes(
    collection: Collection,
    dataset: BeirDataset,
    modes: Sequence[str],
    alphas: Sequence[float | None] = (None,),
    fusions: Sequence[str] = ("convex",),
    depth: int = 100,
) -> dict[str, dict[str, dict[str, float]]]:
    """``label -> run`` for each mode; hybrid once per fusion and (convex) alpha, labelled ``hybrid``,
    ``hybrid@alpha`` or ``hybrid-rrf``; ``auto``: the collection's default search (what a user gets
    naming no mode)."""
    query_ids = list(dataset.queries)
    texts = [dataset.queries[q] for q in query_ids]
    vectors = None
    if any(m != "lexical" for m in modes):  # auto may be dense or hybrid
        vectors = collection.encoder.encode(texts, kind="query")
    runs = {}
    settings: list[tuple[str, str, float | None, str]] = []
    for mode in modes:
        if mode == AUTO:
            default_mode, default_alpha, _ = collection.default_search()
            settings.append((AUTO, default_mode, default_alpha, "convex"))
            continue
        check_mode(mode)
        if mode != "hybrid":
            settings.append((mode, mode, None, "convex"))
            continue
        for fusion in fusions:
            if fusion == "rrf":
                settings.append(("hybrid-rrf", mode, None, fusion))
            else:
                settings.extend((f"hybrid@{a}" if len(alphas) > 1 else "hybrid", mode, a, fusion) for a in alphas)
    for label, mode, alpha, fusion in settings:
        hits = search_store(collection.store, texts, vectors, depth, mode=mode, alpha=alpha, fusion=fusion)
        runs[label] = {q: {h.id: h.score for h in row} for q, row in zip(query_ids, hits)}
    return runs


def scores_of(run: dict[str, dict[str, float]], dataset: BeirDataset) -> dict[str, float]:
    return {
        "ndcg@10": round(100.0 * ndcg_at_k(run, dataset.qrels, 10), 2),
        "recall@100": round(100.0 * recall_at_k(run, dataset.qrels, 100), 2),
        "mrr@10": round(100.0 * mrr_at_k(run, dataset.qrels, 10), 2),
        "hit@1": round(100.0 * mrr_at_k(run, dataset.qrels, 1), 2),  # a relevant document first
    }


def eval_through_store(
    encoder: ShapedEncoder,
    dataset: BeirDataset,
    kinds: Sequence[str] = ("faiss",),
    modes: Sequence[str] = ("dense",),
    alphas: Sequence[float | None] = (None,),
    fusions: Sequence[str] = ("convex",),
    chosen: dict[str, Any] | None = None,
    show_progress: bool = False,
) -> dict[str, dict[str, dict[str, float]]]:
    """``kind -> label -> scores``: the documents encoded once (with a progress bar if ``show_progress``),
    indexed into a temporary store of each kind.

    With ``auto`` in ``modes`` each store's default search is calibrated after indexing, as
    ``isotrope index`` does (no labels read); ``chosen`` (if given) receives ``kind -> choice``."""
    ids, texts = beir_documents(dataset)
    vectors = encoder.encode(texts, kind="document", show_progress=show_progress)
    out = {}
    with tempfile.TemporaryDirectory(prefix="isotrope-eval-") as tmp:
        for kind in kinds:
            with Collection.create(f"{kind}:{Path(tmp) / kind}", encoder, metric="cosine") as collection:
                index_documents(collection, ids, texts, vectors)
                if AUTO in modes:
                    choice = collection.fit_default_search()
                    if chosen is not None:
                        chosen[kind] = choice
                runs = run_modes(collection, dataset, modes, alphas, fusions)
            out[kind] = {label: scores_of(run, dataset) for label, run in runs.items()}
    return out
