"""Benchmark tables in README.md and docs/ generated from ``benchmarks/results/*.json``.

    python -m benchmarks render          # rewrite every marked table from the committed results
    python -m benchmarks render --check  # exit 1 when a committed table differs from what its JSON renders

A table sits between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` in any of :data:`DOCUMENTS`;
NAME is a topic (``encode``, ``ingest``, ...) or ``TOPIC.PART`` (:data:`SECTIONS`). Each rendering
states the command, machine, load and threads it came from. A result marked ``"loaded": true`` is
refused (never cited); a topic without a result renders as "not measured yet" with its command.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import REPO_ROOT, RESULTS_DIR

#: the files (glob patterns under the repository) whose marked tables are generated
DOCUMENTS = ("README.md", "docs/**/*.md")
MARKER = re.compile(r"(<!-- bench:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /bench:(?P=name) -->)", re.DOTALL)
#: what the README says of a side (the backend's vectors)
SIDE_LABELS = {
    "isotrope_torch": "isotrope `torch` (PyTorch float32)",
    "isotrope_onnx": "isotrope `onnx` (ONNX Runtime float32)",
    "isotrope_onnx-int8": "isotrope `onnx-int8` (int8 weights, per tensor)",
    "isotrope_onnx-int8-per-channel": "isotrope `onnx-int8-per-channel` (int8 weights, per channel)",
    "isotrope_fast": "isotrope `--model fast` (static table distilled on STS-B train)",
    "st_torch": "sentence-transformers torch",
    "peer_st_torch": "sentence-transformers torch (peer process)",
    "peer_st_onnx": 'sentence-transformers `backend="onnx"` (peer process)',
    "peer_st_onnx_int8": "sentence-transformers ONNX int8, `export_dynamic_quantized_onnx_model` (peer process)",
}


class LoadedResultError(ValueError):
    """A result measured on a busy machine: never cited."""


# -- formatting ---------------------------------------------------------------------
def num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(num(cell) if not isinstance(cell, str) else cell for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def runs(entry: dict[str, Any]) -> str:
    return ", ".join(f"{t:.3g}" if t < 1000 else f"{t:,.0f}" for t in entry.get("runs_s", []))


def others_cpu(document: dict[str, Any]) -> str:
    """``, other processes N % of the CPU`` where the result recorded it (older results did not)."""
    share = document.get("others_cpu_share")
    return "" if share is None else f", other processes {100 * share:.1f} % of the CPU"


def provenance(document: dict[str, Any]) -> str:
    """One line: command, machine, load before/after, threads, commit, date."""
    machine = document["machine"]
    threads = document.get("threads", {})
    set_to = ", ".join(f"{name} {value}" for name, value in threads.items() if name != "requested")
    return (
        f"`{document['command']}` on {machine['cpu']} ({machine['usable_cores']} cores, {machine['ram_gb']} GB), "
        f"load {document['load_average_before'][0]:.2f} before / {document['load_average_after'][0]:.2f} after"
        f"{others_cpu(document)}, "
        f"{threads.get('requested', '?')} threads ({set_to}), commit {machine['git_commit']}, {document['started'][:10]}"
    )


# -- one renderer per topic ---------------------------------------------------------
def render_encode(result: dict[str, Any]) -> str:
    rows = []
    for name, side in result["sides"].items():
        cosine = (
            "–"
            if "mean_cosine_to_torch" not in side
            else f"{side['mean_cosine_to_torch']:.6f} / {side['min_cosine_to_torch']:.6f}"
        )
        rows.append(
            [
                SIDE_LABELS.get(name, name),
                side["texts_per_s"],
                f"{side['x_st_torch']:.2f}",
                f"{side['spread']:.2f}",
                side["cpu_median_s"],
                cosine,
                side["stsb_spearman"],
                f"{100 * side['stsb_share_of_torch']:.1f} %",
            ]
        )
    head = (
        f"{result['model']}, {result['texts']:,} STS-B test sentences, batch size {result['batch_size']}, max_seq_length "
        f"{result['max_seq_length']}, median of {result['rounds']} alternated rounds (spread = (max - min) / median); "
        f"STS-B Spearman x100 on {result['quality_pairs']:,} test pairs; x ST torch is to sentence-transformers' torch in "
        "the same process.\n\n"
    )
    gates = "\n\nGates: " + ", ".join(f"{name} {num(ok)}" for name, ok in result["gates"].items())
    header = ["side", "texts/s", "x ST torch", "spread", "CPU s", "cosine to torch (mean / min)", "STS-B", "of torch"]
    return head + table(header, rows) + gates


def render_flat(result: dict[str, Any]) -> str:
    """Every scalar figure of a result as ``path | value`` rows (topics without a dedicated table)."""
    rows: list[list[Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, (int, float, str, bool)) or value is None:
            rows.append([prefix, value])

    walk("", {key: value for key, value in result.items() if key != "machine"})
    return table(["figure", "value"], rows)


def _padding(entry: dict[str, Any], side: str) -> str:
    padded = entry.get(f"padded_tokens_{side}")
    return "–" if padded is None else f"{padded / entry['tokens']:.3f}"


def render_ingest(item: dict[str, Any]) -> str:
    chunking = item["chunking"]
    copies = item.get("copies", 1)
    corpus = f"{item['documents'] // copies:,} SciFact documents" + (f" x {copies} copies" if copies > 1 else "")
    head = (
        f"{corpus} ({item.get('abstracts_per_document', 1)} abstracts each), {item['model']}, batch size {item['batch_size']}, "
        f"max_seq_length {item['max_seq_length']}, {item['device']}; every run in a process of its own "
        f"(after a warm-up), {item['repeat']} interleaved rounds, median time and largest peak RSS.\n\n"
    )
    chunks = table(
        ["chunking", "chunks", "tokens the model sees"],
        [
            ["isotrope (TokenChunker 256/32 tokens)", chunking["isotrope"]["chunks"], chunking["isotrope"]["model_tokens"]],
            [
                "LlamaIndex (SentenceSplitter {chunk_size}/{chunk_overlap} tokens)".format(
                    **item.get("llamaindex_splitter", {"chunk_size": 1024, "chunk_overlap": 200})
                ),
                chunking["llamaindex"]["chunks"],
                chunking["llamaindex"]["model_tokens"],
            ],
        ],
    )
    sides = table(
        ["side", "chunks", "median s", "runs (s)", "model tokens/s", "peak RSS MB", "process wall s"],
        [
            [name, e["chunks"], e["median_s"], runs(e), e["model_tokens_per_s"], e["peak_rss_mb"], e["process_wall_s"]]
            for name, e in item["sides"].items()
        ],
    )
    ratios = table(
        [
            "store",
            "speedup (LlamaIndex s / isotrope s)",
            "peak RSS isotrope / LlamaIndex",
            "token throughput isotrope / LlamaIndex",
        ],
        [
            [store, f"{e['speedup']:.2f}x", e["peak_rss_ratio"], e["token_throughput_ratio"]]
            for store, e in item["ratios"].items()
        ],
    )
    stages = table(
        ["side", "stage", "peak RSS MB", "RSS before -> after MB"],
        [
            [name, stage, m.get("peak_rss_mb", "–"), f"{m['rss_before_mb']} -> {m['rss_after_mb']}"]
            for name, e in item["sides"].items()
            for stage, m in e.get("memory_stages", {}).items()
        ],
    )
    return "\n\n".join([head + chunks, sides, *([ratios] if item["ratios"] else []), stages])


def render_shaping(item: dict[str, Any]) -> str:
    rows = []
    for name, entry in item["sets"].items():
        for chain, timing in entry["chains"].items():
            rows.append(
                [
                    name,
                    entry["texts"],
                    chain,
                    entry["embed_raw"]["median_s"],
                    1000 * timing["median_s"],
                    f"{timing['share_pct']:.3f}",
                ]
            )
    head = f"Chains fitted on {item['fitted_on']}; share = apply / (embed_raw + apply).\n\n"
    return head + table(["texts", "n", "chain", "embed_raw s", "apply_transforms ms", "share %"], rows)


def render_static(item: dict[str, Any]) -> str:
    split = item["quality_split"]
    where = (
        f"a subset of SciFact test ({split['queries']} queries, {split['documents']:,} documents)"
        if split["subset"]
        else f"SciFact test ({split['queries']} queries, {split['documents']:,} documents)"
    )
    head = (
        f"Throughput on {item['throughput_docs']} abstracts, batch size {item['batch_size']}, median of "
        f"{item['repeat']}; quality on {where}; static encoders fitted on {item['fitted_on']}.\n\n"
    )
    rows = [
        [name, e["docs_per_s"], f"{e['ratio_to_transformer']:.1f}x", e["ndcg@10"], e["recall@100"]]
        for name, e in item["encoders"].items()
    ]
    return head + table(["encoder", "docs/s", "x transformer", "nDCG@10", "recall@100"], rows)


def render_search(item: dict[str, Any]) -> str:
    settings = ", ".join(f"{k} {v}" for k, v in item["settings"].items())
    head = (
        f"{item['queries']} queries per batch, {item['single_queries']} one at a time, k={item['k']}, "
        f"dim {item['dim']}, median of {item['repeat']}; {settings}.\n\n"
    )
    rows = []
    for library in ("faiss", "lancedb"):
        for n, indexes in item.get(library, {}).items():
            for index, e in indexes.items():
                rows.append(
                    [
                        library,
                        int(n),
                        index,
                        e["recall@10"],
                        e["batch"]["isotrope"]["queries_per_s"],
                        e["batch"]["bare"]["queries_per_s"],
                        f"{e['batch']['overhead_pct']:+.1f}",
                        e["single"]["isotrope"]["latency_ms"],
                        e["single"]["bare"]["latency_ms"],
                        f"{e['single']['overhead_pct']:+.1f}",
                        e["build_s"],
                    ]
                )
    return head + table(
        [
            "store",
            "n",
            "index",
            "recall@10",
            "isotrope q/s",
            "bare q/s",
            "batch overhead %",
            "isotrope ms/query",
            "bare ms/query",
            "single overhead %",
            "build s",
        ],
        rows,
    )


def render_quality(result: dict[str, Any]) -> str:
    return render_shaping(result["shaping"]) + "\n\n" + render_static(result["static"])


def _p50_p99(entry: dict[str, Any] | None) -> str:
    return "–" if not entry else f"{num(entry['p50_ms'])} / {num(entry['p99_ms'])}"


def render_scale(item: dict[str, Any]) -> str:
    """``benchmarks.scale``: indexing, each index type against the bare library, and the three text modes."""
    head = (
        f"{item['chunks']:,} passages ({item['passages']}); {item['queries']} queries per batch and "
        f"{item['single_queries']} one at a time, k={item['k']}; search in a process of its own, cold (the first "
        "queries after open).\n\n"
    )
    stores = item["stores"]
    indexing = table(
        ["store", "chunks", "indexing s", "chunks/s", "peak RSS MB", "disk bytes/chunk"],
        [
            [
                name,
                e["indexing"]["chunks"],
                e["indexing"]["index_wall_s"],
                e["indexing"]["chunks_per_s"],
                e["indexing"]["peak_rss_mb"],
                e["indexing"]["disk_bytes_per_chunk"],
            ]
            for name, e in stores.items()
        ],
    )
    indexes = table(
        ["store", "index", "recall@10", "ms/query isotrope", "ms/query bare", "overhead %", "batch ms isotrope / bare"],
        [
            [
                name,
                kind,
                e["recall_at_10"],
                e["p50_ms_single"],
                e["bare_p50_ms_single"],
                f"{e['overhead_pct_single']:+.1f}",
                f"{num(e['p50_ms_batch'])} / {num(e['bare_p50_ms_batch'])}",
            ]
            for name, store in stores.items()
            for kind, e in store["search"].items()
            if isinstance(e, dict) and "recall_at_10" in e
        ],
    )
    modes = [(name, store["search"]["text_modes"]) for name, store in stores.items() if "text_modes" in store["search"]]
    if not modes:
        return head + indexing + "\n\n" + indexes
    text = table(
        [
            "store",
            "dense p50 / p99 ms",
            "keyword",
            "keyword, bare engine",
            "hybrid",
            "hybrid / dense p50",
            "hybrid, two passes",
            "engine's own hybrid",
        ],
        [
            [
                name,
                _p50_p99(m.get("dense")),
                _p50_p99(m.get("keyword")),
                _p50_p99(m.get("keyword_bare")),
                _p50_p99(m.get("hybrid")),
                f"{m['hybrid']['p50_ms'] / m['dense']['p50_ms']:.2f}x" if "hybrid" in m and "dense" in m else "–",
                _p50_p99(m.get("hybrid_two_pass")),
                _p50_p99(m.get("hybrid_bare")),
            ]
            for name, m in modes
        ],
    )
    return (
        head
        + indexing
        + "\n\n"
        + indexes
        + "\n\nThrough `Collection.search` with text queries (the store's default index):\n\n"
        + text
    )


def scale_provenance(document: dict[str, Any]) -> str:
    """One line for a ``benchmarks.scale`` result: command, machine, the load each child started at, others' CPU."""
    machine, stores = document["machine"], document["stores"].values()
    starts = [s["indexing"]["load_average_before_after"][0] for s in stores] + [
        s["search"]["load_average_at_start"][0] for s in stores
    ]
    shares = [s[step]["others_cpu_share"] for s in stores for step in ("indexing", "search") if "others_cpu_share" in s[step]]
    return (
        f"`{document['command']}` on {machine['cpu']} ({machine['usable_cores']} cores, {machine['ram_gb']} GB), "
        f"children started at load {min(starts):.2f}–{max(starts):.2f}"
        + (f", other processes ≤ {100 * max(shares):.1f} % of the CPU" if shares else "")
        + f", {machine['threads']} indexing threads / {machine['search_threads']} search thread, "
        f"commit {machine['git_commit']}, {document['started'][:10]}"
    )


