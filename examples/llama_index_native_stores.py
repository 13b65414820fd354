"""``IsotropeEmbedding`` with LlamaIndex's own FAISS and LanceDB vector stores.

Any LlamaIndex vector store can hold isotrope vectors: the embedding model is a folder
(``isotrope.json`` + ``state.safetensors``) that you keep beside the index and reload with
``IsotropeEmbedding(folder)`` — its fingerprint says which shaping wrote the vectors. (With
``IsotropeVectorStore`` the store keeps the encoder for you and refuses any other.)

    python examples/llama_index_native_stores.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import faiss
from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.node_parser import SentenceSplitter
from llama_index.vector_stores.faiss import FaissVectorStore
from llama_index.vector_stores.lancedb import LanceDBVectorStore

from isotrope.connectors.llama_index import IsotropeEmbedding

DOCUMENTS = [
    "Mix flour, water, salt and yeast, then knead the dough and let it rise for one to two hours.",
    "The Shinkansen from Tokyo reaches Kyoto in just over two hours; visit Fushimi Inari at sunrise.",
    "Tomato plants need six to eight hours of sun a day; water them deeply twice a week.",
    "The coastal ferry stops at small harbours between Bergen and Kirkenes, far above the Arctic Circle.",
    "Lithium-ion batteries age fastest when kept full and hot; store them half charged in a cool place.",
]
QUESTIONS = ["how long does dough need to rise", "a boat trip in northern Norway"]


def show(name: str, index: VectorStoreIndex) -> None:
    retriever = index.as_retriever(similarity_top_k=2)
    for question in QUESTIONS:
        hits = retriever.retrieve(question)
        print(f"  [{name}] {question!r}: " + "; ".join(f"{h.score:.3f} {h.node.get_content()[:40]}..." for h in hits))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        documents = [Document(text=text) for text in DOCUMENTS]
        nodes = SentenceSplitter(chunk_size=128, chunk_overlap=16).get_nodes_from_documents(documents)
        # fit a shaping (centering, then L2) on the chunks and keep it in a folder
        embed_model = IsotropeEmbedding.from_nodes(nodes, work / "encoder", model="all-MiniLM-L6-v2", shape="center")
        dim = len(embed_model.get_query_embedding("probe"))
        print(f"encoder {embed_model.model_name}, {dim}-d, fingerprint {embed_model.fingerprint[:12]}")

        # LlamaIndex's FAISS store: vectors are unit length, so an inner-product index ranks by cosine
        faiss_store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(dim))
        context = StorageContext.from_defaults(vector_store=faiss_store)
        faiss_index = VectorStoreIndex(nodes, storage_context=context, embed_model=embed_model)
        show("faiss", faiss_index)
        context.persist(persist_dir=str(work / "faiss"))

        # reload later: the index from its folder, the embedding from its own folder
        reloaded = load_index_from_storage(
            StorageContext.from_defaults(
                vector_store=FaissVectorStore.from_persist_dir(str(work / "faiss")), persist_dir=str(work / "faiss")
            ),
            embed_model=IsotropeEmbedding(work / "encoder"),
        )
        show("faiss, reloaded", reloaded)

        # LlamaIndex's LanceDB store (its scores are exp(-distance), the order is the same)
        lance_store = LanceDBVectorStore(uri=str(work / "lancedb"), table_name="chunks", mode="overwrite")
        lance_index = VectorStoreIndex(
            nodes, storage_context=StorageContext.from_defaults(vector_store=lance_store), embed_model=embed_model
        )
        show("lancedb", lance_index)


if __name__ == "__main__":
    main()
