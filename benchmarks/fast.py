"""``--model fast``: encode throughput of a saved fast encoder vs its teacher through sentence-transformers.

Same texts (SciFact abstracts, STS-B test sentences), same process, interleaved repeats after a
warm-up (:func:`benchmarks.common.compare`). The teacher is all-MiniLM-L6-v2 with max_seq_length
256, unit vectors as NumPy; the fast encoder is whatever ``isotrope fit --model fast`` saved
(pass its folder), making several passes per timed run so that a run lasts long enough to time.

    python -m benchmarks.fast --data-dir ../shared/data --encoder ENCODER_DIR --json-out fast.json
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.common import compare, machine_info, ratio, scifact_documents, set_threads, sts_sentences
from benchmarks.encode import BATCH_SIZE, load_sentence_transformer

logger = logging.getLogger(__name__)

FAST_PASSES = 20


def run(data_dir: str | Path, encoder_dir: str | Path, *, texts_per_set: int, repeat: int) -> dict[str, Any]:
    """Texts/s of the fast encoder and of the teacher on each text set, and their ratio."""
    from isotrope.encoder import ShapedEncoder

    fast = ShapedEncoder.load(encoder_dir)
    teacher = load_sentence_transformer("cpu")
    sets = {"scifact_abstracts": [text for _, text in scifact_documents(data_dir, texts_per_set)],
            "sts_sentences": sts_sentences(data_dir, texts_per_set)}
    results: dict[str, Any] = {"encoder": str(encoder_dir), "fast_fingerprint": fast.fingerprint,
                               "fast_passes_per_run": FAST_PASSES, "repeat": repeat, "sets": {}}
    for name, texts in sets.items():
        def fast_passes(texts: list[str] = texts) -> None:
            for _ in range(FAST_PASSES):
                fast.encode(texts)

        timings = compare(
            {"fast": fast_passes,
             "teacher": lambda texts=texts: teacher.encode(texts, batch_size=BATCH_SIZE, convert_to_numpy=True,
                                                          normalize_embeddings=True)},
            repeat, warmups={"fast": lambda: fast.encode(texts[:16]), "teacher": lambda: teacher.encode(texts[:16])})
        fast_seconds = timings["fast"]["median_s"] / FAST_PASSES
        teacher_seconds = timings["teacher"]["median_s"]
        results["sets"][name] = {"texts": len(texts), "fast_texts_per_s": len(texts) / fast_seconds,
                                 "teacher_texts_per_s": len(texts) / teacher_seconds,
                                 "speedup": ratio(teacher_seconds, fast_seconds), "timings": timings}
        logger.info("%s: fast %.0f texts/s, teacher %.0f texts/s", name, len(texts) / fast_seconds,
                    len(texts) / teacher_seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--encoder", required=True, help="a saved fast encoder (isotrope fit --model fast)")
    parser.add_argument("--texts", type=int, default=512, help="texts per set")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    set_threads(args.threads)
    result = {"machine": machine_info(args.threads),
              **run(args.data_dir, args.encoder, texts_per_set=args.texts, repeat=args.repeat)}
    text = json.dumps(result, indent=2)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
