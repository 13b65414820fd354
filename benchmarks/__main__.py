"""The benchmark suite: ``python -m benchmarks TOPIC [--quick|--full] --data-dir DIR``.

Topics: ``encode`` (backends and ``--model fast`` against sentence-transformers, its ONNX backends
included), ``ingest`` (indexing against LlamaIndex, peak RSS), ``search`` (FAISS/LanceDB search and
the scale run), ``cold`` (a cold ``isotrope search`` process per query), ``hybrid`` (hybrid query
latency against LanceDB's and LlamaIndex's), ``serve`` (``isotrope serve`` under load), ``quality``
(shaping and static tables: quality and speed). Each writes ``benchmarks/results/TOPIC.json`` under
the load rule of :mod:`benchmarks.harness` and prints its table; ``render [--check]`` writes (or
checks) the tables in README.md and docs/ from the results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT, RESULTS_DIR, LoadedMachineError, measured, set_threads, write_result
from isotrope.resources import usable_cores

TOPICS = ("encode", "ingest", "search", "cold", "hybrid", "serve", "quality")
#: the peer environment's Python (sentence-transformers with optimum-onnx), when it exists
PEER_PYTHON = REPO_ROOT / ".venv-st-onnx" / "bin" / "python"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("topic", choices=[*TOPICS, "render"])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="mode", action="store_const", const="quick", help="small sizes (the default)")
    size.add_argument("--full", dest="mode", action="store_const", const="full", help="the sizes the docs cite")
    parser.add_argument("--data-dir", type=Path, help="data root with sts/, retrieval/scifact and corpus/")
    parser.add_argument("--threads", type=int, default=usable_cores(), help="threads for every side (default: cores)")
    parser.add_argument("--allow-loaded", action="store_true", help="measure on a busy machine (the result is marked loaded)")
    parser.add_argument("--workdir", type=Path, default=REPO_ROOT / ".cache" / "bench", help="stores, exports, encoders")
    parser.add_argument("--out", type=Path, help="result file (default benchmarks/results/TOPIC.json)")
    parser.add_argument(
        "--st-onnx-python",
        default=str(PEER_PYTHON) if PEER_PYTHON.exists() else None,
        help="Python of an environment with sentence-transformers[onnx] (encode; default .venv-st-onnx if present)",
    )
    parser.add_argument("--texts", type=int, help="encode: timed sentences (default: the mode's)")
    parser.add_argument("--rounds", type=int, help="encode, ingest: timed rounds (default: the mode's; ingest 2)")
    parser.add_argument("--quality-pairs", type=int, help="encode: STS-B test pairs scored (default: all 1,379)")
    parser.add_argument(
        "--join-abstracts", type=int, default=1, help="ingest: SciFact abstracts per document (long documents; default 1)"
    )
    parser.add_argument(
        "--documents", type=int, help="ingest: SciFact abstracts read (default: 20 with --quick, all with --full)"
    )
    parser.add_argument(
        "--copies", type=int, default=1, help="ingest: the corpus repeated this many times (100,000 chunks; default 1)"
    )
    parser.add_argument(
        "--sides",
        help='ingest: the base sides run, comma-separated ("": none; default: isotrope and LlamaIndex, FAISS and LanceDB)',
    )
    parser.add_argument(
        "--variants",
        help="ingest: isotrope sides beside torch, comma-separated, of onnx, onnx-int8, onnx-int8-per-channel, fast and "
        'fast-pairs ("": none; default all but fast-pairs)',
    )
    parser.add_argument("--check", action="store_true", help="render: exit 1 when a committed table is stale")
    parser.set_defaults(mode="quick")
    args = parser.parse_args(argv)
    if args.topic not in ("render", "search") and args.data_dir is None:
        parser.error(f"{args.topic} needs --data-dir (the data root, e.g. ../shared/data)")
    from benchmarks.ingest import SIDES, VARIANTS

    for option, value, known in (("--variants", args.variants, VARIANTS), ("--sides", args.sides, SIDES)):
        unknown = sorted(set(names(value)) - set(known)) if value is not None else []
        if unknown:
            parser.error(f"{option}: unknown {', '.join(unknown)} (choose from {', '.join(known)})")
    if args.copies < 1:
        parser.error(f"--copies must be at least 1; got {args.copies}")
    if args.data_dir is not None and not args.data_dir.is_dir():
        parser.error(f"--data-dir {args.data_dir} is not a folder")
    return args


def names(listed: str) -> tuple[str, ...]:
    """The names of a comma-separated option (``""``: none)."""
    return tuple(name for name in listed.split(",") if name)


def _cli_json(main: Callable[[list[str]], None], argv: list[str]) -> dict[str, Any]:
    """Run a module's ``main(argv + ["--out", FILE])`` and return the JSON it wrote."""
    with tempfile.TemporaryDirectory(prefix="isotrope-bench-") as tmp:
        out = Path(tmp) / "result.json"
        main([*argv, "--out", str(out)])
        return dict(json.loads(out.read_text()))


