"""End-to-end ingestion into FAISS and LanceDB: re-runs, upserts, sync, bad files, a killed run that
resumes, and the demo's docstring reader. Expected chunk ids come from the chunker run on the corpus;
expected vectors from the in-memory encoder."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.config import EncoderConfig
from isotrope.demo import stdlib_docstrings
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.chunking import Chunk, TokenChunker
from isotrope.ingest.loaders import iter_documents
from isotrope.ingest.pipeline import index_documents
from isotrope.search import Collection

pytest.importorskip("faiss")
pytest.importorskip("lancedb")

CHUNKING = {"chunk_tokens": 32, "overlap_tokens": 8}
KINDS = ("faiss", "lancedb")


@pytest.fixture(scope="module")
def encoder(tiny_bert_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(make_sentences(200, seed=3))


def paragraphs(n: int, seed: int) -> str:
    """``n`` paragraphs of four in-vocabulary sentences."""
    sentences = make_sentences(4 * n, seed=seed)
    return "\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 4 * n, 4)) + "\n"


def write_corpus(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for seed, name in enumerate(["a.md", "b.txt", "sub/c.rst"]):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(paragraphs(3, seed=10 + seed), encoding="utf-8")
    return folder


def expected_chunks(folder: Path, encoder: ShapedEncoder) -> dict[str, Chunk]:
    """Chunk id -> chunk, as the chunker cuts the loadable files of ``folder``."""
    chunker = TokenChunker(encoder.tokenizer, **CHUNKING)
    return {chunk.id: chunk for document in iter_documents(folder) for chunk in chunker.chunk(document)}


def ids_of(chunks: dict[str, Chunk], source: str) -> set[str]:
    return {i for i, chunk in chunks.items() if chunk.source == source}


def stored_ids(uri: str) -> list[str]:
    with Collection.open(uri) as collection:
        return collection.store.ids()


def folder_digest(path: Path) -> dict[str, str]:
    return {
        p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()
    }


def index(folder: Path, uri: str, **options):
    return index_documents(folder, uri, show_progress=False, **CHUNKING, **options)


@pytest.mark.parametrize("kind", KINDS)
def test_rerun_upsert_and_sync(tmp_path, encoder, kind):
    corpus = write_corpus(tmp_path / "corpus")
    uri = f"{kind}:{tmp_path / 'store'}"
    first = expected_chunks(corpus, encoder)
    assert all(len(ids_of(first, name)) >= 3 for name in ("a.md", "b.txt", "sub/c.rst"))

    report = index(corpus, uri, encoder=encoder)
    assert (report.documents, report.chunks, report.added, report.unchanged, report.deleted) == (3, len(first), len(first), 0, 0)
    assert sorted(stored_ids(uri)) == sorted(first)
    with Collection.open(uri) as collection:
        assert collection.encoder.fingerprint == encoder.fingerprint
        ids = sorted(first)
        hits = collection.store.get(ids)
        assert [h.text for h in hits] == [first[i].text for i in ids]
        assert all(h.metadata["source"] == first[i].source and h.metadata["start"] == first[i].start for h, i in zip(hits, ids))
        np.testing.assert_allclose(collection.store.vectors(ids), encoder.encode([first[i].text for i in ids]), atol=1e-5)
        version = collection.store.version if kind == "lancedb" else None
        before = dict(zip(ids, collection.store.vectors(ids)))

    # unchanged files: nothing written
    files_before = folder_digest(tmp_path / "store")
    report = index(corpus, uri)
    assert (report.chunks, report.added, report.unchanged, report.deleted) == (len(first), 0, len(first), 0)
    if kind == "lancedb":
        with Collection.open(uri) as collection:
            assert collection.store.version == version
    else:
        assert folder_digest(tmp_path / "store") == files_before

    # a changed file is upserted: its old chunks go, new ones come, the other files are untouched
    text = (corpus / "a.md").read_text()
    (corpus / "a.md").write_text(text.rsplit("\n\n", 1)[0] + "\n\n" + paragraphs(2, seed=99), encoding="utf-8")
    second = expected_chunks(corpus, encoder)
    gone, new = ids_of(first, "a.md") - ids_of(second, "a.md"), ids_of(second, "a.md") - ids_of(first, "a.md")
    assert gone and new and ids_of(first, "a.md") & ids_of(second, "a.md")  # a partial change
    report = index(corpus, uri)
    assert (report.added, report.deleted, report.unchanged) == (len(new), len(gone), len(second) - len(new))
    assert sorted(stored_ids(uri)) == sorted(second)
    with Collection.open(uri) as collection:
        np.testing.assert_allclose(
            collection.store.vectors(sorted(new)), encoder.encode([second[i].text for i in sorted(new)]), atol=1e-5
        )
        others = sorted(ids_of(first, "b.txt") | ids_of(first, "sub/c.rst"))
        np.testing.assert_array_equal(collection.store.vectors(others), np.stack([before[i] for i in others]))

    # a deleted file: its chunks stay without sync, go with sync
    (corpus / "sub" / "c.rst").unlink()
    report = index(corpus, uri)
    assert (report.documents, report.added, report.deleted) == (2, 0, 0)
    assert sorted(stored_ids(uri)) == sorted(second)
    report = index(corpus, uri, sync=True)
    assert (report.added, report.deleted) == (0, len(ids_of(second, "sub/c.rst")))
    assert sorted(stored_ids(uri)) == sorted(expected_chunks(corpus, encoder))


def test_bad_files_are_reported_by_name_and_the_rest_is_indexed(tmp_path, encoder):
    corpus = write_corpus(tmp_path / "corpus")
    good = expected_chunks(corpus, encoder)
    (corpus / "blob.txt").write_bytes(b"the cat\x00\x01\x02 runs")
    (corpus / "empty.md").write_bytes(b"")
    (corpus / "latin1.txt").write_bytes("the caf\xe9 is big".encode("latin-1"))
    (corpus / "big.txt").write_text("the dog runs. " * 400, encoding="utf-8")
    assert (corpus / "big.txt").stat().st_size > 4000 > max(p.stat().st_size for p in corpus.rglob("*.*") if p.name != "big.txt")

    report = index(corpus, f"lancedb:{tmp_path / 'store'}", encoder=encoder, loader_options={"max_file_bytes": 4000})
    reasons = {skipped.path: skipped.reason for skipped in report.skipped}
    assert len(report.skipped) == 4 and set(reasons) == {"blob.txt", "empty.md", "latin1.txt", "big.txt"}
    assert "binary" in reasons["blob.txt"] and "empty" in reasons["empty.md"]
    assert "UTF-8" in reasons["latin1.txt"] and "max_file_bytes=4000" in reasons["big.txt"]
    assert (report.documents, report.added) == (3, len(good))
    assert sorted(stored_ids(f"lancedb:{tmp_path / 'store'}")) == sorted(good)


def test_a_new_store_fits_its_encoder_on_the_corpus(tmp_path, encoder, tiny_bert_path):
    corpus = write_corpus(tmp_path / "corpus")
    uri = f"faiss:{tmp_path / 'store'}"
    report = index(corpus, uri, config=EncoderConfig(model=tiny_bert_path, shape="center"))
    chunks = expected_chunks(corpus, encoder)
    texts = [chunks[i].text for i in sorted(chunks)]
    reference = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu")
    reference.fit_transforms(reference.embed_raw(texts))  # the centring is fitted on every chunk (fewer than fit_samples)
    with Collection.open(uri) as collection:
        assert collection.encoder.metadata["fit"]["n_texts"] == len(chunks) == report.added
        np.testing.assert_allclose(collection.encoder.transforms[0].mean_, reference.transforms[0].mean_, atol=1e-6)
        np.testing.assert_allclose(collection.store.vectors(sorted(chunks)), reference.encode(texts), atol=1e-5)


@pytest.mark.parametrize("family", ["transformer", "static"])
def test_without_a_shape_the_default_is_chosen_by_backbone_family(tmp_path, tiny_bert_path, family):
    model = tiny_bert_path if family == "transformer" else f"static:{tiny_bert_path}"
    uri = f"faiss:{tmp_path / 'store'}"
    index(write_corpus(tmp_path / "corpus"), uri, config=EncoderConfig(model=model))
    with Collection.open(uri) as collection:
        expected = ShapedEncoder.create(model, shape="center" if family == "transformer" else "whiten-partial")
        assert collection.encoder.shape == expected.shape


def test_an_empty_corpus_is_an_error_and_creates_nothing(tmp_path, tiny_bert_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="no text to index"):
        index(tmp_path / "corpus", f"faiss:{tmp_path / 'store'}", config=EncoderConfig(model=tiny_bert_path, shape="center"))
    assert not Collection.exists(f"faiss:{tmp_path / 'store'}")


def test_nothing_to_index_names_the_files_skipped_and_why(tmp_path, tiny_bert_path):
    """A corpus whose every file is skipped says why, not only 'no text to index' (the reasons were lost)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.csv").write_text("title,body\nx,y\n")
    (corpus / "b.txt").write_bytes("caf\u00e9".encode("latin-1"))
    store = f"faiss:{tmp_path / 'store'}"
    with pytest.raises(
        ValueError, match=r"corpus: no text to index \(skipped a\.csv: no column 'text' \(columns: title, body\) and 1 more\)$"
    ):
        index(corpus, store, config=EncoderConfig(model=tiny_bert_path, shape="center"))
    assert not Collection.exists(store)


