"""The ``isotrope`` command line."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from isotrope.config import EncoderConfig

if TYPE_CHECKING:
    from isotrope.backbones.base import TextKind
    from isotrope.encoder import ShapedEncoder

app = typer.Typer(
    name="isotrope",
    help="Shaped sentence encoders, and FAISS/LanceDB stores that keep them beside the vectors.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

_state = {"debug": False}
#: the recipe's defaults: each encoder option below is declared once (its type and help in an alias shared by
#: ``fit``, ``index`` and ``eval``) and takes its default from here
RECIPE = EncoderConfig()

OptionalModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="HF name/path (default all-MiniLM-L6-v2), fast (a static table distilled from all-MiniLM-L6-v2 on your corpus), fast:<teacher>, static:<model>, random:<model>, glove-6b-50d or a vectors file",
    ),
]
DistillSamples = Annotated[
    int | None, typer.Option(help="--model fast: texts the teacher runs on (a seeded sample; default 10000)")
]
TeacherQueriesFlag = Annotated[
    bool,
    typer.Option(
        "--teacher-queries",
        help="--model fast: encode queries also through the teacher (documents stay on the table): "
        "closer to the teacher, at a transformer pass per query",
    ),
]
FastPairsFlag = Annotated[
    bool,
    typer.Option(
        "--fast-pairs",
        help="--model fast: let the table also hold rows for the corpus's frequent token pairs where the teacher's "
        "neighbours keep them (on abstracts: +3 nDCG@10 dense, two thirds of the encode speed, 3x the table)",
    ),
]
EncoderDir = Annotated[Path | None, typer.Option("--encoder", help="a saved encoder folder (from `isotrope fit`), used as it is")]
Shape = Annotated[
    str,
    typer.Option(
        "--shape",
        "-s",
        help="preset (none, center, abtt, whiten, whiten-partial, quantile, flow) or a chain like 'center,abtt(3),l2'",
    ),
]
Pooling = Annotated[str, typer.Option(help="cls, mean, max, mean_sqrt_len, weighted_mean, last_token, mask")]
Layers = Annotated[str, typer.Option(help="last, first_last, an index or a comma list (HF indexing: 0 = embeddings)")]
Prompt = Annotated[
    str | None, typer.Option(help="template with {text}; its [MASK] (or last token) is pooled with --pooling mask")
]
Weights = Annotated[str, typer.Option(help="uniform, idf, sif, usif")]
Frequencies = Annotated[str, typer.Option(help="corpus, wordfreq or a 'word count' file")]
DropTop = Annotated[int, typer.Option(help="drop the N most frequent tokens")]
ExcludeSpecial = Annotated[
    bool | None,
    typer.Option("--exclude-special/--include-special", help="weigh special tokens 0 (default: yes for a static table)"),
]
ExcludePunctuation = Annotated[bool, typer.Option("--exclude-punctuation")]
MaxLength = Annotated[int | None, typer.Option(help="max tokens per text")]
TextField = Annotated[str, typer.Option(help="field holding the text in .jsonl files")]
TokenPrepending = Annotated[
    bool,
    typer.Option("--token-prepending", help="causal LMs: a slot before the text takes the last token's state in early layers"),
]
TPLayers = Annotated[
    str | None,
    typer.Option(
        "--tp-layers", help="START:END decoder layers whose input slot is replaced (default 1 to a quarter of the depth)"
    ),
]
Backend = Annotated[
    str | None,
    typer.Option(
        help="torch (default), onnx, onnx-int8 or onnx-int8-per-channel (ONNX Runtime: pip install 'isotrope[onnx]'); with --encoder or an existing store: runs it (default: as saved)"
    ),
]
SavedBackend = Annotated[
    str | None,
    typer.Option(help="run the saved encoder with torch, onnx, onnx-int8 or onnx-int8-per-channel (default: as saved)"),
]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="log progress details")] = False,
) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def encoder_config(ctx: typer.Context) -> EncoderConfig:
    """The recipe of a command's encoder options: the one place the CLI builds an EncoderConfig
    (``fit``, ``index`` and ``eval`` name their options as its fields; an option left out keeps
    the field's default)."""
    from isotrope.config import FIELDS, EncoderConfig
    from isotrope.encoder import backbone_config, resolve_config
    from isotrope.errors import ConfigError

    options = {name: value for name, value in ctx.params.items() if name in FIELDS and value is not None}
    try:
        config = EncoderConfig.from_dict(options)
    except ConfigError as error:
        flag = _flags(ctx).get(error.field or "")
        raise ValueError(f"{flag}: {error}" if flag else str(error)) from None
    try:
        backbone_config(resolve_config(config))  # options that do not go together, refused before any work
    except ValueError as error:
        raise ValueError(as_flags(str(error), _flags(ctx))) from None
    return config


def as_flags(message: str, flags: dict[str, str]) -> str:
    """A core error message as the command line words it: the recipe fields it names (``tp_layers``) and
    the phrases naming an option's value (``use backend 'torch'``) become the command's flags."""
    import re

    for name, flag in flags.items():
        if "_" in name:
            message = re.sub(rf"(?<![\w-]){name}(?![\w-])", flag, message)
    return re.sub(r"\buse backend '([\w-]+)'", r"use --backend \1", message)


def saved_encoder(ctx: typer.Context, encoder_dir: Path | None) -> ShapedEncoder | None:
    """The encoder of ``--encoder DIR`` (None without it), run with ``--backend`` when given. A saved
    encoder fixes its recipe: any other encoder option given with it is a one-line error."""
    if encoder_dir is None:
        return None
    from isotrope.config import FIELDS
    from isotrope.encoder import ShapedEncoder

    flags = _flags(ctx)
    given = [flags[name] for name in flags if name in FIELDS and name != "backend" and _given(ctx, name)]
    if given:
        raise ValueError(f"--encoder {encoder_dir}: a saved encoder fixes its recipe; drop {' and '.join(given)}")
    return ShapedEncoder.load(encoder_dir, backend=ctx.params.get("backend"))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or by its environment variable)."""
    source = ctx.get_parameter_source(name)  # typer's own copy of click's ParameterSource: compared by name
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _flags(ctx: typer.Context) -> dict[str, str]:
    """Parameter name -> its command-line flag (``drop_top`` -> ``--drop-top``)."""
    return {param.name: param.opts[0] for param in ctx.command.params if param.name and param.opts}


@app.command()
def fit(
    ctx: typer.Context,
    corpus: Annotated[Path, typer.Argument(help="text file (one text a line) or .jsonl with a text field; .gz allowed")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder to write the fitted encoder to")],
    model: OptionalModel = None,
    shape: Annotated[
        str | None,
        typer.Option(
            "--shape", "-s", help="preset or chain (default: none; for --model fast whiten-partial or center, as its fit chooses)"
        ),
    ] = None,
    pooling: Pooling = RECIPE.pooling,
    layers: Layers = str(RECIPE.layers),
    prompt: Prompt = None,
    weights: Weights = RECIPE.weights,
    frequencies: Frequencies = RECIPE.frequencies,
    drop_top: DropTop = RECIPE.drop_top,
    exclude_special: ExcludeSpecial = None,
    exclude_punctuation: ExcludePunctuation = RECIPE.exclude_punctuation,
    max_length: MaxLength = None,
    fit_samples: Annotated[int, typer.Option(help="fit on a uniform sample of at most this many texts")] = 100_000,
    max_samples: Annotated[int | None, typer.Option(hidden=True, help="deprecated: use --fit-samples")] = None,
    text_field: TextField = "text",
    token_prepending: TokenPrepending = RECIPE.token_prepending,
    tp_layers: TPLayers = None,
    distill_samples: DistillSamples = None,
    teacher_queries: TeacherQueriesFlag = False,
    fast_pairs: FastPairsFlag = False,
    backend: Backend = None,
) -> None:
    """Fit a shaped encoder on a corpus and save it."""
    from isotrope.corpus import iter_texts
    from isotrope.encoder import ShapedEncoder

    config = encoder_config(ctx)
    if max_samples is not None:
        typer.echo("--max-samples is deprecated and will be removed in the next release; use --fit-samples", err=True)
        fit_samples = max_samples
    if config.shape == "auto":
        from isotrope.autoshape import choose_shape
        from isotrope.sampling import reservoir_sample

        encoder = choose_shape(reservoir_sample(iter_texts(corpus, text_field), fit_samples), config, fitted_on=str(corpus))
    else:
        encoder = ShapedEncoder.create(config)
        encoder.fit(iter_texts(corpus, text_field), max_samples=fit_samples, fitted_on=str(corpus), show_progress=True)
    encoder.save(out)
    typer.echo(f"saved {encoder!r} to {out}\nfingerprint {encoder.fingerprint}")


@app.command()
def encode(
    encoder_dir: Annotated[Path, typer.Argument(help="a fitted encoder folder (from `isotrope fit`)")],
    input: Annotated[Path, typer.Argument(help="text file (one text a line) or .jsonl")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output .npy file")],
    kind: Annotated[str, typer.Option(help="document or query")] = "document",
    batch_size: Annotated[int, typer.Option()] = 32,
    text_field: TextField = "text",
    backend: SavedBackend = None,
) -> None:
    """Encode texts with a saved encoder into a float32 .npy matrix."""
    import numpy as np

    from isotrope.corpus import iter_texts
    from isotrope.encoder import ShapedEncoder

    encoder = ShapedEncoder.load(encoder_dir, backend=backend)
    if kind not in ("document", "query"):
        raise typer.BadParameter(f"choose document or query; got {kind!r}", param_hint="--kind")
    vectors = encoder.encode(
        list(iter_texts(input, text_field)), kind=cast("TextKind", kind), batch_size=batch_size, show_progress=True
    )
    np.save(out, vectors)
    typer.echo(f"wrote {vectors.shape[0]} x {vectors.shape[1]} vectors to {out}")


Store = Annotated[str, typer.Argument(help="faiss:DIR or lancedb:DIR")]


def _print_hits(hits: list, as_json: bool) -> None:
    if as_json:
        import json

        typer.echo(json.dumps([{"id": h.id, "score": h.score, "text": h.text, "metadata": h.metadata} for h in hits], indent=2))
        return
    for rank, hit in enumerate(hits, start=1):
        where = hit.metadata.get("source", "")
        line = hit.metadata.get("line")
        location = f"{where}:{line}" if line is not None else where
        text = " ".join((hit.text or "").split())
        typer.echo(f"{rank:>2}. {hit.score:.3f}  {location}\n    {text[:200]}")


@app.command()
def index(
    ctx: typer.Context,
    source: Annotated[Path, typer.Argument(help="a folder (recursive) or a file: .txt .md .rst .html .pdf .jsonl .csv")],
    store: Annotated[str, typer.Option("--store", help="faiss:DIR or lancedb:DIR")],
    model: OptionalModel = None,
    shape: Annotated[
        str | None, typer.Option("--shape", "-s", help="shaping preset or chain (default: the recommended one)")
    ] = None,
    encoder_dir: EncoderDir = None,
    distill_samples: DistillSamples = None,
    teacher_queries: TeacherQueriesFlag = False,
    fast_pairs: FastPairsFlag = False,
    pooling: Pooling = RECIPE.pooling,
    layers: Layers = str(RECIPE.layers),
    prompt: Prompt = None,
    weights: Weights = RECIPE.weights,
    frequencies: Frequencies = RECIPE.frequencies,
    drop_top: DropTop = RECIPE.drop_top,
    exclude_special: ExcludeSpecial = None,
    exclude_punctuation: ExcludePunctuation = RECIPE.exclude_punctuation,
    max_length: MaxLength = None,
    chunk_tokens: Annotated[int, typer.Option(help="max tokens per chunk")] = 256,
    overlap_tokens: Annotated[int, typer.Option(help="tokens repeated between chunks")] = 32,
    fit_samples: Annotated[int, typer.Option(help="chunks sampled to fit the shaping")] = 20_000,
    factory: Annotated[str | None, typer.Option(hidden=True, help="deprecated: use --index")] = None,
    index_kind: Annotated[
        str,
        typer.Option(
            "--index",
            help="auto (exact, then an approximate index sized from the count), flat (always exact); "
            "LanceDB also ivf_pq, hnsw_sq; FAISS also an index_factory string, e.g. HNSW32 or IVF1024,PQ32",
        ),
    ] = "auto",
    sync: Annotated[bool, typer.Option("--sync", help="also delete chunks of files no longer in SOURCE")] = False,
    text_field: TextField = "text",
    engine: Annotated[str, typer.Option(help="local: this process; ray: Ray tasks and embedding actors")] = "local",
    address: Annotated[str | None, typer.Option(help="--engine ray: cluster to join (auto, ray://HEAD:10001)")] = None,
    num_actors: Annotated[int, typer.Option(help="--engine ray: embedding actors, each loading the encoder once")] = 2,
    gpus_per_actor: Annotated[float, typer.Option(help="--engine ray: GPUs per actor (0.5 puts two on a GPU)")] = 0.0,
    token_prepending: TokenPrepending = RECIPE.token_prepending,
    tp_layers: TPLayers = None,
    backend: Backend = None,
) -> None:
    """Index documents into a FAISS or LanceDB store, with the fitted encoder saved beside them."""
    from isotrope.ingest.plan import IngestPlan

    if factory:
        typer.echo("--factory is deprecated and will be removed in the next release; use --index", err=True)
    store_options = {"index": factory or index_kind}
    from isotrope.search import check_index, parse_store_uri

    kind = parse_store_uri(store)[0]
    try:
        check_index(kind, store_options["index"])
    except ValueError as error:
        raise typer.BadParameter(f"{error} (for a {kind} store)", param_hint="--index") from None
    if engine not in ("local", "ray"):
        raise typer.BadParameter(f"choose local or ray; got {engine!r}", param_hint="--engine")
    saved = saved_encoder(ctx, encoder_dir)
    # --backend: a new store's encoder runs on it; an existing store's is reopened with it
    plan = IngestPlan(
        source,
        store,
        encoder=saved,
        config=None if saved else encoder_config(ctx),
        store_options=store_options,
        loader_options={"text_field": text_field},
        chunk_tokens=chunk_tokens,
        overlap_tokens=overlap_tokens,
        fit_samples=fit_samples,
        sync=sync,
    )
    if engine == "ray":
        from isotrope.connectors.ray import RayOptions, run_on_ray

        report = run_on_ray(plan, RayOptions(address, num_actors, gpus_per_actor))
    else:
        from isotrope.ingest.pipeline import run_local

        report = run_local(plan)
    for skipped in report.skipped:
        typer.echo(f"skipped {skipped}", err=True)
    typer.echo(f"indexed {source} into {store}: {report.summary()}")


def _search_options(nprobe: int | None, ef: int | None) -> dict[str, Any]:
    """``--nprobe`` / ``--ef`` as store options (the same names in every store)."""
    for name, value in (("--nprobe", nprobe), ("--ef", ef)):
        if value is not None and value < 1:
            raise typer.BadParameter(f"{name} must be at least 1; got {value}", param_hint=name)
    return {key: value for key, value in (("nprobe", nprobe), ("ef", ef)) if value is not None}


@app.command()
def search(
    store: Store,
    query: Annotated[str, typer.Argument(help="the question or keywords")],
    k: Annotated[int, typer.Option("-k", help="number of hits")] = 10,
    where: Annotated[str | None, typer.Option(help="metadata filter, e.g. \"source = 'a.md' and year >= 2020\"")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print hits as JSON")] = False,
    mode: Annotated[
        str | None,
        typer.Option(
            help="dense (vectors), lexical (BM25) or hybrid (both fused); default: the store's calibrated choice (isotrope info)"
        ),
    ] = None,
    alpha: Annotated[
        float | None, typer.Option(help="hybrid: weight of the dense scores, 0..1 (alone: implies --mode hybrid)")
    ] = None,
    group_by: Annotated[str | None, typer.Option(help="best hit per value of this metadata field, e.g. source")] = None,
    nprobe: Annotated[int | None, typer.Option(help="IVF lists searched (default: calibrated for recall@10 >= 0.95)")] = None,
    ef: Annotated[int | None, typer.Option(help="HNSW efSearch (default: calibrated or 128)")] = None,
    backend: SavedBackend = None,
) -> None:
    """Search a store with the encoder that wrote it."""
    from isotrope.search import Collection

    with Collection.open(store, backend=backend, **_search_options(nprobe, ef)) as collection:
        _print_hits(collection.search(query, k=k, where=where, mode=mode, alpha=alpha, group_by=group_by), as_json)


@app.command()
def info(store: Store) -> None:
    """Counts, model, shaping and fingerprint of a store."""
    import json

    from isotrope.search import Collection

    with Collection.open(store) as collection:
        typer.echo(json.dumps(collection.info(), indent=2, default=str))


@app.command()
def optimize(store: Store) -> None:
    """(Re)build the approximate index for the store's current size, recalibrate it, compact LanceDB."""
    import json

    from isotrope.search import Collection

    with Collection.open(store) as collection:
        typer.echo(json.dumps({"store": store, "chunks": len(collection.store), **collection.optimize()}, indent=2))


