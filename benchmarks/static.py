"""Item 4: static token tables with fitted shaping vs the transformer: docs/s and SciFact quality.

Throughput: the same SciFact abstracts, same batch size, median of repeated runs after a
warm-up (a static encoder's run makes several passes over the texts; times are per pass). Quality: nDCG@10 / recall@100 from :func:`isotrope.evaluate.eval_retrieval`; the
static encoders' token statistics and shaping are fitted on the SciFact documents (never on
the queries). ``--quick`` evaluates on a subset: the first test queries, their relevant
documents and distractors from the start of the corpus.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, ratio, scifact_dir, scifact_documents
from benchmarks.harness import alternate

logger = logging.getLogger(__name__)

BATCH_SIZE = 64  # isotrope's default, for every encoder here
#: name -> ShapedEncoder.create options
STATIC_ENCODERS: dict[str, dict[str, Any]] = {
    "static MiniLM table, sif + abtt": {"model": f"static:{MODEL}", "weights": "sif", "shape": "abtt"},
    "static MiniLM table, sif + whiten": {"model": f"static:{MODEL}", "weights": "sif", "shape": "whiten"},
    "GloVe 6B 50d, sif + abtt": {"model": "glove-6b-50d", "weights": "sif", "shape": "abtt"},
}
#: a static encoder is timed over this many passes of the texts per run, so that one run lasts long
#: enough (about as long as the transformer's single pass) for a busy machine's spikes to average out
STATIC_PASSES = 20
SIZES = {
    "quick": {"throughput_docs": 32, "quality_queries": 20, "quality_docs": 150, "fit_docs": 1000},
    "full": {"throughput_docs": 512, "quality_queries": None, "quality_docs": None, "fit_docs": None},
}


def quality_dataset(data_dir: str | Path, queries: int | None, documents: int | None) -> Any:
    """SciFact test split, or a subset: the first ``queries`` test queries (by id), every document
    they mark relevant, and distractors in corpus order up to ``documents`` documents."""
    from isotrope.evaluate.data import BeirDataset, load_beir

    full = load_beir(scifact_dir(data_dir), "test")
    if queries is None:
        return full
    query_ids = sorted(full.qrels)[:queries]
    keep = {doc for qid in query_ids for doc in full.qrels[qid] if doc in full.corpus}
    for doc_id in full.corpus:
        if len(keep) >= (documents or 0):
            break
        keep.add(doc_id)
    return BeirDataset(
        corpus={d: full.corpus[d] for d in full.corpus if d in keep},
        queries={q: full.queries[q] for q in query_ids},
        qrels={q: full.qrels[q] for q in query_ids},
    )


def build_encoders(fit_texts: list[str]) -> dict[str, Any]:
    """The transformer (plain mean pooling, l2) and each static encoder fitted on ``fit_texts``."""
    from isotrope.encoder import ShapedEncoder

    encoders = {
        "transformer (all-MiniLM-L6-v2)": ShapedEncoder.create(
            MODEL, shape="none", max_length=MAX_SEQ_LENGTH, device="cpu", batch_size=BATCH_SIZE
        )
    }
    for name, options in STATIC_ENCODERS.items():
        encoders[name] = ShapedEncoder.create(**options, batch_size=BATCH_SIZE).fit(
            fit_texts, fitted_on="SciFact corpus documents"
        )
    return encoders


def run(data_dir: str | Path, *, quick: bool, repeat: int) -> dict[str, Any]:
    """Docs/s of every encoder on the same abstracts, the ratio to the transformer, and SciFact quality."""
    from isotrope.evaluate.tasks import eval_retrieval

    sizes = SIZES["quick" if quick else "full"]
    corpus = [text for _, text in scifact_documents(data_dir, sizes["fit_docs"])]
    encoders = build_encoders(corpus)
    texts = corpus[: sizes["throughput_docs"]]
    transformer = next(iter(encoders))
    passes = {name: 1 if name == transformer else STATIC_PASSES for name in encoders}

    def encode_passes(name: str) -> None:
        for _ in range(passes[name]):
            encoders[name].encode(texts)

    timings = alternate(
        {name: lambda n=name: encode_passes(n) for name in encoders},
        repeat,
        warmups={name: lambda e=encoder: e.encode(texts[:16]) for name, encoder in encoders.items()},
    )
    for name, timing in timings.items():  # seconds per pass over the texts
        timing.update(passes=passes[name], median_s=timing["median_s"] / passes[name], min_s=timing["min_s"] / passes[name])
    dataset = quality_dataset(data_dir, sizes["quality_queries"], sizes["quality_docs"])
    results: dict[str, Any] = {
        "throughput_docs": len(texts),
        "batch_size": BATCH_SIZE,
        "repeat": repeat,
        "transformer": transformer,
        "quality_split": {
            "queries": len(dataset.queries),
            "documents": len(dataset.corpus),
            "subset": sizes["quality_queries"] is not None,
        },
        "fitted_on": f"{len(corpus)} SciFact corpus documents (no queries)",
        "encoders": {},
    }
    for name, encoder in encoders.items():
        start = time.perf_counter()
        quality = eval_retrieval(lambda batch, kind, e=encoder: e.encode(batch, kind=kind), dataset, k_values=(10, 100))
        timing = timings[name]
        results["encoders"][name] = {
            "config": STATIC_ENCODERS.get(name, {"model": MODEL, "shape": "none"}),
            **timing,
            "docs_per_s": len(texts) / timing["median_s"],
            "ratio_to_transformer": ratio(timings[transformer]["median_s"], timing["median_s"]),
            "ndcg@10": quality["ndcg@10"],
            "recall@100": quality["recall@100"],
            "eval_seconds": time.perf_counter() - start,
        }
        logger.info("static %s: %.0f docs/s, nDCG@10 %.2f", name, len(texts) / timing["median_s"], quality["ndcg@10"])
    return results
