"""Where ``--model fast`` ingestion's peak memory goes (issue 16): ``index_documents`` with
``--model fast`` on the first N lines of the general corpus, in this process, while a thread
samples the resident set every 20 ms and, at each new high (5 MB above the last), records the
main thread's innermost frames. Prints that timeline, the stack at the peak and VmHWM.

    python -m benchmarks.fast_memory --data-dir ../shared/data --lines 3000 --out benchmarks/results/fast_memory.json

The corpus is written the way ``benchmarks.ingest_targets`` writes it (one line per passage).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.common import current_rss_mb, machine_info, peak_rss_mb, print_and_write, set_threads
from benchmarks.ingest import ingest_isotrope
from benchmarks.ingest_targets import read_sentences, write_passages

SAMPLE_EVERY_S = 0.02
STEP_MB = 5.0
FRAMES = 4


def watch(timeline: list[dict[str, Any]], stop: threading.Event) -> None:
    """Append ``{mb, s, frames}`` to ``timeline`` at each new high of the resident set."""
    main, started, high = threading.main_thread().ident, time.perf_counter(), 0.0
    while not stop.is_set():
        rss = current_rss_mb()
        if rss > high + STEP_MB:
            frame = sys._current_frames().get(main) if main is not None else None
            frames = [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in traceback.extract_stack(frame)][-FRAMES:]
            timeline.append({"mb": round(rss), "s": round(time.perf_counter() - started, 2), "frames": frames[::-1]})
            high = rss
        time.sleep(SAMPLE_EVERY_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--lines", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    set_threads(args.threads)
    timeline: list[dict[str, Any]] = []
    stop = threading.Event()
    with tempfile.TemporaryDirectory(prefix="isotrope-fast-memory-") as tmp:
        corpus = Path(tmp) / "lines.jsonl"
        write_passages(read_sentences(args.data_dir), corpus, args.lines, 1)
        before = current_rss_mb()
        watcher = threading.Thread(target=watch, args=(timeline, stop), daemon=True)
        watcher.start()
        started = time.perf_counter()
        report = ingest_isotrope(corpus, Path(tmp) / "store", "faiss", "cpu", 32, {"model": "fast", "factory": "Flat"})
        seconds = time.perf_counter() - started
        stop.set()
        watcher.join()
    for point in timeline:
        print(f"{point['mb']:>6} MB {point['s']:>8.2f} s  " + " <- ".join(point["frames"]))
    result = {
        "command": " ".join(["python -m benchmarks.fast_memory", *sys.argv[1:]]),
        "machine": machine_info(args.threads),
        "lines": args.lines,
        "rss_before_mb": round(before),
        "peak_rss_mb": round(peak_rss_mb()),
        "peak_at": timeline[-1] if timeline else None,
        "seconds": round(seconds, 1),
        "report": report,
        "timeline": timeline,
    }
    print_and_write({key: value for key, value in result.items() if key != "timeline"}, None)
    if args.out:
        print_and_write(result, args.out)


if __name__ == "__main__":
    main()