@app.command()
def calibrate(
    store: Store,
    queries: Annotated[
        Path | None, typer.Argument(help="queries like your users' (one a line, or .jsonl with a text field)")
    ] = None,
    target: Annotated[float, typer.Option(min=0.0, max=1.0, help="recall@10 against exact search to reach")] = 0.95,
    text_field: Annotated[str, typer.Option(help="the .jsonl field holding the query")] = "text",
    default_search: Annotated[
        bool,
        typer.Option(
            "--default-search",
            help="choose the default search (dense, lexical or hybrid and its weight) again from the stored chunks, "
            "without labels (after large appends)",
        ),
    ] = False,
) -> None:
    """Set an approximate index's search breadth from queries like your users' (no rebuild), and/or
    refit the store's default search from its own chunks (--default-search)."""
    import json

    from isotrope.corpus import iter_texts
    from isotrope.search import Collection

    if queries is None and not default_search:
        raise typer.BadParameter("give QUERIES (search breadth) and/or --default-search", param_hint="QUERIES")
    with Collection.open(store) as collection:
        out: dict[str, Any] = {"store": store, "chunks": len(collection.store)}
        if queries is not None:
            out.update(collection.calibrate(list(iter_texts(queries, text_field)), target))
        if default_search:
            out["default_search"] = collection.fit_default_search()
        typer.echo(json.dumps(out, indent=2))


