"""Reshaping a LanceDB store from its stored raw vectors: the rewritten vectors against float64 NumPy
references of the shaping, crash recovery at each step of the rewrite and swap, and the refusals."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import isotrope.reshape
from conftest import make_sentences
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.pipeline import index_documents
from isotrope.reshape import reshape_store
from isotrope.search import Collection
from isotrope.stores.layout import ENCODER_DIR, MARKER, RETIRED, STAGED, ReshapeInProgressError
from isotrope.stores.lock import StoreLockedError
from test_cli import run_cli

pytest.importorskip("lancedb")

CHUNKING = {"chunk_tokens": 32, "overlap_tokens": 8}


class SimulatedCrash(Exception):
    """Raised where a real run would have been killed."""


def write_paragraphs(path: Path, n: int, seed: int) -> None:
    sentences = make_sentences(4 * n, seed=seed)
    path.write_text("\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 4 * n, 4)) + "\n")


@pytest.fixture(scope="module")
def base_store(tmp_path_factory, tiny_bert_path) -> Path:
    """A LanceDB store indexed with shape "none" (only l2): the raw vectors are the backbone's pooled output."""
    root = tmp_path_factory.mktemp("reshape")
    (root / "corpus").mkdir()
    for seed in range(3):
        write_paragraphs(root / "corpus" / f"doc{seed}.md", 3, seed=30 + seed)
    index_documents(
        root / "corpus",
        f"lancedb:{root / 'store'}",
        show_progress=False,
        **CHUNKING,
        config=EncoderConfig(model=tiny_bert_path, shape="none"),
    )
    return root / "store"


@pytest.fixture
def store(tmp_path, base_store) -> Path:
    shutil.copytree(base_store, tmp_path / "store")
    return tmp_path / "store"


def snapshot(path: Path) -> dict:
    """Everything a reshape may change or must keep, read through a fresh Collection."""
    with Collection.open(f"lancedb:{path}") as collection:
        store = collection.store
        ids = sorted(store.ids())
        raw = np.concatenate([batch for _, batch in sorted_raw(store, ids)])
        hits = store.get(ids)
        return {
            "ids": ids,
            "raw": raw,
            "vectors": store.vectors(ids),
            "texts": [h.text for h in hits],
            "metadata": [h.metadata for h in hits],
            "properties": store.properties,
            "fingerprint": collection.encoder.fingerprint,
            "encoder": collection.encoder,
        }


def sorted_raw(store, ids):
    rows = {i: v for batch_ids, batch in store.iter_raw(5) for i, v in zip(batch_ids, batch)}
    return [(ids, np.stack([rows[i] for i in ids]))]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def center_reference(raw: np.ndarray) -> np.ndarray:
    x = raw.astype(np.float64)
    return unit_rows(x - x.mean(axis=0))


def abtt_reference(raw: np.ndarray, n: int) -> np.ndarray:
    x = raw.astype(np.float64)
    centred = x - x.mean(axis=0)
    top = np.linalg.svd(centred, full_matrices=False)[2][:n]
    return unit_rows(centred - centred @ top.T @ top)


def leftovers(path: Path) -> set[str]:
    return {name for name in (MARKER, STAGED, RETIRED) if (path / name).exists()}


