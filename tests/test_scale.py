"""The scale benchmark's passages, and ingestion from a streamed (callable) source with growing commits."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.scale import FIRST_WINDOW, passages
from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.loaders import Document
from isotrope.ingest.pipeline import index_documents
from isotrope.search import Collection


def test_passages_are_disjoint_windows_then_sliding_ones():
    sentences = [f"s{i}." for i in range(30)]
    made = list(passages(sentences, 20))
    assert made[0] == ("w3s3-0", "s0. s1. s2.") and made[9] == ("w3s3-27", "s27. s28. s29.")
    assert made[10] == ("w2s1-0", "s0. s1.") and made[19] == ("w2s1-9", "s9. s10.")
    assert len({pid for pid, _ in made}) == 20
    assert len(list(passages(sentences, 30 // FIRST_WINDOW))) == 10
    with pytest.raises(ValueError, match="at most"):
        list(passages(sentences[:4], 100))


def test_a_callable_source_is_streamed_once_per_pass_and_committed_in_growing_steps(tmp_path, tiny_bert_path, monkeypatch):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(make_sentences(100, seed=3))
    texts = make_sentences(300, seed=4)
    passes = []

    def source():
        passes.append(1)
        return (Document(source=f"d{i}", text=text) for i, text in enumerate(texts))

    commits = []
    from isotrope.connectors.faiss_store import FaissStore

    original = FaissStore.commit
    monkeypatch.setattr(FaissStore, "commit", lambda self: (commits.append(len(self)), original(self))[1])
    uri = f"faiss:{tmp_path / 's'}"
    report = index_documents(source, uri, encoder=encoder, chunk_tokens=0, batch_size=10, commit_every=20, show_progress=False)
    assert report.added == 300 and len(passes) == 1  # a saved encoder needs no fitting pass
    with Collection.open(uri) as collection:
        stored = collection.store.get(collection.store.ids())
        assert sorted(hit.text for hit in stored) == sorted(texts)
    steps = [b - a for a, b in itertools.pairwise(commits)]
    assert steps and all(step >= 20 for step in steps[:-1])
    assert max(steps) > 20  # later commits wait for a quarter of what is stored
