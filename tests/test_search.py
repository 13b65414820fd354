"""Collections (a store plus the encoder that wrote it) and the index/search/info commands, checked
against float64 brute force over the in-memory encoder's vectors of the chunker's chunks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.chunking import Chunk, TokenChunker
from isotrope.ingest.loaders import iter_documents
from isotrope.ingest.pipeline import index_documents
from isotrope.search import Collection, EncoderMismatchError, parse_store_uri
from isotrope.stores.base import Hit
from test_cli import run_cli

pytest.importorskip("faiss")
pytest.importorskip("lancedb")

CHUNKING = {"chunk_tokens": 32, "overlap_tokens": 8}
K = 5
QUERIES = ["the cat runs in the city", "a big red car", "where is the river?", "music and rain"]


@pytest.fixture(scope="module")
def encoder(tiny_bert_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(make_sentences(200, seed=3))


@pytest.fixture
def corpus(tmp_path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for seed, name in enumerate(["a.md", "b.txt", "c.md"]):
        sentences = make_sentences(12, seed=20 + seed)
        (folder / name).write_text("\n\n".join(" ".join(sentences[i : i + 4]) for i in range(0, 12, 4)) + "\n")
    (folder / "blob.txt").write_bytes(b"\x00\x01binary")
    return folder


def expected_chunks(folder: Path, encoder: ShapedEncoder) -> list[Chunk]:
    chunker = TokenChunker(encoder.tokenizer, **CHUNKING)
    return [chunk for document in iter_documents(folder) for chunk in chunker.chunk(document)]


def check_against_brute_force(
    hits: list[list[Hit]], queries: list[str], chunks: list[Chunk], encoder: ShapedEncoder, where=lambda chunk: True
) -> None:
    """Tie-aware: each hit's score is its float64 reference score, and the scores are the reference top k."""
    allowed = [chunk for chunk in chunks if where(chunk)]
    vectors = encoder.encode([chunk.text for chunk in allowed]).astype(np.float64)
    reference = encoder.encode(queries, kind="query").astype(np.float64) @ vectors.T
    column = {chunk.id: j for j, chunk in enumerate(allowed)}
    assert len(hits) == len(queries)
    for row, found in zip(reference, hits):
        assert len(found) == min(K, len(allowed))
        assert all(hit.id in column for hit in found)
        np.testing.assert_allclose([hit.score for hit in found], [row[column[hit.id]] for hit in found], atol=1e-5)
        np.testing.assert_allclose([hit.score for hit in found], np.sort(row)[::-1][:K], atol=1e-5)


def test_parse_store_uri(tmp_path):
    assert parse_store_uri(f"faiss:{tmp_path}/x") == ("faiss", tmp_path / "x")
    assert parse_store_uri(f"lancedb:{tmp_path}/y") == ("lancedb", tmp_path / "y")
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "store.sqlite").touch()
    (tmp_path / "l" / "chunks.lance").mkdir(parents=True)
    assert parse_store_uri(tmp_path / "f") == ("faiss", tmp_path / "f")
    assert parse_store_uri(str(tmp_path / "l")) == ("lancedb", tmp_path / "l")
    with pytest.raises(ValueError, match=r"cannot tell the store kind of .*nowhere.*faiss:DIR or lancedb:DIR"):
        parse_store_uri(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="cannot tell the store kind"):
        parse_store_uri(f"milvus:{tmp_path}")


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_persist_reopen_gives_identical_results(tmp_path, corpus, encoder, kind):
    uri = f"{kind}:{tmp_path / 'store'}"
    chunks = expected_chunks(corpus, encoder)
    index_documents(corpus, uri, encoder=encoder, show_progress=False, **CHUNKING)
    with Collection.open(uri) as collection:  # the encoder loaded from the store
        assert collection.encoder is not encoder and collection.encoder.fingerprint == encoder.fingerprint
        first = collection.search(QUERIES, k=K)
        single = collection.search(QUERIES[0], k=K)
        filtered = collection.search(QUERIES, k=K, where="source = 'b.txt'")
        assert collection.search(QUERIES, k=K, where={"source": "b.txt"}) == filtered
        info = collection.info()
    check_against_brute_force(first, QUERIES, chunks, encoder)
    assert [hit.id for hit in single] == [hit.id for hit in first[0]]  # one query alone or in a batch
    np.testing.assert_allclose([hit.score for hit in single], [hit.score for hit in first[0]], atol=1e-6)
    check_against_brute_force(filtered, QUERIES, chunks, encoder, where=lambda chunk: chunk.source == "b.txt")
    assert all(hit.metadata["source"] == "b.txt" for hits in filtered for hit in hits)
    assert info["store"] == uri and info["chunks"] == len(chunks)
    assert info["fingerprint"] == encoder.fingerprint and info["shape"] == "center,l2" and info["dim"] == str(encoder.dim)

    with Collection.open(uri, encoder=encoder) as collection:  # reopened, with the in-memory encoder
        assert collection.search(QUERIES, k=K) == first
        assert collection.search(QUERIES, k=K, where="source = 'b.txt'") == filtered


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_encoder_mismatch_names_both_fingerprints(tmp_path, corpus, encoder, tiny_bert_path, kind):
    uri = f"{kind}:{tmp_path / 'store'}"
    index_documents(corpus, uri, encoder=encoder, show_progress=False, **CHUNKING)
    other = ShapedEncoder.create(tiny_bert_path, shape="abtt(2)", device="cpu").fit(make_sentences(100, seed=4))
    assert other.fingerprint != encoder.fingerprint
    with pytest.raises(EncoderMismatchError) as error:
        Collection.open(uri, encoder=other)
    assert encoder.fingerprint in str(error.value) and other.fingerprint in str(error.value)
    (corpus / "d.md").write_text("the dog sees the moon.\n")
    with pytest.raises(EncoderMismatchError, match=other.fingerprint):
        index_documents(corpus, uri, encoder=other, show_progress=False, **CHUNKING)
    with Collection.open(uri) as collection:  # nothing was written
        assert len(collection.store) == len(expected_chunks(corpus, encoder)) - 1


