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
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from isotrope import __version__
from isotrope.connectors.server.batching import SearchBatcher
from isotrope.connectors.server.limits import LimitRequests, ServerLimits
from isotrope.stores.base import Hit

try:
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the serve extra
    orjson = None  # type: ignore[assignment]  # the plain JSON response is used instead

if TYPE_CHECKING:
    from isotrope.search import Collection

logger = logging.getLogger(__name__)

MODES = ("dense", "lexical", "hybrid")
#: query texts searched together at most when concurrent requests are batched
BATCH_QUERIES = 64
STATIC_DIR = files("isotrope.connectors.server") / "static"

Where = str | dict[str, Any] | None


def _json_number(value: Any) -> Any:
    """A JSON number, as the schema says: not true/false, not a numeric string (pydantic's lax mode
    would read them as 1, 0 and the number)."""
    if isinstance(value, (bool, str, bytes)):
        raise PydanticCustomError("number_type", "Input should be a number, not {kind}", {"kind": type(value).__name__})
    return value


#: the schema's form of :meth:`SearchOptions.alpha_is_hybrid_only`: unless ``mode`` is hybrid, ``alpha`` is null
ALPHA_HYBRID_ONLY: dict[str, Any] = {
    "if": {"properties": {"mode": {"not": {"const": "hybrid"}}}},
    "then": {"properties": {"alpha": {"type": "null"}}},
}


