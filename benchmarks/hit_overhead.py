"""Issue 22: what ``FaissStore.search`` adds to the bare faiss search (building the ``Hit``s), in one
process: this tree's store, optionally another version's ``faiss_store.py`` (e.g. main's, exported with
``git archive``), and the bare index, alternating query by query on the same store.

    git archive main connectors/faiss_store.py | tar -x -C /tmp/main
    python -m benchmarks.hit_overhead --rows 10000 --factory IVF128,Flat --nprobe 64 \\
        --baseline /tmp/main/connectors/faiss_store.py --out benchmarks/results/hit-overhead-ivf.json

The store (random 384-d vectors, 324-character texts, the metadata ingestion writes) is built in a
temporary folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import machine_info

DIM, K = 384, 10


def build(path: Path, rows: int, factory: str) -> None:
    from isotrope.connectors.faiss_store import FaissStore

    rng = np.random.default_rng(0)
    store = FaissStore(path, DIM, index=factory)
    for start in range(0, rows, 2048):
        n = min(2048, rows - start)
        ids = [f"{i:016x}" for i in range(start, start + n)]
        store.add(
            ids,
            rng.standard_normal((n, DIM)).astype(np.float32),
            ["lorem ipsum dolor sit amet " * 12] * n,
            [
                {"source": f"w3s3-{i}", "document": f"w3s3-{i}", "position": 0, "start": 0, "end": 324}
                for i in range(start, start + n)
            ],
        )
    store.commit()
    store.close()


def run(rows: int, factory: str, nprobe: int, baseline: Path | None, single: int, batches: int) -> dict[str, Any]:
    import faiss

    from isotrope.connectors import faiss_index, faiss_store

    faiss.omp_set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="isotrope-hits-"))
    try:
        build(tmp / "store", rows, factory)
        stores = {"branch": faiss_store.FaissStore(tmp / "store", nprobe=nprobe)}
        if baseline is not None:
            spec = importlib.util.spec_from_file_location("baseline_faiss_store", baseline)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            stores["baseline"] = module.FaissStore(tmp / "store", nprobe=nprobe)
        index = stores["branch"]._index
        params = faiss_index.params_for(index, None, nprobe, 128)
        sides = {name: (lambda x, s=store: s.search(x, K)) for name, store in stores.items()}
        sides["bare"] = lambda x: index.search(x, K, params=params)
        queries = np.random.default_rng(1).standard_normal((200, DIM)).astype(np.float32)
        names = list(sides)
        times: dict[str, dict[str, list[float]]] = {name: {"single": [], "batch": []} for name in names}
        for kind, count in (("single", single), ("batch", batches)):
            for i in range(count):
                for name in names[i % len(names) :] + names[: i % len(names)]:  # rotate the order
                    x = queries[i % len(queries)][None] if kind == "single" else queries
                    tick = time.perf_counter()
                    sides[name](x)
                    times[name][kind].append(time.perf_counter() - tick)
        out: dict[str, Any] = {"rows": rows, "factory": factory, "nprobe": nprobe, "k": K, "machine": machine_info(1)}
        for name in names:
            out[name] = {f"p50_ms_{kind}": 1000 * float(np.median(values)) for kind, values in times[name].items()}
        for name in stores:
            for kind in ("single", "batch"):
                out[name][f"overhead_pct_{kind}"] = 100 * (out[name][f"p50_ms_{kind}"] / out["bare"][f"p50_ms_{kind}"] - 1)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--factory", default="IVF128,Flat")
    parser.add_argument("--nprobe", type=int, default=64)
    parser.add_argument("--baseline", type=Path, help="another version's connectors/faiss_store.py")
    parser.add_argument("--single", type=int, default=1500)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = run(args.rows, args.factory, args.nprobe, args.baseline, args.single, args.batches)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if isinstance(v, dict) and k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