def test_create_and_open_errors(tmp_path, encoder, tiny_bert_path):
    uri = f"faiss:{tmp_path / 'store'}"
    assert not Collection.exists(uri)
    with pytest.raises(FileNotFoundError, match=r"no isotrope store at .*store"):
        Collection.open(uri)
    Collection.create(uri, encoder).close()
    assert Collection.exists(uri) and Collection.exists(tmp_path / "store")
    with pytest.raises(FileExistsError, match="already holds an isotrope store"):
        Collection.create(uri, encoder)
    with Collection.open(tmp_path / "store") as collection:
        assert len(collection.store) == 0 and collection.search("the cat", k=3) == []
    unfitted = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu")
    with pytest.raises(Exception, match="not fitted"):
        Collection.create(f"lancedb:{tmp_path / 'other'}", unfitted)
    assert not Collection.exists(f"lancedb:{tmp_path / 'other'}")


# ----------------------------------------------------------------------------- the command line


def test_cli_index_search_info(monkeypatch, capsys, tmp_path, corpus, tiny_bert_path):
    store = tmp_path / "store"
    uri = f"faiss:{store}"
    code, out, err = run_cli(
        monkeypatch,
        capsys,
        "index",
        corpus,
        "--store",
        uri,
        "--model",
        tiny_bert_path,
        "--shape",
        "center",
        "--chunk-tokens",
        32,
        "--overlap-tokens",
        8,
    )
    assert code == 0, err
    assert "skipped blob.txt: binary file" in err
    loaded = ShapedEncoder.load(store / "encoder", device="cpu")
    assert loaded.shape == "center,l2"
    chunks = expected_chunks(corpus, loaded)
    assert f"3 documents, {len(chunks)} chunks: {len(chunks)} added" in out

    code, out, err = run_cli(monkeypatch, capsys, "search", uri, QUERIES[1], "-k", K, "--json")
    assert code == 0, err
    hits = [Hit(**hit) for hit in json.loads(out)]
    check_against_brute_force([hits], [QUERIES[1]], chunks, loaded)
    texts = {chunk.id: chunk.text for chunk in chunks}
    assert all(hit.text == texts[hit.id] for hit in hits)

    code, out, err = run_cli(monkeypatch, capsys, "search", uri, QUERIES[1], "-k", K, "--json", "--where", "source = 'c.md'")
    assert code == 0, err
    filtered = [Hit(**hit) for hit in json.loads(out)]
    check_against_brute_force([filtered], [QUERIES[1]], chunks, loaded, where=lambda chunk: chunk.source == "c.md")

    code, out, err = run_cli(monkeypatch, capsys, "search", store, QUERIES[1], "-k", 2)  # a bare folder, plain text
    assert code == 0, err
    assert out.startswith(f" 1. {hits[0].score:.3f}  {hits[0].metadata['source']}\n") and "\n 2. " in out

    code, out, err = run_cli(monkeypatch, capsys, "info", uri)
    assert code == 0, err
    info = json.loads(out)
    assert info["chunks"] == len(chunks) and info["fingerprint"] == loaded.fingerprint
    assert (info["model"], info["shape"], info["dim"]) == (tiny_bert_path, "center,l2", "32")

    code, out, err = run_cli(monkeypatch, capsys, "index", corpus, "--store", uri, "--chunk-tokens", 32, "--overlap-tokens", 8)
    assert code == 0, err
    assert f"0 added, {len(chunks)} unchanged" in out


