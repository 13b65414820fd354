"""The LangChain adapters: langchain-tests' standard suites unmodified, then behaviour against references.

References: ``ShapedEncoder.encode`` for vectors, NumPy float64 brute force for scores, a Python
predicate over the documents' metadata for filters, ``Collection.search`` for the hybrid and lexical modes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")
pytest.importorskip("faiss")
pytest.importorskip("lancedb")

from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, VectorStoreIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests

from conftest import make_sentences
from isotrope.backbones import make_backbone
from isotrope.connectors.langchain import JSON_KEY, IsotropeEmbeddings, IsotropeVectorStore, to_where
from isotrope.encoder import ShapedEncoder
from isotrope.errors import EncoderMismatchError, NotFittedError
from isotrope.search import Collection
from isotrope.stores.filters import matches
from isotrope.transforms import TRANSFORMS


@pytest.fixture(scope="module")
def encoder_dir(tiny_bert_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fitted tiny encoder (mean removal + unit length) saved in a folder."""
    path = tmp_path_factory.mktemp("langchain") / "encoder"
    ShapedEncoder.create(tiny_bert_path, shape="center,l2", device="cpu").fit(make_sentences(64, seed=5)).save(path)
    return str(path)


@pytest.fixture(scope="module")
def embeddings(encoder_dir: str) -> IsotropeEmbeddings:
    return IsotropeEmbeddings(encoder=encoder_dir, device="cpu")


# --------------------------------------------------------------------------- the standard suites


class _EncoderParams:
    """The standard embeddings suites build ``IsotropeEmbeddings(encoder=<the fixture's folder>)``."""

    encoder_path = ""

    @pytest.fixture(autouse=True)
    def _encoder_folder(self, encoder_dir: str) -> None:
        self.encoder_path = encoder_dir

    @property
    def embeddings_class(self) -> type[IsotropeEmbeddings]:
        return IsotropeEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"encoder": self.encoder_path, "device": "cpu"}


class TestEmbeddingsUnit(_EncoderParams, EmbeddingsUnitTests):
    pass


class TestEmbeddingsIntegration(_EncoderParams, EmbeddingsIntegrationTests):
    pass


class _StoreSuite(VectorStoreIntegrationTests):
    """Each test gets a new, empty store. The suite's default ``get_embeddings()`` (a fake, random
    embedding) cannot be kept beside the vectors, so the store is built with the tiny isotrope encoder
    (the suite only needs identical texts to be nearest, which any encoder gives)."""

    kind = ""

    @pytest.fixture
    def vectorstore(self, embeddings: IsotropeEmbeddings, tmp_path: Path) -> Iterator[IsotropeVectorStore]:
        store = IsotropeVectorStore(f"{self.kind}:{tmp_path / 'store'}", embeddings)
        yield store
        store.close()


class TestFaissVectorStore(_StoreSuite):
    kind = "faiss"


class TestLanceDBVectorStore(_StoreSuite):
    kind = "lancedb"


# --------------------------------------------------------------------------- embeddings


def test_embeddings_equal_the_encoder_with_queries_and_documents_apart(tiny_bert_path: str) -> None:
    backbone = make_backbone({"type": "hf", "model": tiny_bert_path, "query_prefix": "query: ", "device": "cpu"})
    encoder = ShapedEncoder(backbone, "mean", transforms=[TRANSFORMS["center"]()]).fit(make_sentences(40, seed=3))
    texts = make_sentences(12, seed=1)
    embeddings = IsotropeEmbeddings(encoder)
    documents = np.asarray(embeddings.embed_documents(texts), dtype=np.float32)
    assert np.array_equal(documents, encoder.encode(texts, kind="document"))
    query = np.asarray(embeddings.embed_query(texts[0]), dtype=np.float32)
    assert np.array_equal(query, encoder.encode(texts[:1], kind="query")[0])
    assert not np.allclose(query, documents[0], atol=1e-3)  # the query prefix applies to queries only


def test_fit_saves_the_encoder_fitted_on_the_texts(tiny_bert_path: str, tmp_path: Path) -> None:
    texts = make_sentences(30, seed=4)
    fitted = IsotropeEmbeddings.fit(texts, tmp_path / "enc", model=tiny_bert_path, shape="center", device="cpu")
    reference = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(texts)
    assert fitted.fingerprint == reference.fingerprint == IsotropeEmbeddings(encoder=tmp_path / "enc").fingerprint
    assert np.array_equal(np.asarray(fitted.embed_documents(texts[:3]), dtype=np.float32), reference.encode(texts[:3]))


