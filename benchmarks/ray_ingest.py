"""Ingestion of SciFact on a local Ray runtime vs the single-process pipeline: wall time and memory.

    python -m benchmarks.ray_ingest --data-dir DIR --out ray_ingest.json [--limit N] [--store lancedb]
    python -m benchmarks.ray_ingest --data-dir DIR --out F.json --passages 1000000 --encoder FAST_ENCODER

Each side runs once, in its own process (``python -m benchmarks.ray_ingest --side ...``), on the
same JSON-lines file (SciFact abstracts, ``_id`` and title + text), with ``isotrope index``'s
defaults (all-MiniLM-L6-v2, the default shaping, 256-token chunks):

* ``single``: :func:`isotrope.ingest.pipeline.index_documents`, torch on ``--threads`` threads;
* ``ray``: :func:`isotrope.connectors.ray.index_with_ray` on ``ray.init(num_cpus=--threads)``
  with ``--threads`` embedding actors of one thread each. Ray's start-up is timed apart.

Memory: the single process's peak RSS (VmHWM). For Ray, the driver and every process it
started (GCS, raylet, workers, actors) are sampled every 0.25 s from /proc; the peaks of
their summed RSS and of their summed PSS are reported (RSS counts the shared object store
once per process that maps it; PSS splits shared pages between them). Afterwards the parent
checks that both stores hold the same vectors (max abs difference by id) and the same top-10.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MAX_SEQ_LENGTH,
    MODEL,
    child_main,
    child_parser,
    machine_info,
    ratio,
    run_child,
)

logger = logging.getLogger(__name__)

SIDES = ("single", "ray")
QUERIES = (
    "vitamin D deficiency and bone fractures",
    "gene expression in cancer cells",
    "effect of exercise on blood pressure",
    "antibiotic resistance of bacteria",
    "microRNA regulation of development",
)


# -- memory of a process tree (Linux /proc) ------------------------------------------
def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, stack = _children(), [], [pid]
    while stack:
        for child in tree.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _memory_kb(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB; zeros when it has exited."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


class TreeMemory:
    """Samples the summed RSS and PSS of this process and all its descendants in a thread; keeps the peaks."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_rss_kb = self.peak_pss_kb = self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        pids = [os.getpid(), *_descendants(os.getpid())]
        totals = [_memory_kb(pid) for pid in pids]
        self.peak_rss_kb = max(self.peak_rss_kb, sum(rss for rss, _ in totals))
        self.peak_pss_kb = max(self.peak_pss_kb, sum(pss for _, pss in totals))
        self.peak_processes = max(self.peak_processes, len(pids))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- the child process: one side ----------------------------------------------------
def _common_options(device: str, encoder_dir: Path | None) -> dict[str, Any]:
    from isotrope.config import EncoderConfig
    from isotrope.encoder import DEFAULT_SHAPE, ShapedEncoder

    if encoder_dir is not None:  # a saved (fitted) encoder over the scale benchmark's passages
        return {"encoder": ShapedEncoder.load(encoder_dir), "loader_options": {"id_field": "pid"}, "show_progress": False}
    config = EncoderConfig(model=MODEL, shape=DEFAULT_SHAPE, max_length=MAX_SEQ_LENGTH)
    return {
        "encoder": ShapedEncoder.create(config, device=device),  # unfitted: fitted by the pipeline
        "loader_options": {"id_field": "_id"},
        "show_progress": False,
    }


def run_single(corpus: Path, store: str, encoder_dir: Path | None = None) -> dict[str, Any]:
    from isotrope.ingest.pipeline import index_documents

    start = time.perf_counter()
    report = index_documents(corpus, store, **_common_options("cpu", encoder_dir))
    return {
        "index_s": time.perf_counter() - start,
        "report": report.summary(),
        "chunks": report.chunks,
        "steps_s": {step: round(value, 3) for step, value in report.seconds.items()},
    }