def _index_built(info: dict[str, Any]) -> str:
    if "nprobe" in info and "ef" not in info:
        return f"{info['index_built']}, nprobe {info['nprobe']}"
    graphs = f" ({info['num_partitions']} graphs)" if info.get("num_partitions", 1) > 1 else ""
    return f"{info['index_built']}{graphs}, ef {info['ef']}, refine ×{info['refine']}"


def _scale_column(store: dict[str, Any]) -> list[str]:
    """One store's cells of :func:`render_scale_modes` (the auto index; others in the last row)."""
    indexing, search = store["indexing"], store["search"]
    auto, modes = search["auto"], search.get("text_modes", {})
    dense, hybrid = modes.get("dense"), modes.get("hybrid")
    keyword = _p50_p99(modes.get("keyword"))
    if modes.get("keyword_bare"):
        keyword += f" ({_p50_p99(modes['keyword_bare'])})"
    others = [
        f"{e.get('index_built', kind)}: {e['recall_at_10']:.3f}, {num(e['p50_ms_single'])} ms"
        for kind, e in search.items()
        if kind != "auto" and isinstance(e, dict) and "recall_at_10" in e
    ]
    return [
        f"{indexing['chunks']:,}",
        f"{indexing['index_wall_s'] / 60:.1f} min" if indexing["index_wall_s"] >= 120 else f"{indexing['index_wall_s']:.1f} s",
        f"{indexing['peak_rss_mb'] / 1000:.2f} GB",
        f"{indexing['disk_bytes_per_chunk']:,.0f} B",
        _index_built(search["auto_index"]),
        f"{auto['recall_at_10']:.3f} ({auto['bare_recall_at_10']:.3f})",
        f"{num(auto['p50_ms_single'])} / {num(auto['p99_ms_single'])} ({num(auto['bare_p50_ms_single'])})",
        num(auto.get("p50_ms_single_with_encode") or search.get("p50_ms_single_with_encode_auto")),
        _p50_p99(dense),
        keyword,
        f"{_p50_p99(hybrid)}: {hybrid['p50_ms'] / dense['p50_ms']:.2f}× dense" if hybrid and dense else "–",
        _p50_p99(modes.get("hybrid_two_pass")),
        _p50_p99(modes.get("hybrid_bare")),
        "; ".join(others) or "–",
    ]


