"""What this process uses of the machine: the cores it may run on, and the memory a finished stage hands back."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import os
from concurrent.futures import ThreadPoolExecutor


def usable_cores() -> int:
    """The logical CPUs this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def return_freed_memory() -> None:
    """Collect garbage and, on glibc, hand the heap's free pages back to the system (``malloc_trim``): a
    transformer's freed activations otherwise stay in the process's resident memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def thread_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The process's pool of ``workers`` threads named ``name``, started once (starting threads per call costs
    about a millisecond). Threads do not survive a fork: a forked child starts its own pool, where the parent's
    would take its work and never run it."""
    return _thread_pool(name, workers, os.getpid())


@functools.cache
def _thread_pool(name: str, workers: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