@app.command()
def serve(
    store: Store,
    host: Annotated[str, typer.Option(help="address to bind; 0.0.0.0 exposes the server to the network")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key", envvar="ISOTROPE_API_KEY", show_envvar=True, help="require 'Authorization: Bearer KEY' on the API routes"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level: critical, error, warning, info, debug")] = "info",
    threads: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="CPU threads for encoding and search (default: 1 for a static table, the physical cores for a transformer)",
        ),
    ] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="concurrent queries encoded and searched together, at most")] = 64,
    batch_wait_ms: Annotated[
        float, typer.Option(min=0.0, help="ms an idle server waits for more queries to batch (0: none)")
    ] = 0.0,
    nprobe: Annotated[int | None, typer.Option(help="IVF lists searched (default: the store's calibrated breadth)")] = None,
    ef: Annotated[int | None, typer.Option(help="HNSW efSearch (default: the store's calibrated breadth)")] = None,
    backend: SavedBackend = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="request bodies larger than this are refused (413)")] = 1_048_576,
    max_query_chars: Annotated[int, typer.Option(min=1, help="characters of one query or text (422 beyond)")] = 10_000,
    max_queries: Annotated[int, typer.Option(min=1, help="queries of one /search/batch, texts of one /embed (422 beyond)")] = 256,
    request_timeout: Annotated[
        float, typer.Option(min=0.001, help="seconds a search or embedding may take before the client gets 504")
    ] = 30.0,
    max_in_flight: Annotated[int, typer.Option(min=1, help="API requests answered at once; more get 503 + Retry-After")] = 64,
    client_timeout: Annotated[
        float, typer.Option(min=0.001, help="seconds a client has to send its request body (408), and an idle connection lives")
    ] = 10.0,
    cors: Annotated[
        list[str] | None, typer.Option("--cors", help="an origin whose pages may call the API (repeatable; default none)")
    ] = None,
) -> None:
    """Serve a store over HTTP: a JSON API (/search, /search/batch, /embed, /info), a search page at / and /report."""
    try:
        from isotrope.connectors.server import serve as run_server
        from isotrope.connectors.server.limits import ServerLimits
    except ImportError as error:
        raise ImportError(f"isotrope serve needs its extra: pip install 'isotrope[serve]' ({error})") from None
    limits = ServerLimits(max_body_bytes, max_query_chars, max_queries, request_timeout, max_in_flight, client_timeout)
    typer.echo(f"isotrope serve: {store} on http://{host}:{port} (page /, API docs /docs, report /report)", err=True)
    run_server(
        store,
        host=host,
        port=port,
        api_key=api_key,
        log_level=log_level,
        threads=threads,
        max_batch=max_batch,
        batch_wait_ms=batch_wait_ms,
        store_options=_search_options(nprobe, ef),
        backend=backend,
        limits=limits,
        cors=cors or (),
    )