#: the rows of :func:`render_scale_modes`
SCALE_ROWS = (
    "chunks",
    "indexing wall, keyword index included",
    "indexing peak RSS",
    "disk per chunk",
    "auto index, breadth calibrated at build on pseudo-queries",
    "dense recall@10, 200 real queries (bare library)",
    "dense p50 / p99 ms, query vector → hits (bare library p50)",
    "dense p50 ms, query text → hits, encoding included",
    'dense p50 / p99 ms, `Collection.search(text, mode="dense")`, cold',
    "keyword p50 / p99 ms, cold (bare engine)",
    "hybrid p50 / p99 ms, cold",
    "hybrid, the former two-pass path",
    "LanceDB's own hybrid (RRF)",
    "other index types: recall@10, p50",
)


def render_scale_modes(documents: list[dict[str, Any]]) -> str:
    """``benchmarks.scale`` results (one store or more each) side by side, a column per store, each with its
    provenance line; a loaded result is refused."""
    for document in documents:
        if document.get("loaded"):
            raise LoadedResultError(f"`{document['command']}` ran on a loaded machine: re-run it idle; never cited")
    stores = {name: store for document in documents for name, store in document["stores"].items()}
    columns = [_scale_column(store) for store in stores.values()]
    lines = "\n".join(f"- Measured with {scale_provenance(document)}." for document in documents)
    rows = [[row, *(column[i] for column in columns)] for i, row in enumerate(SCALE_ROWS)]
    return lines + "\n\n" + table(["", *(STORE_NAMES.get(name, name) for name in stores)], rows)


