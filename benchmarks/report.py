"""Render a results JSON as Markdown tables, and check the issue's targets.

    python -m benchmarks.report results.json                          # print the Markdown
    python -m benchmarks.report results.json --update docs/BENCHMARKS.md

``--update`` replaces what lies between ``<!-- results:start -->`` and ``<!-- results:end -->``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

START, END = "<!-- results:start -->", "<!-- results:end -->"
#: the issue's "done when" figures
TARGETS = {
    "encode_speedup": 1.2,
    "ingest_speedup": 3.0,
    "ingest_rss_ratio": 1.0,
    "shaping_share_pct": 3.0,
    "search_overhead_pct": 10.0,
    "static_ratio": 50.0,
    "fit_memory_growth": 1.25,
}


# -- targets ------------------------------------------------------------------------
def _ok(item: Any) -> bool:
    return isinstance(item, dict) and "error" not in item and "skipped" not in item


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per checked figure: what, the goal, the measured value and whether it is met."""
    items, rows = results.get("items", {}), []

    def add(what: str, goal: str, value: float | None, met: bool | None) -> None:
        rows.append({"what": what, "goal": goal, "measured": value, "met": met})

    if _ok(encode := items.get("encode")):
        for name, entry in encode["sets"].items():
            add(
                f"encode speedup vs sentence-transformers, {name}",
                f">= {TARGETS['encode_speedup']}x",
                entry["speedup"],
                entry["speedup"] >= TARGETS["encode_speedup"],
            )
    if _ok(ingest := items.get("ingest")):
        for store, entry in ingest["ratios"].items():
            add(
                f"ingestion speedup vs LlamaIndex, {store}",
                f">= {TARGETS['ingest_speedup']}x",
                entry["speedup"],
                entry["speedup"] >= TARGETS["ingest_speedup"],
            )
            add(
                f"ingestion peak RSS isotrope / LlamaIndex, {store}",
                f"<= {TARGETS['ingest_rss_ratio']}",
                entry["peak_rss_ratio"],
                entry["peak_rss_ratio"] <= TARGETS["ingest_rss_ratio"],
            )
    if _ok(shaping := items.get("shaping")):
        chain = shaping["target_chain"]
        for name, entry in shaping["sets"].items():
            share = entry["chains"][chain]["share_pct"]
            add(
                f"shaping share of encode time ({chain}), {name}",
                f"<= {TARGETS['shaping_share_pct']} %",
                share,
                share <= TARGETS["shaping_share_pct"],
            )
    if _ok(search := items.get("search")):
        for library in ("faiss", "lancedb"):
            for n, indexes in search[library].items():
                for index, entry in indexes.items():
                    for mode in ("batch", "single"):
                        overhead = entry[mode]["overhead_pct"]
                        add(
                            f"search overhead, {library} {index} n={n}, {mode} queries",
                            f"<= {TARGETS['search_overhead_pct']} %",
                            overhead,
                            overhead <= TARGETS["search_overhead_pct"],
                        )
    if _ok(static := items.get("static")):
        for name, entry in static["encoders"].items():
            if name != static["transformer"]:
                add(
                    f"static docs/s vs transformer, {name}",
                    f">= {TARGETS['static_ratio']}x",
                    entry["ratio_to_transformer"],
                    entry["ratio_to_transformer"] >= TARGETS["static_ratio"],
                )
    if _ok(fitting := items.get("fitting")):
        small, large = fitting["sizes"][0], fitting["sizes"][-1]
        for method in ("whiten-stream", "quantile-stream"):
            growth = fitting["methods"][method]["memory_growth"]
            add(
                f"fit memory growth n={large:,} / n={small:,}, {method}",
                f"<= {TARGETS['fit_memory_growth']}",
                growth,
                growth <= TARGETS["fit_memory_growth"],
            )
    return rows


# -- formatting ---------------------------------------------------------------------
def num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
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
    return ", ".join(f"{t:.3g}" for t in entry.get("runs_s", []))


# -- one section per item -----------------------------------------------------------
def render_machine(results: dict[str, Any]) -> str:
    machine = results["machine"]
    versions = ", ".join(f"{name} {version}" for name, version in machine["libraries"].items())
    load = machine["load_average_at_start"], machine.get("load_average_at_end")
    busy = max(load[0][0], (load[1] or [0])[0]) > machine["usable_cores"]
    lines = [
        f"- command: `{results['command']}` ({results['mode']} mode, {results.get('total_seconds', '?')} s in all, "
        f"{results.get('cpu_seconds', '?')} CPU s)",
        f"- started: {results['started']}, commit {machine.get('git_commit')}",
        f"- CPU: {machine['cpu']}, {machine['usable_cores']} usable of {machine['logical_cores']} logical cores, "
        f"{machine['ram_gb']} GB RAM, {machine['threads']} threads; GPU: {machine['gpu'] or 'none'}",
        f"- load average (1, 5, 15 min) at start {load[0]}, at end {load[1]}",
        f"- Python {machine['python']} on {machine['platform']}",
        f"- {versions}",
    ]
    if busy:
        lines.append(
            "- **the machine was busy** (load average above the core count): other work shared the "
            "cores, so absolute figures are low and noisy; ratios are less affected (interleaved runs)"
        )
    return "\n".join(lines)