@app.command()
def report(
    store: Store,
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write")] = Path("report.html"),
    sample: Annotated[int, typer.Option(help="stored vectors sampled for the statistics")] = 2000,
) -> None:
    """Write the shaping report of a store: spectra and cosines before/after shaping, isotropy, fit, auto-shape."""
    from isotrope.report import build_report, render_html
    from isotrope.search import Collection

    if sample < 10:
        raise typer.BadParameter(f"needs at least 10; got {sample}", param_hint="--sample")
    with Collection.open(store) as collection:
        page = render_html(build_report(collection, sample=sample))
    staging = out.with_name(f".{out.name}.tmp")
    staging.write_text(page, encoding="utf-8")
    staging.replace(out)
    typer.echo(f"wrote the shaping report of {store} to {out}")


@app.command()
def reshape(
    store: Store,
    shape: Annotated[
        str, typer.Option("--shape", "-s", help="the new shaping (required): preset or chain, e.g. whiten or 'center,abtt(3),l2'")
    ],
    fit_samples: Annotated[int, typer.Option(help="stored vectors sampled to fit the shaping")] = 100_000,
) -> None:
    """Refit a LanceDB store's shaping from its stored raw vectors (no backbone pass) and rewrite its vectors."""
    from isotrope.reshape import reshape_store

    encoder = reshape_store(store, shape, fit_samples=fit_samples)
    typer.echo(f"reshaped {store} to {encoder.shape}; fingerprint {encoder.fingerprint}")


