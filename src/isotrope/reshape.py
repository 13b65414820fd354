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
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.encoder import ShapedEncoder, reservoir_sample
from isotrope.search import ENCODER_DIR, Collection, describe_encoder, parse_store_uri
from isotrope.shapes import parse_shape
from isotrope.stores.lock import writer_lock
from isotrope.transforms import TRANSFORMS

logger = logging.getLogger(__name__)

MARKER = "reshape.json"
STAGED = "encoder.next"
RETIRED = "encoder.old"


class ReshapeInProgressError(RuntimeError):
    """The store is being reshaped by another process (or another handle in this one)."""


@contextmanager
def _reshape_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on the store folder; the system drops it when the process dies."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no guard against concurrent reshapes
        yield
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReshapeInProgressError(f"{path} is being reshaped; open it when the reshape has finished") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def recover_interrupted_reshape(path: Path, store: Any) -> None:
    """Undo (or finish) a reshape that was killed; a no-op when none was running."""
    marker = path / MARKER
    if not marker.exists():
        return
    with _reshape_lock(path):
        if marker.exists():  # another process may have recovered it before we took the lock
            _recover(path, marker, store)


def _recover(path: Path, marker: Path, store: Any) -> None:
    current, staged, retired = path / ENCODER_DIR, path / STAGED, path / RETIRED
    if staged.exists():  # the encoder swap did not happen: roll the table back
        from_version = json.loads(marker.read_text())["from_version"]
        logger.warning("%s: rolling back an interrupted reshape to table version %s", path, from_version)
        store.restore(from_version)
        if not current.exists() and retired.exists():
            retired.rename(current)
        shutil.rmtree(staged)
    shutil.rmtree(retired, ignore_errors=True)
    marker.unlink()


def _reshaped_encoder(encoder: ShapedEncoder, shape: str) -> ShapedEncoder:
    transforms = [TRANSFORMS[step["kind"]](**step["config"]) for step in parse_shape(shape)]
    return ShapedEncoder(encoder.backbone, encoder.pooling, encoder.weighting, transforms, encoder.batch_size)


def reshape_store(uri: str, shape: str, fit_samples: int = 100_000, seed: int = 0, batch_size: int = 4096) -> ShapedEncoder:
    """Fit ``shape`` on (a sample of) the stored raw vectors and rewrite every shaped vector."""
    kind, path = parse_store_uri(uri)
    with writer_lock(path, "reshaped"), Collection.open(uri) as collection, _reshape_lock(path):
        store = collection.store
        if not getattr(store, "stores_raw_vectors", False):
            raise ValueError(f"{uri}: this store keeps no raw vectors; reshape needs a LanceDB store (re-index instead)")
        rows = (vector for _, vectors in store.iter_raw(batch_size) for vector in vectors)
        sample = np.stack(reservoir_sample(rows, fit_samples, seed))
        encoder = _reshaped_encoder(collection.encoder, shape)
        encoder.fit_transforms(sample)
        encoder.metadata["fit"] = {"fitted_on": f"raw vectors of {len(sample)} stored chunks (reshape)",
                                   "n_texts": len(sample), "seed": seed}
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
