"""isotrope quickstart: index a folder, then search it with the encoder that wrote the store.

The Python equivalent of::

    isotrope index DOCS --store lancedb:STORE --shape center
    isotrope search lancedb:STORE "how long should bread dough rise" --where "topic = 'cooking'"

Runs offline with the packaged all-MiniLM-L6-v2 on a small folder it writes to a temporary
directory: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from isotrope import Collection, EncoderConfig, ShapedEncoder, index_documents

DOCUMENTS = {
    "cooking/bread.md": """# Bread

Mix flour, water, salt and yeast, then knead the dough for ten minutes until it is smooth.
Let the dough rise in a warm place for one to two hours, until it has doubled in size.

Shape the loaf, let it proof for another forty minutes and bake it at 230 degrees for about
thirty-five minutes. The crust should sound hollow when you tap the bottom.
""",
    "cooking/soup.md": """# Tomato soup

Soften an onion and two cloves of garlic in olive oil. Add a kilo of ripe tomatoes,
a little stock and simmer for twenty minutes. Blend until smooth and season with salt and pepper.
""",
    "travel/kyoto.md": """# Two days in Kyoto

Take the early train from Tokyo: the Shinkansen reaches Kyoto in just over two hours.
Visit Fushimi Inari at sunrise, before the crowds, and walk up through the red torii gates.

In the evening, wander through Gion and look for the wooden teahouses along the canal.
""",
    "travel/norway.md": """# The Norwegian fjords

The coastal ferry stops at dozens of small harbours between Bergen and Kirkenes.
Book a cabin in summer, when the sun never sets above the Arctic Circle.
""",
    "garden/tomatoes.txt": """Tomato plants need six to eight hours of sun a day.
Water them deeply twice a week rather than a little every day, and tie the stems to a stake as they grow.
Pick the fruit when it is fully coloured and slightly soft.
""",
}
NOTES = [  # a JSON lines file: "text" is indexed, the other fields become filterable metadata
    {
        "text": "Sourdough needs a longer rise than yeasted bread, often overnight in the fridge.",
        "topic": "cooking",
        "year": 2024,
    },
    {"text": "The night bus from Kyoto to Tokyo is cheap but you will not sleep much.", "topic": "travel", "year": 2023},
    {"text": "Slugs love young lettuce; a ring of copper tape keeps them off.", "topic": "garden", "year": 2022},
]


def write_folder(root: Path) -> Path:
    for name, text in DOCUMENTS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (root / "notes.jsonl").write_text("\n".join(json.dumps(note) for note in NOTES) + "\n", encoding="utf-8")
    return root


def show(title: str, hits) -> None:
    print(f"\n{title}")
    for rank, hit in enumerate(hits, start=1):
        where = hit.metadata["source"] + (f" ({hit.metadata['topic']})" if "topic" in hit.metadata else "")
        print(f"  {rank}. {hit.score:.3f}  {where}: {' '.join(hit.text.split())[:90]}")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        docs = write_folder(Path(tmp) / "docs")

        # 1. index into LanceDB; index_documents builds the encoder and fits its shaping on the chunks
        tick = time.perf_counter()
        report = index_documents(
            docs,
            f"lancedb:{tmp}/lance",
            config=EncoderConfig(model="all-MiniLM-L6-v2", shape="center"),
            chunk_tokens=64,
            overlap_tokens=16,
            show_progress=False,
        )
        print(f"lancedb: {report.summary()} in {time.perf_counter() - tick:.1f}s")

        # 2. open the store: its own encoder (fingerprint-checked) encodes the queries
        with Collection.open(f"lancedb:{tmp}/lance") as collection:
            info = collection.info()
            print(
                f"encoder {info['model']}, shape {info['shape']}, {info['chunks']} chunks, fingerprint {info['fingerprint'][:12]}"
            )
            show("Q: how long should bread dough rise", collection.search("how long should bread dough rise", k=3))
            show(
                "Q: how do I get to Kyoto  [where topic = 'travel']",
                collection.search("how do I get to Kyoto", k=2, where="topic = 'travel'"),
            )
            show(
                "Q: how often should I water  [where source = 'garden/tomatoes.txt']",
                collection.search("how often should I water", k=2, where={"source": "garden/tomatoes.txt"}),
            )

        # 3. the same with FAISS and an encoder fitted beforehand (e.g. on a larger, general corpus)
        encoder = ShapedEncoder.create("all-MiniLM-L6-v2", shape="center").fit(DOCUMENTS.values())
        report = index_documents(
            docs, f"faiss:{tmp}/faiss", encoder=encoder, chunk_tokens=64, overlap_tokens=16, show_progress=False
        )
        print(f"\nfaiss: {report.summary()}")
        with Collection.open(f"faiss:{tmp}/faiss") as collection:
            show("Q: a ferry trip in the far north", collection.search("a ferry trip in the far north", k=2))

        # 4. re-running is incremental: unchanged chunks are skipped
        report = index_documents(docs, f"faiss:{tmp}/faiss", chunk_tokens=64, overlap_tokens=16, show_progress=False)
        print(f"\nsecond run: {report.added} added, {report.unchanged} unchanged")


if __name__ == "__main__":
    main()
