"""schemathesis against a live ``isotrope serve``: every operation of its own /openapi.json, all checks.

    python tests/reliability/fuzz_api.py --examples 1000 --max-time 900 --out fuzz.json

builds a FAISS and a LanceDB store (a 16-d word table and 120 one-sentence chunks written here),
serves each twice (without and with ``--api-key``; the key is sent as a bearer header), and runs
``st run`` on each server: the coverage and fuzzing phases, positive and negative data, every
check (no 5xx, response schemas, documented status codes and content types, auth...). The
stateful phase has nothing to link: no operation creates what another reads. It prints, per
server and operation, the requests sent, the status codes met and the failures (JSON; ``--out``
writes it too). ``schemathesis.toml`` beside this file is the run's configuration: a schema-valid
``where`` may still be a filter that does not parse, so 400 is an accepted answer to valid data.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from harness import env, write_corpus, write_table

CONFIG = Path(__file__).with_name("schemathesis.toml")
KEY = "fuzz-secret-key"


def build_stores(root: Path, kinds: list[str]) -> list[str]:
    """One store of each kind over the same 120 chunks."""
    from isotrope.config import EncoderConfig
    from isotrope.ingest.pipeline import index_documents

    corpus = write_corpus(root / "corpus", n_files=10)
    table = write_table(root / "table.txt")
    uris = [f"{kind}:{root / kind}" for kind in kinds]
    for uri in uris:
        index_documents(corpus, uri, config=EncoderConfig(model=table, shape="center"), show_progress=False)
    return uris


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(uri: str, port: int, key: str | None, log: Path) -> subprocess.Popen:
    """``isotrope serve`` in its own process, returned once /healthz answers."""
    import httpx

    args = [sys.executable, "-c", "from isotrope.cli import main; main()", "serve", uri, "--port", str(port)]
    args += ["--log-level", "warning", *(["--api-key", key] if key else [])]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"isotrope serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"isotrope serve did not answer on port {port} within 120 s")


def summarize(ndjson: Path) -> dict[str, Any]:
    """Requests, status codes and failed checks per operation from schemathesis's NDJSON events."""
    operations: dict[str, dict[str, Any]] = {}
    for line in ndjson.read_text().splitlines():
        event = json.loads(line).get("ScenarioFinished")
        if not event:
            continue
        recorder = event["recorder"]
        operation = operations.setdefault(
            recorder["label"], {"requests": 0, "statuses": collections.Counter(), "failures": set()}
        )
        for interaction in recorder.get("interactions", {}).values():
            operation["requests"] += 1
            response = interaction.get("response")
            operation["statuses"][str(response["status_code"]) if response else "no response"] += 1
        for checks in recorder.get("checks", {}).values():
            for check in checks:
                if check["status"] == "failure":
                    operation["failures"].add(f"{check['name']}: {str(check.get('failure_info') or '')[:2000]}")
    return {
        label: {"requests": op["requests"], "statuses": dict(op["statuses"]), "failures": sorted(op["failures"])}
        for label, op in sorted(operations.items())
    }


def fuzz(
    uri: str, key: str | None, examples: int, max_time: int, seed: int, workdir: Path, only: list[str] | None = None
) -> dict[str, Any]:
    """One ``st run`` against ``uri`` served (with ``key`` when given; the operations of the paths
    ``only`` names, when given); its summary and exit code."""
    port = free_port()
    name = f"{uri.split(':')[0]}-{'key' if key else 'open'}" + "".join(path.replace("/", "-") for path in only or [])
    server = start_server(uri, port, key, workdir / f"{name}.serve.log")
    ndjson = workdir / f"{name}.ndjson"
    st = Path(sys.executable).with_name("st")
    command = [str(st), "--no-color", "--config-file", str(CONFIG), "run", f"http://127.0.0.1:{port}/openapi.json"]
    command += ["--checks", "all", "--max-examples", str(examples), "--max-time", str(max_time), "--workers", "1"]
    command += ["--seed", str(seed), "--generation-database", "none", "--report", "ndjson", "--report-ndjson-path", str(ndjson)]
    command += ["--header", f"Authorization: Bearer {key}"] if key else []
    for path in only or []:
        command += ["--include-path", path]
    began = time.monotonic()
    try:
        run = subprocess.run(command, capture_output=True, text=True, env=env(), timeout=max_time + 300, cwd=workdir)
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = {"server": name, "exit": run.returncode, "seconds": round(time.monotonic() - began, 1)}
    summary["operations"] = summarize(ndjson) if ndjson.exists() else {}
    if run.returncode != 0:
        summary["output"] = run.stdout[-6000:] + run.stderr[-2000:]
    summary["server_errors_logged"] = (workdir / f"{name}.serve.log").read_text().count("Traceback")
    return summary


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1000, help="schemathesis --max-examples per operation")
    parser.add_argument("--max-time", type=int, default=900, help="seconds each st run may take at most")
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument(
        "--servers",
        default="faiss-open,faiss-key,lancedb-open,lancedb-key",
        help="STORE-open (no key) or STORE-key, comma-separated",
    )
    parser.add_argument("--only", action="append", metavar="PATH", help="fuzz only this path's operations (repeatable)")
    parser.add_argument("--out", type=Path, help="write the summaries here as JSON")
    parser.add_argument(
        "--workdir", type=Path, help="keep the stores, server logs and NDJSON reports here (default: a temporary folder)"
    )
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="isotrope-fuzz-") as folder:
        root = args.workdir or Path(folder)
        root.mkdir(parents=True, exist_ok=True)
        servers = [server.split("-") for server in args.servers.split(",")]
        uris = dict(zip(sorted({kind for kind, _ in servers}), build_stores(root, sorted({kind for kind, _ in servers}))))
        for kind, mode in servers:
            results.append(
                fuzz(uris[kind], KEY if mode == "key" else None, args.examples, args.max_time, args.seed, root, args.only)
            )
            print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
