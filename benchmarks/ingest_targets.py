"""Ingestion against LlamaIndex at equal text embedded: the transformer on each backend (issue 20)
and ``--model fast`` at 10k-100k chunks (issue 16).

Both sides read the same JSON-lines file of passages from the general English corpus, each short
enough (at most ``MAX_PASSAGE_TOKENS`` word pieces) that neither side's chunker splits it: isotrope's
``TokenChunker`` (256 tokens) and LlamaIndex's ``SentenceSplitter`` (1,024 tiktoken tokens) both make
one chunk per passage, and :func:`chunkings` checks that their chunk texts are identical, so both
embed the same text. LlamaIndex: ``VectorStoreIndex.from_documents`` with
``HuggingFaceEmbedding(all-MiniLM-L6-v2)`` into ``FaissVectorStore(IndexFlatIP)``, persisted.
isotrope: ``index_documents`` into a ``faiss:`` store with a ``Flat`` index (the same exact index).
Every timed run is a process of its own (``benchmarks.ingest``'s child: warm-up, then the timed
ingestion loading its model anew; peak RSS = the process's VmHWM); sides run in interleaved rounds.

    # issue 20: the transformer, each backend, vs LlamaIndex (same chunks)
    python -m benchmarks.ingest_targets transformer --data-dir ../shared/data --chunks 2000 --repeat 2 \\
        --out benchmarks/results/ingest_transformer.json
    # issue 16: --model fast end to end and with a saved encoder; LlamaIndex measured at the small sizes
    python -m benchmarks.ingest_targets fast --data-dir ../shared/data --sizes 10000,100000 \\
        --llamaindex-sizes 2000,10000 --out benchmarks/results/ingest_fast.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, machine_info, print_and_write, ratio, run_child
from benchmarks.ingest import BATCH_SIZE, merge_runs, read_records

logger = logging.getLogger(__name__)

SENTENCES = "corpus/general_english_sentences.txt.gz"
#: word pieces (without [CLS]/[SEP]) a passage may have: the model then sees all of it, and neither chunker splits it
MAX_PASSAGE_TOKENS = MAX_SEQ_LENGTH - 2
BACKENDS = ("torch", "onnx", "onnx-int8", "onnx-int8-per-channel")
LLAMAINDEX = "llamaindex-faiss"
#: the isotrope sides of ``fast``: end to end (teacher pass included), and with the saved encoder
FAST_SIDES = ("isotrope-fast", "isotrope-fast-encoder")
#: every finished run is also appended here (JSON lines), so a long run that is stopped leaves its measurements
PARTIAL: Path | None = None


# -- the corpus -------------------------------------------------------------------------
def read_sentences(data_dir: str | Path) -> list[str]:
    path = Path(data_dir) / SENTENCES
    if not path.is_file():
        raise FileNotFoundError(f"no general English corpus at {path} (pass the data root as --data-dir)")
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [" ".join(line.split()) for line in handle if line.strip()]


def write_passages(sentences: list[str], path: Path, count: int, window: int) -> int:
    """The first ``count`` disjoint windows of ``window`` lines that fit the model whole, as JSON lines
    ``{"_id", "text"}``; longer windows are skipped. Returns how many were written."""
    from transformers import AutoTokenizer

    from benchmarks.encode import model_path

    tokenizer = AutoTokenizer.from_pretrained(model_path())
    written = 0
    with open(path, "w", encoding="utf-8") as handle:
        for begin in range(0, len(sentences) - window + 1, 4096 * window):
            texts = [
                " ".join(sentences[start : start + window])
                for start in range(begin, min(begin + 4096 * window, len(sentences) - window + 1), window)
            ]
            lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
            for offset, (text, length) in enumerate(zip(texts, lengths)):
                if length <= MAX_PASSAGE_TOKENS and written < count:
                    handle.write(json.dumps({"_id": f"w{window}-{begin // window + offset}", "text": text}) + "\n")
                    written += 1
            if written >= count:
                return written
    raise ValueError(f"the corpus has only {written} windows of {window} lines under {MAX_PASSAGE_TOKENS} tokens")


def chunkings(corpus: Path) -> dict[str, Any]:
    """Each side's chunking of ``corpus`` (as its ingestion does it): chunk count, tokens the model
    sees per chunk, and how many chunk texts the two sides share."""
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import MetadataMode
    from transformers import AutoTokenizer

    from benchmarks.encode import model_path
    from isotrope.ingest.chunking import TokenChunker
    from isotrope.ingest.loaders import iter_documents

    tokenizer = AutoTokenizer.from_pretrained(model_path())
    chunker = TokenChunker(tokenizer, 256, 32)  # index_documents' defaults
    texts = {"isotrope": [chunk.text for document in iter_documents(corpus, id_field="_id") for chunk in chunker.chunk(document)]}
    nodes = SentenceSplitter().get_nodes_from_documents(
        [Document(text=record["text"], id_=record["_id"]) for record in read_records(corpus)]
    )
    texts["llamaindex"] = [node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]
    result: dict[str, Any] = {
        "isotrope_chunker": "TokenChunker 256/32 word pieces (index_documents' default)",
        "llamaindex_chunker": "SentenceSplitter 1024/200 tiktoken tokens (default)",
    }
    for side, side_texts in texts.items():
        lengths = [len(ids) for ids in tokenizer(side_texts, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]]
        result[side] = {
            "chunks": len(side_texts),
            "model_tokens": sum(lengths),
            "tokens_per_chunk": {
                "mean": round(statistics.mean(lengths), 1),
                "median": statistics.median(lengths),
                "min": min(lengths),
                "max": max(lengths),
            },
        }
    result["identical_chunk_texts"] = sum(a == b for a, b in zip(sorted(texts["isotrope"]), sorted(texts["llamaindex"])))
    return result


# -- running the sides ------------------------------------------------------------------
def run_rounds(
    sides: dict[str, list[str]], corpus: Path, repeat: int, threads: int, batch_size: int
) -> dict[str, dict[str, Any]]:
    """Every side ``repeat`` times, each run a process of its own, in rounds of rotating order."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    names = list(sides)
    for round_index in range(repeat):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            side = LLAMAINDEX if name.startswith("llamaindex") else "isotrope-faiss"
            args = ["--side", side, "--corpus", str(corpus), "--repeat", "1", "--batch-size", str(batch_size), *sides[name]]
            if side != LLAMAINDEX:
                args += ["--index", "flat"]
            runs[name].append(run_child("benchmarks.ingest", args, threads))
            if PARTIAL:
                with open(PARTIAL, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps({"corpus": corpus.name, "name": name, **runs[name][-1]}) + "\n")
            logger.info(
                "%s, %s round %d: %.1f s, peak RSS %.0f MB",
                corpus.name,
                name,
                round_index + 1,
                runs[name][-1]["median_s"],
                runs[name][-1]["peak_rss_mb"],
            )
    return {name: merge_runs(entries) for name, entries in runs.items()}


