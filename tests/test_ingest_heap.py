"""glibc's mmap threshold fixed for indexing: freed activation-sized blocks leave resident memory.

Each case runs in a fresh process (the setting is process-wide): one block the size of a batch's
activations is freed first (glibc then raises its threshold above that size), then blocks of that
size alternate with small blocks that stay allocated, and all the large ones are freed."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only")

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from isotrope.ingest.heap import limit_heap_growth

    def rss_mb():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS"))

    limited = limit_heap_growth() if sys.argv[1] == "limit" else False
    block = 2**20  # float64: 8 MiB, as one hidden-state tensor of a batch
    np.ones(block)  # freed at once: glibc's dynamic threshold rises above 8 MiB
    start = rss_mb()
    large, small = [], []
    for _ in range(40):
        large.append(np.ones(block))
        small.append(np.ones(300))  # 2.4 KB from the heap, kept: it pins what lies below it
    large.clear()
    print(limited, rss_mb() - start)
    """
)


def run(mode: str, **env: str) -> tuple[bool, float]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    limited, grown = done.stdout.split()
    return limited == "True", float(grown)


def test_a_fixed_threshold_hands_freed_blocks_back_where_the_default_keeps_them():
    limited, grown = run("limit")
    assert limited and grown < 40  # 320 MB were touched and freed
    limited, grown = run("default")
    assert not limited and grown > 200  # glibc's own behaviour: the freed blocks stay resident


def test_the_users_own_threshold_is_left_alone():
    limited, grown = run("limit", MALLOC_MMAP_THRESHOLD_=str(64 * 2**20))
    assert not limited and grown > 200  # their 64 MiB threshold: the 8 MiB blocks come from the heap
