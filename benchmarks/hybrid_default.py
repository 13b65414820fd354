"""The default search a user gets (calibrated per store without labels) beside dense, lexical and fixed hybrid.

For each retrieval set (BEIR folder) and model: ``isotrope eval retrieval --model MODEL --fit-corpus corpus
--beir SET --mode auto --store faiss,lancedb`` (the corpus indexed into each store, the store's default
search chosen from its own chunks as ``isotrope index`` does, then every mode scored on the set's test
qrels). Writes one JSON per run and prints a markdown table (nDCG@10, FAISS / LanceDB):

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.hybrid_default --data-dir ../shared/data \\
        --sets retrieval/scifact .cache/isotrope/sets/stsb-para .cache/isotrope/sets/sick-para \\
        .cache/isotrope/sets/20ng-topic --models all-MiniLM-L6-v2 fast --cache-dir .cache/isotrope \\
        --out benchmarks/results/hybrid_default
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from isotrope.config import EncoderConfig
from isotrope.evaluate.commands import evaluate, write_json
from isotrope.evaluate.harness import Evaluator

STORES = ("faiss", "lancedb")
COLUMNS = ("dense", "lexical", "hybrid", "auto")
#: a model name ending so (``fast-pairs``) is ``--model fast --fast-pairs``
PAIRS = "-pairs"


def run(folder: Path, model: str, cache_dir: str | None, out: Path) -> dict:
    """One ``eval retrieval --mode auto`` run, written to ``out/<set>__<model>.json``."""
    result = evaluate(
        "retrieval",
        EncoderConfig(model=model.removesuffix(PAIRS), fast_pairs=model.endswith(PAIRS)),
        Evaluator(cache_dir=cache_dir),
        beir=folder,
        fit_corpus="corpus",
        modes=["auto"],
        stores=list(STORES),
    )
    result = {"set": folder.name, "model": model, **result}
    write_json(result, out / f"{folder.name}__{model.replace(':', '_').replace('/', '_')}.json")
    return result


def table(results: list[tuple[str, str, dict]]) -> str:
    """Markdown: set x model rows, each mode's nDCG@10 (FAISS / LanceDB), the choice, the target check."""
    lines = [
        "| set | encoder | dense | lexical | hybrid (α 0.45) | **default** | chosen (FAISS / LanceDB) | ≥ max(dense, lexical) − 0.5 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, model, result in results:
        scores = result["scores"]
        cells = [" / ".join(f"{scores[kind][column]['ndcg@10']:.2f}" for kind in STORES) for column in COLUMNS]
        met = all(
            scores[kind]["auto"]["ndcg@10"] >= max(scores[kind]["dense"]["ndcg@10"], scores[kind]["lexical"]["ndcg@10"]) - 0.5
            for kind in STORES
        )
        chosen = " / ".join(_chosen(result["default_search"][kind]) for kind in STORES)
        lines.append(f"| {name} | {model} | {' | '.join(cells[:3])} | **{cells[3]}** | {chosen} | {'yes' if met else '**no**'} |")
    return "\n".join(lines)


def _chosen(choice: dict) -> str:
    return choice["mode"] + (f" {choice['alpha']:g}" if choice.get("alpha") is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sets", nargs="+", required=True, help="BEIR folders (relative to --data-dir, or paths)")
    parser.add_argument("--models", nargs="+", default=["all-MiniLM-L6-v2", "fast"])
    parser.add_argument("--cache-dir", default=".cache/isotrope")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hybrid_default"))
    parser.add_argument("--report", action="store_true", help="only print the table of the runs in --out")
    args = parser.parse_args()
    if args.report:
        runs = [json.loads(path.read_text()) for path in sorted(args.out.glob("*__*.json"))]
        print(table([(run["set"], run["model"], run) for run in runs if "set" in run]))
        return
    results = []
    for model in args.models:
        for name in args.sets:
            folder = args.data_dir / name if (args.data_dir / name).is_dir() else Path(name)
            result = run(folder, model, args.cache_dir, args.out)
            results.append((folder.name, model, result))
            print(
                json.dumps(
                    {
                        "set": folder.name,
                        "model": model,
                        "ndcg@10": {k: v["auto"]["ndcg@10"] for k, v in result["scores"].items()},
                    }
                )
            )
    print(table(results))


if __name__ == "__main__":
    main()