class SearchOptions(BaseModel):
    """What every search takes besides its query text."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=ALPHA_HYBRID_ONLY)
    k: Annotated[int, BeforeValidator(_json_number)] = Field(10, ge=1, le=1000, description="number of hits")
    mode: Literal["dense", "lexical", "hybrid"] | None = Field(
        None, description="dense vectors, full-text, or both fused; default: the store's calibrated choice (/info default_search)"
    )
    alpha: Annotated[float | None, BeforeValidator(_json_number)] = Field(
        None, ge=0.0, le=1.0, description="hybrid: weight of the dense ranking"
    )
    where: Where = Field(None, description='metadata filter: "source = \'a.md\' and year >= 2020" or {"year": {"$gte": 2020}}')
    group_by: str | None = Field(None, min_length=1, description="metadata field: at most one hit per value")

    @model_validator(mode="after")
    def alpha_is_hybrid_only(self) -> SearchOptions:
        """``alpha`` weighs hybrid search only (the schema says so with ``if``/``then``)."""
        if self.alpha is not None and self.mode != "hybrid":
            raise PydanticCustomError(
                "hybrid_only", "alpha weighs the two sides of hybrid search; mode {mode!r} takes none", {"mode": self.mode}
            )
        return self


#: what ``str.strip`` removes (``str.isspace``), as one character class: a text must hold another character
WHITESPACE = "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_BLANK = f"[^{WHITESPACE}]"


def _not_blank(text: str) -> str:
    """A query or text to encode holds something besides whitespace (the schema's ``pattern``)."""
    if not text.strip():
        raise PydanticCustomError("blank", "is blank")
    return text


def _text(max_chars: int, description: str) -> Any:
    return Annotated[
        str,
        Field(min_length=1, max_length=max_chars, description=description, json_schema_extra={"pattern": NOT_BLANK}),
        AfterValidator(_not_blank),
    ]


def request_models(limits: ServerLimits) -> tuple[type[SearchOptions], type[SearchOptions], type[BaseModel]]:
    """The request bodies of /search, /search/batch and /embed under ``limits`` (their schemas say them)."""
    query = _text(limits.max_query_chars, "the question or keywords")
    text = _text(limits.max_query_chars, "a text to encode")

    class SearchRequest(SearchOptions):
        query: query  # type: ignore[valid-type]

    class BatchRequest(SearchOptions):
        queries: list[query] = Field(min_length=1, max_length=limits.max_queries, description="query texts")  # type: ignore[valid-type]

    class EmbedRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        texts: list[text] = Field(min_length=1, max_length=limits.max_queries, description="texts to encode")  # type: ignore[valid-type]
        kind: Literal["query", "document"] = Field("query", description="query texts get the encoder's query prefix, if any")

    return SearchRequest, BatchRequest, EmbedRequest


class FieldError(BaseModel):
    """One field that failed validation: where it is, what is wrong, and pydantic's error type."""

    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """Every error answer: ``detail`` is one line naming what is wrong; a 422 lists the bad fields in ``errors``."""

    detail: str
    errors: list[FieldError] | None = None


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
        self,
        collection: Collection,
        worker: ThreadPoolExecutor,
        max_batch: int = BATCH_QUERIES,
        max_wait: float = 0.0,
        timeout: float = ServerLimits.request_timeout,
    ) -> None:
        self.collection = collection
        self.worker = worker
        self.timeout = timeout
        self.batcher = SearchBatcher(
            lambda queries, **options: self.collection.search(queries, **options), worker, max_batch=max_batch, max_wait=max_wait
        )
        self._report: tuple[int, str] | None = None  # (sample size, page) of the last report

    async def _limited(self, work: Awaitable[Any]) -> Any:
        """``work``'s result, or 504 after ``timeout`` seconds (a search already running finishes in
        the worker, unseen; one still queued is dropped)."""
        try:
            return await asyncio.wait_for(work, self.timeout)
        except asyncio.TimeoutError:
            raise HTTPException(504, f"no answer within {self.timeout:g} s (--request-timeout)") from None

    async def _run(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._limited(asyncio.wrap_future(self.worker.submit(function, *args, **kwargs)))

    @staticmethod
    def _options(options: SearchOptions) -> dict[str, Any]:
        """Keyword arguments of ``Collection.search``."""
        keywords: dict[str, Any] = {"k": options.k, "where": options.where or None, "mode": options.mode}
        if options.alpha is not None:
            keywords["alpha"] = options.alpha
        if options.group_by is not None:
            keywords["group_by"] = options.group_by
        return keywords

    async def search(self, queries: list[str], options: SearchOptions) -> list[list[Hit]]:
        """The hits of each query, batched with concurrent searches; a bad filter is a 400, no answer within the time limit a 504."""
        try:
            return await self._limited(self.batcher.search(queries, **self._options(options)))
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


def _takes(model: type[BaseModel]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a route's ``request`` argument its body model (made per app, so not a name its module knows)."""

    def mark(route: Callable[..., Any]) -> Callable[..., Any]:
        route.__annotations__["request"] = model
        return route

    return mark


def _errors(*statuses: int, html: bool = False) -> dict[int | str, dict[str, Any]]:
    """The error answers of a route, all in the one-line :class:`Problem` shape (JSON, also from a
    route whose success is an ``html`` page)."""
    reasons = {
        400: "a body that is not JSON, or a filter the store cannot apply",
        401: "missing or wrong bearer token",
        408: "request body sent too slowly",
        413: "request body too large",
        422: "a field fails validation (named in detail and errors)",
        500: "internal error (the log has the traceback)",
        503: "too many requests in flight: retry after Retry-After seconds",
        504: "the request took longer than the per-request time limit",
    }
    if html:
        problem = {"application/json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
        return {status: {"description": reasons[status], "content": problem} for status in statuses}
    return {status: {"model": Problem, "description": reasons[status]} for status in statuses}


def create_app(
    collection: Collection,
    api_key: str | None = None,
    worker: ThreadPoolExecutor | None = None,
    max_batch: int = BATCH_QUERIES,
    max_wait: float = 0.0,
    limits: ServerLimits | None = None,
    cors: Sequence[str] = (),
) -> Any:
    """The FastAPI app over an open ``collection``, used from ``worker`` (the thread that opened it;
    a new one when None: fine for a LanceDB store). ``api_key`` requires ``Authorization: Bearer KEY``
    on every API route (the page, its static files, the OpenAPI docs and /healthz hold no store data),
    and only then does the OpenAPI document declare bearer auth. Concurrent searches are batched up
    to ``max_batch`` query texts, waiting ``max_wait`` seconds for company when the worker is idle
    (0: never). ``limits`` bound what one client may ask (:class:`ServerLimits`); ``cors`` lists the
    origins whose pages may call the API (none by default)."""
    limits = limits or ServerLimits()
    searcher = Searcher(
        collection, worker or collection_worker(), max_batch=max_batch, max_wait=max_wait, timeout=limits.request_timeout
    )
    SearchRequest, BatchRequest, EmbedRequest = request_models(limits)
    guarded: list[Any] = []
    statuses: tuple[int, ...] = (408, 413, 500, 503, 504)
    if api_key is not None:
        bearer = HTTPBearer(auto_error=False)

        def authorize(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
            if credentials is None or not secrets.compare_digest(credentials.credentials.encode(), api_key.encode()):
                raise HTTPException(
                    401, "missing or wrong bearer token (Authorization: Bearer KEY)", headers={"WWW-Authenticate": "Bearer"}
                )

        guarded = [Depends(authorize)]
        statuses = (401, *statuses)

    app = FastAPIOffline(
        title="isotrope",
        version=__version__,
        description=f"Search the store {collection.kind}:{collection.path} with the encoder that wrote it.",
    )
    app.state.searcher = searcher
    app.state.limits = limits

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

    @app.get("/info", tags=["service"], dependencies=guarded, responses=_errors(*statuses))
    async def info() -> dict[str, Any]:
        """What ``isotrope info`` prints, and the search modes this server offers."""
        return await searcher.info()

    searching = _errors(400, 422, *statuses)

    @app.post("/search", response_model=SearchResponse, tags=["search"], dependencies=guarded, responses=searching)
    @_takes(SearchRequest)
    async def search(request: Any) -> Response:
        """The best ``k`` chunks for one query."""
        hits = (await searcher.search([request.query], request))[0]
        return json_response({"query": request.query, "hits": [hit_json(hit) for hit in hits]})

    @app.post("/search/batch", response_model=BatchResponse, tags=["search"], dependencies=guarded, responses=searching)
    @_takes(BatchRequest)
    async def search_batch(request: Any) -> Response:
        """The best ``k`` chunks for each of many queries (one encoder pass)."""
        results = await searcher.search(request.queries, request)
        return json_response(
            {
                "results": [
                    {"query": query, "hits": [hit_json(hit) for hit in hits]} for query, hits in zip(request.queries, results)
                ]
            }
        )

    @app.post(
        "/embed", response_model=EmbedResponse, tags=["search"], dependencies=guarded, responses=_errors(400, 422, *statuses)
    )
    @_takes(EmbedRequest)
    async def embed(request: Any) -> dict[str, Any]:
        """Vectors from the store's encoder, comparable with the stored ones."""
        vectors = await searcher.embed(request.texts, request.kind)
        return {"fingerprint": collection.encoder.fingerprint, "dim": int(vectors.shape[1]), "vectors": vectors.tolist()}

    @app.get(
        "/report",
        response_class=HTMLResponse,
        tags=["report"],
        dependencies=guarded,
        responses=_errors(400, 422, *statuses, html=True),
    )
    async def report(sample: int = Query(2000, ge=10, le=20_000, description="stored vectors sampled")) -> HTMLResponse:
        """The shaping report: spectra, cosine distributions, isotropy, fit and auto-shape candidates."""
        return HTMLResponse(await searcher.report(sample))

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(str(STATIC_DIR / "index.html"))

    app.mount("/static", StaticFiles(directory=str(STATIC_DIR)), name="static")
    app.add_middleware(FormBodyAsJSON)
    if cors:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors), allow_methods=["GET", "POST"], allow_headers=["*"])
    app.add_middleware(LimitRequests, limits=limits)
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
    limits: ServerLimits | None = None,
    cors: Sequence[str] = (),
) -> None:
    """Open ``store`` with its encoder (once, in the collection's worker thread, on ``backend`` when given;
    ``store_options`` such as ``nprobe`` go to the store), warm it up, and serve until interrupted; concurrent searches are
    batched, and ``limits`` and ``cors`` apply (see :func:`create_app`). uvicorn closes a keep-alive connection
    idle for ``limits.client_timeout`` seconds."""
    limits = limits or ServerLimits()
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
        app = create_app(
            collection, api_key, worker, max_batch=max_batch, max_wait=batch_wait_ms / 1000, limits=limits, cors=cors
        )
        logger.info("serving %s on http://%s:%d", store, host, port)
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=max(1, round(limits.client_timeout)))
    finally:
        worker.submit(collection.close).result()
        worker.shutdown()
