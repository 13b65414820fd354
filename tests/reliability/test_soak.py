"""The soak (tests/reliability/soak.py) in its full-series form: 60 s of mixed traffic on each store while
writers append and one is killed -9 and resumed; nothing a client cannot retry fails, nothing is lost."""

from __future__ import annotations

import os

import pytest
from soak import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("ISOTROPE_RELIABILITY_FULL") != "1", reason="set ISOTROPE_RELIABILITY_FULL=1"),
]


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_soak_with_a_killed_writer(kind):
    result = main(["--store", kind, "--duration", "60", "--clients", "2"])
    assert result["failed_unretryable"] == 0, result["failures"]
    check = result["store_check"]
    assert check["lost"] == check["duplicated"] == check["extra"] == check["vectors_differing"] == 0, check
    assert check["chunks"] == check["expected"] > 120
    assert any(write.get("killed") for write in result["writes"]), result["writes"]
    assert not any("error" in write for write in result["writes"]), result["writes"]
    assert result["server_tracebacks"] == 0
    assert abs(result["rss_drift"]) < 0.10, result["rss_mib"]
