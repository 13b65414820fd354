"""The framework examples run as scripts, with the tiny BERT in place of all-MiniLM-L6-v2 (ISOTROPE_EXAMPLE_MODEL)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name: str, model: str) -> str:
    env = {**os.environ, "ISOTROPE_EXAMPLE_MODEL": model, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_langchain_rag_example(tiny_bert_path: str) -> None:
    pytest.importorskip("langchain_core")
    out = run_example("langchain_rag.py", tiny_bert_path)
    assert out.count("\nA: [") == 2  # each question answered from a retrieved passage
    assert "filtered to topic = travel: [('" in out and "baking" not in out.split("filtered")[1].split("\n")[0]
    assert "reopened: top hit" in out


@pytest.mark.slow
def test_lancedb_registry_example(tiny_bert_path: str) -> None:
    pytest.importorskip("lancedb")
    out = run_example("lancedb_registry.py", tiny_bert_path)
    assert out.startswith(tuple("-0123456789"))
    assert "tea only: " in out and "the table records encoder " in out


@pytest.mark.slow
def test_llama_index_pipeline_example(tiny_bert_path: str) -> None:
    pytest.importorskip("llama_index.core")
    out = run_example("llama_index_pipeline.py", tiny_bert_path)
    assert "first run: 3 chunks written" in out
    assert "second run, same documents: 0 chunks written" in out
    assert "third run, cycling changed: 1 chunks written" in out
