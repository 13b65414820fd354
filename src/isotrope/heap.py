"""Handing the memory a finished stage freed back to the system, so the next stage's peak does not sit on it."""

from __future__ import annotations

import contextlib
import ctypes
import gc


def return_freed_memory() -> None:
    """Collect garbage and, on glibc, hand the heap's free pages back to the system (``malloc_trim``): a
    transformer's freed activations otherwise stay in the process's resident memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
