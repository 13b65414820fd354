"""``--model fast``: encode throughput of a saved fast encoder vs its teacher through sentence-transformers.

Same texts (SciFact abstracts, STS-B test sentences), same process, same threads (torch, BLAS
and the tokenizers' Rust pool all get ``--threads``), interleaved repeats after a warm-up
(:func:`benchmarks.common.compare`). The teacher is all-MiniLM-L6-v2 with max_seq_length 256,
unit vectors as NumPy. The fast encoder is timed as saved (it reads up to its ``max_length``,
8,192 tokens) and truncated at the teacher's 256 tokens, so the two read the same tokens. Also
timed: the teacher's tokenizer alone (``tokenizers`` ``encode_batch``, which caps any speed-up a
static encoder could reach by calling it) and a one-line query (``encode([q], kind="query")``,
p50/p99 over ``--query-calls`` calls).

    python -m benchmarks.fast --data-dir ../shared/data --encoder ENCODER_DIR --json-out fast.json
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import compare, machine_info, print_and_write, ratio, scifact_documents, set_threads, sts_sentences
from benchmarks.encode import BATCH_SIZE, MAX_SEQ_LENGTH, load_sentence_transformer

logger = logging.getLogger(__name__)

QUERY = "what is the effect of vitamin D supplements on bone density in older adults?"


def query_latency(encoder: Any, calls: int) -> dict[str, float]:
    """p50 / p99 milliseconds of encoding one one-line query, in process, after a warm-up."""
    encoder.encode([QUERY], kind="query")
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        encoder.encode([QUERY], kind="query")
        times.append(time.perf_counter() - start)
    return {"calls": calls, "p50_ms": float(np.percentile(times, 50) * 1e3), "p99_ms": float(np.percentile(times, 99) * 1e3)}


def run(
    data_dir: str | Path,
    encoder_dir: str | Path,
    *,
    abstracts: int,
    sentences: int,
    repeat: int,
    fast_passes: int,
    query_calls: int,
) -> dict[str, Any]:
    """Texts/s of the fast encoder (as saved and at 256 tokens), the tokenizer and the teacher, and ratios."""
    from isotrope.encoder import ShapedEncoder

    fast = ShapedEncoder.load(encoder_dir)
    fast256 = ShapedEncoder.load(encoder_dir)
    fast256.backbone.set_max_length(MAX_SEQ_LENGTH)
    teacher = load_sentence_transformer("cpu")
    tokenizer = teacher.tokenizer._tokenizer  # the Rust tokenizer sentence-transformers calls
    tokenizer.enable_truncation(MAX_SEQ_LENGTH)
    sets = {
        "scifact_abstracts": [text for _, text in scifact_documents(data_dir, abstracts)],
        "sts_sentences": sts_sentences(data_dir, sentences),
    }
    results: dict[str, Any] = {
        "encoder": str(encoder_dir),
        "fast_fingerprint": fast.fingerprint,
        "fast_max_length": fast.backbone.max_length,
        "teacher_max_length": MAX_SEQ_LENGTH,
        "fast_passes_per_run": fast_passes,
        "repeat": repeat,
        "sets": {},
    }
    for name, texts in sets.items():

        def passes(encoder: Any, texts: list[str] = texts) -> None:
            for _ in range(fast_passes):
                encoder.encode(texts)

        def tokenize(texts: list[str] = texts) -> None:
            for _ in range(fast_passes):
                tokenizer.encode_batch(texts)

        fast_cold = ShapedEncoder.load(encoder_dir)  # first pass: its word cache is empty
        started = time.perf_counter()
        fast_cold.encode(texts)
        cold_seconds = time.perf_counter() - started
        timings = compare(
            {
                "fast": lambda: passes(fast),
                "fast_256": lambda: passes(fast256),
                "tokenizer_256": tokenize,
                "teacher": lambda texts=texts: teacher.encode(
                    texts, batch_size=BATCH_SIZE, convert_to_numpy=True, normalize_embeddings=True
                ),
            },
            repeat,
            warmups={
                "fast": lambda texts=texts: fast.encode(texts),
                "fast_256": lambda texts=texts: fast256.encode(texts),
                "tokenizer_256": lambda texts=texts: tokenizer.encode_batch(texts[:16]),
                "teacher": lambda texts=texts: teacher.encode(texts[:16]),
            },
        )
        teacher_seconds = timings["teacher"]["median_s"]
        entry: dict[str, Any] = {
            "texts": len(texts),
            "teacher_texts_per_s": len(texts) / teacher_seconds,
            "fast_first_pass_texts_per_s": len(texts) / cold_seconds,
            "speedup_first_pass": ratio(teacher_seconds, cold_seconds),
        }
        for side in ("fast", "fast_256", "tokenizer_256"):
            seconds = timings[side]["median_s"] / fast_passes
            entry[f"{side}_texts_per_s"] = len(texts) / seconds
            entry[f"speedup_{side}"] = ratio(teacher_seconds, seconds)
        entry["timings"] = timings
        results["sets"][name] = entry
        logger.info("%s: %s", name, {key: round(value, 1) for key, value in entry.items() if isinstance(value, float)})
    results["query"] = query_latency(fast, query_calls)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--encoder", required=True, help="a saved fast encoder (isotrope fit --model fast)")
    parser.add_argument("--abstracts", type=int, default=1000, help="SciFact abstracts")
    parser.add_argument("--sentences", type=int, default=2000, help="STS-B test sentences")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--fast-passes", type=int, default=5, help="passes of the fast encoder per timed run")
    parser.add_argument("--query-calls", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_threads(args.threads)
    result = {
        "machine": machine_info(args.threads),
        **run(
            args.data_dir,
            args.encoder,
            abstracts=args.abstracts,
            sentences=args.sentences,
            repeat=args.repeat,
            fast_passes=args.fast_passes,
            query_calls=args.query_calls,
        ),
    }
    print_and_write(result, args.json_out)


if __name__ == "__main__":
    main()
