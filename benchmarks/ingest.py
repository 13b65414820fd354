"""Item 2: ingestion end to end (load, chunk, embed, write) of SciFact into FAISS and LanceDB.

isotrope's ``index_documents`` (its default chunking and shaping, as ``isotrope index``) vs
LlamaIndex's ``VectorStoreIndex.from_documents`` with ``HuggingFaceEmbedding`` and its
``FaissVectorStore`` (persisted with ``storage_context.persist``) / ``LanceDBVectorStore``, its
``SentenceSplitter`` set to 256/32 tokens like isotrope's chunker (its default, 1024/200, makes chunks
the model truncates at 256 tokens: it would embed a quarter of the text). Same model, max length,
batch size and threads.

Every timed run is a process of its own (``python -m benchmarks.ingest --side ...``), which imports
only what its side needs (isotrope's sides no LlamaIndex or LanceDB client, LlamaIndex's no isotrope
store): a warm-up ingestion of a few documents, whose garbage is then freed (:func:`release_warmup`,
every side alike), then the timed run into a fresh directory, building its embedding model anew; the
process reports its peak RSS (VmHWM) at the end. Rounds are
interleaved across the sides in rotating order; the median time and the largest peak RSS
of each side's processes are reported.
Both sides read the same JSON-lines file (``_id`` and ``text`` = title + abstract).
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.common import MAX_SEQ_LENGTH, MODEL, child_main, child_parser, ratio, run_child, scifact_documents
from benchmarks.harness import StageMemory
from isotrope.resources import return_freed_memory

logger = logging.getLogger(__name__)

SIDES = ("isotrope-faiss", "isotrope-lancedb", "llamaindex-faiss", "llamaindex-lancedb")
BATCH_SIZE = 32
DIM = 384
WARMUP_DOCS = 4
SIZES = {"quick": 20, "full": None}  # documents of SciFact (None: the whole corpus)
#: LlamaIndex's SentenceSplitter as isotrope chunks (index_documents' defaults: 256 tokens, 32 repeated)
LLAMA_SPLITTER = {"chunk_size": 256, "chunk_overlap": 32}
#: isotrope FAISS variants run beside the default (torch) side: the other backends and ``--model fast`` (with and
#: without ``--fast-pairs``)
VARIANTS: dict[str, list[str]] = {
    "onnx": ["--backend", "onnx"],
    "onnx-int8": ["--backend", "onnx-int8"],
    "onnx-int8-per-channel": ["--backend", "onnx-int8-per-channel"],
    "fast": ["--model", "fast"],
    "fast-pairs": ["--model", "fast", "--fast-pairs"],
}
#: the variants a run measures unless ``--variants`` names others
DEFAULT_VARIANTS = ("onnx", "onnx-int8", "onnx-int8-per-channel", "fast")


# -- the child process: one side ----------------------------------------------------
def read_records(corpus: Path) -> list[dict[str, str]]:
    with open(corpus, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def ingest_isotrope(
    corpus: Path, target: Path, store: str, device: str, batch_size: int, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``index_documents`` as ``isotrope index`` runs it. ``options``: ``backend`` (torch, onnx, ...),
    ``model`` (e.g. ``fast``; its shaping is then the model's default), ``fast_pairs`` (``--fast-pairs``),
    ``encoder`` (a saved encoder folder, as ``--encoder``), ``factory`` (the FAISS index, e.g. ``Flat``)."""
    from isotrope.config import EncoderConfig
    from isotrope.encoder import DEFAULT_SHAPE, ShapedEncoder, default_shape
    from isotrope.ingest.pipeline import index_documents

    options = options or {}
    model = options.get("model") or MODEL
    config = EncoderConfig(
        model=model,
        shape=DEFAULT_SHAPE if model == MODEL else default_shape(model),
        max_length=MAX_SEQ_LENGTH if model == MODEL else None,
        backend=options.get("backend") or "torch",
        fast_pairs=bool(options.get("fast_pairs")),
    )
    memory = StageMemory()
    with memory.stage("encoder"):  # an onnx backend's first use exports and quantises (in a child process)
        if options.get("encoder"):
            encoder = ShapedEncoder.load(options["encoder"])
        else:  # fitted by the pipeline
            encoder = ShapedEncoder.create(config, device=device, batch_size=batch_size)
    with pipeline_stages(memory), memory.stage("index"):  # the whole of index_documents
        report = index_documents(
            corpus,
            f"{store}:{target}",
            encoder=encoder,
            store_options={"index": options["factory"]} if options.get("factory") and store == "faiss" else None,
            loader_options={"id_field": "_id", "max_file_bytes": None},  # the corpus is one file (100 MB at 13 copies)
            show_progress=False,
        )
    return {
        "documents": report.documents,
        "chunks": report.chunks,
        "steps_s": {step: round(value, 3) for step, value in report.seconds.items()},
        "memory_stages": memory.stages,
    }


