"""A bounded soak of ``isotrope serve`` with faults: mixed search traffic on loopback while writers append.

    python tests/reliability/soak.py --store faiss --duration 600 --clients 4 --out soak.json

builds a store from 10 JSON-lines files (a 16-d word table written here), serves it with
``isotrope serve`` and sends, from ``--clients`` threads with keep-alive connections, a mix of
/search (dense, lexical, hybrid; some with a filter or group_by), /search/batch and /embed for
``--duration`` seconds. Meanwhile a writer adds 5 files at a time to the corpus and runs the
library's index (the reliability driver, resuming into the same store); its second run is killed
with ``kill -9`` at a random moment after its first commit, then resumed. At the end it reports, as JSON:

* requests by status; failed searches a client could not retry (anything but 200, 503 with
  Retry-After, 504 and 408) and connection errors;
* the store against a clean build of the final corpus: chunk ids lost, duplicated and extra, and
  stored vectors that differ from their text encoded again by the store's encoder;
* the server's resident memory (after the first tenth of the run, at the end, at most) and its drift;
* latency p50/p99 of the answered requests (only meaningful on an otherwise idle machine).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_api import free_port, start_server

from harness import WORDS, run, start, write_corpus, write_table

RETRYABLE = {503, 504, 408}


def request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """One request of the mix: a path and its JSON body."""

    def words() -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(1, 6)))

    roll = rng.random()
    if roll < 0.6:
        body: dict[str, Any] = {"query": words(), "k": rng.randint(1, 20), "mode": rng.choice(["dense", "lexical", "hybrid"])}
        if rng.random() < 0.2:
            body["where"] = f"source = 'part{rng.randint(0, 30):03d}.jsonl'"
        elif rng.random() < 0.1:
            body["group_by"] = "source"
        return "/search", body
    if roll < 0.8:
        return "/search/batch", {"queries": [words() for _ in range(rng.randint(2, 8))], "k": 5}
    return "/embed", {"texts": [words() for _ in range(rng.randint(1, 8))]}


class Traffic:
    """Client threads sending the mix until stopped; what they met."""

    def __init__(self, url: str, clients: int, seed: int) -> None:
        self.url = url
        self.statuses: Counter[str] = Counter()
        self.latencies: list[float] = []
        self.unretryable: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, args=(seed + i,), daemon=True) for i in range(clients)]

    def client(self, seed: int) -> None:
        import httpx

        rng = random.Random(seed)
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                path, body = request(rng)
                began = time.perf_counter()
                try:
                    response = client.post(path, json=body)
                except httpx.HTTPError as error:
                    with self.lock:
                        self.statuses["connection error"] += 1
                        self.unretryable.append(f"{path}: {type(error).__name__}: {error}")
                    continue
                elapsed = time.perf_counter() - began
                with self.lock:
                    self.statuses[str(response.status_code)] += 1
                    if response.status_code == 200:
                        self.latencies.append(elapsed)
                    elif response.status_code not in RETRYABLE:
                        self.unretryable.append(f"{path} {json.dumps(body)[:200]}: {response.status_code} {response.text[:200]}")

    def __enter__(self) -> Traffic:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def add_files(corpus: Path, first: int, count: int, seed: int) -> None:
    """Files ``part{first}`` .. of the same form as ``write_corpus``'s, with their own sentences."""
    rng = random.Random(seed)
    for number in range(first, first + count):
        lines = [json.dumps({"text": f"{number} {i} " + " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))}) for i in range(12)]
        (corpus / f"part{number:03d}.jsonl").write_text("\n".join(lines) + "\n")


def writer(corpus: Path, uri: str, table: str, deadline: float, seed: int, log: list[dict[str, Any]]) -> None:
    """Rounds of 5 new files and an index run into ``uri``; the second run is killed -9 and resumed."""
    try:
        _write_rounds(corpus, uri, table, deadline, random.Random(seed), log)
    except Exception as error:  # reported with the figures: a writer that failed is a finding
        log.append({"error": f"{type(error).__name__}: {error}"[:2000]})


def _write_rounds(corpus: Path, uri: str, table: str, deadline: float, rng: random.Random, log: list[dict[str, Any]]) -> None:
    files = len(list(corpus.iterdir()))
    round_ = 0
    while time.monotonic() < deadline:
        round_ += 1
        added = 60 if round_ == 2 else 5  # the killed run has more to do, so the kill lands mid-run
        add_files(corpus, files, added, rng.randrange(2**31))
        files += added
        if round_ == 2:
            before = stored_chunks(uri)
            process = start("index", str(corpus), uri, table)
            while process.poll() is None and stored_chunks(uri) == before:  # until its first commit lands
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 0.3))
            killed = process.poll() is None
            if killed:
                process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()
            process.stderr.close()
            log.append({"round": round_, "files": files, "killed": killed, "chunks_after_kill": stored_chunks(uri)})
        seconds = run("index", str(corpus), uri, table)  # a resume after the kill
        log.append({"round": round_, "files": files, "seconds": round(seconds, 1)})


def stored_chunks(uri: str) -> int:
    """The chunks a reader finds in ``uri`` now (the store alone: no encoder loaded)."""
    from isotrope.search import _store_class, parse_store_uri

    kind, path = parse_store_uri(uri)
    store = _store_class(kind)(path)
    try:
        return len(store)
    finally:
        store.close()


def check_store(uri: str, clean_uri: str) -> dict[str, int]:
    """Ids lost, duplicated and extra against the clean build; vectors that differ from a fresh encode."""
    from isotrope.search import Collection

    with Collection.open(clean_uri) as clean:
        expected = set(clean.store.ids())
    with Collection.open(uri) as collection:
        ids = collection.store.ids()
        unique = sorted(set(ids))
        hits = collection.store.get(unique)
        stored = collection.store.vectors(unique)
        encoded = collection.encoder.encode([hit.text for hit in hits], kind="document")
    differing = int(np.sum(~np.isclose(stored, encoded, atol=1e-5).all(axis=1)))
    return {
        "chunks": len(unique),
        "expected": len(expected),
        "lost": len(expected - set(ids)),
        "duplicated": len(ids) - len(unique),
        "extra": len(set(ids) - expected),
        "vectors_differing": differing,
    }


def soak(kind: str, duration: float, clients: int, seed: int, root: Path) -> dict[str, Any]:
    corpus = write_corpus(root / "corpus", n_files=10)
    table = write_table(root / "table.txt")
    uri = f"{kind}:{root / 'store'}"
    run("index", str(corpus), uri, table)
    port = free_port()
    server = start_server(uri, port, None, root / "serve.log")
    rss: list[tuple[float, float]] = []
    writes: list[dict[str, Any]] = []
    began = time.monotonic()
    deadline = began + duration
    try:
        with Traffic(f"http://127.0.0.1:{port}", clients, seed) as traffic:
            thread = threading.Thread(target=writer, args=(corpus, uri, table, deadline, seed, writes), daemon=True)
            thread.start()
            while time.monotonic() < deadline:
                rss.append((time.monotonic() - began, rss_mib(server.pid)))
                time.sleep(1.0)
            thread.join()
        rss.append((time.monotonic() - began, rss_mib(server.pid)))
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    clean_uri = f"{kind}:{root / 'clean'}"
    run("index", str(corpus), clean_uri, table)
    warm = [mib for at, mib in rss if at >= duration / 10] or [rss[-1][1]]
    latencies = sorted(traffic.latencies)
    return {
        "store": kind,
        "duration_s": duration,
        "clients": clients,
        "requests": sum(traffic.statuses.values()),
        "statuses": dict(traffic.statuses),
        "failed_unretryable": len(traffic.unretryable),
        "failures": traffic.unretryable[:10],
        "writes": writes,
        "store_check": check_store(uri, clean_uri),
        "rss_mib": {"warm": round(warm[0], 1), "end": round(rss[-1][1], 1), "max": round(max(m for _, m in rss), 1)},
        "rss_drift": round((rss[-1][1] - warm[0]) / warm[0], 4),
        "latency_ms": {
            "p50": round(1000 * statistics.median(latencies), 1) if latencies else None,
            "p99": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1) if latencies else None,
        },
        "server_tracebacks": (root / "serve.log").read_text().count("Traceback"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["faiss", "lancedb"], default="faiss")
    parser.add_argument("--duration", type=float, default=600, help="seconds of traffic")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--out", type=Path, help="write the result here as JSON")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="isotrope-soak-"))
    try:
        result = soak(args.store, args.duration, args.clients, args.seed, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
