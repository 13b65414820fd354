"""``--model fast`` encode speed on abstracts: a saved fast encoder with its token-pair rows, the same table with
them cut off, and the teacher, in one process.

The first ``--texts`` SciFact abstracts (title and text); each side encodes them once untimed (filling the word
cache, as a second pass over a corpus or a query service reads it), then the rounds alternate the sides in
rotating order (:func:`benchmarks.harness.alternate`); the teacher (all-MiniLM-L6-v2, torch) encodes the first
``--teacher-texts`` of them per round. Also: rows pooled per abstract, the table's bytes, and a one-line query's
milliseconds (p50 of ``--queries`` calls, sides alternating). Speeds are abstracts per second and ratios to the
teacher's.

    python -m benchmarks.fast_encode --encoder ENC --data-dir ../shared/data --out benchmarks/results/fast_encode_pairs.json

``ENC``: ``isotrope fit DATA/retrieval/scifact/corpus.jsonl --model fast --out ENC`` (pair rows kept there).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import MODEL, print_and_write, scifact_documents
from benchmarks.harness import alternate, measured, set_threads
from isotrope.encoder import ShapedEncoder

QUERY = "vitamin D and bone density in older adults"


def without_pairs(folder: Path) -> ShapedEncoder:
    """The encoder of ``folder`` with its pair rows cut off: the token table it holds, pooled alone."""
    encoder = ShapedEncoder.load(folder)
    backbone = encoder.backbone
    if backbone.pairs is None:
        raise ValueError(f"{folder}: this encoder has no token-pair rows to compare with")
    backbone.stored = np.ascontiguousarray(backbone.stored[: backbone.pairs.vocab])
    backbone.pairs = None
    return encoder


def query_ms(encoders: dict[str, ShapedEncoder], calls: int) -> dict[str, float]:
    """p50 milliseconds of ``encode([QUERY], kind="query")`` per encoder, the encoders alternating call by call."""
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(calls):
        for name, encoder in encoders.items():
            start = time.perf_counter()
            encoder.encode([QUERY], kind="query")
            times[name].append(time.perf_counter() - start)
    return {name: round(1000 * statistics.median(values), 4) for name, values in times.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = [text for _, text in scifact_documents(args.data_dir, args.texts)]
    encoders = {"with pair rows": ShapedEncoder.load(args.encoder), "token table": without_pairs(args.encoder)}
    teacher = ShapedEncoder.create(MODEL).fit(texts[:50])
    sides = {name: (lambda e=encoder: e.encode(texts)) for name, encoder in encoders.items()}
    sides["teacher"] = lambda: teacher.encode(texts[: args.teacher_texts])
    timings = alternate(sides, args.rounds)
    speed = {name: len(texts) / timings[name]["median_s"] for name in encoders}
    teacher_speed = args.teacher_texts / timings["teacher"]["median_s"]
    return {
        "texts": len(texts),
        "teacher_texts": args.teacher_texts,
        "rounds": args.rounds,
        "timings": timings,
        "abstracts_per_s": {**{name: round(value) for name, value in speed.items()}, "teacher": round(teacher_speed, 2)},
        "x_teacher": {name: round(value / teacher_speed, 1) for name, value in speed.items()},
        "rows_per_abstract": {
            name: float(np.mean([len(ids) for ids in encoder.backbone.token_ids(texts)])) for name, encoder in encoders.items()
        },
        "table_mb": {name: round(encoder.backbone.stored.nbytes / 1e6, 1) for name, encoder in encoders.items()},
        "query_ms_p50": query_ms(encoders, args.queries),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoder", type=Path, required=True, help="a saved fast encoder with token-pair rows")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--teacher-texts", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--allow-loaded", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    threads = set_threads(args.threads)
    command = "python -m benchmarks.fast_encode " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v)
    document = measured("fast_encode", command, "full", args.allow_loaded, lambda: {"threads": threads, **run(args)})
    print_and_write(document, args.out)


if __name__ == "__main__":
    main()
