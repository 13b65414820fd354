"""ONNX Runtime execution of a Hugging Face backbone: export once, cache, quantise, run.

The export (``torch.onnx`` with the TorchScript exporter and eager attention, as optimum exports for
sentence-transformers; no optimum) has two inputs, ``input_ids`` and ``attention_mask`` (int64,
dynamic batch and sequence axes), and one output per hidden state,
``hidden_0`` (embeddings) .. ``hidden_L``, so every layer choice (``last``, ``first_last``, an
index) and prompt pooling read the same states as the torch backbone (the states are the inputs
of the next layer, so the extra outputs cost no compute). The TorchScript graph is what ONNX Runtime's
fusions (LayerNorm, GELU, MatMul+bias) recognise; the dynamo exporter's graph of SDPA attention took
~20 % more CPU time in fp32 and ~30 % more in int8 (ORT profiler and process CPU time, all-MiniLM-L6-v2,
STS-B sentences; docs/BENCHMARKS.md). Exports live in the cache
folder (``$ISOTROPE_CACHE_DIR`` or ``~/.cache/isotrope``) under ``onnx/<content hash of the model
files>/``: ``model.onnx`` (float32), ``model.int8.onnx`` and ``model.int8-per-channel.onnx``
(``onnxruntime.quantization.quantize_dynamic``), each written once and reused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.pooling import pool
from isotrope.resources import usable_cores

logger = logging.getLogger(__name__)

#: bump when the export's inputs/outputs change: old cache entries are then ignored
EXPORT_VERSION = 2
MODEL_FILE = "model.onnx"
#: ONNX opset of the export (LayerNormalization is an operator from 17 on)
OPSET = 17
QUANTISED_FILES = {"onnx-int8": "model.int8.onnx", "onnx-int8-per-channel": "model.int8-per-channel.onnx"}
#: only the matrix products are quantised: int8 embedding tables (Gather) cost quality and little time
QUANTISED_OPS = ["MatMul"]
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def require_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or a one-line ImportError saying what to install."""
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(
            "the onnx backends need ONNX Runtime: pip install 'isotrope[onnx]' "
            "(onnxruntime, onnx, onnxscript), or use backend 'torch'"
        ) from None
    return onnxruntime


