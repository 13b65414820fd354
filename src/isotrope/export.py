"""Write a folded encoder in formats other libraries load: model2vec and sentence-transformers.

Both libraries tokenize without special tokens, average the rows of the text's tokens and
(as exported here) L2-normalise: the same as a folded encoder whose weights are in its rows
and whose chain ends in ``l2``. The folders are written with NumPy and safetensors only (no
torch); loading them needs the other library. model2vec also drops the [UNK] token of every
text, so its row must be zero (as ``--exclude-special``, the default for static tables, makes it).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import cast

import numpy as np
from safetensors.numpy import save_file

from isotrope import __version__
from isotrope.backbones.folded import FoldedBackbone
from isotrope.encoder import ShapedEncoder
from isotrope.fold import FoldError, fold_encoder

FORMATS = ("model2vec", "sentence-transformers")


def _exportable(encoder: ShapedEncoder) -> ShapedEncoder:
    """``encoder`` folded (if not yet), checked to be a mean over rows followed by L2, queries included."""
    if encoder.query_teacher is not None:
        raise FoldError(
            f"this encoder also sends queries through {encoder.query_teacher.model} (--teacher-queries); model2vec and "
            "sentence-transformers encode queries as documents: export an encoder fitted without --teacher-queries"
        )
    if encoder.spec["backbone"]["type"] != "folded":
        encoder = fold_encoder(encoder)
    pairs = cast(FoldedBackbone, encoder.backbone).pairs
    if pairs is not None:
        raise FoldError(
            f"this table also has rows for {len(pairs)} token pairs, which model2vec and sentence-transformers do not look up: "
            "export an encoder fitted without --fast-pairs"
        )
    if not encoder.transforms or encoder.transforms[-1].kind != "l2":
        raise FoldError(
            f"export needs a chain that ends in l2 (this one: {encoder.metadata.get('folded', {}).get('from_shape', encoder.shape)}): "
            "model2vec and sentence-transformers average unweighted rows, which equals the encoder only after L2"
        )
    return encoder


def _nonzero_special_rows(encoder: ShapedEncoder, table: np.ndarray) -> list[str]:
    """Special tokens the encoder adds or keeps whose rows carry weight (the exporters drop or never add them)."""
    tokenizer = cast(FoldedBackbone, encoder.backbone).core_tokenizer
    added = set(tokenizer.encode("x").ids) - set(tokenizer.encode("x", add_special_tokens=False).ids)
    ids = sorted(added | set(encoder.backbone.special_ids().tolist()))
    return [tokenizer.id_to_token(i) or str(i) for i in ids if i < len(table) and np.abs(table[i]).max() > 0]


def export_encoder(encoder: ShapedEncoder, out: str | Path, format: str) -> Path:
    """Write ``encoder`` (folded here if it is not) to the folder ``out`` in ``format``; returns ``out``.

    Raises FoldError (one line, naming the step) for a chain that cannot fold or does not end in l2,
    and for special tokens that carry weight.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")
    encoder = _exportable(encoder)
    backbone = cast(FoldedBackbone, encoder.backbone)
    table = backbone.table
    if backbone.get_state()["table"].dtype == np.float16:
        table = table.astype(np.float16)
    weighted = _nonzero_special_rows(encoder, table)
    if weighted:
        raise FoldError(
            f"special tokens {', '.join(weighted)} carry weight, but {format} tokenizes without them: refit with exclude_special"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        if format == "model2vec":
            _write_model2vec(encoder, table, staging)
        else:
            _write_sentence_transformers(encoder, table, staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out


def _write_json(path: Path, document: object) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")


def _write_model2vec(encoder: ShapedEncoder, table: np.ndarray, folder: Path) -> None:
    backbone = cast(FoldedBackbone, encoder.backbone)
    save_file({"embeddings": np.ascontiguousarray(table)}, folder / "model.safetensors")
    (folder / "tokenizer.json").write_text(backbone.tokenizer_json(), encoding="utf-8")
    _write_json(
        folder / "config.json",
        {
            "model_type": "model2vec",
            "architectures": ["StaticModel"],
            "tokenizer_name": backbone.folded_from,
            "apply_pca": None,
            "hidden_dim": int(table.shape[1]),
            "normalize": True,
            "max_length": backbone.max_length,
            "isotrope": {"version": __version__, "fingerprint": encoder.fingerprint},
        },
    )


def _write_sentence_transformers(encoder: ShapedEncoder, table: np.ndarray, folder: Path) -> None:
    backbone = cast(FoldedBackbone, encoder.backbone)
    (folder / "0_StaticEmbedding").mkdir()
    (folder / "1_Normalize").mkdir()
    save_file(
        {"embedding.weight": np.ascontiguousarray(table, dtype=np.float32)}, folder / "0_StaticEmbedding" / "model.safetensors"
    )
    (folder / "0_StaticEmbedding" / "tokenizer.json").write_text(backbone.tokenizer_json(), encoding="utf-8")
    _write_json(folder / "1_Normalize" / "config.json", {})
    _write_json(
        folder / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "0_StaticEmbedding", "type": "sentence_transformers.models.StaticEmbedding"},
            {"idx": 1, "name": "1", "path": "1_Normalize", "type": "sentence_transformers.models.Normalize"},
        ],
    )
    _write_json(
        folder / "config_sentence_transformers.json",
        {
            "__version__": {"isotrope": __version__},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
            "isotrope_fingerprint": encoder.fingerprint,
        },
    )
