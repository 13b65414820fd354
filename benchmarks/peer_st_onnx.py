"""Peer process of the encode topic: sentence-transformers' torch, ``backend="onnx"`` and its int8 model.

sentence-transformers' ONNX backend needs optimum-onnx, which pins a transformers older than
isotrope's, so this runs under the Python of a separate environment (``--st-onnx-python``;
``make bench-peer-env`` builds one) and alternates with the parent process round by round over
stdin/stdout: after ``ready`` (models loaded, exported, quantised, every side's vectors of the
quality sentences saved), each ``round`` line runs every side once on the timed sentences
(rotating order) and answers one JSON line of wall and CPU seconds per side; ``quit`` ends it.
It imports nothing from isotrope (whose transformers is the other one).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCH_SIZE = 32
MAX_SEQ_LENGTH = 256


def quantization_config() -> str:
    """The optimum quantisation preset this CPU runs best (avx512_vnni, avx512, avx2, else arm64)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "arm64"
    for name in ("avx512_vnni", "avx512f", "avx2"):
        if name in flags:
            return name.removesuffix("f")
    return "arm64"


def load_models(model: str, work: Path, threads: int) -> tuple[dict[str, Any], str]:
    import onnxruntime as ort
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    folder = work / "st-model"
    quantized = f"onnx/model_qint8_{quantization_config()}.onnx"
    if not (folder / quantized).is_file():
        if folder.exists():
            shutil.rmtree(folder)
        shutil.copytree(model, folder)
        exported = SentenceTransformer(str(folder), device="cpu", backend="onnx")
        exported.save(str(folder))  # onnx/model.onnx beside the weights
        export_dynamic_quantized_onnx_model(exported, quantization_config(), str(folder))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    onnx_kwargs = {"session_options": options, "provider": "CPUExecutionProvider", "file_name": "onnx/model.onnx"}
    models = {
        "st_torch": SentenceTransformer(str(folder), device="cpu"),
        "st_onnx": SentenceTransformer(str(folder), device="cpu", backend="onnx", model_kwargs=onnx_kwargs),
        "st_onnx_int8": SentenceTransformer(
            str(folder), device="cpu", backend="onnx", model_kwargs={**onnx_kwargs, "file_name": quantized}
        ),
    }
    for st_model in models.values():
        st_model.max_seq_length = MAX_SEQ_LENGTH
    return models, quantized


def encode(model: Any, texts: list[str]) -> np.ndarray:
    return model.encode(texts, batch_size=BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timed", type=Path, required=True, help="JSON list of the timed sentences")
    parser.add_argument("--quality", type=Path, required=True, help="JSON list of the quality sentences")
    parser.add_argument("--model", required=True, help="the model's folder")
    parser.add_argument("--work", type=Path, required=True, help="cache folder (exports, vectors)")
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    import sentence_transformers
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    timed, quality = json.loads(args.timed.read_text()), json.loads(args.quality.read_text())
    models, quantized = load_models(args.model, args.work, args.threads)
    for name, st_model in models.items():  # the quality pass doubles as the warm-up
        np.save(args.work / f"{name}.npy", encode(st_model, quality).astype(np.float32))
    ready = {
        "ready": list(models),
        "file": quantized,
        "threads": {"torch": torch.get_num_threads(), "onnxruntime": args.threads},
        "versions": {
            "sentence-transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
        },
    }
    print(json.dumps(ready), flush=True)
    names = list(models)
    for index, line in enumerate(sys.stdin):
        if line.strip() != "round":
            break
        shift = index % len(names)
        times = {}
        for name in names[shift:] + names[:shift]:
            cpu, start = time.process_time(), time.perf_counter()
            encode(models[name], timed)
            times[name] = [time.perf_counter() - start, time.process_time() - cpu]
        print(json.dumps(times), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
