"""Issue 22: one indexing run's seconds per stage (read+chunk, embed, write, finish), no profiler, as a
JSON line: run it alternately with this tree's code and with an older one (PYTHONPATH) at the same load.

    python -m benchmarks.ingest_stages --chunks 30000 --kind faiss --encoder ENCODER_DIR \\
        --data-dir ../shared/data >> benchmarks/results/ingest-stages-30k.jsonl
    # the code before issue 22's third round, for comparison:
    git archive 1bc99b5 src/isotrope connectors | tar -x -C /tmp/old   # then arrange /tmp/old/isotrope
    PYTHONPATH=/tmp/old python -m benchmarks.ingest_stages ... --label old

Passages and batches (2,048 chunks) are the scale benchmark's; chunked at 256 tokens (index_documents' default).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import git_commit
from benchmarks.scale import ADD_BATCH, documents, read_sentences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, required=True, help="passages to index")
    parser.add_argument("--kind", choices=("faiss", "lancedb"), default="faiss")
    parser.add_argument("--encoder", type=Path, required=True, help="a saved encoder folder")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--label", default="new")
    args = parser.parse_args()
    import isotrope
    from isotrope.encoder import ShapedEncoder
    from isotrope.ingest.pipeline import index_documents

    sentences = read_sentences(args.data_dir)
    encoder = ShapedEncoder.load(args.encoder)
    folder = Path(tempfile.mkdtemp(prefix="isotrope-stages-"))
    try:
        load = os.getloadavg()[0]
        start = time.perf_counter()
        report = index_documents(
            documents(sentences, args.chunks),
            f"{args.kind}:{folder / 'store'}",
            encoder=encoder,
            batch_size=ADD_BATCH,
            show_progress=False,
        )
        wall = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    stages = dict(report.seconds)
    if "read_chunk" not in stages:  # older code: what the other stages leave
        stages["read_chunk"] = wall - sum(stages.get(name, 0.0) for name in ("fit", "embed", "write"))
    print(
        json.dumps(
            {
                "label": args.label,
                "code": git_commit(Path(isotrope.__file__).parent),  # None: a tree outside git (PYTHONPATH)
                "kind": args.kind,
                "n": args.chunks,
                "chunks": report.added,
                "wall_s": round(wall, 2),
                "stages_s": {name: round(value, 2) for name, value in stages.items()},
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "load_start": round(load, 2),
                "load_end": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