def render_cold(result: dict[str, Any]) -> str:
    head = (
        f"`isotrope search STORE QUERY -k 3` in a fresh process, stores of {result['documents']:,} SciFact abstracts "
        f"written by `isotrope index`; median of {result['rounds']} rotating rounds (spread = (max - min) / median), "
        "largest peak RSS."
    )
    if result.get("untimed_first"):
        head += " Each command ran once untimed first (bytecode written, files in the page cache)."
    header = ["process (store, encoder)", "wall s", "spread", "peak RSS MB"]
    rows = [[name, e["median_s"], f"{e['spread']:.2f}", e["peak_rss_mb"]] for name, e in result["processes"].items()]
    if "warm_queries" in result:  # one query on the open store too
        head += f" Warm: the median of {result['warm_queries']} queries one at a time on the store opened in one process."
        header.append("warm query ms")
        rows = [[*row, e.get("warm_query_ms", "–")] for row, e in zip(rows, result["processes"].values())]
    return head + "\n\n" + table(header, rows)


def render_search_topic(result: dict[str, Any]) -> str:
    parts = [render_search(result["synthetic"])]
    if "scale" in result:
        parts.append(render_scale(result["scale"]))
    return "\n\n".join(parts)


#: NAME -> (result topic, renderer of its "result")
SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "encode": ("encode", render_encode),
    "ingest": ("ingest", render_ingest),
    "ingest-100k-fast": ("ingest-100k-fast", render_ingest),
    "ingest-24k": ("ingest-24k", render_ingest),
    "ingest-100k": ("ingest-100k", render_ingest),
    "search": ("search", render_search_topic),
    "cold": ("cold", render_cold),
    "hybrid": ("hybrid", render_flat),
    "serve": ("serve", render_flat),
    "quality": ("quality", render_quality),
}