def cache_root() -> Path:
    """``$ISOTROPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/isotrope``, else ``~/.cache/isotrope``."""
    if os.environ.get("ISOTROPE_CACHE_DIR"):
        return Path(os.environ["ISOTROPE_CACHE_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "isotrope"


def model_folder(model_path: str) -> Path:
    """The local folder holding a model's files (a hub name is looked up in the local hub cache)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model_path, local_files_only=True))
    except Exception as error:  # the hub raises several error types for a missing snapshot
        raise FileNotFoundError(f"{model_path}: no local copy of the model to export to ONNX ({error})") from None


def _model_files(folder: Path) -> list[Path]:
    """The config and weight files at the top of a model folder, sorted by name."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and (p.name == "config.json" or p.suffix in _WEIGHT_SUFFIXES))
    if not any(p.suffix in _WEIGHT_SUFFIXES for p in files):
        raise FileNotFoundError(f"{folder}: no weight files (.safetensors/.bin) to export to ONNX")
    return files


def model_hash(folder: Path) -> str:
    """sha256 over the names and bytes of the model's config and weight files (top level of the folder)."""
    digest = hashlib.sha256(f"isotrope-onnx-export-{EXPORT_VERSION}".encode())
    for path in _model_files(folder):
        digest.update(f"\0{path.name}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()


def remembered_model_hash(folder: Path, cache: Path) -> str:
    """:func:`model_hash`, remembered in ``cache/hashes.json`` against each file's size, mtime and inode: a
    cold process otherwise reads the weights again to find its export (all-MiniLM-L6-v2: 66 ms of a 0.27 s
    session load). A memo that cannot be read or written is recomputed or skipped."""
    signature = [[p.name, s.st_size, s.st_mtime_ns, s.st_ino] for p in _model_files(folder) for s in [p.stat()]]
    memo_path, key = cache / "hashes.json", f"{EXPORT_VERSION}:{folder.resolve()}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    memo = memo if isinstance(memo, dict) else {}
    remembered = memo.get(key)
    if isinstance(remembered, dict) and remembered.get("files") == signature:
        return str(remembered["hash"])
    digest = model_hash(folder)
    memo[key] = {"files": signature, "hash": digest}
    staging = memo_path.with_name(f".{memo_path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging.write_text(json.dumps(memo, indent=1))
        os.replace(staging, memo_path)
    except OSError as error:
        logger.debug("cannot remember the hash of %s in %s: %s", folder, memo_path, error)
        staging.unlink(missing_ok=True)
    return digest


def _atomic_folder(target: Path, build: Any) -> None:
    """Run ``build(staging_folder)`` and move the result to ``target`` (another process may win the race)."""
    staging = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / MODEL_FILE).is_file():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def export_hidden_states(model_path: str, folder: Path) -> None:
    """Export the model with every hidden state as an output to ``folder/model.onnx``."""
    import torch
    from transformers import AutoModel

    # eager attention: SDPA traces to a graph ONNX Runtime fuses less well
    model = AutoModel.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager").eval()
    count = model.config.num_hidden_layers + 1

    class AllHiddenStates(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True).hidden_states)

    input_ids = torch.ones((2, 8), dtype=torch.long)
    attention_mask = torch.ones((2, 8), dtype=torch.long)
    attention_mask[1, 5:] = 0  # a padded row, so the mask is not specialised away
    outputs = [f"hidden_{index}" for index in range(count)]
    axes = {name: {0: "batch", 1: "sequence"} for name in ["input_ids", "attention_mask", *outputs]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            AllHiddenStates(),
            (input_ids, attention_mask),
            str(folder / MODEL_FILE),
            input_names=["input_ids", "attention_mask"],
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )


def quantise(source: Path, target: Path, per_channel: bool) -> None:
    """Dynamic int8 quantisation of the weights (activations quantised on the fly), written atomically."""
    require_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    staging = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantiser logs a pre-processing hint on the root logger
    try:
        quantize_dynamic(
            source, staging, weight_type=QuantType.QInt8, per_channel=per_channel, op_types_to_quantize=QUANTISED_OPS
        )
        staging.replace(target)
    finally:
        root.setLevel(level)
        staging.unlink(missing_ok=True)


def build_in_child(step: str, source: str, target: str) -> None:
    """Run one build step (``export``, ``quantise`` or ``quantise-per-channel``) in a fresh Python process.

    The export loads and traces the torch model and the quantiser holds copies of the graph: done in
    this process, their memory stays its high-water mark and partly resident (all-MiniLM-L6-v2,
    int8 per channel: 874 MB peak and 718 MB afterwards, against 396 / 361 MB from the cache), so an
    indexing run that exports on first use would carry it to its end.
    """
    code = "import sys; from isotrope.backbones.onnx import build_step; build_step(*sys.argv[1:])"
    done = subprocess.run([sys.executable, "-c", code, step, source, target], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise RuntimeError(f"ONNX {step} of {source} failed: {last}")


def build_step(step: str, source: str, target: str) -> None:
    """One build step in this process (the child's side of :func:`build_in_child`)."""
    if step == "export":
        export_hidden_states(source, Path(target))
    else:
        quantise(Path(source), Path(target), per_channel=step == "quantise-per-channel")


def exported_model(model_path: str, backend: str, cache_dir: str | Path | None = None) -> Path:
    """The cached ``.onnx`` file of ``model_path`` for ``backend``, exporting/quantising it on first use
    (in a child process: :func:`build_in_child`)."""
    folder = model_folder(model_path)
    cache = Path(cache_dir or cache_root() / "onnx")
    entry = cache / remembered_model_hash(folder, cache)[:32]
    if not (entry / MODEL_FILE).is_file():
        logger.info("exporting %s to ONNX (once; cached in %s)", model_path, entry)
        entry.parent.mkdir(parents=True, exist_ok=True)
        _atomic_folder(entry, lambda staging: build_in_child("export", str(folder), str(staging)))
    if backend not in QUANTISED_FILES:
        return entry / MODEL_FILE
    target = entry / QUANTISED_FILES[backend]
    if not target.is_file():
        logger.info("quantising %s to int8 (%s)", model_path, target.name)
        step = "quantise-per-channel" if backend.endswith("per-channel") else "quantise"
        build_in_child(step, str(entry / MODEL_FILE), str(target))
    return target


def physical_cores() -> int:
    """Physical cores this process may use: its CPUs, less SMT siblings (from /proc/cpuinfo where present)."""
    available = usable_cores()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return max(1, available)
    processors = [
        {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in block.splitlines())}
        for block in text.strip().split("\n\n")
    ]
    if not processors or any("core id" not in fields for fields in processors):
        return max(1, available)
    cores = {(fields.get("physical id"), fields["core id"]) for fields in processors}
    return max(1, available * len(cores) // len(processors))


def session_threads() -> int:
    """``OMP_NUM_THREADS`` when set (as torch reads it), else the physical cores."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else physical_cores()


class OnnxHiddenStates:
    """An ONNX Runtime session over a cached export: hidden states of padded id batches."""

    def __init__(
        self, model_path: str, backend: str, use_cuda: bool = False, cache_dir: str | Path | None = None, spinning: bool = True
    ) -> None:
        """``spinning=False``: the session's threads sleep between runs instead of spinning, for short runs that
        alternate with other threaded work (a query's teacher pass beside faiss's search)."""
        ort = require_onnxruntime()
        self.model_path = model_path
        self.path = exported_model(model_path, backend, cache_dir)
        options = ort.SessionOptions()
        options.intra_op_num_threads = session_threads()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # batches differ in shape (length-sorted, padded per batch): a memory pattern is planned and kept
        # per shape, so with it the arena grew with the corpus (int8-per-channel, 600 -> 2,000 SciFact
        # abstracts: 1,066 -> 1,202 MB resident; without it 850 -> 941 MB)
        options.enable_mem_pattern = False
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = ["CPUExecutionProvider"]
        if use_cuda and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, "CUDAExecutionProvider")
        elif use_cuda:
            logger.warning("onnxruntime has no CUDA provider here (install onnxruntime-gpu): running on the CPU")
        self.session = ort.InferenceSession(str(self.path), options, providers=providers)

    @functools.cached_property
    def config(self) -> Any:
        """The model's transformers config (imports transformers: the session itself needs neither it nor torch)."""
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.model_path)

    def states(self, input_ids: np.ndarray, attention_mask: np.ndarray, layers: list[int]) -> np.ndarray:
        """Mean of the chosen hidden states (HF indexing), float32 (B, T, d)."""
        feed = {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)}
        outputs = self.session.run([f"hidden_{index}" for index in layers], feed)
        if len(outputs) == 1:
            return outputs[0]
        return np.stack(outputs).mean(axis=0, dtype=np.float32)


class OnnxMeanPooler:
    """A transformer's mean-pooled last hidden states (special tokens included, padding masked) through its cached
    ONNX export, with ONNX Runtime and ``tokenizers`` alone: no torch or transformers to import. The export must
    exist (written when the model last ran on this backend, e.g. as the teacher of a ``fast`` table)."""

    def __init__(self, model: str, backend: str, batch_size: int = 64) -> None:
        from tokenizers import Tokenizer

        from isotrope.backbones.resolve import default_max_length, resolve_model_path

        folder = model_folder(resolve_model_path(model))
        self.layer = int(json.loads((folder / "config.json").read_text())["num_hidden_layers"])
        # spinning threads would hold the cores after each query's run: faiss's search right after it took 3.3 ms
        # instead of 0.05 (648 chunks, 2 cores)
        self.session = OnnxHiddenStates(str(folder), backend, spinning=False)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        settings = folder / "tokenizer_config.json"
        limit = json.loads(settings.read_text()).get("model_max_length") if settings.is_file() else None
        self.tokenizer.enable_truncation(default_max_length(folder, limit))
        self.batch_size = batch_size

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``(len(texts), hidden size)``."""
        out = []
        for begin in range(0, len(texts), self.batch_size):
            ids = [encoding.ids for encoding in self.tokenizer.encode_batch(list(texts[begin : begin + self.batch_size]))]
            width = max(len(row) for row in ids)
            input_ids = np.zeros((len(ids), width), dtype=np.int64)
            mask = np.zeros((len(ids), width), dtype=np.int64)
            for row, tokens in enumerate(ids):
                input_ids[row, : len(tokens)], mask[row, : len(tokens)] = tokens, 1
            out.append(pool(self.session.states(input_ids, mask, [self.layer]), mask, "mean"))
        return np.concatenate(out)
