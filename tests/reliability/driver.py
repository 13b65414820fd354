"""A writer process for the reliability trials: prints ``ready`` once imported, then indexes or reshapes.

``python driver.py index SOURCE STORE MODEL`` / ``python driver.py reshape STORE SHAPE``. Small
batches and frequent commits give a kill many different places to land.
"""

from __future__ import annotations

import sys

from isotrope.config import EncoderConfig
from isotrope.ingest.pipeline import index_documents
from isotrope.reshape import reshape_store

if __name__ == "__main__":
    command, *args = sys.argv[1:]
    print("ready", flush=True)
    if command == "index":
        source, store, model = args
        index_documents(
            source, store, config=EncoderConfig(model=model, shape="center"), batch_size=16, commit_every=32, show_progress=False
        )
    elif command == "reshape":
        store, shape = args
        reshape_store(store, shape, batch_size=64)
    else:
        sys.exit(f"unknown command {command!r}")
    print("done", flush=True)