#: NAME -> the ``benchmarks.scale`` result files (``benchmarks/results/STEM.json``) shown side by side
SCALE_SECTIONS: dict[str, tuple[str, ...]] = {
    "scale-1m": ("scale-1m-faiss-modes", "scale-1m-lancedb-modes"),
    "scale-100k": ("scale-100k-modes",),
    "scale-1m-epyc": ("scale-1m-faiss-modes-epyc", "scale-1m-lancedb-modes-epyc"),
    "scale-100k-epyc": ("scale-100k-modes-epyc",),
}
STORE_NAMES = {"faiss": "FAISS", "lancedb": "LanceDB"}


def render_topic(document: dict[str, Any], name: str | None = None, show_loaded: bool = False) -> str:
    """A result document's table(s) with its provenance line; LoadedResultError for a loaded result
    (``show_loaded``: rendered with a warning instead, for the terminal)."""
    topic = document["topic"]
    warning = ""
    if document.get("loaded") and show_loaded:
        warning = "LOADED RUN: not citable (the load rule was waived with --allow-loaded).\n\n"
    elif document.get("loaded"):
        raise LoadedResultError(
            f"benchmarks/results/{topic}.json was measured at load {document['load_average_before'][0]:.2f} "
            "(loaded): re-run it on an idle machine; a loaded result is never cited"
        )
    renderer = SECTIONS[name or topic][1]
    return f"{warning}Measured with {provenance(document)}.\n\n{renderer(document['result'])}"


