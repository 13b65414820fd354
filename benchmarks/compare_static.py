"""One table, one run: BM25, model2vec, ``static:`` + ``whiten-partial``, ``fast`` and the teacher.

Retrieval sets (nDCG@10, exact search): SciFact and any BEIR folder passed with ``--beir``
(``benchmarks/build_retrieval_sets.py`` builds more). STS (Spearman x100, test): STS-B and SICK-R.

* BM25: ``bm25s`` (English stop words, Snowball stemmer); retrieval only.
* model2vec: ``model2vec.distill`` of the same teacher (defaults: PCA to 256 dims, SIF
  weights), made into ``--model2vec DIR`` when that folder does not exist yet; no fitting on
  any corpus. ``model2vec.distill`` needs ``skeletoken`` (its ``distill`` extra, which would also
  pin transformers < 5.4): ``pip install --no-deps skeletoken`` is enough.
* ``static:all-MiniLM-L6-v2`` + ``whiten-partial``: fitted on the retrieval corpus, or on
  ``--sts-fit-corpus`` for STS.
* ``fast``: distilled on the retrieval corpus (the teacher over ``--distill-samples`` of its
  texts), or on ``--sts-fit-corpus`` for STS (never the scored sentences).
* the teacher, all-MiniLM-L6-v2, mean pooling.

The teacher's token states are cached in ``--cache-dir`` (shared by the teacher rows and the
``fast`` distillations).

    python -m benchmarks.compare_static --data-dir ../shared/data --cache-dir .cache/isotrope \
        --model2vec M2V_DIR --sts-fit-corpus STS_FIT.txt --out benchmarks/results/compare_static.json
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import Any

from benchmarks.common import print_and_write
from benchmarks.hybrid import bm25s_baseline
from isotrope.config import EncoderConfig
from isotrope.evaluate.commands import run_retrieval, run_sts
from isotrope.evaluate.data import load_beir, load_sick, load_stsb
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.tasks import eval_retrieval, eval_sts

logger = logging.getLogger(__name__)

TEACHER = "all-MiniLM-L6-v2"
RECIPES = {
    "static + whiten-partial": EncoderConfig(model=f"static:{TEACHER}", shape="whiten-partial"),
    "fast": EncoderConfig(model="fast", shape="whiten-partial"),
    "teacher": EncoderConfig(model=TEACHER),
}


def model2vec_scores(folder: Path, data_dir: Path, beirs: dict[str, Path]) -> dict[str, float]:
    from model2vec import StaticModel

    if not folder.exists():
        from model2vec.distill import distill

        from isotrope.backbones.resolve import resolve_model_path

        started = time.perf_counter()
        distill(model_name=resolve_model_path(TEACHER), pca_dims=256, device="cpu").save_pretrained(str(folder))
        logger.info("model2vec: distilled %s into %s in %.0f s", TEACHER, folder, time.perf_counter() - started)
    model = StaticModel.from_pretrained(str(folder))

    def encode(texts: list[str], kind: str) -> Any:
        return model.encode(list(texts))

    scores = {name: round(eval_retrieval(encode, load_beir(path))["ndcg@10"], 2) for name, path in beirs.items()}
    scores["stsb"] = round(eval_sts(encode, load_stsb(data_dir, "test")), 2)
    scores["sickr"] = round(eval_sts(encode, load_sick(data_dir, "test")), 2)
    return scores


def run(
    data_dir: Path,
    cache_dir: Path,
    model2vec: Path | None,
    sts_fit_corpus: str,
    beirs: dict[str, Path],
    distill_samples: int | None,
    sts_distill_samples: int | None,
    fit_samples: int,
    rows: list[str],
) -> dict[str, Any]:
    evaluator = Evaluator(cache_dir=cache_dir, fit_samples=fit_samples)
    table: dict[str, dict[str, float]] = {}
    details: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for row in rows:
        started = time.perf_counter()
        if row == "bm25":
            table[row] = {name: bm25s_baseline(load_beir(path)) for name, path in beirs.items()}
        elif row == "model2vec":
            if model2vec is None:
                logger.info("model2vec: no --model2vec folder, row left out")
                continue
            table[row] = model2vec_scores(model2vec, data_dir, beirs)
        else:
            recipe = sts_recipe = RECIPES[row]
            if row == "fast":
                recipe = recipe.replace(distill_samples=distill_samples)
                sts_recipe = recipe.replace(distill_samples=sts_distill_samples)
            table[row], details[row] = {}, {}
            for name, path in beirs.items():
                result = run_retrieval(evaluator, recipe, beir=path, fit_corpus="corpus")
                table[row][name] = result["scores"]["ndcg@10"]
                details[row][name] = {key: result.get(key) for key in ("scores", "fitted_on", "distill")}
            result = run_sts(
                evaluator,
                sts_recipe,
                tasks=["stsb", "sickr"],
                data_dir=data_dir,
                fit_corpus=None if row == "teacher" else sts_fit_corpus,
            )
            table[row].update(result["scores"])
            details[row]["sts"] = {key: result.get(key) for key in ("scores", "fitted_on", "distill")}
        seconds[row] = round(time.perf_counter() - started, 1)
        logger.info("%s: %s (%.0f s)", row, table[row], seconds[row])
    return {
        "table": table,
        "details": details,
        "seconds": seconds,
        "sts_fit_corpus": Path(sts_fit_corpus).name,
        "distill_samples": distill_samples,
        "sts_distill_samples": sts_distill_samples,
        "fit_samples": fit_samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument(
        "--model2vec", type=Path, help="model2vec.distill of the teacher: read from this folder, or distilled into it"
    )
    parser.add_argument(
        "--sts-fit-corpus", required=True, help="text file the static rows are fitted on for STS (never the test sentences)"
    )
    parser.add_argument("--beir", type=Path, action="append", default=[], help="more BEIR folders")
    parser.add_argument("--distill-samples", type=int, help="fast on a retrieval corpus (default: the product's)")
    parser.add_argument("--sts-distill-samples", type=int, help="fast on --sts-fit-corpus (default: the product's)")
    parser.add_argument("--fit-samples", type=int, default=30000)
    parser.add_argument("--row", action="append", choices=["bm25", "model2vec", *RECIPES])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    beirs = {path.name: path for path in [args.data_dir / "retrieval" / "scifact", *args.beir]}
    result = run(
        args.data_dir,
        args.cache_dir,
        args.model2vec,
        args.sts_fit_corpus,
        beirs,
        args.distill_samples,
        args.sts_distill_samples,
        args.fit_samples,
        args.row or ["bm25", "model2vec", *RECIPES],
    )
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
