"""The HTTP path of ``isotrope serve`` alone: its app over a collection whose search returns 10
canned hits at once, served by uvicorn in a child process, loaded like ``benchmarks.serve``.

    python -m benchmarks.serve_http --loop uvloop --http httptools
    python -m benchmarks.serve_http --loop asyncio --http h11

prints p50/p99 latency and queries per second with ``--clients`` clients and with one: the
ceiling that parsing, validation, batching and serialization put on any store.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import cpu_model, git_commit, print_and_write
from benchmarks.serve import free_port, load, wait_healthy


def serve_canned(port: int, loop: str, http: str) -> None:
    """Run the app over a collection answering every query with the same 10 hits."""
    import uvicorn

    from isotrope.connectors.server import create_app
    from isotrope.stores.base import Hit

    hits = [
        Hit(
            f"id{i}",
            0.5 - i / 100,
            "a stored sentence of about twelve words, like those of the corpus",
            {"source": "corpus.txt.gz", "line": i},
        )
        for i in range(10)
    ]
    canned = SimpleNamespace(kind="canned", path="/", search=lambda queries, **options: [list(hits) for _ in queries])
    uvicorn.run(create_app(canned), host="127.0.0.1", port=port, log_level="warning", loop=loop, http=http)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", default="auto", help="uvicorn event loop: auto, asyncio or uvloop")
    parser.add_argument("--http", default="auto", help="uvicorn HTTP parser: auto, h11 or httptools")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = multiprocessing.get_context("spawn").Process(target=serve_canned, args=(port, args.loop, args.http))
    server.start()
    try:
        wait_healthy(url, SimpleNamespace(poll=lambda: server.exitcode, returncode=server.exitcode), 120)
        queries = [f"query number {i}" for i in range(args.queries + 200)]
        load_before = [round(x, 2) for x in os.getloadavg()]
        load(url, queries[:200], args.clients, 10)
        concurrent = load(url, queries[200:], args.clients, 10)
        single = load(url, queries[200 : 200 + args.queries // 4], 1, 10)
    finally:
        server.terminate()
        server.join(timeout=30)
    print_and_write(
        {
            "loop": args.loop,
            "http": args.http,
            "concurrent": concurrent,
            "one_client": {key: single[key] for key in ("queries", "errors", "p50_ms", "p99_ms", "qps")},
            "machine": {
                "cpu": cpu_model(),
                "cores": os.cpu_count(),
                "load_average_before": load_before,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
            },
            "commit": git_commit(),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