def render_section(name: str, results_dir: Path = RESULTS_DIR) -> str:
    if name in SCALE_SECTIONS:
        paths = [results_dir / f"{stem}.json" for stem in SCALE_SECTIONS[name]]
        if not all(path.is_file() for path in paths):
            return (
                f"Not measured under the load rule yet: {', '.join(path.name for path in paths if not path.is_file())} missing."
            )
        return render_scale_modes([json.loads(path.read_text()) for path in paths])
    if name not in SECTIONS:
        raise KeyError(f"unknown benchmark table {name!r}; known: {', '.join([*SECTIONS, *SCALE_SECTIONS])}")
    topic = SECTIONS[name][0]
    path = results_dir / f"{topic}.json"
    if not path.is_file():
        return (
            f"Not measured under the load rule yet: run `python -m benchmarks {topic} --quick|--full --data-dir DATA` on an idle "
            "machine, then `python -m benchmarks render`."
        )
    return render_topic(json.loads(path.read_text()), name)


def rendered_text(text: str, results_dir: Path = RESULTS_DIR) -> str:
    """``text`` with every marked block replaced by its rendering."""
    return MARKER.sub(lambda m: f"{m.group(1)}{render_section(m.group('name'), results_dir)}\n{m.group(4)}", text)


def main(check: bool = False, root: Path = REPO_ROOT, results_dir: Path = RESULTS_DIR) -> int:
    """Rewrite (or with ``check``, compare) every marked table; 1 when ``check`` finds a stale one."""
    stale = []
    for path in sorted({path for pattern in DOCUMENTS for path in root.glob(pattern) if path.is_file()}):
        relative = str(path.relative_to(root))
        text = path.read_text()
        try:
            new = rendered_text(text, results_dir)
        except (LoadedResultError, KeyError) as error:
            print(f"error: {relative}: {error}", file=sys.stderr)
            return 2
        if new == text:
            continue
        if check:
            stale.append(relative)
        else:
            path.write_text(new)
            print(f"rendered {relative}")
    if stale:
        print(f"stale benchmark tables in {', '.join(stale)}: run python -m benchmarks render", file=sys.stderr)
        return 1
    return 0
