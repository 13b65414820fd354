"""The ingestion plan: the one transform-apply function, the plan's checks, the sources it accepts,
and an ingestion path that never imports the evaluation package."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.loaders import Document
from isotrope.ingest.pipeline import run_local
from isotrope.ingest.plan import IngestPlan
from isotrope.search import Collection
from isotrope.transforms import L2, Center, apply_chain

pytest.importorskip("faiss")


def test_apply_chain_equals_a_float64_reference():
    rng = np.random.default_rng(0)
    fit, data = rng.normal(2.0, 1.5, (200, 6)), rng.normal(2.0, 1.5, (30, 6))
    center = Center().fit(fit)
    shaped = apply_chain([center, L2()], data)
    centred = data.astype(np.float64) - fit.astype(np.float64).mean(axis=0)
    expected = centred / np.linalg.norm(centred, axis=1, keepdims=True)
    assert shaped.dtype == np.float32
    assert np.abs(shaped - expected).max() < 1e-6
    np.testing.assert_array_equal(apply_chain([], data), data.astype(np.float32))


@pytest.mark.parametrize("field", ["fit_samples", "batch_size", "commit_every"])
def test_a_plan_refuses_sizes_below_one_naming_the_field(field, tmp_path):
    with pytest.raises(ValueError, match=f"^{field} must be at least 1; got 0$"):
        IngestPlan(tmp_path, f"faiss:{tmp_path / 'store'}", **{field: 0})


def test_a_source_given_as_a_function_is_read_once_per_pass(tiny_glove_path, tmp_path):
    """A function source starts a fresh pass each call: one pass for the fit sample, one to write."""
    calls = []
    texts = make_sentences(30, seed=2)

    def documents():
        calls.append(1)
        return (Document(f"d{i}.txt", text) for i, text in enumerate(texts))

    plan = IngestPlan(
        documents,
        f"faiss:{tmp_path / 'store'}",
        config=EncoderConfig(model=tiny_glove_path, shape="center"),
        chunk_tokens=0,
        show_progress=False,
    )
    report = run_local(plan)
    assert len(calls) == 2 and report.added == report.chunks == report.documents == len(texts)
    with Collection.open(plan.store) as collection:
        ids = collection.store.ids()
        stored = [hit.text for hit in collection.store.get(ids)]
        assert stored == texts
        reference = ShapedEncoder.create(tiny_glove_path, shape="center").fit(texts)
        assert np.abs(collection.store.vectors(ids) - reference.encode(texts)).max() < 1e-5


@pytest.mark.parametrize("as_function", [False, True])
def test_documents_given_in_python_are_named_not_dumped(tiny_glove_path, tmp_path, as_function):
    """The encoder and the store's default search record what the fit sample came from in a few words,
    never the repr of every document (a list of thousands once made a megabyte-long store property)."""
    documents = [Document(f"d{i}.txt", text) for i, text in enumerate(make_sentences(30, seed=4))]

    def listed():
        return iter(documents)

    plan = IngestPlan(
        listed if as_function else documents,
        f"faiss:{tmp_path / 'store'}",
        config=EncoderConfig(model=tiny_glove_path, shape="center"),
        chunk_tokens=0,
        show_progress=False,
    )
    run_local(plan)
    expected = "30 sampled chunks of documents from listed()" if as_function else "30 sampled chunks of documents given as a list"
    with Collection.open(plan.store) as collection:
        assert collection.encoder.metadata["fit"]["fitted_on"] == expected
        assert all(len(value) < 10_000 for value in collection.store.properties.values())


def test_ingestion_never_imports_the_evaluation_package(tiny_glove_path, tmp_path):
    """--shape auto on the local engine (autoshape included), then a re-run: no isotrope.evaluate module loaded."""
    (tmp_path / "docs").mkdir()
    sentences = make_sentences(240, seed=4)
    for part in range(4):
        text = "\n\n".join(" ".join(sentences[i : i + 6]) for i in range(part * 60, part * 60 + 60, 6))
        (tmp_path / "docs" / f"part{part}.txt").write_text(text + "\n", encoding="utf-8")
    script = textwrap.dedent(f"""
        import json, sys
        from isotrope import EncoderConfig, index_documents
        store = {f"faiss:{tmp_path / 'store'}"!r}
        options = dict(config=EncoderConfig(model={tiny_glove_path!r}, shape="auto"), chunk_tokens=24,
                       overlap_tokens=4, show_progress=False)
        first = index_documents({str(tmp_path / "docs")!r}, store, **options)
        again = index_documents({str(tmp_path / "docs")!r}, store, **options)
        loaded = sorted(name for name in sys.modules if name.startswith("isotrope."))
        print(json.dumps({{"added": first.added, "again": again.added, "modules": loaded}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["added"] > 0 and outcome["again"] == 0
    assert "isotrope.autoshape" in outcome["modules"]  # the auto path ran
    assert [name for name in outcome["modules"] if name.startswith("isotrope.evaluate")] == []
