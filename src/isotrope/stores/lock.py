"""One writer per store: an exclusive lock file beside the store folder, holding the writer's pid.

The lock is an ``flock`` on ``.<store>.write-lock`` next to the store folder (so a store can be
locked before its folder exists). The system drops it when the holder dies, even by ``kill -9``:
a lock file left behind is stale and the next writer takes it over, saying so. A second writer is
refused at once, before any fitting, with the holder's pid. Readers never take it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from isotrope.errors import StoreLockedError

logger = logging.getLogger(__name__)


def lock_path(store_path: str | Path) -> Path:
    path = Path(store_path).expanduser().absolute()
    return path.parent / f".{path.name}.write-lock"


def _holder(handle: int) -> dict:
    try:
        return json.loads(os.pread(handle, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}


@contextmanager
def writer_lock(store_path: str | Path, what: str = "written") -> Iterator[None]:
    """Hold the store's writer lock; :class:`StoreLockedError` at once when another live process holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no guard against concurrent writers
        yield
        return
    path = lock_path(store_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            for _ in range(20):  # the holder writes its record just after it takes the lock: wait for it a moment
                if holder.get("pid"):
                    break
                time.sleep(0.05)
                holder = _holder(handle)
            os.close(handle)
            raise StoreLockedError(
                f"{store_path} is being {holder.get('what', 'written')} by process {holder.get('pid', '?')} "
                f"(since {holder.get('since', '?')}); wait for it to finish or stop it, then run again"
            ) from None
        # the file may have been removed by the previous holder between our open and our lock: lock the new one
        try:
            same = os.fstat(handle).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(handle)
    stale = _holder(handle)
    if stale.get("pid") and stale["pid"] != os.getpid():
        logger.warning("%s: taking over a stale write lock of process %s (it is no longer running)", store_path, stale["pid"])
    record = json.dumps({"pid": os.getpid(), "what": what, "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
    os.ftruncate(handle, 0)
    os.pwrite(handle, record, 0)
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            path.unlink()
        os.close(handle)  # releases the lock