def test_a_recipe_needing_no_corpus_embeds_and_one_needing_fit_is_refused(tiny_bert_path: str) -> None:
    plain = IsotropeEmbeddings(model=tiny_bert_path, shape="l2", device="cpu")
    vector = np.asarray(plain.embed_query("the cat runs"), dtype=np.float64)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
    with pytest.raises(NotFittedError, match="needs fitting"):
        IsotropeEmbeddings(model=tiny_bert_path, shape="center", device="cpu")
    with pytest.raises(ValueError, match="either encoder"):
        IsotropeEmbeddings()


# --------------------------------------------------------------------------- the store

DOCS = make_sentences(24, seed=11)


def documents() -> list[Document]:
    """Documents with scalar metadata (some lack ``year``) and one list value each."""
    out = []
    for i, text in enumerate(DOCS):
        metadata = {"lang": ["en", "fr", "de"][i % 3], "n": i, "tags": ["t", str(i % 2)]}
        if i % 4:
            metadata["year"] = 2018 + i % 5
        out.append(Document(id=f"d{i}", page_content=text, metadata=metadata))
    return out


@pytest.fixture(params=["faiss", "lancedb"])
def filled(request: pytest.FixtureRequest, embeddings: IsotropeEmbeddings, tmp_path: Path) -> Iterator[IsotropeVectorStore]:
    store = IsotropeVectorStore.from_documents(documents(), embeddings, uri=f"{request.param}:{tmp_path / 'store'}")
    yield store
    store.close()


def brute_force(encoder: ShapedEncoder, query: str, keep: list[int], k: int) -> list[str]:
    vectors = encoder.encode(DOCS, kind="document").astype(np.float64)
    scores = vectors[keep] @ encoder.encode([query], kind="query")[0].astype(np.float64)
    return [f"d{keep[i]}" for i in np.argsort(-scores, kind="stable")[:k]]


def test_similarity_search_with_score_matches_brute_force(filled: IsotropeVectorStore, embeddings: IsotropeEmbeddings) -> None:
    query = "the happy dog runs in the rain"
    results = filled.similarity_search_with_score(query, k=5)
    assert [document.id for document, _ in results] == brute_force(embeddings.encoder, query, list(range(len(DOCS))), 5)
    vectors = embeddings.encoder.encode(DOCS, kind="document").astype(np.float64)
    query_vector = embeddings.encoder.encode([query], kind="query")[0].astype(np.float64)
    for document, score in results:
        assert score == pytest.approx(vectors[int(document.id[1:])] @ query_vector, abs=1e-5)
    by_vector = filled.similarity_search_by_vector(embeddings.embed_query(query), k=5)
    assert [document.id for document in by_vector] == [document.id for document, _ in results]


@pytest.mark.parametrize(
    "filter",
    [
        {"lang": "fr"},
        {"year": {"$gte": 2020}, "lang": {"$in": ["en", "de"]}},
        {"$or": [{"lang": "de"}, {"n": {"$lt": 3}}]},
        {"year": {"$ne": 2019}},
        {"n": {"$between": [4, 9]}},
    ],
)
def test_filters_keep_exactly_the_matching_documents(
    filter: dict, filled: IsotropeVectorStore, embeddings: IsotropeEmbeddings
) -> None:
    where = to_where(filter)
    keep = [i for i, document in enumerate(documents()) if matches(document.metadata, where)]
    assert keep and len(keep) < len(DOCS)
    got = filled.similarity_search("a small bird sees the moon", k=len(DOCS), filter=filter)
    assert [document.id for document in got] == brute_force(embeddings.encoder, "a small bird sees the moon", keep, len(DOCS))


def test_unsupported_filter_operator_is_named() -> None:
    with pytest.raises(ValueError, match=r"'\$like' is not supported"):
        to_where({"lang": {"$like": "e%"}})


