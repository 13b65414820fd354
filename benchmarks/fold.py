"""Folded encoders: quality and size of each storage choice, cold-process search and query latency.

    python -m benchmarks.fold quality --beir DATA/retrieval/scifact --out benchmarks/results/fold_quality.json
    python -m benchmarks.fold speed --beir DATA/retrieval/scifact --out benchmarks/results/fold_speed.json

Both fit ``static:all-MiniLM-L6-v2`` + ``whiten-partial`` on the BEIR corpus exactly as
``isotrope eval retrieval --model static:all-MiniLM-L6-v2 --shape whiten-partial --fit-corpus corpus``
does, then fold it. ``quality``: nDCG@10 / recall@100 and size on disk of the unfolded encoder and
of every folded variant (float32, float16, int8, fewer dims). ``speed``: the same corpus indexed
into FAISS once with the unfolded and once with the folded encoder; ``isotrope search`` in a fresh
process on each (wall time and peak RSS, median of ``--repeat``), the same through the library,
the bare ``import numpy, faiss`` floor, and one-line query encode latency in process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL, SHAPE = "static:all-MiniLM-L6-v2", "whiten-partial"
#: (label, dtype, dims) of the folded variants measured
VARIANTS = [
    ("float32", "float32", None),
    ("float16", "float16", None),
    ("int8", "int8", None),
    ("float16, 256 dims", "float16", 256),
    ("float16, 128 dims", "float16", 128),
    ("float16, 64 dims", "float16", 64),
    ("int8, 128 dims", "int8", 128),
]
QUERY = "what causes the immune response to a vaccine"


def fitted_encoder(beir: Path) -> tuple[Any, Any]:
    """The unfolded encoder fitted on the corpus as `isotrope eval retrieval --fit-corpus corpus` fits it."""
    from isotrope.config import EncoderConfig
    from isotrope.evaluate.data import load_beir
    from isotrope.evaluate.harness import Evaluator
    from isotrope.evaluate.tasks import document_text

    dataset = load_beir(beir, "test")
    documents = [document_text(doc) for doc in dataset.corpus.values()]
    encoder, _ = Evaluator().fit(EncoderConfig(model=MODEL, shape=SHAPE), documents)
    return encoder, dataset


def folder_mb(path: Path) -> float:
    return sum(file.stat().st_size for file in path.rglob("*") if file.is_file()) / 1e6


def quality(args: argparse.Namespace) -> dict[str, Any]:
    from isotrope.evaluate.harness import encode_function
    from isotrope.evaluate.tasks import eval_retrieval
    from isotrope.fold import fold_encoder

    encoder, dataset = fitted_encoder(args.beir)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        variants = [("unfolded (backbone + weights + whiten-partial)", encoder)]
        variants += [(f"folded {label}", fold_encoder(encoder, dtype=dtype, dims=dims)) for label, dtype, dims in VARIANTS]
        for index, (label, candidate) in enumerate(variants):
            scores = eval_retrieval(encode_function(candidate), dataset, k_values=(10, 100))
            folder = candidate.save(Path(work) / f"encoder-{index}")
            rows.append(
                {
                    "encoder": label,
                    "dims": candidate.dim,
                    "ndcg@10": round(scores["ndcg@10"], 2),
                    "recall@100": round(scores["recall@100"], 2),
                    "folder_mb": round(folder_mb(folder), 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return {
        "model": MODEL,
        "shape": SHAPE,
        "beir": str(args.beir),
        "rows": rows,
        "note": "the unfolded folder holds only the fitted arrays: it also needs the model package (its table) and torch",
    }


def timed_child(command: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one fresh process, measured by GNU time: a child forked from this
    (large) process would report this process's RSS as its peak (ru_maxrss survives exec)."""
    started = time.perf_counter()
    done = subprocess.run(
        ["/usr/bin/time", "-f", "PEAK_RSS_KB %M", *command], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-500:]}")
    peak_kb = next(line.split()[1] for line in done.stderr.splitlines() if line.startswith("PEAK_RSS_KB"))
    return wall, int(peak_kb) / 1024


def cold(command: list[str], repeat: int) -> dict[str, float]:
    runs = [timed_child(command) for _ in range(repeat)]
    return {
        "wall_s_median": round(statistics.median(w for w, _ in runs), 3),
        "wall_s_min": round(min(w for w, _ in runs), 3),
        "peak_rss_mb_max": round(max(r for _, r in runs), 1),
    }


def query_latency(encoder: Any, repeat: int = 2000) -> dict[str, float]:
    encoder.encode([QUERY], kind="query")
    times = []
    for _ in range(repeat):
        tick = time.perf_counter()
        encoder.encode([QUERY], kind="query")
        times.append(time.perf_counter() - tick)
    times.sort()
    return {"p50_ms": round(1e3 * times[len(times) // 2], 3), "p99_ms": round(1e3 * times[int(len(times) * 0.99)], 3)}


def speed(args: argparse.Namespace) -> dict[str, Any]:
    if args.workdir is not None:
        return measure_speed(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="fold-speed-") as work:
        return measure_speed(args, Path(work))


def measure_speed(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build (or reuse) the two stores under ``work`` and time them."""
    from isotrope.encoder import ShapedEncoder
    from isotrope.evaluate.tasks import document_text
    from isotrope.fold import fold_encoder
    from isotrope.ingest.loaders import Document
    from isotrope.ingest.pipeline import index_documents

    stores = {name: work / name for name in ("unfolded", "folded")}
    if not all((path / "encoder").is_dir() for path in stores.values()):  # build once; --workdir reuses them
        encoder, dataset = fitted_encoder(args.beir)
        documents = [Document(source=doc_id, text=document_text(doc)) for doc_id, doc in dataset.corpus.items()]
        for name, candidate in (("unfolded", encoder), ("folded", fold_encoder(encoder, dtype=args.dtype))):
            index_documents(documents, f"faiss:{stores[name]}", encoder=candidate, show_progress=False)
    isotrope = str(Path(sys.executable).with_name("isotrope"))
    library = (
        "import sys\nfrom isotrope.search import Collection\nwith Collection.open(sys.argv[1]) as c: c.search(sys.argv[2], k=10)"
    )
    result: dict[str, Any] = {
        "model": MODEL,
        "shape": SHAPE,
        "folded_dtype": args.dtype,
        "repeat": args.repeat,
        "query": QUERY,
        "workdir": work.name,
    }
    result["floor: python -c 'import numpy, faiss'"] = cold([sys.executable, "-c", "import numpy, faiss"], args.repeat)
    for name, path in stores.items():
        result[f"cli search, {name} store"] = cold([isotrope, "search", f"faiss:{path}", QUERY, "-k", "10"], args.repeat)
        result[f"library search, {name} store"] = cold([sys.executable, "-c", library, f"faiss:{path}", QUERY], args.repeat)
    result["query encode, unfolded"] = query_latency(ShapedEncoder.load(stores["unfolded"] / "encoder"), repeat=500)
    result["query encode, folded"] = query_latency(ShapedEncoder.load(stores["folded"] / "encoder"))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fold", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("quality", "speed"))
    parser.add_argument("--beir", type=Path, required=True, help="BEIR folder, e.g. DATA/retrieval/scifact")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--repeat", type=int, default=5, help="speed: cold processes per measurement")
    parser.add_argument("--dtype", default="float16", help="speed: the folded table's storage")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="speed: where the two stores are built (reused when they exist there)"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from benchmarks.common import machine_info

    result = quality(args) if args.what == "quality" else speed(args)
    result["machine"] = machine_info(os.cpu_count() or 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