@pytest.mark.slow
def test_reshape_refits_on_the_raw_vectors_and_rewrites_every_vector(store, base_store, tmp_path):
    uri = f"lancedb:{store}"
    before = snapshot(store)
    np.testing.assert_allclose(before["raw"], before["encoder"].embed_raw(before["texts"]), atol=1e-5)
    np.testing.assert_allclose(before["vectors"], unit_rows(before["raw"].astype(np.float64)), atol=1e-6)

    encoder = reshape_store(uri, "center", batch_size=4)
    after = snapshot(store)
    assert leftovers(store) == set()
    assert after["fingerprint"] == encoder.fingerprint == after["properties"]["fingerprint"] != before["fingerprint"]
    assert after["properties"]["shape"] == "center,l2" and after["encoder"].shape == "center,l2"
    assert after["encoder"].metadata["fit"]["n_texts"] == len(before["ids"])
    np.testing.assert_allclose(after["vectors"], center_reference(before["raw"]), atol=1e-5)
    np.testing.assert_allclose(after["vectors"], after["encoder"].encode(after["texts"]), atol=1e-4)
    for key in ("ids", "raw", "texts", "metadata"):
        np.testing.assert_equal(after[key], before[key])
    with Collection.open(uri) as collection:
        for position in (0, 7, len(after["ids"]) - 1):
            assert collection.search(after["texts"][position], k=1)[0].id == after["ids"][position]

    encoder = reshape_store(uri, "abtt(2),l2")  # from the shaped store: the raw vectors are still there
    again = snapshot(store)
    assert again["fingerprint"] == encoder.fingerprint and again["properties"]["shape"] == "abtt(n_components=2),l2"
    np.testing.assert_allclose(again["vectors"], abtt_reference(before["raw"], 2), atol=1e-4)

    (tmp_path / "more").mkdir()  # new chunks get the new shaping (and their raw vectors)
    write_paragraphs(tmp_path / "more" / "new.md", 2, seed=77)
    report = index_documents(tmp_path / "more", uri, show_progress=False, **CHUNKING)
    with Collection.open(uri) as collection:
        new = sorted(set(collection.store.ids()) - set(before["ids"]))
        assert len(new) == report.added > 0
        texts = [hit.text for hit in collection.store.get(new)]
        np.testing.assert_allclose(collection.store.vectors(new), encoder.encode(texts), atol=1e-4)


def crash_at(monkeypatch, step: str) -> None:
    """Make reshape_store stop at ``step`` as if the process had been killed there."""
    if step == "rewrite":  # while the new vectors stream into the table (second batch)
        real_apply = ShapedEncoder.apply_transforms
        batches = []

        def apply_transforms(self, raw):
            batches.append(len(raw))
            if sum(n > 1 for n in batches) == 2:  # the 1-row call is the dimension probe
                raise SimulatedCrash("simulated crash")
            return real_apply(self, raw)

        monkeypatch.setattr(ShapedEncoder, "apply_transforms", apply_transforms)
    elif step == "swap":  # the old encoder folder is set aside, the new one not yet in place
        real_replace = os.replace

        def replace(src, dst, *args, **kwargs):
            if Path(src).name == STAGED and Path(dst).name == ENCODER_DIR:
                raise SimulatedCrash("simulated crash")
            return real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)
    else:  # the new encoder is in place, the old one and the marker not yet removed
        real_rmtree = shutil.rmtree

        def rmtree(path, *args, **kwargs):
            if Path(path).name == RETIRED:
                raise SimulatedCrash("simulated crash")
            return real_rmtree(path, *args, **kwargs)

        monkeypatch.setattr(shutil, "rmtree", rmtree)


@pytest.mark.parametrize(
    "step, left_behind",
    [
        ("rewrite", {MARKER, STAGED}),
        ("swap", {MARKER, STAGED, RETIRED}),
        ("cleanup", {MARKER, RETIRED}),
    ],
)
def test_an_interrupted_reshape_is_recovered_on_the_next_open(store, monkeypatch, step, left_behind):
    uri = f"lancedb:{store}"
    before = snapshot(store)
    with monkeypatch.context() as patched:
        crash_at(patched, step)
        with pytest.raises(Exception, match="simulated crash"):
            reshape_store(uri, "center", batch_size=4)
    assert leftovers(store) == left_behind
    assert (store / ENCODER_DIR).exists() == (step != "swap")
    assert Collection.exists(uri)  # also while the encoder folder is set aside

    after = snapshot(store)  # the open recovers
    assert leftovers(store) == set()
    for key in ("ids", "raw", "texts", "metadata"):
        np.testing.assert_equal(after[key], before[key])
    if step == "cleanup":  # the swap was done: the reshape is complete
        assert after["properties"]["shape"] == "center,l2" and after["fingerprint"] == after["properties"]["fingerprint"]
        np.testing.assert_allclose(after["vectors"], center_reference(before["raw"]), atol=1e-5)
    else:  # rolled back to the state before the reshape
        assert after["fingerprint"] == before["fingerprint"] and after["properties"] == before["properties"]
        np.testing.assert_array_equal(after["vectors"], before["vectors"])
    encoder = reshape_store(uri, "abtt(2),l2")  # and the store can be reshaped again
    assert snapshot(store)["fingerprint"] == encoder.fingerprint


