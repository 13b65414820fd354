"""Load benchmark of ``isotrope serve``: N queries from C concurrent clients over loopback HTTP.

    python -m benchmarks.serve --data-dir ../shared/data --store lancedb:/tmp/serve-static \
        --model static:all-MiniLM-L6-v2 --shape whiten-partial

builds the store once (the first ``--chunks`` sentences of the general-English corpus, one
chunk each; reused when it exists), starts ``isotrope serve`` on a free 127.0.0.1 port,
sends ``--queries`` dense searches (held-out corpus sentences, k=10) from ``--clients`` threads,
each with its own keep-alive connection, and prints p50/p99 latency, queries per second and
the error count as JSON. The server process is stopped at the end whatever happens.

``--serve-args`` passes options to ``isotrope serve`` (``"--max-batch 1"`` serves one query at a
time, as the server did before it batched; ``"--nprobe 16"`` searches fewer IVF lists). The
hits the server returned for the first ``--recall-queries`` queries are then compared with the
exact top k (float64 NumPy over every stored vector): the recall of what was timed.

``--wrk-seconds S`` then also loads the server for S seconds with wrk (a C load generator,
``apt-get install wrk``; one thread, ``--clients`` keep-alive connections, the same held-out queries
in turn): the Python clients cost as much CPU as the server on a small machine, wrk a fraction.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import print_and_write, store_label
from benchmarks.harness import REPO_ROOT, machine_info
from isotrope.config import EncoderConfig

CORPUS = "corpus/general_english_sentences.txt.gz"


def read_sentences(data_dir: Path, count: int) -> list[str]:
    """The first ``count`` non-empty sentences of the general-English corpus."""
    sentences: list[str] = []
    with gzip.open(data_dir / CORPUS, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                sentences.append(line.strip())
                if len(sentences) == count:
                    break
    return sentences


def build_store(
    store: str,
    sentences: list[str],
    config: Any,
    fit_samples: int = 20_000,
    factory: str | None = None,
) -> None:
    """Index one chunk per sentence with the encoder ``config`` (skipped when the store exists); ``factory``: a FAISS store's index."""
    from isotrope.ingest.loaders import Document
    from isotrope.ingest.pipeline import index_documents
    from isotrope.search import Collection

    if Collection.exists(store):
        return
    documents = [Document(source=CORPUS, text=text, metadata={"line": i + 1}, position=i) for i, text in enumerate(sentences)]
    report = index_documents(
        documents,
        store,
        config=config,
        chunk_tokens=0,
        fit_samples=fit_samples,
        store_options={"index": factory} if factory else None,
    )
    print(f"built {store}: {report.summary()}", file=sys.stderr)
    with Collection.open(store) as collection:  # LanceDB indexes rows at 50,000; add the rest to the index
        if hasattr(collection.store, "optimize"):
            collection.store.optimize()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode} before answering")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"no answer from {url}/healthz within {timeout:.0f}s")


def request_body(query: str, k: int) -> dict[str, Any]:
    """One dense search request: the mode is named, so the store's own default search (which may be keyword
    or hybrid) does not decide what is timed, and the recall check against exact dense search holds."""
    return {"query": query, "k": k, "mode": "dense"}


def load(url: str, queries: list[str], clients: int, k: int, answers: dict[int, list[str]] | None = None) -> dict[str, Any]:
    """Send every query once, spread over ``clients`` threads; latencies in milliseconds. The hit
    ids of query ``i`` go to ``answers[i]`` when a dict is given."""
    import httpx

    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    next_query = iter(range(len(queries)))

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60.0) as http:
            while True:
                with lock:
                    index = next(next_query, None)
                if index is None:
                    return
                tick = time.perf_counter()
                try:
                    response = http.post("/search", json=request_body(queries[index], k))
                    hits = response.json()["hits"] if response.status_code == 200 else []
                    ok = len(hits) == k
                    problem = None if ok else f"HTTP {response.status_code}: {response.text[:200]}"
                    if answers is not None:
                        answers[index] = [hit["id"] for hit in hits]
                except httpx.HTTPError as error:
                    problem = f"{type(error).__name__}: {error}"
                elapsed = (time.perf_counter() - tick) * 1000
                with lock:
                    latencies.append(elapsed)
                    if problem:
                        errors.append(problem)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "queries": len(latencies),
        "clients": clients,
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": round(statistics.median(ordered), 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "qps": round(len(latencies) / wall, 1),
        "seconds": round(wall, 2),
    }


WRK_SCRIPT = """
local bodies, index = {}, 0
for line in io.lines(os.getenv("WRK_BODIES")) do bodies[#bodies + 1] = line end
request = function()
  index = index % #bodies + 1
  return wrk.format("POST", "/search", {["Content-Type"] = "application/json"}, bodies[index])
end
done = function(summary, latency, requests)
  local errors = summary.errors
  io.write(string.format(
    '{"queries": %d, "seconds": %.2f, "p50_ms": %.2f, "p99_ms": %.2f, "errors": %d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1e3, latency:percentile(99) / 1e3,
    errors.connect + errors.read + errors.write + errors.status + errors.timeout))
end
"""