#: the pipeline's steps whose peak RSS is measured: (owner module, attribute, stage name); reading and
#: chunking run between them, lazily, and count in ``index`` only
PIPELINE_STAGES = (
    ("isotrope.ingest.plan:IngestPlan", "sample", "load+chunk+sample"),
    ("isotrope.ingest.plan:Target", "fit", "fit (teacher pass, shaping fit)"),
    ("isotrope.ingest.pipeline", "_embed", "embed"),
    ("isotrope.ingest.plan:ChunkWriter", "add", "write"),
    ("isotrope.ingest.plan:Target", "finish", "finish (index build, default search)"),
    ("isotrope.search:Collection", "fit_default_search", "default search (in finish)"),
)


@contextmanager
def pipeline_stages(memory: StageMemory) -> Iterator[None]:
    """Measure each of :data:`PIPELINE_STAGES` as a stage of ``memory`` while the block runs."""
    import importlib

    restore = []
    for owner_name, attribute, stage in PIPELINE_STAGES:
        module_name, _, class_name = owner_name.partition(":")
        owner = importlib.import_module(module_name)
        owner = getattr(owner, class_name) if class_name else owner
        original = getattr(owner, attribute)

        def staged(*args: Any, _original: Any = original, _stage: str = stage, **kwargs: Any) -> Any:
            with memory.stage(_stage):
                return _original(*args, **kwargs)

        setattr(owner, attribute, staged)
        restore.append((owner, attribute, original))
    try:
        yield
    finally:
        for owner, attribute, original in restore:
            setattr(owner, attribute, original)


def ingest_llamaindex(corpus: Path, target: Path, store: str, device: str, batch_size: int) -> dict[str, Any]:
    import faiss
    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    from benchmarks.common import model_path

    memory = StageMemory()
    with memory.stage("load"):
        documents = [Document(text=record["text"], id_=record["_id"]) for record in read_records(corpus)]
    options: dict[str, Any] = {}
    if device != "cpu":
        import torch

        options["model_kwargs"] = {"dtype": torch.bfloat16}
    with memory.stage("encoder"):
        embed_model = HuggingFaceEmbedding(
            model_name=model_path(),
            max_length=MAX_SEQ_LENGTH,
            embed_batch_size=batch_size,
            device=device,
            normalize=True,
            **options,
        )
    if store == "faiss":
        from llama_index.vector_stores.faiss import FaissVectorStore

        vector_store = FaissVectorStore(faiss_index=faiss.IndexFlatIP(DIM))
    else:
        from llama_index.vector_stores.lancedb import LanceDBVectorStore

        vector_store = LanceDBVectorStore(uri=str(target), table_name="chunks", mode="overwrite")
    storage = StorageContext.from_defaults(vector_store=vector_store)
    with memory.stage("chunk"):  # what from_documents runs first
        nodes = SentenceSplitter(**LLAMA_SPLITTER).get_nodes_from_documents(documents)
    with memory.stage("embed+index"):
        VectorStoreIndex(nodes, storage_context=storage, embed_model=embed_model)
    with memory.stage("write"):
        if store == "faiss":
            storage.persist(persist_dir=str(target))
            chunks = vector_store.client.ntotal
        else:
            chunks = vector_store.table.count_rows()
    return {"documents": len(documents), "chunks": int(chunks), "memory_stages": memory.stages}