def run_topic(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.mode == "quick"
    data = str(args.data_dir) if args.data_dir else ""
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.topic == "encode":
        from benchmarks import encode

        return encode.run(
            args.data_dir,
            mode=args.mode,
            workdir=args.workdir,
            st_onnx_python=args.st_onnx_python,
            threads=args.threads,
            texts=args.texts,
            rounds=args.rounds,
            quality_pairs=args.quality_pairs,
        )
    if args.topic == "ingest":
        from benchmarks import ingest

        return ingest.run(
            args.data_dir,
            quick=quick,
            repeat=args.rounds or 2,
            threads=args.threads,
            join=args.join_abstracts,
            variants=ingest.DEFAULT_VARIANTS if args.variants is None else names(args.variants),
            abstracts=args.documents,
            copies=args.copies,
            sides=ingest.SIDES if args.sides is None else names(args.sides),
        )
    if args.topic == "search":
        from benchmarks import scale, search

        result: dict[str, Any] = {"synthetic": search.run(quick=quick, repeat=3 if quick else 5, workdir=args.workdir)}
        if args.data_dir:
            chunks = "10000" if quick else "1000000"
            result["scale"] = _cli_json(scale.main, ["--chunks", chunks, "--data-dir", data, "--threads", str(args.threads)])
        return result
    if args.topic == "cold":
        from benchmarks import cold

        return cold.run(args.data_dir, quick=quick, threads=args.threads)
    if args.topic == "hybrid":
        from benchmarks import hybrid_latency

        return _cli_json(
            hybrid_latency.main, ["--chunks", "10000" if quick else "100000", "--queries", "100" if quick else "200"]
        )
    if args.topic == "serve":
        from benchmarks import serve

        chunks = "10000" if quick else "100000"
        store = f"lancedb:{args.workdir / f'serve-static-{chunks}'}"
        return _cli_json(
            serve.main,
            ["--data-dir", data, "--store", store, "--chunks", chunks, "--queries", "300" if quick else "1000"],
        )
    from benchmarks import shaping, static

    repeat = 3 if quick else 5
    return {
        "shaping": shaping.run(args.data_dir, quick=quick, repeat=repeat),
        "static": static.run(args.data_dir, quick=quick, repeat=repeat),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("faiss", "httpx", "sentence_transformers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from benchmarks import render

    if args.topic == "render":
        return render.main(check=args.check)
    threads = set_threads(args.threads)
    arguments = sys.argv[1:] if argv is None else argv
    # absolute paths are recorded relative to the repository, so results read the same on every machine
    command = "python -m benchmarks " + shlex.join(
        os.path.relpath(arg, REPO_ROOT) if os.path.isabs(arg) else arg for arg in arguments
    )
    try:
        document = measured(args.topic, command, args.mode, args.allow_loaded, lambda: run_topic(args))
    except LoadedMachineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    document["threads"] = threads
    out = write_result(document, args.out or RESULTS_DIR / f"{args.topic}.json")
    print(render.render_topic(document, show_loaded=True))
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
