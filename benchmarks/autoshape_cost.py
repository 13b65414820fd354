"""What ``--shape auto``'s selection costs against encoding the corpus once, per set and model.

For each retrieval set (BEIR folder) and model: one backbone pass over the corpus (``--shape none``
fit and raw vectors; the first pass when ``--cache-dir`` does not hold the corpus yet), then
:func:`isotrope.autoshape.choose_shape` on the same corpus, whose sample vectors come from that
pass (the cache for a transformer, the same vectors for a static table) and whose reported
selection time is what auto adds: the pseudo-queries and the texts they were cut from through
the backbone, every candidate's fits and scores. Wall and CPU seconds of this process; on a
shared machine only the CPU seconds and the ratios mean much.

    .venv/bin/python -m benchmarks.autoshape_cost --data-dir ../shared/data \\
        --sets .cache/isotrope/sets/stsb-para retrieval/scifact passages:100000 --models static:all-MiniLM-L6-v2 \\
        --out benchmarks/results/autoshape_cost

As in ``isotrope index``, auto chooses on a fair sample of at most ``IngestPlan.fit_samples``
(20,000) texts, so its cost stops growing there while encoding the corpus grows with it. A set
named ``passages:N`` is the first N passages of ``benchmarks.scale`` (windows of consecutive
general-corpus sentences) instead of a BEIR folder: a corpus larger than any labelled set here.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from benchmarks.common import run_per_set_and_model
from benchmarks.scale import passages, read_sentences
from isotrope.autoshape import choose_shape, fit_unshaped, format_candidate
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder, fair_sample
from isotrope.evaluate.data import load_beir
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.tasks import document_text
from isotrope.ingest.plan import IngestPlan

logger = logging.getLogger("autoshape_cost")


PASSAGES = "passages:"


def corpus_texts(folder: Path, data_dir: Path) -> list[str]:
    """The texts of a BEIR folder's corpus, or of ``passages:N``."""
    if folder.name.startswith(PASSAGES):
        count = int(folder.name[len(PASSAGES) :])
        return [text for _, text in passages(read_sentences(data_dir), count)]
    return [document_text(doc) for doc in load_beir(folder, "test").corpus.values()]


def measure(folder: Path, model: str, data_dir: Path, cache_dir: str | None) -> dict:
    documents = corpus_texts(folder, data_dir)
    sample = fair_sample(((0, text) for text in documents), IngestPlan.fit_samples)
    backbone = Evaluator(cache_dir=cache_dir)._backbone(EncoderConfig(model=model), documents)
    wall, cpu = time.perf_counter(), time.process_time()
    encoder = ShapedEncoder.create(model=model, shape="none", backbone=backbone)
    fit_unshaped(encoder, documents)
    encoder.embed_raw(documents)
    encode = {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}
    chosen = choose_shape(sample, EncoderConfig(model=model), backbone=backbone).metadata["auto_shape"]
    result = {
        "set": folder.name,
        "model": model,
        "documents": len(documents),
        "sample": len(sample),
        "encode_corpus_seconds": round(encode["wall"], 1),
        "encode_corpus_cpu_seconds": round(encode["cpu"], 1),
        "selection_seconds": chosen["selection_seconds"],
        "selection_cpu_seconds": chosen["selection_cpu_seconds"],
        "proxy": chosen["proxy"],
        "pseudo_queries": chosen["pseudo_queries"],
        "chosen": format_candidate(chosen["chosen"]),
    }
    logger.info("%s", result)
    return result


def report(results: list[dict]) -> str:
    lines = [
        "| set | model | documents | encode corpus s (CPU s) | selection s (CPU s) | proxy (pseudo-queries) "
        "| auto chose | selection / encode, CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = r["selection_cpu_seconds"] / max(r["encode_corpus_cpu_seconds"], 0.1)
        lines.append(
            f"| {r['set']} | {r['model']} | {r['documents']} | {r['encode_corpus_seconds']} "
            f"({r['encode_corpus_cpu_seconds']}) | {r['selection_seconds']} ({r['selection_cpu_seconds']}) "
            f"| {r['proxy']} ({r['pseudo_queries']}) | {r['chosen']} | {100 * ratio:.0f} % |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sets", nargs="+", required=True, help="BEIR folders (relative to --data-dir, or paths)")
    parser.add_argument("--models", nargs="+", default=["static:all-MiniLM-L6-v2"])
    parser.add_argument("--cache-dir", default=".cache/isotrope")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/autoshape_cost"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    results = run_per_set_and_model(
        args.out.with_suffix(".json"),
        args.data_dir,
        args.sets,
        args.models,
        lambda folder, model: measure(folder, model, args.data_dir, args.cache_dir),
    )
    args.out.with_suffix(".md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