def test_a_store_being_reshaped_is_refused_not_recovered(store, monkeypatch):
    uri = f"lancedb:{store}"
    before = snapshot(store)
    real_describe = isotrope.reshape.describe_encoder
    seen = []

    def describe_encoder(encoder):  # called between the vector rewrite and the encoder swap
        seen.append(leftovers(store))
        with pytest.raises(ReshapeInProgressError, match="is being reshaped"):
            Collection.open(uri)  # must not roll back the live reshape
        with pytest.raises(StoreLockedError, match="is being reshaped by process"):  # the single-writer lock
            reshape_store(uri, "abtt(2),l2")
        return real_describe(encoder)

    monkeypatch.setattr(isotrope.reshape, "describe_encoder", describe_encoder)
    encoder = reshape_store(uri, "center", batch_size=4)
    assert seen == [{MARKER, STAGED}]
    after = snapshot(store)
    assert after["fingerprint"] == encoder.fingerprint and leftovers(store) == set()
    np.testing.assert_allclose(after["vectors"], center_reference(before["raw"]), atol=1e-5)


def test_a_shape_of_another_dimension_is_refused_before_writing(store):
    before = snapshot(store)
    with pytest.raises(ValueError, match="gives 8-d vectors but the store holds 32-d ones"):
        reshape_store(f"lancedb:{store}", "pca(8),l2")
    after = snapshot(store)
    assert leftovers(store) == set() and after["fingerprint"] == before["fingerprint"]
    np.testing.assert_array_equal(after["vectors"], before["vectors"])


def test_a_faiss_store_cannot_be_reshaped(tmp_path, base_store, tiny_bert_path):
    pytest.importorskip("faiss")
    (tmp_path / "corpus").mkdir()
    write_paragraphs(tmp_path / "corpus" / "doc.md", 2, seed=5)
    uri = f"faiss:{tmp_path / 'store'}"
    index_documents(tmp_path / "corpus", uri, encoder=snapshot(base_store)["encoder"], show_progress=False, **CHUNKING)
    with pytest.raises(ValueError, match="keeps no raw vectors; reshape needs a LanceDB store"):
        reshape_store(uri, "center")
    assert leftovers(tmp_path / "store") == set()
    with Collection.open(uri) as collection:
        assert collection.store.properties["shape"] == "l2"


def test_cli_reshape(monkeypatch, capsys, store, tmp_path):
    before = snapshot(store)
    code, out, err = run_cli(monkeypatch, capsys, "reshape", f"lancedb:{store}", "--shape", "center")
    assert code == 0, err
    after = snapshot(store)
    assert out == f"reshaped lancedb:{store} to center,l2; fingerprint {after['fingerprint']}\n"
    np.testing.assert_allclose(after["vectors"], center_reference(before["raw"]), atol=1e-5)
    code, _, err = run_cli(monkeypatch, capsys, "reshape", f"faiss:{tmp_path / 'nowhere'}", "--shape", "center")
    assert code == 1 and err.splitlines() == [
        f"error: no isotrope store at {tmp_path / 'nowhere'} (missing encoder/isotrope.json)"
    ]
