"""Retrieval-augmented generation in LlamaIndex with an isotrope encoder and store.

``IsotropeEmbedding`` (an encoder shaped on the folder's own chunks) embeds, ``IsotropeVectorStore``
keeps the vectors, the texts and the encoder; a retriever and a query engine read it back.
The query engine uses LlamaIndex's ``MockLLM``, which runs offline and answers with the prompt it
was given, so what you see is exactly the context a real LLM would receive: swap in any LLM.

    python examples/llama_index_rag.py                 # a small sample folder, written to a temp dir
    python examples/llama_index_rag.py DOCS --store faiss:./rag-store "my question" ...
"""

from __future__ import annotations

import argparse
import tempfile
import textwrap
import time
from pathlib import Path

from llama_index.core import SimpleDirectoryReader, StorageContext, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.vector_stores import MetadataFilter, MetadataFilters

from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore

SAMPLE = {
    "bread.md": "# Bread\n\nMix flour, water, salt and yeast, then knead the dough for ten minutes. Let it rise in a "
    "warm place for one to two hours, until it has doubled. Bake at 230 degrees for thirty-five minutes; "
    "the crust should sound hollow when tapped.",
    "kyoto.md": "# Two days in Kyoto\n\nThe Shinkansen from Tokyo reaches Kyoto in just over two hours. Visit "
    "Fushimi Inari at sunrise, before the crowds, and walk through Gion in the evening.",
    "tomatoes.md": "# Growing tomatoes\n\nTomato plants need six to eight hours of sun a day. Water them deeply twice "
    "a week and tie the stems to a stake as they grow.",
    "fjords.md": "# The Norwegian fjords\n\nThe coastal ferry stops at small harbours between Bergen and Kirkenes. "
    "In summer the sun never sets above the Arctic Circle.",
    "batteries.md": "# Looking after batteries\n\nLithium-ion batteries age fastest when kept full and hot. Store them "
    "half charged in a cool place and avoid draining them to zero.",
}
QUESTIONS = [
    "How long should bread dough rise?",
    "How do I get from Tokyo to Kyoto?",
    "How can I make my phone battery last longer?",
]


def show_hits(question: str, hits) -> None:
    print(f"\nQ: {question}")
    for rank, hit in enumerate(hits, start=1):
        text = " ".join(hit.node.get_content().split())
        print(f"  {rank}. {hit.score:.3f}  {hit.node.metadata.get('file_name')}: {text[:90]}")


def build(folder: Path, uri: str, workdir: Path) -> VectorStoreIndex:
    """Chunk the folder, fit the encoder on the chunks, embed and store them."""
    tick = time.perf_counter()
    documents = SimpleDirectoryReader(str(folder), recursive=True).load_data()
    nodes = SentenceSplitter(chunk_size=128, chunk_overlap=16).get_nodes_from_documents(documents)
    embed_model = IsotropeEmbedding.from_nodes(nodes, workdir / "encoder", model="all-MiniLM-L6-v2", shape="center")
    store = IsotropeVectorStore(uri, embed_model=embed_model)
    index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed_model)
    print(
        f"indexed {len(documents)} documents as {len(nodes)} chunks into {uri} in {time.perf_counter() - tick:.1f}s "
        f"(encoder {embed_model.model_name}, fingerprint {embed_model.fingerprint[:12]})"
    )
    return index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", type=Path, help="documents to index (default: a small sample)")
    parser.add_argument("questions", nargs="*", default=QUESTIONS)
    parser.add_argument("--store", help="faiss:DIR or lancedb:DIR (default: lancedb in a temp dir); reused if it exists")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        folder = args.folder
        if folder is None:
            folder = workdir / "docs"
            folder.mkdir()
            for name, text in SAMPLE.items():
                (folder / name).write_text(text + "\n", encoding="utf-8")
        uri = args.store or f"lancedb:{workdir / 'store'}"

        if IsotropeVectorStore.exists(uri):  # a second run: the store brings its own encoder
            store = IsotropeVectorStore(uri)
            index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
            print(f"reusing {uri} (encoder {store.embed_model.model_name})")
        else:
            index = build(folder, uri, workdir)

        retriever = index.as_retriever(similarity_top_k=3)
        for question in args.questions:
            show_hits(question, retriever.retrieve(question))

        if args.folder is None:  # metadata filters go to the store (file_name is SimpleDirectoryReader's)
            only = MetadataFilters(filters=[MetadataFilter(key="file_name", value="tomatoes.md")])
            show_hits(
                "How often should I water?  [file_name == tomatoes.md]",
                index.as_retriever(similarity_top_k=2, filters=only).retrieve("How often should I water?"),
            )

        engine = index.as_query_engine(llm=MockLLM(), similarity_top_k=2)
        question = args.questions[0]
        response = engine.query(question)
        print(f"\nQuery engine, Q: {question}\nretrieved context:")
        for source in response.source_nodes:
            print(
                f"  [{source.score:.3f}] {source.node.metadata.get('file_name')}: {' '.join(source.node.get_content().split())}"
            )
        print("MockLLM answer (it echoes its prompt):")
        print(textwrap.indent(textwrap.shorten(str(response), 600), "  "))

        # reopen the store as a later process would: no embedding model to remember
        index.vector_store.close()
        store = IsotropeVectorStore(uri)
        again = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
        hits = again.as_retriever(similarity_top_k=1).retrieve(question)
        print(f"\nreopened {uri}: top hit for {question!r} is {hits[0].node.metadata.get('file_name')} ({hits[0].score:.3f})")
        store.close()


if __name__ == "__main__":
    main()