def run_side(
    side: str, corpus: Path, workdir: Path, repeat: int, device: str, batch_size: int, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Warm up on a few documents, then ``repeat`` timed ingestions of ``corpus`` into fresh directories.
    ``options`` go to :func:`ingest_isotrope` (an isotrope side only)."""
    library, store = side.split("-")
    if library == "isotrope":

        def ingest(*args: Any) -> dict[str, Any]:
            return ingest_isotrope(*args, options=options)
    else:
        ingest = ingest_llamaindex
    warmup = workdir / "warmup.jsonl"
    with open(corpus, encoding="utf-8") as handle:
        warmup.write_text("".join(line for _, line in zip(range(WARMUP_DOCS), handle)), encoding="utf-8")
    ingest(warmup, workdir / "warmup", store, device, batch_size)
    release_warmup()
    times, detail = [], {}
    for run_index in range(repeat):
        target = workdir / f"run{run_index}"
        start = time.perf_counter()
        detail = ingest(corpus, target, store, device, batch_size)
        times.append(time.perf_counter() - start)
        if (options or {}).get("keep_encoder") and library == "isotrope":  # the encoder the run fitted, for reuse
            shutil.rmtree(options["keep_encoder"], ignore_errors=True)
            shutil.copytree(target / "encoder", options["keep_encoder"])
        shutil.rmtree(target, ignore_errors=True)
    return {
        "side": side,
        **detail,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "runs_s": [round(t, 3) for t in times],
    }


def release_warmup() -> None:
    """Free what the warm-up left behind, on every side alike, so the timed run starts as a fresh run
    would: its objects in reference cycles (the warm-up's encoder or embedding model, 80 to 90 MB until
    the collector runs) and, on glibc, the heap pages freed (``malloc_trim``; 130 to 150 MB)."""
    return_freed_memory()


def _child(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="isotrope-ingest-") as tmp:
        options = {
            "backend": args.backend,
            "model": args.model,
            "fast_pairs": args.fast_pairs,
            "encoder": args.encoder,
            "factory": args.factory,
            "keep_encoder": args.keep_encoder,
        }
        return run_side(args.side, args.corpus, Path(tmp), args.repeat, args.device, args.batch_size, options)


# -- the parent: all sides ----------------------------------------------------------
def write_corpus(data_dir: str | Path, path: Path, limit: int | None, join: int = 1, copies: int = 1) -> int:
    """The benchmark's input file: SciFact as JSON lines ``{"_id", "text"}`` (the first ``limit`` abstracts),
    ``join`` consecutive abstracts per document (long technical documents, many chunks each), the whole of it
    ``copies`` times (ids ``ID~2``, ``ID~3``, ... after the first copy): a corpus of 100,000 chunks from
    SciFact's 5,183 abstracts, for timing (no side merges repeated texts)."""
    abstracts = scifact_documents(data_dir, limit)
    documents = [
        (abstracts[start][0], "\n\n".join(text for _, text in abstracts[start : start + join]))
        for start in range(0, len(abstracts), max(join, 1))
    ]
    with open(path, "w", encoding="utf-8") as handle:
        for copy in range(1, copies + 1):
            for doc_id, text in documents:
                handle.write(json.dumps({"_id": doc_id if copy == 1 else f"{doc_id}~{copy}", "text": text}) + "\n")
    return len(documents) * copies


def chunk_statistics(corpus: Path) -> dict[str, dict[str, int]]:
    """Chunks each side's chunking makes and the tokens the model then sees (<= 256 per chunk)."""
    from llama_index.core import Document
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import MetadataMode
    from transformers import AutoTokenizer

    from benchmarks.common import model_path
    from isotrope.ingest.chunking import TokenChunker
    from isotrope.ingest.loaders import iter_documents

    tokenizer = AutoTokenizer.from_pretrained(model_path())
    chunker = TokenChunker(tokenizer, 256, 32)  # index_documents' defaults
    isotrope_texts = [
        chunk.text
        for document in iter_documents(corpus, id_field="_id", max_file_bytes=None)
        for chunk in chunker.chunk(document)
    ]
    nodes = SentenceSplitter(**LLAMA_SPLITTER).get_nodes_from_documents(
        [Document(text=record["text"], id_=record["_id"]) for record in read_records(corpus)]
    )
    llama_texts = [node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]

    def tokens(texts: list[str]) -> int:
        encoded = tokenizer(texts, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]
        return sum(len(ids) for ids in encoded)

    return {
        "isotrope": {"chunks": len(isotrope_texts), "model_tokens": tokens(isotrope_texts)},
        "llamaindex": {"chunks": len(llama_texts), "model_tokens": tokens(llama_texts)},
    }


def merge_runs(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's processes (one timed run each) as one entry: median time, the largest peak RSS."""
    times = [entry["median_s"] for entry in entries]
    merged = {
        **entries[-1],
        "median_s": statistics.median(times),
        "min_s": min(times),
        "runs_s": [round(t, 3) for t in times],
        "peak_rss_mb": max(entry["peak_rss_mb"] for entry in entries),
        "peak_rss_runs_mb": [round(entry["peak_rss_mb"], 1) for entry in entries],
        "process_wall_s": statistics.median(entry["process_wall_s"] for entry in entries),
    }
    if "steps_s" in merged:
        merged["steps_s"] = [entry["steps_s"] for entry in entries]
    return merged


def run(
    data_dir: str | Path,
    *,
    quick: bool,
    repeat: int,
    threads: int,
    device: str = "cpu",
    batch_size: int = BATCH_SIZE,
    join: int = 1,
    variants: tuple[str, ...] = DEFAULT_VARIANTS,
    abstracts: int | None = None,
    copies: int = 1,
    sides: tuple[str, ...] = SIDES,
) -> dict[str, Any]:
    """Each of ``sides`` and ``variants`` in its own process; wall-time and peak-RSS ratios LlamaIndex / isotrope
    per store, and for each of ``variants`` (isotrope FAISS with another backend or ``--model fast``) against
    LlamaIndex FAISS, where both ran. ``join``: abstracts per document, ``copies``: repeats of the corpus (see
    :func:`write_corpus`); ``abstracts``: how many SciFact abstracts are read (default: the mode's size)."""
    with tempfile.TemporaryDirectory(prefix="isotrope-ingest-") as tmp:
        corpus = Path(tmp) / "scifact.jsonl"
        limit = abstracts if abstracts is not None else SIZES["quick" if quick else "full"]
        documents = write_corpus(data_dir, corpus, limit, join, copies)
        results: dict[str, Any] = {
            "documents": documents,
            "abstracts_per_document": join,
            "copies": copies,
            "model": MODEL,
            "batch_size": batch_size,
            "max_seq_length": MAX_SEQ_LENGTH,
            "device": device,
            "repeat": repeat,
            "chunking": chunk_statistics(corpus),
            "llamaindex_splitter": LLAMA_SPLITTER,
            "sides": {},
        }
        names = (*sides, *(f"isotrope-faiss:{variant}" for variant in variants))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for round_index in range(repeat):  # interleaved rounds, rotating order: a busy spell hits every side
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                side, _, variant = name.partition(":")
                args = [
                    *VARIANTS.get(variant, []),
                    "--side",
                    side,
                    "--corpus",
                    str(corpus),
                    "--repeat",
                    "1",
                    "--device",
                    device,
                    "--batch-size",
                    str(batch_size),
                ]
                runs[name].append(run_child("benchmarks.ingest", args, threads))
                logger.info("ingest %s round %d: %.1fs", name, round_index + 1, runs[name][-1]["median_s"])
    results["sides"] = measured = {name: merge_runs(entries) for name, entries in runs.items()}
    for name, entry in measured.items():
        entry["model_tokens_per_s"] = results["chunking"][name.split("-")[0]]["model_tokens"] / entry["median_s"]
    results["ratios"] = {}
    pairs = {store: (f"isotrope-{store}", f"llamaindex-{store}") for store in ("faiss", "lancedb")}
    pairs.update({f"faiss:{variant}": (f"isotrope-faiss:{variant}", "llamaindex-faiss") for variant in variants})
    for key, (our_name, their_name) in pairs.items():
        if our_name not in measured or their_name not in measured:
            continue
        ours, theirs = measured[our_name], measured[their_name]
        results["ratios"][key] = {
            "speedup": ratio(theirs["median_s"], ours["median_s"]),
            "peak_rss_ratio": ratio(ours["peak_rss_mb"], theirs["peak_rss_mb"]),
            "token_throughput_ratio": ratio(ours["model_tokens_per_s"], theirs["model_tokens_per_s"]),
        }
    return results


def main() -> None:
    parser = child_parser("One ingestion side, in its own process (used by benchmarks.run).")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--backend", default="torch", help="isotrope: torch, onnx, onnx-int8, onnx-int8-per-channel")
    parser.add_argument("--model", default=None, help=f"isotrope: the model (default {MODEL}; e.g. fast)")
    parser.add_argument("--fast-pairs", action="store_true", help="isotrope --model fast: with token-pair rows")
    parser.add_argument("--encoder", default=None, help="isotrope: a saved encoder folder (as --encoder)")
    parser.add_argument("--keep-encoder", default=None, help="isotrope: copy the encoder the run saved to this folder")
    parser.add_argument("--factory", default=None, help="isotrope FAISS: the index (e.g. Flat; default: auto)")
    child_main(parser, _child)


if __name__ == "__main__":
    main()
