"""Cold ``isotrope search``: a fresh process per query, as a user's shell runs it.

Stores of the first N SciFact abstracts are written with ``isotrope index`` (FAISS and LanceDB; the
transformer all-MiniLM-L6-v2, ``--model fast``, and ``--model fast --teacher-queries`` in FAISS). Each round then
runs ``isotrope search STORE QUERY -k 3`` once per store, each in a new process, in rotating order, beside
the floor ``python -c "import numpy, faiss"``, after one untimed run of each (the children may write bytecode, as
an installed package has it: the source files of an editable install are otherwise compiled again in every
process). Per process: wall time from spawn to exit and peak RSS
(``wait4``'s ``ru_maxrss``). Median, spread and every round are reported. Then, warm: each store opened in
this process answers the first :data:`WARM_QUERIES` SciFact queries one at a time (``Collection.search``,
k 3), stores alternating round by round; the median query's milliseconds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import MODEL, scifact_dir, scifact_documents
from benchmarks.harness import alternate, thread_env

SIZES = {"quick": 500, "full": 5183}  # SciFact abstracts per store
ROUNDS = {"quick": 5, "full": 9}
#: name -> the ``isotrope index`` options of its encoder, and the stores it is measured in
ENCODERS = {
    "transformer": (["--model", MODEL], ("faiss", "lancedb")),
    "fast": (["--model", "fast"], ("faiss", "lancedb")),
    "fast, teacher queries": (["--model", "fast", "--teacher-queries"], ("faiss",)),
}
WARM_QUERIES = 50
FLOOR = [sys.executable, "-c", "import numpy, faiss"]


def child_env(threads: int) -> dict[str, str]:
    """This environment with ``threads`` threads, allowed to write bytecode (``PYTHONDONTWRITEBYTECODE`` unset)."""
    return {**{key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}, **thread_env(threads)}


def isotrope_command() -> str:
    """The ``isotrope`` script of this interpreter's environment."""
    return str(Path(sys.executable).parent / "isotrope")


def first_queries(data_dir: str | Path, count: int = 1) -> list[str]:
    with open(scifact_dir(data_dir) / "queries.jsonl", encoding="utf-8") as handle:
        return [str(json.loads(line)["text"]) for line, _ in zip(handle, range(count))]


def build_stores(data_dir: str | Path, workdir: Path, documents: int, threads: int) -> dict[str, str]:
    """``isotrope index`` of the first ``documents`` abstracts into each store with each encoder; name -> URI."""
    corpus = workdir / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as handle:
        for doc_id, text in scifact_documents(data_dir, documents):
            handle.write(json.dumps({"_id": doc_id, "text": text}) + "\n")
    stores = {}
    for encoder, (options, kinds) in ENCODERS.items():
        for kind in kinds:
            folder = f"{kind}-{encoder}".replace(", ", "-").replace(" ", "-")
            uri = f"{kind}:{workdir / folder}"
            command = [isotrope_command(), "index", str(corpus), "--store", uri, *options]
            subprocess.run(command, env=child_env(threads), check=True, capture_output=True)
            stores[f"{kind}, {encoder}"] = uri
    return stores


#: a small process that spawns the measured one and reports its wall time, exit code and peak RSS (KB):
#: a child forked from this (large) process would inherit this process's RSS as its high-water mark
SPAWNER = """
import os, sys, time
out = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
start = time.perf_counter()
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=out)
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - start, os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def timed_process(command: list[str], threads: int) -> tuple[float, float]:
    """Wall seconds from spawn to exit and the process's peak RSS in MB; raises when it fails."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", SPAWNER, *command],
        env=child_env(threads),
        capture_output=True,
        text=True,
        check=True,
    )
    wall, code, peak_kb = done.stdout.split()
    if int(code) != 0:
        raise RuntimeError(f"{' '.join(command)} exited {code}: {done.stderr.strip()[-500:]}")
    return float(wall), int(peak_kb) / 1024


def summary(walls: list[float], peaks: list[float]) -> dict[str, Any]:
    median = statistics.median(walls)
    return {
        "median_s": round(median, 3),
        "spread": round((max(walls) - min(walls)) / median, 3),
        "runs_s": [round(wall, 3) for wall in walls],
        "peak_rss_mb": round(max(peaks), 1),
    }


def warm_queries(stores: dict[str, str], queries: list[str], rounds: int) -> dict[str, float]:
    """Store name -> the median milliseconds of one ``Collection.search(query, k=3)`` on an open store."""
    from isotrope.search import Collection

    collections = {name: Collection.open(uri) for name, uri in stores.items()}
    try:
        per_query = {
            name: (lambda collection=collection: [collection.search(query, k=3) for query in queries])
            for name, collection in collections.items()
        }
        timings = alternate(per_query, rounds)
    finally:
        for collection in collections.values():
            collection.close()
    return {name: round(1000 * timing["median_s"] / len(queries), 2) for name, timing in timings.items()}


def run(data_dir: str | Path, *, quick: bool, threads: int, rounds: int | None = None) -> dict[str, Any]:
    """Build the stores, then ``rounds`` rotating rounds of one cold search per store and the floor, then the
    warm queries."""
    mode = "quick" if quick else "full"
    rounds = rounds or ROUNDS[mode]
    query, *_ = queries = first_queries(data_dir, WARM_QUERIES)
    with tempfile.TemporaryDirectory(prefix="isotrope-cold-") as tmp:
        stores = build_stores(data_dir, Path(tmp), SIZES[mode], threads)
        commands = {'python -c "import numpy, faiss" (the floor)': FLOOR}
        commands.update({name: [isotrope_command(), "search", uri, query, "-k", "3"] for name, uri in stores.items()})
        timings: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in commands}
        names = list(commands)
        for name in names:  # untimed: bytecode written, files in the page cache
            timed_process(commands[name], threads)
        for round_index in range(rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                wall, peak = timed_process(commands[name], threads)
                timings[name][0].append(wall)
                timings[name][1].append(peak)
        warm = warm_queries(stores, queries, rounds)
    processes = {name: summary(walls, peaks) for name, (walls, peaks) in timings.items()}
    for name, milliseconds in warm.items():
        processes[name]["warm_query_ms"] = milliseconds
    return {
        "documents": SIZES[mode],
        "query": query,
        "rounds": rounds,
        "untimed_first": True,
        "warm_queries": len(queries),
        "processes": processes,
    }
