"""Item 7: on a CUDA machine, items 1 and 2 on the GPU in bfloat16, and FAISS search on the GPU.

Detects CUDA through torch (and GPUs through faiss for the search part) and returns a
``skipped`` reason instead of numbers when there is none, so the suite runs anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import encode, ingest, search
from benchmarks.common import cuda_device


def faiss_gpus() -> int:
    try:
        import faiss
    except ImportError:
        return 0
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def run(
    data_dir: str | Path, *, quick: bool, repeat: int, ingest_repeat: int, threads: int, workdir: str | Path | None = None
) -> dict[str, Any]:
    """Encode and ingestion comparisons with device="cuda" (bf16 on both sides) and GPU FAISS search."""
    device_name = cuda_device()
    if device_name is None:
        return {"skipped": "no CUDA device visible to torch"}
    results: dict[str, Any] = {"device": device_name}
    results["encode"] = encode.run(data_dir, quick=quick, repeat=repeat, device="cuda", bf16=True)
    results["ingest"] = ingest.run(data_dir, quick=quick, repeat=ingest_repeat, threads=threads, device="cuda")
    if faiss_gpus():
        results["search"] = search.run(quick=quick, repeat=repeat, workdir=workdir, gpu=True)
    else:
        results["search"] = {"skipped": "faiss sees no GPU (install faiss-gpu for GPU search)"}
    return results
