"""Item 3: shaping overhead, the fitted transform chain's time as a share of the encode time.

On the same texts: ``embed_raw`` (tokenize, transformer, pool) vs ``apply_transforms`` of
each chain, fitted beforehand on the raw vectors of all the texts (fitting is not counted).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, scifact_documents, sts_sentences
from benchmarks.harness import alternate

logger = logging.getLogger(__name__)

CHAINS = ("center,l2", "center,whiten,l2", "abtt,l2", "quantile,l2")
#: the chain the issue's target names
TARGET_CHAIN = "center,whiten,l2"
SIZES = {"quick": {"scifact_abstracts": 32, "sts_sentences": 512}, "full": {"scifact_abstracts": 512, "sts_sentences": None}}
TRANSFORM_REPEAT = 25  # the chain takes micro- to milliseconds: more runs for a stable median


def shaped_encoders(backbone: Any, raw: np.ndarray) -> dict[str, Any]:
    """One encoder per chain over the same backbone, each chain fitted on ``raw``."""
    from isotrope.encoder import ShapedEncoder
    from isotrope.shapes import parse_shape
    from isotrope.transforms import make_transform

    encoders = {}
    for chain in CHAINS:
        transforms = [make_transform(step["kind"], **step["config"]) for step in parse_shape(chain)]
        encoders[chain] = ShapedEncoder(backbone, transforms=transforms).fit_transforms(raw)
    return encoders


def run(data_dir: str | Path, *, quick: bool, repeat: int) -> dict[str, Any]:
    """Per text set and chain: median embed_raw and apply_transforms times and the chain's share
    (in %) of encode = embed_raw + apply_transforms."""
    from isotrope.encoder import ShapedEncoder

    sizes = SIZES["quick" if quick else "full"]
    sets = {
        "scifact_abstracts": [text for _, text in scifact_documents(data_dir, sizes["scifact_abstracts"])],
        "sts_sentences": sts_sentences(data_dir, sizes["sts_sentences"]),
    }
    base = ShapedEncoder.create(MODEL, shape="none", max_length=MAX_SEQ_LENGTH, device="cpu")
    raw_timings, raw_vectors = {}, {}
    for name, texts in sets.items():

        def embed(texts: list[str] = texts, name: str = name) -> None:
            raw_vectors[name] = base.embed_raw(texts)

        raw_timings[name] = alternate(
            {"embed_raw": embed}, repeat, warmups={"embed_raw": lambda t=texts: base.embed_raw(t[:16])}
        )["embed_raw"]
    encoders = shaped_encoders(base.backbone, np.concatenate(list(raw_vectors.values())))
    results: dict[str, Any] = {
        "model": MODEL,
        "chains": list(CHAINS),
        "target_chain": TARGET_CHAIN,
        "fitted_on": f"raw vectors of the {sum(map(len, sets.values()))} benchmark texts",
        "sets": {},
    }
    for name, texts in sets.items():
        entry: dict[str, Any] = {"texts": len(texts), "embed_raw": raw_timings[name], "chains": {}}
        for chain, encoder in encoders.items():
            timing = alternate({"apply": lambda e=encoder, r=raw_vectors[name]: e.apply_transforms(r)}, TRANSFORM_REPEAT)["apply"]
            # share of the whole encode: embed_raw + apply_transforms
            timing["share_pct"] = 100.0 * timing["median_s"] / (raw_timings[name]["median_s"] + timing["median_s"])
            entry["chains"][chain] = timing
        results["sets"][name] = entry
        logger.info("shaping %s: %s share %.3f%%", name, TARGET_CHAIN, entry["chains"][TARGET_CHAIN]["share_pct"])
    return results