def run_ray(corpus: Path, store: str, workers: int, encoder_dir: Path | None = None) -> dict[str, Any]:
    # one thread per actor; workers inherit this environment from the runtime started below
    os.environ.update(dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"), "1"))
    import ray
    from isotrope.connectors.ray import index_with_ray

    with TreeMemory() as memory:
        start = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        started = time.perf_counter()
        try:
            report = index_with_ray(corpus, store, num_actors=workers, **_common_options("cpu", encoder_dir))
        finally:
            ended = time.perf_counter()
            ray.shutdown()
    return {
        "ray_init_s": started - start,
        "index_s": ended - started,
        "total_s": ended - start,
        "report": report.summary(),
        "chunks": report.chunks,
        "steps_s": {step: round(value, 3) for step, value in report.seconds.items()},
        "tree_peak_rss_mb": memory.peak_rss_kb / 1024,
        "tree_peak_pss_mb": memory.peak_pss_kb / 1024,
        "processes": memory.peak_processes,
    }


def _child(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    if args.side == "single":
        result = run_single(args.corpus, args.store, args.encoder)
    else:
        result = run_ray(args.corpus, args.store, args.threads, args.encoder)
    result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    return result


# -- the parent: both sides ---------------------------------------------------------
def compare_stores(single: str, distributed: str) -> dict[str, Any]:
    """Max abs vector difference by id, and whether the top-10 of a few queries agree."""
    import numpy as np

    from isotrope.search import Collection

    with Collection.open(single) as reference, Collection.open(distributed) as store:
        ids = reference.store.ids()
        same_ids = sorted(ids) == sorted(store.store.ids())
        difference = float(np.abs(store.store.vectors(ids) - reference.store.vectors(ids)).max())
        mine, theirs = store.search(list(QUERIES), k=10), reference.search(list(QUERIES), k=10)
        same_top10 = all([h.id for h in a] == [h.id for h in b] for a, b in zip(mine, theirs))
    return {"same_ids": same_ids, "max_abs_vector_difference": difference, "same_top10": same_top10}


def write_passages(data_dir: str | Path, folder: Path, n: int, files: int = 16) -> int:
    """The scale benchmark's first ``n`` passages as ``files`` JSON-lines files (``pid``, ``text``)."""
    from benchmarks.scale import passages, read_sentences

    folder.mkdir()
    with ExitStack() as stack:
        handles = [stack.enter_context(open(folder / f"part-{i:02d}.jsonl", "w", encoding="utf-8")) for i in range(files)]
        for count, (pid, text) in enumerate(passages(read_sentences(data_dir), n)):
            handles[count % files].write(json.dumps({"pid": pid, "text": text}) + "\n")
    return n


def run(
    data_dir: str | Path,
    *,
    threads: int,
    store_kind: str = "lancedb",
    limit: int | None = None,
    workdir: Path | None = None,
    passages: int | None = None,
    encoder_dir: Path | None = None,
) -> dict[str, Any]:
    from benchmarks.ingest import write_corpus

    with tempfile.TemporaryDirectory(prefix="isotrope-ray-ingest-", dir=workdir) as tmp:
        if passages:
            corpus = Path(tmp) / "passages"
            documents = write_passages(data_dir, corpus, passages)
        else:
            corpus = Path(tmp) / "scifact.jsonl"
            documents = write_corpus(data_dir, corpus, limit)
        results: dict[str, Any] = {
            "documents": documents,
            "corpus": f"{passages} scale-benchmark passages" if passages else "SciFact",
            "model": encoder_dir.name if encoder_dir else MODEL,
            "store": store_kind,
            "threads": threads,
            "machine": machine_info(threads),
            "sides": {},
        }
        stores = {side: f"{store_kind}:{Path(tmp) / side}" for side in SIDES}
        for side in SIDES:
            args = ["--side", side, "--corpus", str(corpus), "--store", stores[side]]
            args += ["--encoder", str(encoder_dir)] if encoder_dir else []
            results["sides"][side] = run_child("benchmarks.ray_ingest", args, threads)
            logger.info("%s: %.1fs", side, results["sides"][side]["index_s"])
        results["agreement"] = compare_stores(stores["single"], stores["ray"])
    single, distributed = results["sides"]["single"], results["sides"]["ray"]
    results["ratios"] = {
        "ray_index_over_single": ratio(distributed["index_s"], single["index_s"]),
        "ray_total_over_single": ratio(distributed["total_s"], single["index_s"]),
        "ray_tree_pss_over_single_rss": ratio(distributed["tree_peak_pss_mb"], single["peak_rss_mb"]),
    }
    return results


def main() -> None:
    parser = child_parser("One side of the Ray ingestion benchmark, in its own process.")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--encoder", type=Path)
    child_main(parser, _child)


def parent_main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ray_ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="data root holding retrieval/scifact")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--store", choices=("lancedb", "faiss"), default="lancedb")
    parser.add_argument("--limit", type=int, default=None, help="first N SciFact documents (default: all)")
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="single side: torch threads; ray side: CPUs and one-thread actors",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where the corpus and the stores are written")
    parser.add_argument("--passages", type=int, help="index N of the scale benchmark's passages instead of SciFact")
    parser.add_argument("--encoder", type=Path, help="with --passages: a saved encoder folder (e.g. --model fast)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    results = run(
        args.data_dir,
        threads=args.threads,
        store_kind=args.store,
        limit=args.limit,
        workdir=args.workdir,
        passages=args.passages,
        encoder_dir=args.encoder,
    )
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps({key: results[key] for key in ("sides", "agreement", "ratios")}, indent=1))


if __name__ == "__main__":
    import sys

    if "--side" in sys.argv:
        main()
    else:
        parent_main()
