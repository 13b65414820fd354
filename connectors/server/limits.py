"""What one client may ask of ``isotrope serve``: the limits, their defaults, and the ASGI middleware
that holds the ones a route cannot (body size, a body sent too slowly, requests in flight).

Each limit answers with a one-line ``{"detail": ...}`` naming the limit and the flag that sets it:
413 for a body over ``max_body_bytes``, 408 for a body not received within ``client_timeout``
seconds, 503 with ``Retry-After`` when ``max_in_flight`` requests are already being answered.
Query length and batch size are part of the request schema (422); the per-request time limit
is applied around the search (504, :mod:`isotrope.connectors.server`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

#: routes that never touch the store: never refused for load
UNLIMITED_PATHS = ("/healthz",)


@dataclass(frozen=True)
class ServerLimits:
    """The limits of one server; every field has a CLI flag of the same name (``--max-body-bytes``...)."""

    max_body_bytes: int = 1_048_576  #: a request body larger than this is refused (413)
    max_query_chars: int = 10_000  #: characters of one query or text (422)
    max_queries: int = 256  #: query texts of /search/batch, texts of /embed (422)
    request_timeout: float = 30.0  #: seconds a search or embedding may take before the client gets 504
    max_in_flight: int = 64  #: API requests answered at once; more get 503 with Retry-After
    client_timeout: float = 10.0  #: seconds to send a request body, and an idle keep-alive connection lives

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_query_chars", "max_queries", "max_in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; got {getattr(self, name)}")
        for name in ("request_timeout", "client_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds; got {getattr(self, name)}")


async def send_error(send: Any, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    """A one-line JSON error answered straight from the ASGI layer."""
    body = json.dumps({"detail": detail}).encode()
    extra = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra],
        }
    )
    await send({"type": "http.response.body", "body": body})


class LimitRequests:
    """ASGI middleware: refuses a body over ``max_body_bytes`` (by its Content-Length, or as it
    streams in), a body that takes longer than ``client_timeout`` to arrive, and requests beyond
    ``max_in_flight`` at once (503, ``Retry-After: 1``)."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits
        self.in_flight = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Answer a request over a limit here; pass the others on with their body read whole."""
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        limits = self.limits
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            await send_error(send, 413, f"request body over {limits.max_body_bytes} bytes (--max-body-bytes)")
            return
        if self.in_flight >= limits.max_in_flight:
            await send_error(
                send, 503, f"server busy: {limits.max_in_flight} requests in flight (--max-in-flight)", {"Retry-After": "1"}
            )
            return
        self.in_flight += 1
        try:
            body = await self._read_body(receive, send)
            if body is not None:
                await self.app(scope, _replay(body, receive), send)
        finally:
            self.in_flight -= 1

    async def _read_body(self, receive: Any, send: Any) -> bytes | None:
        """The whole request body, or None once a 413 or 408 has been answered."""
        limits = self.limits
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            try:
                message = await asyncio.wait_for(receive(), timeout=limits.client_timeout)
            except asyncio.TimeoutError:
                await send_error(send, 408, f"request body not received within {limits.client_timeout:g} s (--client-timeout)")
                return None
            if message["type"] != "http.request":  # the client went away
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limits.max_body_bytes:
                await send_error(send, 413, f"request body over {limits.max_body_bytes} bytes (--max-body-bytes)")
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` giving ``body`` as one message, then whatever ``receive`` gives (disconnects)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