@app.command()
def demo(
    store: Annotated[str, typer.Option(help="where the demo store lives")] = "lancedb:.isotrope-demo",
) -> None:
    """Index the standard library's docstrings and answer a few questions (offline, about two minutes)."""
    from isotrope.demo import run_demo, stdlib_root

    typer.echo(f"isotrope demo: docstrings of the Python standard library at {stdlib_root()} -> {store}")
    answers, report, timings, info = run_demo(store)
    typer.echo(f"indexed: {report.summary()}")
    typer.echo(f"encoder: {info['model']}, shape {info['shape']}, fingerprint {info['fingerprint'][:16]}")
    typer.echo("timings: " + ", ".join(f"{step} {seconds:.1f}s" for step, seconds in timings.items()))
    for question, hits in answers:
        typer.echo(f"\nQ: {question}")
        _print_hits(hits, as_json=False)
    typer.echo(
        f"\nserve it (search page, JSON API, shaping report): isotrope serve {store}\n"
        'then open http://127.0.0.1:8000/ or: curl -X POST localhost:8000/search -d \'{"query": "read a gzip file"}\''
    )


@app.command("eval")
def evaluate(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="sts, retrieval, clustering, classification or isotropy")],
    model: OptionalModel = None,
    shape: Annotated[
        str | None,
        typer.Option(
            "--shape", "-s", help="preset or chain (default: none; for --model fast whiten-partial or center, as its fit chooses)"
        ),
    ] = None,
    encoder_dir: EncoderDir = None,
    distill_samples: DistillSamples = None,
    teacher_queries: TeacherQueriesFlag = False,
    fast_pairs: FastPairsFlag = False,
    pooling: Pooling = RECIPE.pooling,
    layers: Layers = str(RECIPE.layers),
    prompt: Prompt = None,
    weights: Weights = RECIPE.weights,
    frequencies: Frequencies = RECIPE.frequencies,
    drop_top: DropTop = RECIPE.drop_top,
    exclude_special: ExcludeSpecial = None,
    exclude_punctuation: ExcludePunctuation = RECIPE.exclude_punctuation,
    max_length: MaxLength = None,
    fit_corpus: Annotated[
        str | None,
        typer.Option(
            help="text/.jsonl file to fit on; 'corpus' = the BEIR corpus; 'split:NAME' = another split of the clustering file"
        ),
    ] = None,
    fit_samples: Annotated[int, typer.Option(help="texts sampled from the fit corpus")] = 20_000,
    context_corpus: Annotated[
        str | None, typer.Option(help="text file the context: tables are averaged over (default: the fit corpus)")
    ] = None,
    transductive: Annotated[bool, typer.Option("--transductive", help="fit on the evaluation texts (labelled so)")] = False,
    data_dir: Annotated[Path | None, typer.Option(help="root holding sts/, classification/ (e.g. shared/data)")] = None,
    sts_task: Annotated[
        list[str] | None, typer.Option("--task", help="stsb, sickr; or MR, CR, SUBJ, MPQA, TREC, SST2, SST5")
    ] = None,
    pairs: Annotated[list[Path] | None, typer.Option(help="STS file of 'sentence1<TAB>sentence2<TAB>score' lines")] = None,
    beir: Annotated[Path | None, typer.Option(help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv")] = None,
    jsonl: Annotated[Path | None, typer.Option(help="clustering: .jsonl(.gz) with text and label")] = None,
    split: Annotated[str | None, typer.Option(help="clustering: keep records of this split")] = None,
    limit: Annotated[int | None, typer.Option(help="clustering/isotropy: at most this many texts")] = None,
    texts: Annotated[Path | None, typer.Option("--texts", help="isotropy: a text file")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="token-state cache (a sweep never re-runs the backbone)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the result to this JSON file")] = None,
    token_prepending: TokenPrepending = RECIPE.token_prepending,
    tp_layers: TPLayers = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="retrieval through a store: dense, lexical, hybrid, auto (the calibrated default beside the three) or a comma list"
        ),
    ] = None,
    store_kind: Annotated[str | None, typer.Option("--store", help="retrieval --mode: faiss, lancedb or faiss,lancedb")] = None,
    alpha: Annotated[float | None, typer.Option(help="retrieval --mode hybrid: weight of the dense scores")] = None,
    fusion: Annotated[str, typer.Option(help="retrieval --mode hybrid: convex or rrf")] = "convex",
    backend: Backend = None,
) -> None:
    """Evaluate one encoder recipe on a task; the result records what the shaping was fitted on."""
    from isotrope.evaluate.commands import evaluate as run_evaluation
    from isotrope.evaluate.commands import write_json
    from isotrope.evaluate.harness import Evaluator

    saved = saved_encoder(ctx, encoder_dir)
    config = saved.config if saved is not None else encoder_config(ctx)
    result = run_evaluation(
        task,
        config,
        Evaluator(cache_dir=cache_dir, fit_samples=fit_samples, encoder=saved, show_progress=True),
        tasks=sts_task or [],
        data_dir=data_dir,
        pairs=pairs or [],
        beir=beir,
        jsonl=jsonl,
        split=split,
        limit=limit,
        texts_file=texts,
        fit_corpus=fit_corpus,
        transductive=transductive,
        context_corpus=context_corpus,
        modes=_comma_list(mode),
        stores=_comma_list(store_kind),
        alpha=alpha,
        fusion=fusion,
    )
    typer.echo(write_json(result, json_out))


