"""Shared helpers: thread settings, timing (warm-up, interleaved repeats, median), peak memory,
child processes (one per measured side, so sides never share memory), machine facts and data."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the transformer every comparison uses, and sentence-transformers' max_seq_length for it
MODEL = "all-MiniLM-L6-v2"
MAX_SEQ_LENGTH = 256
LIBRARIES = (
    "isotrope", "torch", "transformers", "tokenizers", "sentence-transformers", "numpy", "scipy",
    "scikit-learn", "faiss-cpu", "faiss-gpu-cu12", "lancedb", "pylance", "pyarrow", "llama-index-core",
    "llama-index-embeddings-huggingface", "llama-index-vector-stores-faiss", "llama-index-vector-stores-lancedb",
)  # fmt: skip


# -- threads ------------------------------------------------------------------------
def thread_env(threads: int) -> dict[str, str]:
    """Environment that pins OpenMP / MKL / tokenizers threading for a child process."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "RAYON_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "true",
    }


def set_threads(threads: int) -> None:
    """Use ``threads`` threads in torch, faiss and the BLAS/OpenMP pools already loaded (numpy, scipy)."""
    from threadpoolctl import threadpool_limits

    os.environ.update(thread_env(threads))
    threadpool_limits(limits=threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


# -- timing -------------------------------------------------------------------------
def print_and_write(result: dict[str, Any], out: Path | None) -> None:
    """Print a benchmark's JSON result and, when ``out`` is given, write it there too."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")


def summarize(times: list[float]) -> dict[str, Any]:
    """Median, min and every run, in seconds."""
    return {"median_s": statistics.median(times), "min_s": min(times), "runs_s": [round(t, 6) for t in times]}


def compare(
    sides: Mapping[str, Callable[[], Any]],
    repeat: int,
    warmups: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Time each side ``repeat`` times after one untimed warm-up per side.

    Rounds are interleaved and the order rotates every round (A B, B A, ...), so a
    slow spell of a shared machine falls on every side alike. Returns a summary per side.
    """
    names = list(sides)
    for name in names:
        (warmups or sides)[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeat):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            sides[name]()
            times[name].append(time.perf_counter() - start)
    return {name: summarize(values) for name, values in times.items()}


def ratio(numerator: float, denominator: float) -> float | None:
    return None if not denominator else numerator / denominator


# -- memory -------------------------------------------------------------------------
def _status_mb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (VmHWM; ru_maxrss where /proc is missing)."""
    value = _status_mb("VmHWM")
    if value is None:
        scale = 1024 * 1024 if sys.platform == "darwin" else 1024
        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    return value


def current_rss_mb() -> float:
    """Resident memory of this process now (VmRSS; the peak where /proc is missing)."""
    value = _status_mb("VmRSS")
    return peak_rss_mb() if value is None else value


# -- child processes ----------------------------------------------------------------
def run_child(module: str, args: list[str], threads: int, timeout: float | None = None) -> dict[str, Any]:
    """Run ``python -m module ARGS --threads N --json-out FILE`` in a fresh process and return its JSON.

    The child reports its own peak RSS (:func:`child_main` adds it); ``process_wall_s`` is the
    child's whole life seen from here, interpreter start and imports included.
    """
    with tempfile.TemporaryDirectory(prefix="isotrope-bench-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", module, *args, "--threads", str(threads), "--json-out", str(out)]
        env = {**os.environ, **thread_env(threads), "PYTHONPATH": _pythonpath()}
        start = time.perf_counter()
        done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - start
        if done.returncode != 0 or not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"{' '.join(command)} exited with code {done.returncode}:\n{tail}")
        result = json.loads(out.read_text())
    result["process_wall_s"] = wall
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


# -- machine ------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The short commit of the git tree at ``root`` (``+dirty`` with uncommitted changes), or None outside one."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def cuda_device() -> str | None:
    """Name of the first CUDA device torch sees, or None."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_info(threads: int) -> dict[str, Any]:
    """Facts that make the numbers reproducible: CPU, cores, RAM, load, versions, commit."""
    return {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_gb": ram_gb(),
        "threads": threads,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpu": cuda_device(),
        "libraries": library_versions(),
        "git_commit": git_commit(),
    }


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


def run_per_set_and_model(
    out_json: Path, data_dir: Path, sets: list[str], models: list[str], measure: Callable[[Path, str], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``measure(folder, model)`` for every set and model not yet in ``out_json``, which is rewritten after
    each one (an interrupted run resumes); a set is a folder under ``data_dir`` or a path. Returns all rows."""
    results = json.loads(out_json.read_text()) if out_json.exists() else []
    done = {(row["set"], row["model"]) for row in results}
    for name in sets:
        folder = data_dir / name if (data_dir / name).exists() else Path(name)
        for model in models:
            if (folder.name, model) in done:
                continue
            results.append(measure(folder, model))
            out_json.parent.mkdir(parents=True, exist_ok=True)
            out_json.write_text(json.dumps(results, indent=2) + "\n")
    return results


def store_label(uri: str) -> str:
    """``kind:folder`` of a store URI (the folder's name only: results name no machine paths)."""
    from isotrope.search import parse_store_uri

    kind, path = parse_store_uri(uri)
    return f"{kind}:{path.name}"
