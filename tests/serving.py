"""Helpers shared by the server tests: a small store with known contents, and a live uvicorn server.

``build_store(uri, encoder)`` indexes ``DOCUMENTS`` (one chunk each) into ``uri``;
``live_server(app)`` runs an app on a free 127.0.0.1 port in a thread and yields its URL.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conftest import make_sentences
from isotrope.encoder import ShapedEncoder
from isotrope.ingest.loaders import Document
from isotrope.ingest.pipeline import index_documents

SOURCES = ("a.md", "b.md", "c.txt")
#: 60 one-sentence documents over three sources, with a year in their metadata
DOCUMENTS = [
    Document(source=SOURCES[i % 3], text=text, metadata={"year": 2000 + i % 7}, position=i)
    for i, text in enumerate(make_sentences(60, seed=11))
]


def build_store(uri: str, encoder: ShapedEncoder) -> None:
    index_documents(DOCUMENTS, uri, encoder=encoder, chunk_tokens=0, show_progress=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def live_server(app: Any, timeout: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a daemon thread; stopped on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            server.should_exit = True
            raise RuntimeError(f"uvicorn did not start on port {port} within {timeout}s")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)
