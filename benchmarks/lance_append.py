"""Issue 22: LanceDB ``add`` appending batches whose ids are known new (``new_ids=True``, as ingestion
does) against the upsert's ``merge_insert`` on id, batches of 2,048 alternated between two stores.

    python -m benchmarks.lance_append --rows 100000 --out benchmarks/results/lance-append-100k.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import machine_info

BATCH, DIM = 2048, 384


def run(rows: int) -> dict:
    from isotrope.connectors.lancedb_store import LanceDBStore

    root = Path(tempfile.mkdtemp(prefix="isotrope-append-"))
    stores = {
        "append": LanceDBStore(root / "a", dim=DIM, index="flat"),
        "merge_insert": LanceDBStore(root / "m", dim=DIM, index="flat"),
    }
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {name: [] for name in stores}
    for start in range(0, rows, BATCH):
        ids = [f"{i:016x}" for i in range(start, start + BATCH)]
        vectors = rng.standard_normal((BATCH, DIM)).astype(np.float32)
        texts = [f"passage {i} " + "lorem ipsum dolor sit amet " * 10 for i in ids]
        metadata = [{"source": i, "document": i, "position": 0, "start": 0, "end": 300} for i in ids]
        order = ("append", "merge_insert") if (start // BATCH) % 2 else ("merge_insert", "append")
        for name in order:  # the same batch into both stores, the order alternating
            tick = time.perf_counter()
            stores[name].add(ids, vectors, texts, metadata, new_ids=name == "append")
            times[name].append(time.perf_counter() - tick)
    stored = {name: len(store) for name, store in stores.items()}
    shutil.rmtree(root, ignore_errors=True)
    return {
        "rows": rows,
        "batch": BATCH,
        "dim": DIM,
        "machine": machine_info(2),
        **{
            name: {"total_s": sum(t), "first_batches_s": t[1:4], "last_batches_s": t[-3:], "stored": stored[name]}
            for name, t in times.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = run(args.rows)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k]["total_s"] for k in ("append", "merge_insert")}))


if __name__ == "__main__":
    main()
