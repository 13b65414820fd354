"""Faults around a store: failed creation, a missing encoder, a tampered encoder, concurrent writers and readers."""

from __future__ import annotations

import pytest

from conftest import make_sentences
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection


@pytest.fixture
def glove_encoder(tiny_glove_path):
    return ShapedEncoder.create(tiny_glove_path, shape="center").fit(["the cat sat on the mat", "the dog runs fast"])


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_a_store_that_fails_to_build_leaves_no_half_made_folder(kind, glove_encoder, tmp_path, monkeypatch):
    from isotrope import search

    store_class = search._store_class(kind)

    def fail(self, **properties):
        raise ImportError("The lance library is required to use this function. Please install with `pip install pylance`.")

    monkeypatch.setattr(store_class, "set_properties", fail)
    with pytest.raises(ImportError, match="lance library"):
        Collection.create(f"{kind}:{tmp_path / 'store'}", glove_encoder)
    assert not (tmp_path / "store").exists()
    # an existing (empty) folder the user made is kept, but holds no store
    (tmp_path / "mine").mkdir()
    with pytest.raises(ImportError):
        Collection.create(f"{kind}:{tmp_path / 'mine'}", glove_encoder)
    assert (tmp_path / "mine").is_dir() and not Collection.exists(f"{kind}:{tmp_path / 'mine'}")


def index(source, store, model, **options):
    from isotrope.ingest.pipeline import index_documents

    return index_documents(source, store, config=EncoderConfig(model=model, shape="center"), show_progress=False, **options)


@pytest.fixture
def docs(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, sentence in enumerate(make_sentences(12, seed=3)):
        (folder / f"d{i:02d}.txt").write_text(sentence)
    return folder


def test_a_second_writer_is_refused_before_any_fitting(docs, tmp_path, tiny_glove_path, monkeypatch):
    from isotrope.stores.lock import StoreLockedError, writer_lock

    store = f"lancedb:{tmp_path / 'store'}"
    fitted = []
    monkeypatch.setattr(ShapedEncoder, "fit_sample", lambda *a, **k: fitted.append(1))
    with (
        writer_lock(tmp_path / "store", "indexed"),
        pytest.raises(StoreLockedError, match=rf"being indexed by process {__import__('os').getpid()} .*wait for it"),
    ):
        index(docs, store, tiny_glove_path)
    assert fitted == [] and not (tmp_path / "store").exists()


def test_a_writer_in_another_process_is_named_and_a_dead_ones_lock_is_taken_over(docs, tmp_path, tiny_glove_path, caplog):
    import json
    import subprocess
    import sys

    from isotrope.stores.lock import StoreLockedError, lock_path

    store = f"faiss:{tmp_path / 'store'}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time; from isotrope.stores.lock import writer_lock\n"
                f"with writer_lock({str(tmp_path / 'store')!r}):\n    print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreLockedError, match=f"process {holder.pid} "):
            index(docs, store, tiny_glove_path)
    finally:
        holder.kill()
        holder.wait()
    # kill -9 leaves the lock file with the dead pid: stale, so the next writer takes it over
    assert json.loads(lock_path(tmp_path / "store").read_text())["pid"] == holder.pid
    with caplog.at_level("WARNING", logger="isotrope.stores.lock"):
        report = index(docs, store, tiny_glove_path)
    assert report.added == 12 and f"stale write lock of process {holder.pid}" in caplog.text
    assert not lock_path(tmp_path / "store").exists()


def test_duplicated_rows_are_repaired_by_the_next_run(docs, tmp_path, tiny_glove_path, caplog):
    store = f"lancedb:{tmp_path / 'store'}"
    index(docs, store, tiny_glove_path)
    with Collection.open(store) as collection:  # what two unserialised writers used to leave
        dataset = collection.store._writable()
        dataset.insert(dataset.to_table().slice(0, 5))
        assert len(collection.store) == 17
    with caplog.at_level("WARNING"):
        report = index(docs, store, tiny_glove_path)
    assert "5 chunk ids were stored more than once" in caplog.text and report.added == 5
    with Collection.open(store) as collection:
        ids = collection.store.ids()
        assert len(ids) == len(set(ids)) == 12


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_a_store_without_its_encoder_is_refused_with_how_to_recover(kind, docs, tmp_path, tiny_glove_path):
    import shutil

    from isotrope.search import EncoderMissingError

    store = f"{kind}:{tmp_path / 'store'}"
    index(docs, store, tiny_glove_path)
    shutil.rmtree(tmp_path / "store" / "encoder")
    for action in (lambda: index(docs, store, tiny_glove_path), lambda: Collection.open(store)):
        with pytest.raises(
            EncoderMissingError, match=r"holds vectors but no encoder/ folder .*re-index the documents into a new store"
        ):
            action()


def test_a_tampered_backbone_source_is_refused_before_it_is_loaded(tmp_path, tiny_glove_path, monkeypatch):
    import json

    from isotrope import backbones
    from isotrope.persist import EncoderFormatError

    encoder = ShapedEncoder.create(tiny_glove_path, shape="center").fit(make_sentences(5))
    encoder.save(tmp_path / "enc")
    spec = json.loads((tmp_path / "enc" / "isotrope.json").read_text())
    spec["backbone"]["source"] = str(tmp_path / "evil.pt")
    (tmp_path / "enc" / "isotrope.json").write_text(json.dumps(spec))
    monkeypatch.setattr(backbones, "make_backbone", lambda *a, **k: pytest.fail("the backbone was built"))
    with pytest.raises(EncoderFormatError, match=r"do not match the saved fingerprint .* nothing was loaded"):
        ShapedEncoder.load(tmp_path / "enc")


def test_readers_open_a_faiss_store_while_a_writer_holds_the_database(docs, tmp_path, tiny_glove_path):
    import sqlite3
    import time

    store = f"faiss:{tmp_path / 'store'}"
    index(docs, store, tiny_glove_path)
    writer = sqlite3.connect(tmp_path / "store" / "store.sqlite", isolation_level=None)
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    writer.execute("BEGIN EXCLUSIVE")  # a writer in the middle of its commit
    writer.execute("DELETE FROM properties")
    try:
        started = time.monotonic()
        with Collection.open(store) as collection:
            assert collection.search(make_sentences(1, seed=3)[0], k=1)[0].metadata["source"] == "d00.txt"
        assert time.monotonic() - started < 5
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_reshape_requires_a_shape(tmp_path):
    from typer.testing import CliRunner

    from isotrope.cli import app

    result = CliRunner().invoke(app, ["reshape", f"lancedb:{tmp_path / 'store'}"])
    assert result.exit_code == 2 and "Missing option '--shape'" in result.output