def transformer(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 20: the transformer on each backend vs LlamaIndex, same chunks."""
    with tempfile.TemporaryDirectory(prefix="isotrope-ingest-", dir=args.workdir) as tmp:
        corpus = Path(tmp) / "passages.jsonl"
        count = write_passages(read_sentences(args.data_dir), corpus, args.chunks, args.window)
        result: dict[str, Any] = {
            "passages": count,
            "window_lines": args.window,
            "model": MODEL,
            "batch_size": args.batch_size,
            "repeat": args.repeat,
            "chunking": chunkings(corpus),
        }
        sides = {LLAMAINDEX: []} | {f"isotrope-{backend}": ["--backend", backend] for backend in args.backends}
        result["sides"] = run_rounds(sides, corpus, args.repeat, args.threads, args.batch_size)
    theirs = result["sides"][LLAMAINDEX]
    result["ratios"] = {
        name: {
            "speedup": ratio(theirs["median_s"], entry["median_s"]),
            "peak_rss_ratio": ratio(entry["peak_rss_mb"], theirs["peak_rss_mb"]),
        }
        for name, entry in result["sides"].items()
        if name != LLAMAINDEX
    }
    return result


def transformer_from_partial(partial: Path, corpus: Path, command: str) -> dict[str, Any]:
    """A ``transformer`` result from the runs a stopped command had finished (its ``.partial.jsonl``)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for line in partial.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        runs.setdefault(record.pop("name"), []).append(record)
    sides = {name: merge_runs(entries) for name, entries in runs.items()}
    theirs = sides[LLAMAINDEX]
    return {
        "command": command,
        "stopped_early": f"built from {partial.name}: the runs finished before it was stopped",
        "passages": theirs["documents"],
        "model": MODEL,
        "chunking": chunkings(corpus),
        "sides": sides,
        "ratios": {
            name: {
                "speedup": ratio(theirs["median_s"], entry["median_s"]),
                "peak_rss_ratio": ratio(entry["peak_rss_mb"], theirs["peak_rss_mb"]),
            }
            for name, entry in sides.items()
            if name != LLAMAINDEX
        },
    }


def fast(args: argparse.Namespace) -> dict[str, Any]:
    """Issue 16: ``--model fast`` end to end (at ``end_to_end_sizes``; the largest run's encoder is
    kept), then that saved encoder (``--encoder``) at every size, then LlamaIndex at the sizes it can
    be run at, its per-chunk rate projected linearly to the others."""
    sentences = read_sentences(args.data_dir)
    result: dict[str, Any] = {
        "window_lines": 1,
        "model": "fast (teacher all-MiniLM-L6-v2)",
        "llamaindex_model": MODEL,
        "batch_size": args.batch_size,
        "repeat": args.repeat,
        "sizes": {},
    }
    with tempfile.TemporaryDirectory(prefix="isotrope-ingest-", dir=args.workdir) as tmp:
        largest = max(args.sizes + args.llamaindex_sizes + args.end_to_end_sizes)
        corpus = Path(tmp) / f"lines-{largest}.jsonl"
        write_passages(sentences, corpus, largest, 1)
        encoder = Path(tmp) / "fast-encoder"
        result["encoder_fitted_on"] = (
            f"the {max(args.end_to_end_sizes):,} lines of the largest end-to-end run (the encoder that run saved in its store)"
        )
        plan = (
            [(size, "isotrope-fast") for size in sorted(args.end_to_end_sizes, reverse=True)]
            + [(size, "isotrope-fast-encoder") for size in sorted(args.sizes, reverse=True)]
            + [(size, LLAMAINDEX) for size in sorted(args.llamaindex_sizes)]
        )
        for size, name in plan:
            part = corpus if size == largest else Path(tmp) / f"lines-{size}.jsonl"
            if not part.exists():
                with open(corpus, encoding="utf-8") as source, open(part, "w", encoding="utf-8") as target:
                    target.writelines(line for _, line in zip(range(size), source))
            entry = result["sizes"].setdefault(str(size), {"sides": {}})
            if "chunking" not in entry and size <= args.check_chunking_up_to:
                entry["chunking"] = chunkings(part)
            if name == "isotrope-fast":
                side_args = ["--model", "fast"] + (["--keep-encoder", str(encoder)] if size == largest else [])
            else:
                side_args = ["--encoder", str(encoder)] if name == "isotrope-fast-encoder" else []
            entry["sides"].update(run_rounds({name: side_args}, part, args.repeat, args.threads, args.batch_size))
    result["projection"] = project(result["sizes"], sorted({*args.sizes, *args.end_to_end_sizes, 1_000_000}))
    return result


def project(sizes: dict[str, Any], targets: list[int]) -> dict[str, Any]:
    """LlamaIndex's time at each size in ``targets``: its per-chunk rate at the largest size it was
    measured at, times the size (linear; also the line through its two largest sizes). isotrope's
    at a size it was not run at: the line through its two largest sizes. Speedups against those."""

    def measured(side: str) -> list[tuple[int, float, float]]:
        return sorted(
            (int(size), entry["sides"][side]["median_s"], entry["sides"][side]["peak_rss_mb"])
            for size, entry in sizes.items()
            if side in entry["sides"]
        )

    def line(points: list[tuple[int, float, float]], size: int) -> float | None:
        if len(points) < 2:
            return None
        (n0, t0, _), (n1, t1, _) = points[-2], points[-1]
        return t1 + (t1 - t0) / (n1 - n0) * (size - n1)

    llama = measured(LLAMAINDEX)
    largest_n, largest_t, largest_rss = llama[-1]
    result: dict[str, Any] = {
        "llamaindex_measured_up_to": largest_n,
        "llamaindex_s_per_chunk": largest_t / largest_n,
        "llamaindex_peak_rss_mb_at_largest": largest_rss,
        "sizes": {},
    }
    for size in targets:
        row: dict[str, Any] = {
            "llamaindex_s": largest_t / largest_n * size,
            "llamaindex_s_line": line(llama, size),
            "llamaindex": "measured" if size == largest_n else "projected",
        }
        for side in FAST_SIDES:
            points = measured(side)
            at = {n: (t, rss) for n, t, rss in points}
            seconds = at[size][0] if size in at else line(points, size)
            row[side] = {
                "s": seconds,
                "how": "measured" if size in at else "projected",
                "speedup": ratio(row["llamaindex_s"], seconds) if seconds else None,
                "peak_rss_mb": at[size][1] if size in at else None,
            }
            if size in at:
                row[side]["peak_rss_vs_llamaindex_at_largest"] = ratio(at[size][1], largest_rss)
        result["sizes"][str(size)] = row
    return result


# -- Markdown ---------------------------------------------------------------------------
def chunking_table(chunking: dict[str, Any]) -> list[str]:
    lines = ["| chunking | chunks | tokens the model sees | tokens per chunk: mean / median / min / max |", "|---|---:|---:|---|"]
    for side, chunker in (("isotrope", "isotrope_chunker"), ("llamaindex", "llamaindex_chunker")):
        entry, per = chunking[side], chunking[side]["tokens_per_chunk"]
        lines.append(
            f"| {side}: {chunking[chunker]} | {entry['chunks']:,} | {entry['model_tokens']:,} | "
            f"{per['mean']} / {per['median']} / {per['min']} / {per['max']} |"
        )
    lines.append(f"\nIdentical chunk texts on both sides: {chunking['identical_chunk_texts']:,}.")
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The tables of a ``transformer`` or ``fast`` result."""
    machine = result["machine"]

    def load(value: Any) -> Any:
        return value[0] if isinstance(value, list) else value

    lines = [
        f"`{result['command']}`: {machine['cpu']}, {machine['usable_cores']} cores, {machine['threads']} threads; "
        f"load average {load(machine['load_average_at_start'])} at the start, "
        f"{load(machine.get('load_average_at_end', '?'))} at the end; {result['wall_s'] / 60:.0f} min in all.",
        "",
    ]
    if "sides" in result:  # transformer
        lines += [
            *chunking_table(result["chunking"]),
            "",
            "| side | median s | runs s | chunks/s | x LlamaIndex | peak RSS MB | RSS / LlamaIndex |",
            "|---|---:|---|---:|---:|---:|---:|",
        ]
        for name, entry in result["sides"].items():
            ratios = result["ratios"].get(name, {"speedup": 1.0, "peak_rss_ratio": 1.0})
            lines.append(
                f"| {name} | {entry['median_s']:.1f} | {', '.join(f'{t:.1f}' for t in entry['runs_s'])} | "
                f"{entry['chunks'] / entry['median_s']:.1f} | **{ratios['speedup']:.2f}** | "
                f"{entry['peak_rss_mb']:,.0f} | {ratios['peak_rss_ratio']:.2f} |"
            )
        return "\n".join(lines)
    lines += [
        "| chunks | side | median s | runs s | steps s (fit / embed / write) | chunks/s | peak RSS MB |",
        "|---:|---|---:|---|---|---:|---:|",
    ]
    for size, entry in result["sizes"].items():
        for name, side in entry["sides"].items():
            steps = side.get("steps_s", [{}])[-1]
            step_text = " / ".join(f"{steps[k]:.1f}" for k in ("fit", "embed", "write") if k in steps)
            lines.append(
                f"| {int(size):,} | {name} | {side['median_s']:.1f} | {', '.join(f'{t:.1f}' for t in side['runs_s'])} "
                f"| {step_text} | {side['chunks'] / side['median_s']:,.0f} | {side['peak_rss_mb']:,.0f} |"
            )
    projection = result["projection"]
    lines += [
        "",
        "| chunks | LlamaIndex s | isotrope fast s | x LlamaIndex | isotrope fast + saved encoder s | x LlamaIndex |",
        "|---:|---|---|---:|---|---:|",
    ]
    for size, row in projection["sizes"].items():
        cells = [f"{row['llamaindex_s']:,.0f} ({row['llamaindex']})"]
        for side in FAST_SIDES:
            entry = row[side]
            cells += ["–", "–"] if entry["s"] is None else [f"{entry['s']:,.1f} ({entry['how']})", f"**{entry['speedup']:.1f}**"]
        lines.append(f"| {int(size):,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("table", help="print the Markdown tables of result files").add_argument("results", nargs="+", type=Path)
    for name in ("transformer", "fast"):
        command = commands.add_parser(name)
        command.add_argument("--data-dir", required=True, help="the data root holding corpus/general_english_sentences.txt.gz")
        command.add_argument("--repeat", type=int, default=1, help="interleaved rounds (each run its own process)")
        command.add_argument("--threads", type=int, default=2)
        command.add_argument("--batch-size", type=int, default=BATCH_SIZE)
        command.add_argument("--workdir", default=None, help="where the temporary corpus and stores go")
        command.add_argument("--out", type=Path, default=None)
    commands.choices["transformer"].add_argument("--chunks", type=int, default=2000)
    commands.choices["transformer"].add_argument("--window", type=int, default=4, help="lines per passage")
    commands.choices["transformer"].add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS))
    sizes = commands.choices["fast"]
    sizes.add_argument(
        "--sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 100_000],
        help="sizes run with the saved fast encoder (--encoder)",
    )
    sizes.add_argument("--llamaindex-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[2_000, 10_000])
    sizes.add_argument(
        "--end-to-end-sizes",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10_000, 100_000],
        help="sizes run end to end (teacher pass included); the largest run's encoder is reused",
    )
    sizes.add_argument(
        "--check-chunking-up-to", type=int, default=100_000, help="compare both chunkings at sizes up to this many lines"
    )
    args = parser.parse_args()
    if args.command == "table":
        print("\n\n".join(markdown(json.loads(path.read_text())) for path in args.results))
        return
    global PARTIAL
    PARTIAL = args.out.with_suffix(".partial.jsonl") if args.out else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    started = time.time()
    info = machine_info(args.threads)
    result = {
        "command": " ".join(["python -m benchmarks.ingest_targets", *sys.argv[1:]]),
        "machine": info,
        **(transformer(args) if args.command == "transformer" else fast(args)),
    }
    result["wall_s"] = time.time() - started
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print_and_write(result, args.out)


if __name__ == "__main__":
    main()