def test_metadata_round_trips_lists_included_and_lists_are_not_filterable(filled: IsotropeVectorStore) -> None:
    expected = {document.id: document for document in documents()}
    got = filled.get_by_ids(["d3", "missing", "d0"])
    assert sorted(got, key=lambda d: d.id or "") == [expected["d0"], expected["d3"]]
    assert JSON_KEY in filled.run(lambda collection: collection.get(["d0"]))[0].metadata  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="reserved"):
        filled.add_texts(["x"], [{JSON_KEY: "y"}])


def test_retriever_reaches_hybrid_and_lexical_search(filled: IsotropeVectorStore) -> None:
    query = "cats like music and snow"
    for mode, alpha in (("hybrid", 0.4), ("lexical", None)):
        kwargs = {"k": 6, "mode": mode, **({"alpha": alpha} if alpha is not None else {})}
        retrieved = filled.as_retriever(search_kwargs=kwargs).invoke(query)
        reference = filled.run(lambda collection: collection.search(query, k=6, mode=mode, alpha=alpha))  # noqa: B023
        assert [document.id for document in retrieved] == [hit.id for hit in reference]  # type: ignore[union-attr]


def test_delete_by_filter_and_ids(filled: IsotropeVectorStore) -> None:
    filled.delete(filter={"lang": "fr"})
    left = {document.id for document in filled.similarity_search("the cat", k=len(DOCS))}
    assert left == {f"d{i}" for i in range(len(DOCS)) if i % 3 != 1}
    filled.delete(["d0", "d3"], filter={"lang": "en"})  # both: d0 and d3 are en
    assert not filled.get_by_ids(["d0", "d3"])
    with pytest.raises(ValueError, match="needs ids or a filter"):
        filled.delete()


def test_reopened_store_answers_alike_and_refuses_another_encoder(
    embeddings: IsotropeEmbeddings, tiny_bert_path: str, tmp_path: Path
) -> None:
    uri = f"faiss:{tmp_path / 'store'}"
    with IsotropeVectorStore.from_texts(DOCS, embeddings, uri=uri) as store:
        before = store.similarity_search_with_score("the red car", k=4)
    with IsotropeVectorStore(uri) as reopened:  # the store's own encoder, no embedding given
        assert reopened.similarity_search_with_score("the red car", k=4) == before
    other = IsotropeEmbeddings(model=tiny_bert_path, shape="l2", device="cpu")
    with pytest.raises(EncoderMismatchError):
        IsotropeVectorStore(uri, other)


def test_an_embedding_that_is_not_an_isotrope_encoder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pass an IsotropeEmbeddings, not DeterministicFakeEmbedding"):
        IsotropeVectorStore(f"faiss:{tmp_path / 'store'}", DeterministicFakeEmbedding(size=6))
    assert not Collection.exists(f"faiss:{tmp_path / 'store'}")


def test_relevance_scores_map_cosine_onto_zero_one(filled: IsotropeVectorStore) -> None:
    query = "the old house by the river"
    scored = filled.similarity_search_with_score(query, k=5)
    relevance = filled.similarity_search_with_relevance_scores(query, k=5)
    assert [d.id for d, _ in relevance] == [d.id for d, _ in scored]
    assert [r for _, r in relevance] == pytest.approx([(1 + s) / 2 for _, s in scored])
    kept = filled.as_retriever(search_type="similarity_score_threshold", search_kwargs={"score_threshold": 0.5, "k": 24})
    assert {d.id for d in kept.invoke(query)} == {d.id for d, s in filled.similarity_search_with_score(query, k=24) if s >= 0}


def test_a_store_written_by_isotrope_index_is_read_as_documents(embeddings: IsotropeEmbeddings, tmp_path: Path) -> None:
    uri = f"lancedb:{tmp_path / 'store'}"
    rows = [{"source": f"file{i % 3}.txt", "chunk": i} for i in range(len(DOCS))]
    with Collection.create(uri, embeddings.encoder) as collection:  # as `isotrope index` writes: plain rows
        collection.add([f"c{i}" for i in range(len(DOCS))], DOCS, rows)
        expected = collection.search("a green tree in the city", k=5)
    with IsotropeVectorStore(uri) as store:
        got = store.similarity_search_with_score("a green tree in the city", k=5)
    assert [(d.id, d.page_content, d.metadata, s) for d, s in got] == [(h.id, h.text, h.metadata, h.score) for h in expected]