def test_cli_errors_are_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "search", f"faiss:{tmp_path / 'none'}", "the cat")
    assert code == 1 and err.splitlines() == [f"error: no isotrope store at {tmp_path / 'none'} (missing encoder/isotrope.json)"]
    code, _, err = run_cli(monkeypatch, capsys, "info", tmp_path)
    assert code == 1 and len(err.splitlines()) == 1 and "cannot tell the store kind" in err


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_collection_add_encodes_upserts_and_deletes(tmp_path, encoder, kind):
    """``Collection.add`` encodes with the collection's encoder (the exact brute-force top k over
    those texts), upserts by id, keeps raw vectors where the store does, and ``delete`` takes ids,
    a filter or both."""
    texts = make_sentences(30, seed=41)
    ids = [f"t{i}" for i in range(len(texts))]
    rows = [{"part": i % 3} for i in range(len(texts))]
    with Collection.create(f"{kind}:{tmp_path / 's'}", encoder) as collection:
        assert collection.add(ids, texts, rows) == ids
        chunks = [
            Chunk(id=i, text=t, source="", position=0, start=0, end=len(t), metadata=r) for i, t, r in zip(ids, texts, rows)
        ]
        check_against_brute_force(collection.search(QUERIES, k=K), QUERIES, chunks, encoder)
        if collection.store.stores_raw_vectors:
            np.testing.assert_allclose(collection.store.raw_vectors(ids[:3]), encoder.embed_raw(texts[:3]), atol=1e-5)
        collection.add(["t0"], ["a brand new text about trains"], [{"part": 9}])
        assert len(collection.store) == len(texts)
        assert collection.get(["t0"])[0].text == "a brand new text about trains"
        assert collection.delete(where="part = 1") == 10
        assert collection.delete(ids=["t0", "t2", "missing"], where={"part": 2}) == 1
        assert sorted(collection.store.ids()) == sorted(f"t{i}" for i in range(30) if i % 3 != 1 and i != 2)
        with pytest.raises(ValueError, match="ids or a where"):
            collection.delete()


def test_collection_add_refuses_vectors_of_another_encoder(tmp_path, encoder):
    texts = make_sentences(4, seed=42)
    with Collection.create(f"faiss:{tmp_path / 's'}", encoder) as collection:
        good = encoder.encode(texts)
        collection.add(["a", "b", "c", "d"], texts, vectors=good)
        shuffled = good[::-1].copy()
        with pytest.raises(EncoderMismatchError, match=r"e: its vector is not this store's encoder's"):
            collection.add(["e", "f", "g", "h"], texts, vectors=shuffled)
        assert len(collection.store) == 4


def test_no_writer_goes_around_the_collection():
    """Outside the store layer and ingestion's writers, stores are written through ``Collection.add``
    (it encodes with the store's own encoder): no module calls a store's ``add`` directly."""
    import re

    root = Path(__file__).resolve().parents[1]
    allowed = {"src/isotrope/search.py", "src/isotrope/ingest/plan.py"}  # the collection and the ingestion writer
    pattern = re.compile(r"\bstore\.add\(")
    offenders = [
        str(path.relative_to(root))
        for folder in ("src/isotrope", "connectors")
        for path in (root / folder).rglob("*.py")
        if "stores" not in path.relative_to(root).parts
        and not path.name.endswith("_store.py")
        and str(path.relative_to(root)) not in allowed
        and pattern.search(path.read_text())
    ]
    assert offenders == []