# ----------------------------------------------------------------------------- a killed ingestion

CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from isotrope.connectors.faiss_store import FaissStore
    from isotrope.connectors.lancedb_store import LanceDBStore
    from isotrope.ingest.pipeline import index_documents

    def pause_after_first_commit(cls, kind):
        add, commit = cls.add, cls.commit
        committed = []

        def add_then_pause(self, ids, *args, **kwargs):
            add(self, ids, *args, **kwargs)
            if committed:  # a batch written since the last commit: wait here for SIGKILL
                print(f"{kind} paused {len(self)}\\n", end="", flush=True)  # one write: the two stores' threads print
                time.sleep(600)

        def commit_and_report(self):
            commit(self)
            committed.append(len(self))
            print(f"{kind} committed {len(self)}\\n", end="", flush=True)

        cls.add, cls.commit = add_then_pause, commit_and_report

    pause_after_first_commit(FaissStore, "faiss")
    pause_after_first_commit(LanceDBStore, "lancedb")
    corpus, *stores = sys.argv[1:]
    options = dict(chunk_tokens=32, overlap_tokens=8, batch_size=4, commit_every=8, show_progress=False)
    threads = [threading.Thread(target=index_documents, args=(corpus, store), kwargs=options) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("finished", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")
def test_a_killed_ingestion_keeps_its_commits_and_resumes_without_duplicates(tmp_path, encoder):
    assert CHUNKING == {"chunk_tokens": 32, "overlap_tokens": 8}  # as in CHILD
    corpus = write_corpus(tmp_path / "corpus")
    chunks = expected_chunks(corpus, encoder)
    assert len(chunks) > 12  # more than two batches and a commit: the child pauses before it finishes
    uris = {kind: f"{kind}:{tmp_path / kind}" for kind in KINDS}
    for uri in uris.values():
        Collection.create(uri, encoder).close()

    log = tmp_path / "child.log"
    with open(log, "w") as stderr:  # one process writes both stores (one import of torch), each in a thread
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(corpus), *uris.values()], stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    watchdog = threading.Timer(240, child.kill)
    watchdog.start()
    committed: dict[str, int] = {}
    paused: dict[str, int] = {}
    try:
        for line in child.stdout:
            kind, event, count = ([*line.split(), "", ""])[:3]
            if event in ("committed", "paused"):
                (committed if event == "committed" else paused)[kind] = int(count)
            if len(paused) == len(KINDS):
                break
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        watchdog.cancel()
        child.stdout.close()
    assert set(paused) == set(KINDS), log.read_text()[-3000:]
    assert child.returncode == -signal.SIGKILL

    for kind, uri in uris.items():
        assert 0 < committed[kind] < paused[kind] < len(chunks)
        with Collection.open(uri) as collection:  # consistent and readable
            ids = collection.store.ids()
            assert len(ids) == len(set(ids)) == len(collection.store) and set(ids) <= set(chunks)
            # FAISS keeps the last commit; every LanceDB write is its own commit
            assert len(ids) == (committed[kind] if kind == "faiss" else paused[kind])
            np.testing.assert_allclose(collection.store.vectors(ids), encoder.encode([chunks[i].text for i in ids]), atol=1e-5)
            top = collection.search(chunks[ids[0]].text, k=1)
            assert top[0].id == ids[0]
        report = index(corpus, uri)
        assert (report.unchanged, report.added) == (len(ids), len(chunks) - len(ids))
        with Collection.open(uri) as collection:
            final = collection.store.ids()
            assert len(final) == len(collection.store) == len(chunks) and set(final) == set(chunks)
            np.testing.assert_allclose(
                collection.store.vectors(sorted(chunks)), encoder.encode([chunks[i].text for i in sorted(chunks)]), atol=1e-5
            )


# ----------------------------------------------------------------------------- the demo's docstring reader

FAKE_STDLIB = {
    "argparse.py": '''\
        """Command-line parsing library."""


        class ArgumentParser:
            """Object for parsing command line strings into Python objects."""

            def parse_args(self, args=None):
                """Convert argument strings to objects."""

                def inner():
                    """A nested helper: not listed."""

            def _private(self):
                """A private method."""


        def _helper():
            """A private function."""


        def undocumented():
            pass


        async def fetch():
            """Fetch asynchronously."""
        ''',
    "antigravity.py": '''\
        """Open a comic in a web browser."""
        from pathlib import Path
        Path(__file__).with_name("IMPORTED").write_text("imported")
        ''',
    "broken.py": '''\
        """Never read."""
        def oops(:
        ''',
    "_private_module.py": '"""Private module."""\n',
    "notes.txt": '"""Not Python."""\n',
    "json/__init__.py": '"""JSON encoder and decoder."""\n',
    "json/decoder.py": '''\
        import re


        def loads(s):
            """Deserialize s to a Python object. '''
    + "More words. " * 50
    + '''"""
        ''',
    "test/test_argparse.py": '"""Tests are skipped."""\n',
    "__pycache__/cached.py": '"""Caches are skipped."""\n',
}


@pytest.fixture
def fake_stdlib(tmp_path) -> Path:
    root = tmp_path / "lib"
    for name, source in FAKE_STDLIB.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def line_of(name: str, needle: str) -> int:
    """1-based line of the first line of FAKE_STDLIB[name] that contains ``needle``."""
    lines = textwrap.dedent(FAKE_STDLIB[name]).splitlines()
    return next(number for number, line in enumerate(lines, start=1) if needle in line)


def test_stdlib_docstrings_reads_public_docstrings_without_importing(fake_stdlib):
    modules_before = set(sys.modules)
    documents = list(stdlib_docstrings(fake_stdlib, max_chars=60))
    assert not (fake_stdlib / "IMPORTED").exists()  # antigravity's top level never ran
    assert not {"antigravity", "argparse", "broken", "json.decoder"} & (set(sys.modules) - modules_before)

    long_docstring = "Deserialize s to a Python object. " + "More words. " * 50
    expected = {  # name -> (source, line, node kind, docstring)
        "argparse": ("argparse.py", 1, "Module", "Command-line parsing library."),
        "argparse.ArgumentParser": (
            "argparse.py",
            line_of("argparse.py", "class ArgumentParser"),
            "ClassDef",
            "Object for parsing command line strings into Python objects.",
        ),
        "argparse.ArgumentParser.parse_args": (
            "argparse.py",
            line_of("argparse.py", "def parse_args"),
            "FunctionDef",
            "Convert argument strings to objects.",
        ),
        "argparse.fetch": ("argparse.py", line_of("argparse.py", "async def fetch"), "AsyncFunctionDef", "Fetch asynchronously."),
        "antigravity": ("antigravity.py", 1, "Module", "Open a comic in a web browser."),
        "json": ("json/__init__.py", 1, "Module", "JSON encoder and decoder."),
        "json.decoder.loads": (
            "json/decoder.py",
            line_of("json/decoder.py", "def loads"),
            "FunctionDef",
            long_docstring.strip()[:60],
        ),
    }
    found = {d.metadata["name"]: d for d in documents}
    assert sorted(found) == sorted(expected) and len(documents) == len(expected)
    for name, (source, line, kind, docstring) in expected.items():
        document = found[name]
        assert (document.source, document.metadata["line"], document.metadata["kind"]) == (source, line, kind)
        assert document.text == f"{name}: {docstring}"
    assert len({d.key for d in documents}) == len(documents)  # distinct documents, hence distinct chunk ids


def test_docstrings_index_and_answer_with_module_and_line(tmp_path, fake_stdlib, encoder):
    documents = list(stdlib_docstrings(fake_stdlib, max_chars=60))
    uri = f"lancedb:{tmp_path / 'demo'}"
    # name + 60 characters stay under 120 tokens: one chunk per docstring
    report = index_documents(documents, uri, encoder=encoder, show_progress=False, chunk_tokens=120, overlap_tokens=8)
    assert report.documents == report.chunks == report.added == len(documents)
    target = next(d for d in documents if d.metadata["name"] == "argparse.ArgumentParser.parse_args")
    with Collection.open(uri) as collection:
        hit = collection.search(target.text, k=1)[0]
    assert hit.text == target.text
    assert (hit.metadata["source"], hit.metadata["line"]) == ("argparse.py", target.metadata["line"])
