"""Keep an indexing process's resident memory near what it uses: glibc's large-block threshold.

glibc serves a block above its mmap threshold with pages of its own and unmaps them on free, but it
raises that threshold to the size of each such block freed (up to 32 MiB). After the first torch
batch, the encoder's activations (a few MiB to 32 MiB each) then come from the heap, where the small
blocks allocated between them pin them: the process keeps every batch's high-water mark, and the
teacher pass, the writes and the default search's encodes stack on it. A fixed threshold keeps such
blocks mapped and handed back as soon as they are freed (on the ingestion benchmark's LanceDB side,
1,526 chunks: peak 1,157 -> 959 MB, the warm-up freed in both). Process-wide, as glibc's ``MALLOC_MMAP_THRESHOLD_`` variable is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

logger = logging.getLogger(__name__)

#: blocks from this size up are mapped and unmapped on their own (glibc's default starts at 128 KiB)
MMAP_THRESHOLD = 4 * 1024 * 1024
#: ``mallopt``'s parameter number for the mmap threshold (malloc.h)
M_MMAP_THRESHOLD = -3
#: set by the user: the process's allocator is left as they set it
ENV_OVERRIDE = "MALLOC_MMAP_THRESHOLD_"


def limit_heap_growth(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for this process; whether it was set (False
    on another C library, or where the user set ``MALLOC_MMAP_THRESHOLD_`` themselves)."""
    if ENV_OVERRIDE in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    done = bool(ctypes.CDLL(name).mallopt(M_MMAP_THRESHOLD, threshold))
    logger.debug("glibc mmap threshold %s at %d bytes", "set" if done else "not set", threshold)
    return done
