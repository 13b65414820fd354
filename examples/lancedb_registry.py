"""A plain LanceDB table that embeds with an isotrope encoder, through LanceDB's embedding registry.

Importing ``isotrope.connectors.lancedb_registry`` registers ``"isotrope"``; after the one
``create`` call everything is LanceDB's own API: the table embeds texts on ``add`` (as documents)
and on ``search`` (as queries), and records the encoder's fingerprint in its schema.

    python examples/lancedb_registry.py            # all-MiniLM-L6-v2 shaped on the texts below
    python examples/lancedb_registry.py --model MODEL
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import lancedb
from lancedb.embeddings import get_registry
from lancedb.pydantic import LanceModel, Vector

import isotrope.connectors.lancedb_registry  # noqa: F401  registers "isotrope" in LanceDB's registry
from isotrope.connectors.encoders import fit_encoder

TEXTS = {
    "Espresso is brewed by forcing hot water through finely ground coffee at high pressure.": "coffee",
    "A French press steeps coarse grounds for four minutes before the plunger is pressed.": "coffee",
    "Green tea should steep at about 80 degrees; boiling water makes it bitter.": "tea",
    "Chai simmers black tea with milk, ginger, cardamom and cinnamon.": "tea",
    "Cold brew steeps coffee in cold water for twelve to eighteen hours.": "coffee",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.environ.get("ISOTROPE_EXAMPLE_MODEL", "all-MiniLM-L6-v2"))
    parser.add_argument("--question", default="how long does cold brew coffee steep?")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        fit_encoder(TEXTS, Path(tmp) / "encoder", model=args.model, shape="center")  # or any `isotrope fit` folder
        func = get_registry().get("isotrope").create(encoder=f"{tmp}/encoder")

        class Passage(LanceModel):
            text: str = func.SourceField()
            vector: Vector(func.ndims()) = func.VectorField()  # type: ignore[valid-type]
            drink: str

        table = lancedb.connect(f"{tmp}/db").create_table("passages", schema=Passage)
        table.add([{"text": text, "drink": drink} for text, drink in TEXTS.items()])  # embedded here
        for hit in table.search(args.question).metric("cosine").limit(2).to_list():  # the question embedded as a query
            print(f"{1 - hit['_distance']:.3f}  [{hit['drink']}] {hit['text']}")
        tea = table.search("what temperature?").where("drink = 'tea'").metric("cosine").limit(1).to_list()
        print("tea only:", tea[0]["text"])

        recorded = json.loads(table.schema.metadata[b"embedding_functions"])[0]["model"]
        print(f"the table records encoder {recorded['fingerprint'][:12]} ({recorded['encoder']})")


if __name__ == "__main__":
    main()