def wrk_load(url: str, queries: list[str], clients: int, k: int, seconds: float) -> dict[str, Any]:
    """``clients`` connections from one wrk thread sending ``queries`` in turn for ``seconds``."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        bodies, script = Path(folder) / "bodies.jsonl", Path(folder) / "search.lua"
        bodies.write_text("".join(json.dumps(request_body(query, k)) + "\n" for query in queries), encoding="utf-8")
        script.write_text(WRK_SCRIPT, encoding="utf-8")
        command = ["wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s", "-s", str(script), url + "/search"]
        output = subprocess.run(
            command, env={**os.environ, "WRK_BODIES": str(bodies)}, capture_output=True, text=True, check=True
        )
    result = json.loads(output.stdout.strip().splitlines()[-1])
    result["qps"] = round(result["queries"] / result["seconds"], 1)
    return {"clients": clients, **result}


def served_recall(store: str, queries: list[str], answers: dict[int, list[str]], k: int) -> float:
    """Mean recall@k of the served hits against the exact top k over every stored vector (float64)."""
    from isotrope.search import Collection
    from isotrope.stores.memory import exact_scores, top_k

    with Collection.open(store) as collection:
        ids = collection.store.ids()
        stored = np.asarray(collection.store.vectors(ids), dtype=np.float64)
        encoded = np.asarray(collection.encoder.encode(queries, kind="query"), dtype=np.float64)
        best = top_k(exact_scores(encoded, stored, collection.store.metric), k)
    found = [len(set(answers.get(i, [])) & {ids[j] for j in best[i]}) / k for i in range(len(queries))]
    return round(float(np.mean(found)), 4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="shared data root (holds corpus/)")
    parser.add_argument("--store", required=True, help="lancedb:DIR or faiss:DIR; built when missing")
    parser.add_argument("--model", default="static:all-MiniLM-L6-v2")
    parser.add_argument("--shape", default="whiten-partial")
    parser.add_argument("--backend", default="torch", help="the new store's encoder runtime: torch, onnx, ...")
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--fit-samples", type=int, default=20_000, help="chunks the shaping is fitted on")
    parser.add_argument("--factory", help="a new FAISS store's index_factory string (default: auto), e.g. HNSW32")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=50, help="queries sent first, not measured")
    parser.add_argument("--single", type=int, default=200, help="queries then sent from one client")
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    parser.add_argument("--serve-args", default="", help="options for isotrope serve, e.g. '--max-batch 1'")
    parser.add_argument("--recall-queries", type=int, default=200, help="served answers checked against exact search")
    parser.add_argument("--wrk-seconds", type=float, default=0.0, help="then load with wrk for this long (0: not)")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)

    sentences = read_sentences(args.data_dir, args.chunks + args.queries + args.warmup)
    if len(sentences) < args.chunks + args.queries + args.warmup:
        raise SystemExit(f"{args.data_dir / CORPUS} has only {len(sentences)} sentences")
    config = EncoderConfig(model=args.model, shape=args.shape, backend=args.backend)
    build_store(args.store, sentences[: args.chunks], config, args.fit_samples, args.factory)
    queries = sentences[args.chunks :]  # held out: never indexed
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        str(Path(sys.executable).parent / "isotrope"),
        "serve",
        args.store,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *shlex.split(args.serve_args),
    ]
    load_before = [round(x, 2) for x in os.getloadavg()]
    server = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        tick = time.perf_counter()
        wait_healthy(url, server, args.startup_timeout)
        startup = time.perf_counter() - tick
        load(url, queries[: args.warmup], args.clients, args.k)
        answers: dict[int, list[str]] = {}
        measured = queries[args.warmup : args.warmup + args.queries]
        result = load(url, measured, args.clients, args.k, answers)
        single = load(url, queries[args.warmup : args.warmup + args.single], 1, args.k)
        wrk = wrk_load(url, measured, args.clients, args.k, args.wrk_seconds) if args.wrk_seconds else None
        load_after = [round(x, 2) for x in os.getloadavg()]
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    checked = min(args.recall_queries, len(measured))
    recall = served_recall(args.store, measured[:checked], answers, args.k) if checked else None
    print_and_write(
        {
            "store": store_label(args.store),
            "model": args.model,
            "shape": args.shape,
            "chunks": args.chunks,
            "serve_args": args.serve_args,
            "startup_seconds": round(startup, 1),
            "concurrent": result,
            "one_client": {key: single[key] for key in ("queries", "errors", "p50_ms", "p99_ms", "qps")},
            **({"concurrent_wrk": wrk} if wrk else {}),
            f"recall@{args.k}": recall,
            "recall_queries": checked,
            "machine": machine_info(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
