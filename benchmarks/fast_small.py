"""``--model fast`` on small corpora: the fitted table against its teacher and the unfitted table, and
variants of the fit, each fitted on the evaluated corpus alone (nDCG@10, exact search).

Every cell goes through the harness as ``isotrope eval retrieval --model fast --fit-corpus corpus --beir
DIR`` does; a variant only changes the keyword arguments of :func:`isotrope.distill.distill_table`:

* ``default``: the product (pseudo-query rows; λ by agreement, the pseudo-query proxy's veto);
* ``unfitted``: no fit strength to try (the unfitted context table, the fallback);
* ``sentence-windows``: the budget a small corpus leaves spent on its chunks' sentences (their own
  teacher vectors as targets);
* ``no-query-rows``: without the pseudo-query rows (each chunk's sentences mapped to the chunk's
  teacher vector) that the default adds;
* ``fit-always``: the fit the proxy ranks best, even when its interval does not clear the margin;
* ``lam-X``: the fit at that one strength (X times the unit), whatever the proxy says;
* ``no-mixes``: without the candidates halfway between the unfitted table and a fit (the rule before them);
* ``pairs``: ``--fast-pairs`` (token-pair rows, :mod:`isotrope.token_pairs`, where the rule keeps them);
* ``pairs-X``: the token-pair table at that one strength, whatever its agreement with the teacher;
* ``query-weight-X``: the pseudo-query rows of a chunk weighing X times its own row (the default: 1);
* ``teacher-queries``: the product's table with ``--teacher-queries`` (queries also through the teacher);
  ``teacher-queries-W``: the same with the teacher's vector weighing W in the mix (the default:
  :data:`isotrope.teacher_queries.WEIGHT`);
* ``teacher``: the transformer itself (all-MiniLM-L6-v2, unshaped).

``--teacher-backend`` runs the distillation's teacher on that runtime (default: the product's,
:func:`isotrope.backbones.static.teacher_backend`); its cells are keyed ``VARIANT@BACKEND``.

Results are written after every cell, so a long run keeps what it finished.

    python -m benchmarks.fast_small --cache-dir .cache/isotrope --sets S/scifact-500 S/scifact-1000 \\
        --variants teacher default unfitted --out benchmarks/results/fast_small.json
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
from pathlib import Path
from typing import Any

import isotrope.backbones.static
import isotrope.distill
import isotrope.teacher_queries
from benchmarks.common import MODEL, print_and_write
from isotrope.backbones.backends import BACKENDS
from isotrope.config import EncoderConfig
from isotrope.evaluate.commands import run_retrieval
from isotrope.evaluate.harness import Evaluator

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "unfitted": {"lambdas": ()},
    "sentence-windows": {"windows": "sentences"},
    "no-query-rows": {"query_weight": 0.0},
    "fit-always": {"margin": -100.0},
    **{f"lam-{lam:g}": {"lambdas": (lam,), "mixes": (), "margin": -100.0} for lam in (10.0, 3.0, 1.0, 0.3)},
    "no-mixes": {"mixes": ()},
    "pairs": {},
    **{f"pairs-{lam:g}": {"pair_lambdas": (lam,)} for lam in (1.0, 0.3)},
    **{f"query-weight-{weight:g}": {"query_weight": weight} for weight in (0.3, 3.0)},
}


TEACHER_WEIGHTS = (0.25, 0.75, 1.0)


def run_cell(cache_dir: Path, folder: Path, variant: str, modes: list[str], split: str | None = None) -> dict[str, Any]:
    """One set and one variant, with a fresh harness (a fitted table is never reused across variants)."""
    original, weight = isotrope.distill.distill_table, isotrope.teacher_queries.WEIGHT
    give_back = isotrope.distill.PAIR_GIVE_BACK
    if variant.startswith("pairs-"):
        isotrope.distill.PAIR_GIVE_BACK = float("inf")
    if variant in VARIANTS:
        isotrope.distill.distill_table = functools.partial(original, **VARIANTS[variant])
    if variant.startswith("teacher-queries-"):
        isotrope.teacher_queries.WEIGHT = float(variant.rsplit("-", 1)[1])
    try:
        if variant == "teacher":
            config = EncoderConfig(model=MODEL)
        else:
            config = EncoderConfig(
                model="fast", teacher_queries=variant.startswith("teacher-queries"), fast_pairs=variant.startswith("pairs")
            )
        scores = run_retrieval(
            Evaluator(cache_dir=cache_dir),
            config,
            beir=folder,
            fit_corpus="corpus",
            split=split,
            modes=modes if variant != "unfitted" else [],
        )
    finally:
        isotrope.distill.distill_table, isotrope.teacher_queries.WEIGHT = original, weight
        isotrope.distill.PAIR_GIVE_BACK = give_back
    return {key: scores.get(key) for key in ("scores", "fitted_on", "distill")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--sets", type=Path, nargs="+", required=True, help="BEIR folders")
    weights = [f"teacher-queries-{weight:g}" for weight in TEACHER_WEIGHTS]
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["teacher", "default", "unfitted"],
        choices=["teacher", "teacher-queries", *weights, *VARIANTS],
    )
    parser.add_argument("--split", help="the qrels split scored (default test; SciFact's train chose the defaults)")
    parser.add_argument("--modes", nargs="*", default=[], help="also through a FAISS store: dense, lexical, hybrid")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--teacher-backend", choices=BACKENDS, help="the distillation teacher's runtime (default: the product's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result: dict[str, dict[str, Any]] = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
    if args.teacher_backend:
        isotrope.backbones.static.TEACHER_BACKEND = args.teacher_backend
    suffix = f"@{args.teacher_backend}" if args.teacher_backend else ""
    for folder in args.sets:
        for variant in args.variants:
            result.setdefault(folder.name, {})[variant + suffix] = cell = run_cell(
                args.cache_dir, folder, variant, args.modes, args.split
            )
            logging.info("%s / %s%s: %s", folder.name, variant, suffix, cell["scores"])
            print_and_write(result, args.out)


if __name__ == "__main__":
    main()
