"""What choosing a new store's default search costs against the rest of its ingestion.

Indexes the first N passages of ``benchmarks.scale`` (windows of consecutive general-corpus sentences)
into a new store with ``isotrope index``'s code (:func:`isotrope.ingest.pipeline.index_documents`),
which ends by choosing the default search (:meth:`isotrope.search.Collection.fit_default_search`), and
prints the ingestion report's steps: ``default_search`` is the choice, the rest is ingestion (fit,
read and chunk, embed, write). Target (issue 31): at 100,000 chunks, the choice is at most 10 % of
ingestion with ``--model fast`` and 3 % with the transformer. Time it on an idle machine:

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.default_search_cost --data-dir ../shared/data \\
        --passages 100000 --model fast --store lancedb --out benchmarks/results/default_search_cost_fast.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from benchmarks.harness import OthersCpu, load_now, machine_info, wait_for_load
from benchmarks.scale import passages, read_sentences
from isotrope.config import EncoderConfig
from isotrope.ingest.loaders import Document
from isotrope.ingest.pipeline import index_documents
from isotrope.search import Collection


def measure(data_dir: Path, n: int, model: str, store_kind: str) -> dict:
    """One ingestion of ``n`` passages into a new store: its steps' seconds and the choice's share."""
    load_at_start, others = wait_for_load(), OthersCpu()
    documents = [Document(f"p{i}", text) for i, (_, text) in enumerate(passages(read_sentences(data_dir), n))]
    with tempfile.TemporaryDirectory(prefix="isotrope-default-search-") as tmp:
        uri = f"{store_kind}:{Path(tmp) / 'store'}"
        report = index_documents(documents, uri, config=EncoderConfig(model=model), chunk_tokens=0, show_progress=False)
        with Collection.open(uri) as collection:
            choice = collection.info()["default_search"]
    steps = {step: round(seconds, 2) for step, seconds in report.seconds.items() if step != "finish"}
    ingestion = sum(seconds for step, seconds in steps.items() if step != "default_search")
    return {
        "passages": n,
        "model": model,
        "store": store_kind,
        "chunks": report.chunks,
        "steps_s": steps,
        "default_search_share_of_ingestion": round(steps["default_search"] / ingestion, 4),
        "choice": {key: choice.get(key) for key in ("mode", "alpha", "proxy", "pseudo_queries", "sample_chunks")},
        "load_average_at_start": load_at_start,
        "load_average_at_end": load_now(),
        **(others.figures() or {}),
        "machine": machine_info(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--model", default="fast")
    parser.add_argument("--store", choices=("faiss", "lancedb"), default="lancedb")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    result = measure(args.data_dir, args.passages, args.model, args.store)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
