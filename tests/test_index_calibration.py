"""An index built in a store that a Collection holds calibrates its breadth on pseudo-queries cut from the
stored chunks (queries like real ones); a bare store, or chunks too short to cut queries from, keeps the
queries made from stored vectors. Recall is checked against NumPy float64 brute force."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GLOVE_WORDS
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection
from isotrope.sentences import split_sentences
from isotrope.stores import index_plan
from test_autofusion import _texts
from test_index_plan import DIM, assert_smallest_breadth_reaching, brute_force, draw, fill, recall_of


def like_real(seed: int, n: int = 200) -> np.ndarray:
    """Queries between two clusters' points: harder than the stored vectors, drawn alike for calibration and check."""
    return draw(n, seed) * 0.5 + draw(n, seed + 1) * 0.5


def test_calibration_queries_are_the_given_then_the_pseudo_then_the_stored() -> None:
    given, made = np.ones((2, 3)), np.zeros((2, 3))
    assert index_plan.calibration_queries(given, lambda: pytest.fail("not asked")) == (given, index_plan.GIVEN_QUERIES)
    queries, source = index_plan.calibration_queries(None, lambda: made)
    assert queries is made and source == index_plan.PSEUDO_QUERIES
    assert index_plan.calibration_queries(None, lambda: None) == (None, index_plan.STORED_VECTORS)
    assert index_plan.calibration_queries(None, None) == (None, index_plan.STORED_VECTORS)


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_an_index_calibrated_on_queries_like_real_ones_reaches_the_target_on_fresh_ones(kind, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    data = draw(4000, 31)
    asked = []
    if kind == "faiss":
        store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    else:
        store = LanceDBStore(tmp_path / "db", dim=DIM, index="auto", metric="ip")
    store.calibration_queries = lambda: (asked.append(True), like_real(40))[1]
    fill(store, data, batch=4000)  # one commit builds the planned index and calibrates it
    info = store.index_info()
    assert asked == [True] and info["calibrated_on"] == index_plan.PSEUDO_QUERIES
    if kind == "faiss":
        name, ladder = "nprobe", index_plan.finer([p for p in index_plan.NPROBE_LADDER if p <= info["nlist"]])
        assert info["index_built"] == index_plan.faiss_factory_for(4000) and 1 < info["nprobe"] < info["nlist"]
    else:
        name, ladder = "ef", index_plan.finer([v for v in index_plan.EF_LADDER if v >= 10 * store.refine])
    # the smallest breadth of the finer ladder reaching the target plus the pseudo-query margin on them
    assert_smallest_breadth_reaching(
        store, name, like_real(40), data, index_plan.TARGET_RECALL + index_plan.PSEUDO_QUERY_MARGIN, list(ladder)
    )
    fresh = like_real(50)  # held out, drawn like the calibration queries: the target within 200 queries' sampling error
    assert recall_of(store.search(fresh, 10), brute_force(fresh, data)) >= index_plan.TARGET_RECALL - 0.02
    store.close()
    reopened = FaissStore(tmp_path / "s") if kind == "faiss" else LanceDBStore(tmp_path / "db")
    assert reopened.index_info()["calibrated_on"] == index_plan.PSEUDO_QUERIES and getattr(reopened, name) == info[name]
    reopened.close()


def test_a_bare_store_calibrates_on_stored_vectors(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    store = FaissStore(tmp_path / "s", dim=DIM, index="auto", metric="ip")
    fill(store, draw(3000, 33), batch=3000)
    assert store.index_info()["calibrated_on"] == index_plan.STORED_VECTORS and not store.is_exact
    store.close()


@pytest.fixture(scope="module")
def encoder(tiny_glove_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_glove_path, shape="center").fit(_texts(100, seed=9))


def test_index_queries_are_sentences_cut_from_their_stored_chunks(tmp_path, encoder) -> None:
    texts = _texts(400, seed=5)
    with Collection.create(f"faiss:{tmp_path / 's'}", encoder) as collection:
        collection.add([f"c{i}" for i in range(len(texts))], texts)
        vectors, sources = collection.index_queries(50)
        texts_cut, cut_from = collection.index_query_texts(50)
    assert vectors is not None and len(vectors) == len(sources) == 50 and len(set(sources)) == 50
    assert cut_from == sources
    np.testing.assert_allclose(encoder.encode(texts_cut, kind="query"), vectors, atol=1e-6)
    for text, source in zip(texts_cut, sources):
        assert text in [texts[int(source[1:])][start:end] for start, end in split_sentences(texts[int(source[1:])])]
    for vector, source in zip(vectors, sources):
        text = texts[int(source[1:])]
        sentences = [text[start:end] for start, end in split_sentences(text)]
        assert np.abs(encoder.encode(sentences, kind="query") - vector).max(axis=1).min() < 1e-5  # one of them


def _word_pairs(n: int) -> list[str]:
    """Chunks of two words: too short to cut a pseudo-query from."""
    words = [w.lower() for w in GLOVE_WORDS if w.isalpha()]
    return [" ".join(pair) for pair in np.random.default_rng(7).choice(words, (n, 2))]


@pytest.mark.parametrize(("texts", "source"), [(_texts(3000, seed=6), "pseudo-queries"), (_word_pairs(3000), "stored vectors")])
def test_a_collection_index_calibrates_on_pseudo_queries_where_its_chunks_give_them(
    texts, source, tmp_path, monkeypatch, encoder
) -> None:
    monkeypatch.setattr(index_plan, "EXACT_BELOW", 1000)
    with Collection.create(f"faiss:{tmp_path / 's'}", encoder) as collection:
        collection.add([f"c{i}" for i in range(len(texts))], texts)
        collection.commit()
        info = collection.store.index_info()
    assert not info["index_exact"] and info["calibrated_on"] == source
