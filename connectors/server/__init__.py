"""``isotrope serve``: a FastAPI app over one collection, its search page and its shaping report.

The store and its encoder are opened once, before the server starts, in one worker thread
that then runs every search (a FAISS store's SQLite connection lives in the thread that opened
it, a tokenizer is not shared safely between threads, and the work is CPU-bound anyway); the
event loop only parses, validates and answers. Concurrent searches are batched
(:mod:`.batching`): those that arrive while the worker is busy are encoded and searched together
when it is free. Bad input is a 4xx answer with a one-line ``detail``; any other failure is a 500
whose body names the error type, never a traceback (that goes to the log). The API docs at
``/docs`` and ``/redoc`` load their scripts from the server (fastapi-offline), not from a CDN.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field

from isotrope import __version__
from isotrope.connectors.server.batching import SearchBatcher
from isotrope.stores.base import Hit

try:
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the serve extra
    orjson = None  # type: ignore[assignment]  # the plain JSON response is used instead

if TYPE_CHECKING:
    from isotrope.search import Collection

logger = logging.getLogger(__name__)

MODES = ("dense", "lexical", "hybrid")
MAX_BATCH = 256
#: query texts searched together at most when concurrent requests are batched
BATCH_QUERIES = 64
STATIC_DIR = files("isotrope.connectors.server") / "static"

Where = str | dict[str, Any] | None


class SearchOptions(BaseModel):
    """What every search takes besides its query text."""

    model_config = ConfigDict(extra="forbid")
    k: int = Field(10, ge=1, le=1000, description="number of hits")
    mode: Literal["dense", "lexical", "hybrid"] = Field("dense", description="dense vectors, full-text, or both fused")
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="hybrid: weight of the dense ranking")
    where: Where = Field(None, description='metadata filter: "source = \'a.md\' and year >= 2020" or {"year": {"$gte": 2020}}')
    group_by: str | None = Field(None, min_length=1, description="metadata field: at most one hit per value")


class SearchRequest(SearchOptions):
    """One query and the search options."""

    query: str = Field(min_length=1, max_length=10_000, description="the question or keywords")


class BatchRequest(SearchOptions):
    """Several queries searched with the same options."""

    queries: list[str] = Field(min_length=1, max_length=MAX_BATCH, description="query texts")


class EmbedRequest(BaseModel):
    """Texts to encode with the store's encoder."""

    model_config = ConfigDict(extra="forbid")
    texts: list[str] = Field(min_length=1, max_length=MAX_BATCH, description="texts to encode")
    kind: Literal["query", "document"] = Field("query", description="query texts get the encoder's query prefix, if any")


class HitOut(BaseModel):
    """One hit: the stored id, its score (higher is closer), text, source file and metadata."""

    id: str
    score: float
    text: str | None
    source: str | None
    metadata: dict[str, Any]


class SearchResponse(BaseModel):
    """The hits of one query, best first."""

    query: str
    hits: list[HitOut]


class BatchResponse(BaseModel):
    """The hits of each query, in the order asked."""

    results: list[SearchResponse]


class EmbedResponse(BaseModel):
    """Vectors from the store's encoder, with its fingerprint and dimension."""

    fingerprint: str
    dim: int
    vectors: list[list[float]]


def hit_json(hit: Hit) -> dict[str, Any]:
    """The fields of ``isotrope search --json`` plus the chunk's source file."""
    return {"id": hit.id, "score": hit.score, "text": hit.text, "source": hit.metadata.get("source"), "metadata": hit.metadata}


