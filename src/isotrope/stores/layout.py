"""The on-disk layout of a store folder: the encoder beside the vectors, and the reshape markers.

A store folder holds the store's own files, ``encoder/`` (the fitted encoder its vectors were
shaped with) and, only while a reshape runs or after one was killed, ``reshape.json`` (the table
version before the rewrite), ``encoder.next/`` (the staged encoder) and ``encoder.old/`` (the
retired one). :func:`recover_interrupted_reshape` rolls such a folder back (or finishes the swap).
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

from isotrope.errors import ReshapeInProgressError

logger = logging.getLogger(__name__)

ENCODER_DIR = "encoder"
MARKER = "reshape.json"
STAGED = "encoder.next"
RETIRED = "encoder.old"


@contextmanager
def reshape_lock(path: Path) -> Iterator[None]:
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
    with reshape_lock(path):
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
