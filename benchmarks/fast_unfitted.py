"""``--model fast`` on SciFact without the fit: the unfitted table (context rows, mapped input rows
for unseen tokens, ``whiten-partial``) at given teacher samples, to compare with the fitted curve
(docs/results/fast.md). Same harness and cache as ``isotrope eval retrieval --model fast``;
only the candidate lambdas are emptied, which is the fallback path the product takes when no fit wins.

    python -m benchmarks.fast_unfitted --data-dir ../shared/data --cache-dir .cache/isotrope \
        --samples 1000 --samples 2500 --out benchmarks/results/fast_unfitted.json
"""

from __future__ import annotations

import argparse
import functools
import logging
from pathlib import Path

import isotrope.distill
from benchmarks.common import print_and_write
from isotrope.config import EncoderConfig
from isotrope.evaluate.commands import run_retrieval
from isotrope.evaluate.harness import Evaluator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--samples", type=int, action="append", required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    isotrope.distill.distill_table = functools.partial(isotrope.distill.distill_table, lambdas=())
    evaluator = Evaluator(cache_dir=args.cache_dir)
    result = {}
    for samples in args.samples:
        scores = run_retrieval(
            evaluator,
            EncoderConfig(model="fast", shape="whiten-partial", distill_samples=samples),
            beir=args.data_dir / "retrieval" / "scifact",
            fit_corpus="corpus",
        )
        result[str(samples)] = {key: scores.get(key) for key in ("scores", "fitted_on", "distill")}
        logging.info("unfitted, %d teacher samples: %s", samples, scores["scores"])
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