def json_response(payload: dict[str, Any]) -> Response:
    """``payload`` (already in its response model's shape) as JSON, serialized by orjson when it is
    installed: a tenth of the time of validating it into the model and dumping that."""
    if orjson is None:
        return JSONResponse(payload)
    return Response(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")


def _field_name(location: tuple[Any, ...]) -> str:
    """``("body", "queries", 1)`` -> ``"queries.1"``: where the bad value is, without its request part."""
    parts = [str(part) for part in location]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _one_line(errors: list[dict[str, Any]]) -> str:
    return "; ".join(f"{_field_name(tuple(error.get('loc', ())))}: {error.get('msg', 'invalid')}" for error in errors)


class FormBodyAsJSON:
    """ASGI middleware reading form-encoded POST bodies as JSON: ``curl -d '{...}'`` sends that
    content type by default, and no route here takes a form."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Pass the request on, a form-encoded POST body relabelled as JSON."""
        if scope["type"] == "http" and scope["method"] == "POST":
            scope = dict(scope)
            scope["headers"] = [
                (name, b"application/json")
                if name == b"content-type" and value.startswith(b"application/x-www-form-urlencoded")
                else (name, value)
                for name, value in scope["headers"]
            ]
        await self.app(scope, receive, send)


def collection_worker() -> ThreadPoolExecutor:
    """The one thread that opens and uses a collection: a FAISS store's SQLite connection works only
    in the thread that made it, and a tokenizer is not shared safely between threads."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="isotrope-collection")


class Searcher:
    """The collection behind the app, used from its worker thread only; searches are batched."""

    def __init__(
        self, collection: Collection, worker: ThreadPoolExecutor, max_batch: int = BATCH_QUERIES, max_wait: float = 0.0
    ) -> None:
        self.collection = collection
        self.worker = worker
        self.batcher = SearchBatcher(
            lambda queries, **options: self.collection.search(queries, **options), worker, max_batch=max_batch, max_wait=max_wait
        )
        self._report: tuple[int, str] | None = None  # (sample size, page) of the last report

    async def _run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.wrap_future(self.worker.submit(function, *args, **kwargs))

    @staticmethod
    def _options(options: SearchOptions) -> dict[str, Any]:
        """Keyword arguments of ``Collection.search``."""
        keywords: dict[str, Any] = {"k": options.k, "where": options.where or None, "mode": options.mode}
        if options.alpha is not None:
            keywords["alpha"] = options.alpha
        if options.group_by is not None:
            keywords["group_by"] = options.group_by
        return keywords

    async def search(self, queries: list[str], options: SearchOptions, field: str = "query") -> list[list[Hit]]:
        """The hits of each query, batched with concurrent searches; a blank query is a 422 naming ``field``, a bad filter a 400."""
        for index, query in enumerate(queries):
            if not query.strip():
                raise HTTPException(422, f"{field if field == 'query' else f'{field}.{index}'}: is blank")
        try:
            return await self.batcher.search(queries, **self._options(options))
        except (ValueError, KeyError, TypeError) as error:  # bad filter, unknown field
            raise HTTPException(400, str(error).strip("'\"")) from None

    async def embed(self, texts: list[str], kind: str) -> Any:
        """The vectors of ``texts`` from the store's encoder, as ``kind`` (query or document) texts."""
        try:
            return await self._run(self.collection.encoder.encode, texts, kind=kind)
        except (ValueError, TypeError) as error:
            raise HTTPException(422, f"texts: {error}") from None

    async def info(self) -> dict[str, Any]:
        """``isotrope info`` of the store, with the server's version and search modes."""
        info = await self._run(self.collection.info)
        return {**info, "server": {"isotrope": __version__, "modes": list(MODES)}}

    def _render_report(self, sample: int) -> str:
        from isotrope.report import build_report, render_html

        if self._report is None or self._report[0] != sample:  # only the worker thread touches this
            self._report = (sample, render_html(build_report(self.collection, sample=sample)))
        return self._report[1]

    async def report(self, sample: int) -> str:
        """The shaping report page; the last one is kept (the store does not change while served)."""
        try:
            return await self._run(self._render_report, sample)
        except ValueError as error:
            raise HTTPException(400, str(error)) from None


def create_app(
    collection: Collection,
    api_key: str | None = None,
    worker: ThreadPoolExecutor | None = None,
    max_batch: int = BATCH_QUERIES,
    max_wait: float = 0.0,
) -> Any:
    """The FastAPI app over an open ``collection``, used from ``worker`` (the thread that opened it;
    a new one when None: fine for a LanceDB store). ``api_key`` requires ``Authorization: Bearer KEY``
    on every API route (the page, its static files, the OpenAPI docs and /healthz hold no store data).
    Concurrent searches are batched up to ``max_batch`` query texts, waiting ``max_wait`` seconds
    for company when the worker is idle (0: never)."""
    searcher = Searcher(collection, worker or collection_worker(), max_batch=max_batch, max_wait=max_wait)
    bearer = HTTPBearer(auto_error=False)

    def authorize(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if api_key is None:
            return
        if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), api_key.encode()):
            raise HTTPException(
                401, "missing or wrong bearer token (Authorization: Bearer KEY)", headers={"WWW-Authenticate": "Bearer"}
            )

    app = FastAPIOffline(
        title="isotrope",
        version=__version__,
        description=f"Search the store {collection.kind}:{collection.path} with the encoder that wrote it.",
    )
    app.state.searcher = searcher
    guarded = [Depends(authorize)]

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = [{key: value for key, value in e.items() if key in ("loc", "msg", "type")} for e in error.errors()]
        return JSONResponse({"detail": _one_line(errors), "errors": errors}, status_code=422)

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        logger.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error ({type(error).__name__}); see the server log"}, status_code=500)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info", tags=["service"], dependencies=guarded)
    async def info() -> dict[str, Any]:
        """What ``isotrope info`` prints, and the search modes this server offers."""
        return await searcher.info()

    @app.post("/search", response_model=SearchResponse, tags=["search"], dependencies=guarded)
    async def search(request: SearchRequest) -> Response:
        """The best ``k`` chunks for one query."""
        hits = (await searcher.search([request.query], request))[0]
        return json_response({"query": request.query, "hits": [hit_json(hit) for hit in hits]})

    @app.post("/search/batch", response_model=BatchResponse, tags=["search"], dependencies=guarded)
    async def search_batch(request: BatchRequest) -> Response:
        """The best ``k`` chunks for each of many queries (one encoder pass)."""
        results = await searcher.search(request.queries, request, field="queries")
        return json_response(
            {
                "results": [
                    {"query": query, "hits": [hit_json(hit) for hit in hits]} for query, hits in zip(request.queries, results)
                ]
            }
        )

    @app.post("/embed", response_model=EmbedResponse, tags=["search"], dependencies=guarded)
    async def embed(request: EmbedRequest) -> dict[str, Any]:
        """Vectors from the store's encoder, comparable with the stored ones."""
        vectors = await searcher.embed(request.texts, request.kind)
        return {"fingerprint": collection.encoder.fingerprint, "dim": int(vectors.shape[1]), "vectors": vectors.tolist()}

    @app.get("/report", response_class=HTMLResponse, tags=["report"], dependencies=guarded)
    async def report(sample: int = Query(2000, ge=10, le=20_000, description="stored vectors sampled")) -> HTMLResponse:
        """The shaping report: spectra, cosine distributions, isotropy, fit and auto-shape candidates."""
        return HTMLResponse(await searcher.report(sample))

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(str(STATIC_DIR / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
    app.add_middleware(FormBodyAsJSON)
    return app


def default_threads(model: str) -> int:
    """1 for a static table: a query is a lookup and a short index walk, and a second OpenMP thread
    spin-waits (a fast-encoder store at 100,000 chunks: p50 7 ms with 1 thread, 44 ms with 2 under 8
    clients); the physical cores for a transformer, whose batched forward pass they share (46 against
    55 ms; docs/benchmarks/serve.md)."""
    from isotrope.backbones import is_static_source
    from isotrope.backbones.onnx import physical_cores

    return 1 if is_static_source(model) else physical_cores()


def limit_threads(threads: int) -> None:
    """Cap the BLAS/OpenMP pools and torch's intra-op threads: one query is a few dozen tokens, too
    little work to share out, and on a busy machine OpenMP threads spin-wait for each other
    (all-MiniLM-L6-v2 took 3.5 s a query with 2 threads and 0.16 s with 1 on the loaded 2-core machine)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def serve(
    store: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    log_level: str = "info",
    threads: int | None = None,
    max_batch: int = BATCH_QUERIES,
    batch_wait_ms: float = 0.0,
    store_options: dict[str, Any] | None = None,
    backend: str | None = None,
) -> None:
    """Open ``store`` with its encoder (once, in the collection's worker thread, on ``backend`` when given;
    ``store_options`` such as ``nprobe`` go to the store), warm it up, and serve until interrupted; concurrent searches are
    batched (see :func:`create_app`)."""
    import uvicorn

    from isotrope.search import Collection

    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # read by ONNX Runtime sessions, which are made on open
    worker = collection_worker()
    collection = worker.submit(Collection.open, store, backend=backend, **(store_options or {})).result()
    threads = threads or default_threads(collection.encoder.config.model)
    logger.info("searching on %d CPU thread(s)", threads)
    limit_threads(threads)
    worker.submit(limit_threads, threads).result()  # OpenMP's thread count is per calling thread: set it where searches run
    try:
        if worker.submit(len, collection.store).result():
            for queries in ("warm up", ["warm up", "the batched path"]):
                worker.submit(collection.search, queries, k=1).result()
        app = create_app(collection, api_key, worker, max_batch=max_batch, max_wait=batch_wait_ms / 1000)
        logger.info("serving %s on http://%s:%d", store, host, port)
        uvicorn.run(app, host=host, port=port, log_level=log_level)
    finally:
        worker.submit(collection.close).result()
        worker.shutdown()
