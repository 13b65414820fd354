"""Refit a store's shaping from its stored raw vectors, without running the backbone again.

Crash safety: a marker file records the table version before the rewrite; the new
encoder is staged in ``encoder.next/``; all vectors are replaced in one table
version; the encoder folders are swapped last. Opening a store whose marker is
still there rolls an unfinished reshape back (or completes the final swap). A running
reshape holds a lock on the store folder (released by the system if the process dies), so
a store opened meanwhile is refused instead of "recovered" under the live reshape.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator

import numpy as np

from isotrope.encoder import ShapedEncoder
from isotrope.errors import StoreCapabilityError
from isotrope.sampling import reservoir_sample
from isotrope.search import Collection, describe_encoder, parse_store_uri
from isotrope.shapes import build_chain
from isotrope.stores.base import ReshapableStore
from isotrope.stores.layout import ENCODER_DIR, MARKER, RETIRED, STAGED, reshape_lock
from isotrope.stores.lock import writer_lock


def _reshaped_encoder(encoder: ShapedEncoder, shape: str) -> ShapedEncoder:
    transforms = build_chain(shape)
    return ShapedEncoder(
        encoder.backbone,
        encoder.pooling,
        encoder.weighting,
        transforms,
        encoder.batch_size,
        config=encoder.config.replace(shape=shape),
    )


def reshape_store(uri: str, shape: str, fit_samples: int = 100_000, seed: int = 0, batch_size: int = 4096) -> ShapedEncoder:
    """Fit ``shape`` on (a sample of) the stored raw vectors and rewrite every shaped vector."""
    _kind, path = parse_store_uri(uri)
    with writer_lock(path, "reshaped"), Collection.open(uri) as collection, reshape_lock(path):
        store = collection.store
        if not store.stores_raw_vectors or not isinstance(store, ReshapableStore):
            raise StoreCapabilityError(
                f"{uri}: this store keeps no raw vectors; reshape needs a LanceDB store (re-index instead)"
            )
        rows = (vector for _, vectors in store.iter_raw(batch_size) for vector in vectors)
        sample = np.stack(reservoir_sample(rows, fit_samples, seed))
        encoder = _reshaped_encoder(collection.encoder, shape)
        encoder.fit_transforms(sample)
        encoder.metadata["fit"] = {
            "fitted_on": f"raw vectors of {len(sample)} stored chunks (reshape)",
            "n_texts": len(sample),
            "seed": seed,
        }
        if encoder.dim != store.dim:
            raise ValueError(f"shape {shape!r} gives {encoder.dim}-d vectors but the store holds {store.dim}-d ones")

        (path / MARKER).write_text(json.dumps({"from_version": store.version}))
        encoder.save(path / STAGED)

        def shaped() -> Iterator[tuple[list[str], np.ndarray]]:
            for ids, raw in store.iter_raw(batch_size):
                yield ids, encoder.apply_transforms(raw)

        store.rewrite_vectors(shaped())
        store.set_properties(**describe_encoder(encoder))
        store.commit()
        (path / ENCODER_DIR).rename(path / RETIRED)
        os.replace(path / STAGED, path / ENCODER_DIR)
        shutil.rmtree(path / RETIRED)
        (path / MARKER).unlink()
    return encoder
