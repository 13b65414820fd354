"""The benchmark suite's entry point.

    python -m benchmarks.run [--quick] --data-dir DIR --out results.json [--only encode,ingest,...]

``DIR`` is the data root holding ``retrieval/scifact`` and ``sts/stsbenchmark``. Results go
to one JSON file (machine, versions, every figure, the issue's targets checked); render it
with ``python -m benchmarks.report results.json``. ``--quick`` runs small sizes (a few
minutes on two cores); without it the full sizes run (SciFact whole, 1M vectors).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benchmarks.common import REPO_ROOT, machine_info, set_threads

logger = logging.getLogger("benchmarks")

ITEMS = ("encode", "ingest", "shaping", "static", "search", "fitting", "gpu")
NEEDS_DATA = {"encode", "ingest", "shaping", "static", "gpu"}
#: repeats per item (median of N) when --repeat is not given
REPEATS = {
    "quick": {"encode": 3, "ingest": 2, "shaping": 3, "static": 3, "search": 3, "gpu": 3},
    "full": {"encode": 5, "ingest": 2, "shaping": 5, "static": 3, "search": 5, "gpu": 5},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes on two cores")
    parser.add_argument("--data-dir", type=Path, help="data root with retrieval/scifact and sts/stsbenchmark")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated subset of {','.join(ITEMS)}")
    parser.add_argument("--threads", type=int, default=None, help="threads for torch, faiss and BLAS (default: the usable cores)")
    parser.add_argument("--repeat", type=int, default=None, help="timed repeats per comparison (default per item)")
    parser.add_argument("--workdir", type=Path, default=None, help="where temporary stores are written")
    args = parser.parse_args(argv)
    items = [item.strip() for item in args.only.split(",") if item.strip()]
    unknown = sorted(set(items) - set(ITEMS))
    if unknown:
        parser.error(f"unknown item(s) {', '.join(unknown)}; choose from {', '.join(ITEMS)}")
    args.items = [item for item in ITEMS if item in items]
    if NEEDS_DATA & set(args.items):
        if args.data_dir is None:
            parser.error(f"--data-dir is needed by {', '.join(sorted(NEEDS_DATA & set(args.items)))}")
        for folder in ("retrieval/scifact", "sts/stsbenchmark"):
            if not (args.data_dir / folder).is_dir():
                parser.error(f"--data-dir {args.data_dir} has no {folder}/")
    if args.threads is None:
        args.threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return args


def run_item(item: str, args: argparse.Namespace) -> dict[str, Any]:
    mode = "quick" if args.quick else "full"

    def repeat(name: str) -> int:
        return args.repeat or REPEATS[mode][name]

    if item == "encode":
        from benchmarks import encode

        return encode.run(args.data_dir, quick=args.quick, repeat=repeat("encode"))
    if item == "ingest":
        from benchmarks import ingest

        return ingest.run(args.data_dir, quick=args.quick, repeat=repeat("ingest"), threads=args.threads)
    if item == "shaping":
        from benchmarks import shaping

        return shaping.run(args.data_dir, quick=args.quick, repeat=repeat("shaping"))
    if item == "static":
        from benchmarks import static

        return static.run(args.data_dir, quick=args.quick, repeat=repeat("static"))
    if item == "search":
        from benchmarks import search

        return search.run(quick=args.quick, repeat=repeat("search"), workdir=args.workdir)
    if item == "fitting":
        from benchmarks import fitting

        return fitting.run(quick=args.quick, threads=args.threads)
    from benchmarks import gpu

    return gpu.run(
        args.data_dir,
        quick=args.quick,
        repeat=repeat("gpu"),
        ingest_repeat=repeat("ingest"),
        threads=args.threads,
        workdir=args.workdir,
    )


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children (the sides run as children)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("faiss", "httpx", "sentence_transformers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    set_threads(args.threads)
    from benchmarks.report import check_targets

    arguments = sys.argv[1:] if argv is None else argv
    # absolute paths are recorded relative to the repository, so results read the same on every machine
    command = "python -m benchmarks.run " + " ".join(
        os.path.relpath(arg, REPO_ROOT) if os.path.isabs(arg) else arg for arg in arguments
    )
    results: dict[str, Any] = {
        "command": command,
        "mode": "quick" if args.quick else "full",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(args.threads),
        "items": {},
        "seconds": {},
    }
    failed = []
    suite_start = time.perf_counter()
    for item in args.items:
        logger.info("running %s", item)
        start = time.perf_counter()
        try:
            results["items"][item] = run_item(item, args)
        except Exception as error:  # one failing item must not lose the others' figures
            logger.error("%s failed: %s", item, error)
            results["items"][item] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
            failed.append(item)
        results["seconds"][item] = round(time.perf_counter() - start, 1)
        args.out.write_text(json.dumps(results, indent=1))  # partial results survive an interruption
    results["total_seconds"] = round(time.perf_counter() - suite_start, 1)
    results["cpu_seconds"] = round(_cpu_seconds(), 1)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["targets"] = check_targets(results)
    args.out.write_text(json.dumps(results, indent=1))
    logger.info("wrote %s in %.0fs%s", args.out, results["total_seconds"], f"; FAILED: {', '.join(failed)}" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