def render_targets(rows: list[dict[str, Any]]) -> str:
    mark = {True: "yes", False: "**no**", None: "–"}
    return table(
        ["figure", "goal", "measured", "met"], [[row["what"], row["goal"], row["measured"], mark[row["met"]]] for row in rows]
    )


def render_encode(item: dict[str, Any]) -> str:
    head = (
        f"{item['model']}, batch size {item['batch_size']}, max_seq_length {item['max_seq_length']}, "
        f"{item['device']} {item['dtype']}, median of {item['repeat']} after a warm-up.\n\n"
    )
    rows = [
        [
            name,
            e["texts"],
            e["tokens"],
            _padding(e, "isotrope"),
            _padding(e, "sentence_transformers"),
            e["isotrope"]["texts_per_s"],
            e["sentence_transformers"]["texts_per_s"],
            f"{e['speedup']:.2f}x",
            f"{e['max_abs_diff']:.1e}",
            runs(e["isotrope"]),
            runs(e["sentence_transformers"]),
        ]
        for name, e in item["sets"].items()
    ]
    return head + table(
        [
            "texts",
            "n",
            "tokens",
            "isotrope padded/real",
            "s-t padded/real",
            "isotrope texts/s",
            "sentence-transformers texts/s",
            "speedup",
            "max abs diff",
            "isotrope runs (s)",
            "s-t runs (s)",
        ],
        rows,
    )


def _padding(entry: dict[str, Any], side: str) -> str:
    padded = entry.get(f"padded_tokens_{side}")
    return "–" if padded is None else f"{padded / entry['tokens']:.3f}"


def render_ingest(item: dict[str, Any]) -> str:
    chunking = item["chunking"]
    head = (
        f"{item['documents']:,} SciFact documents, {item['model']}, batch size {item['batch_size']}, "
        f"max_seq_length {item['max_seq_length']}, {item['device']}; every run in a process of its own "
        f"(after a warm-up), {item['repeat']} interleaved rounds, median time and largest peak RSS.\n\n"
    )
    chunks = table(
        ["chunking", "chunks", "tokens the model sees"],
        [
            ["isotrope (TokenChunker 256/32 tokens)", chunking["isotrope"]["chunks"], chunking["isotrope"]["model_tokens"]],
            [
                "LlamaIndex (SentenceSplitter 1024/200, default)",
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
    return "\n\n".join([head + chunks, sides, ratios])


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


def render_fitting(item: dict[str, Any]) -> str:
    rows = []
    for method, entry in item["methods"].items():
        for n in item["sizes"]:
            e = entry[str(n)]
            rows.append([method, n, e["fit_s"], e["peak_delta_mb"], e["input_mb"]])
        rows.append([method, "growth", "", f"{entry['memory_growth']:.2f}x", ""])
    head = (
        f"dim {item['dim']}, blocks of {item['block_rows']:,} rows, quantile subsample {item['subsample']:,}; "
        "peak delta = peak RSS minus RSS before the data, one process per row.\n\n"
    )
    return head + table(["method", "n", "fit s", "peak delta MB", "input MB"], rows)


def render_gpu(item: dict[str, Any]) -> str:
    parts = [f"Device: {item['device']}."]
    for name, render in (("encode", render_encode), ("ingest", render_ingest), ("search", render_search)):
        entry = item.get(name)
        parts.append(f"#### GPU {name}\n\n" + (render(entry) if _ok(entry) else f"Not run: {_why(entry)}"))
    return "\n\n".join(parts)


def _why(item: Any) -> str:
    if isinstance(item, dict):
        return item.get("skipped") or item.get("error") or "no result"
    return "no result"


SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "encode": ("1. Encode throughput", render_encode),
    "ingest": ("2. Ingestion end to end", render_ingest),
    "shaping": ("3. Shaping overhead", render_shaping),
    "static": ("4. Static encoders vs the transformer", render_static),
    "search": ("5. Search", render_search),
    "fitting": ("6. Fitting", render_fitting),
    "gpu": ("7. GPU", render_gpu),
}


def render(results: dict[str, Any]) -> str:
    """The whole results section: machine, targets, then one subsection per item."""
    parts = ["### Machine and run\n\n" + render_machine(results)]
    parts.append("### Targets\n\n" + render_targets(results.get("targets") or check_targets(results)))
    for name, (title, renderer) in SECTIONS.items():
        if name in results["items"]:
            item = results["items"][name]
            body = renderer(item) if _ok(item) else f"Not run: {_why(item)}"
            parts.append(f"### {title}\n\n{body}")
    return "\n\n".join(parts) + "\n"


def update_document(path: Path, markdown: str) -> None:
    text = path.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{path} has no {START} ... {END} markers to replace")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{START}\n\n{markdown}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description="Results JSON -> Markdown.")
    parser.add_argument("results", type=Path)
    parser.add_argument("--update", type=Path, help="replace the results section of this Markdown file")
    args = parser.parse_args(argv)
    markdown = render(json.loads(args.results.read_text(encoding="utf-8")))
    if args.update:
        update_document(args.update, markdown)
    else:
        sys.stdout.write(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