def _comma_list(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


@app.command()
def sweep(
    config: Annotated[Path, typer.Argument(help="JSON grid: see docs/how-to/evaluate.md")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output stem: writes OUT.json and OUT.md")] = Path("sweep"),
) -> None:
    """Run a grid of recipes x tasks and write a JSON + Markdown table."""
    from isotrope.evaluate.sweep import run_sweep

    rows = run_sweep(config, out)
    typer.echo(f"{len(rows)} results written to {out}.json and {out}.md")


@app.command()
def fold(
    encoder_dir: Annotated[Path, typer.Argument(help="a fitted encoder folder over a static table (from `isotrope fit`)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder to write the folded encoder to")],
    dtype: Annotated[str, typer.Option(help="table storage: float32, float16, or int8 (one scale per row)")] = "float32",
    dims: Annotated[int | None, typer.Option(help="keep the leading N whitened components (chain ending in whiten/pca)")] = None,
) -> None:
    """Fold an encoder's table, weights and linear shaping into one table (encoding then needs no torch)."""
    from isotrope.encoder import ShapedEncoder
    from isotrope.fold import fold_encoder

    folded = fold_encoder(ShapedEncoder.load(encoder_dir), dtype=dtype, dims=dims)
    folded.save(out)
    size = sum(path.stat().st_size for path in out.iterdir())
    typer.echo(f"saved {folded!r} ({folded.dim} dims, {dtype}, {size / 1e6:.1f} MB) to {out}\nfingerprint {folded.fingerprint}")


@app.command()
def export(
    encoder_dir: Annotated[Path, typer.Argument(help="a fitted (or folded) encoder folder over a static table")],
    format: Annotated[str, typer.Option("--format", "-f", help="model2vec or sentence-transformers")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder to write")],
) -> None:
    """Write the folded encoder as a model2vec or sentence-transformers model folder."""
    from isotrope.encoder import ShapedEncoder
    from isotrope.export import export_encoder

    export_encoder(ShapedEncoder.load(encoder_dir), out, format)
    loader = "model2vec.StaticModel.from_pretrained" if format == "model2vec" else "sentence_transformers.SentenceTransformer"
    typer.echo(f"wrote {format} model to {out} (load with {loader}({str(out)!r}))")


#: click's ClickException as typer raises it: click's own, or (typer >= 0.26) typer's vendored copy, which
#: ``import click`` does not see
_CLICK_ERROR: type[Any] = next(cls for cls in typer.BadParameter.__mro__ if cls.__name__ == "ClickException")


def main() -> None:
    """Entry point: one clear error line, tracebacks only with --debug."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # quiet transformers (if a command loads it) without importing it: a folded encoder never does
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # already imported (main called in a process that loaded it)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    try:
        code = app(standalone_mode=False)  # returns an exit code where typer exits (--help, and Ctrl-C in typer >= 0.26)
    except SystemExit:
        raise
    except (KeyboardInterrupt, typer.Abort):  # typer < 0.26 turns Ctrl-C into Abort
        code = 130
    except _CLICK_ERROR as error:  # a usage error: the usage line, the wrong option named, exit code 2
        error.show()
        sys.exit(error.exit_code)
    except Exception as error:  # the CLI's last line of defence: one line, not a traceback
        from isotrope.errors import one_line

        if _state["debug"]:
            raise
        typer.echo(f"error: {one_line(error)}", err=True)
        sys.exit(1)
    if code == 130:
        typer.echo("interrupted", err=True)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
