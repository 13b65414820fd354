"""A LlamaIndex ingestion pipeline into an isotrope store, run again as documents change.

``IngestionPipeline([SentenceSplitter(), IsotropeEmbedding], vector_store=IsotropeVectorStore,
docstore=SimpleDocumentStore())``: the docstore remembers each document's hash, so a second run
over the same documents writes nothing and a changed document's chunks replace its old ones.

    python examples/llama_index_pipeline.py          # all-MiniLM-L6-v2, LanceDB store in a temp dir
    python examples/llama_index_pipeline.py --model MODEL --store faiss
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from llama_index.core import Document, VectorStoreIndex
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.storage.docstore import SimpleDocumentStore

from isotrope.connectors.llama_index import IsotropeEmbedding, IsotropeVectorStore

DOCS = {
    "hiking": "Carry more water than you think you need. Start early to avoid afternoon storms in the mountains.",
    "cycling": "Check tyre pressure before every ride. A chain needs oil every few hundred kilometres.",
    "swimming": "Breathe every third stroke to balance your freestyle. Warm up with easy lengths first.",
}


def documents() -> list[Document]:
    return [Document(text=text, id_=name, metadata={"sport": name}) for name, text in DOCS.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.environ.get("ISOTROPE_EXAMPLE_MODEL", "all-MiniLM-L6-v2"))
    parser.add_argument("--store", choices=["faiss", "lancedb"], default="lancedb")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        embedding = IsotropeEmbedding.from_nodes(documents(), Path(tmp) / "encoder", model=args.model, shape="center")
        store = IsotropeVectorStore(f"{args.store}:{tmp}/store", embed_model=embedding)
        pipeline = IngestionPipeline(
            transformations=[SentenceSplitter(chunk_size=64, chunk_overlap=0), embedding],
            vector_store=store,
            docstore=SimpleDocumentStore(),
        )
        print(f"first run: {len(pipeline.run(documents=documents()))} chunks written")
        print(f"second run, same documents: {len(pipeline.run(documents=documents()))} chunks written")
        DOCS["cycling"] = "Clean the chain with degreaser, then oil it lightly. Brakes wear faster in the rain."
        print(f"third run, cycling changed: {len(pipeline.run(documents=documents()))} chunks written")

        index = VectorStoreIndex.from_vector_store(store, embed_model=store.embed_model)
        for hit in index.as_retriever(similarity_top_k=1).retrieve("how often should I oil my bike chain?"):
            print(f"{hit.score:.3f} [{hit.node.metadata['sport']}] {hit.node.get_content()}")
        store.close()


if __name__ == "__main__":
    main()
