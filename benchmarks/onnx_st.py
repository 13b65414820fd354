"""Child of benchmarks/onnx.py, run by the Python of a separate environment that has
sentence-transformers with its ONNX extra (optimum-onnx pins an older transformers than isotrope's):
times sentence-transformers' torch, ``backend="onnx"`` and its dynamically quantised int8 model in
interleaved rounds, and saves their vectors for the agreement figures.

    PY -m benchmarks.onnx_st --texts texts.json --model DIR --work DIR --repeat 3 --threads 2 --json-out r.json
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import child_main, child_parser, compare

BATCH_SIZE = 32
MAX_SEQ_LENGTH = 256


def work(args: Any) -> dict[str, Any]:
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model

    texts = json.loads(Path(args.texts).read_text())
    folder = Path(args.work) / "st-model"
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(args.model, folder)
    models = {"st_torch": SentenceTransformer(str(folder), device="cpu")}
    models["st_onnx"] = SentenceTransformer(str(folder), device="cpu", backend="onnx")
    models["st_onnx"].save(str(folder))  # writes onnx/model.onnx beside the weights
    export_dynamic_quantized_onnx_model(models["st_onnx"], args.quantization, str(folder))
    models["st_onnx_int8"] = SentenceTransformer(
        str(folder), device="cpu", backend="onnx", model_kwargs={"file_name": f"onnx/model_qint8_{args.quantization}.onnx"}
    )
    vectors: dict[str, np.ndarray] = {}

    def side(name: str, subset: list[str] = texts) -> Any:
        model = models[name]
        model.max_seq_length = MAX_SEQ_LENGTH
        return lambda: vectors.__setitem__(
            name, model.encode(subset, batch_size=BATCH_SIZE, convert_to_numpy=True, show_progress_bar=False)
        )

    timings = compare(
        {name: side(name) for name in models}, args.repeat, warmups={name: side(name, texts[:16]) for name in models}
    )
    for name, array in vectors.items():
        np.save(Path(args.work) / f"{name}.npy", array.astype(np.float32))
    return {
        "timings": timings,
        "versions": {"sentence-transformers": sentence_transformers.__version__, "transformers": transformers.__version__},
        "quantization": args.quantization,
    }


if __name__ == "__main__":
    parser = child_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--texts", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quantization", default="avx512_vnni", help="arm64, avx2, avx512 or avx512_vnni")
    child_main(parser, work)
