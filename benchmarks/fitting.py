"""Item 6: time and peak memory of fitting whitening and quantile maps on n x 384 vectors, at two n.

Each (method, n) runs in its own process (``python -m benchmarks.fitting --method ... --n ...``);
the memory figure is the process's peak RSS minus its RSS just before the data starts.

* ``whiten-stream``: ``Whiten.partial_fit`` over blocks drawn on the fly (the n x 384 matrix
  never exists); float64 moments, refitted after every block.
* ``quantile-materialised``: ``Quantile.fit(X)`` on the whole matrix, which the API takes;
  scikit-learn then bounds its own work by ``subsample`` rows.
* ``quantile-stream``: a uniform sample of ``subsample`` rows kept while the blocks stream by
  (the rows with the smallest random keys), then ``Quantile.fit`` on the sample.

``subsample`` is Quantile's default (100,000) in the full run and 25,000 under ``--quick``, so
that both quick sizes exceed it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from benchmarks.common import child_main, child_parser, current_rss_mb, peak_rss_mb, run_child
from benchmarks.search import DIM, Mixture

logger = logging.getLogger(__name__)

METHODS = ("whiten-stream", "quantile-materialised", "quantile-stream")
SIZES = {"quick": (50_000, 200_000), "full": (200_000, 1_000_000)}
#: rows the quantile fits keep: Quantile's default, smaller under --quick so both sizes exceed it
SUBSAMPLE = {"quick": 25_000, "full": 100_000}
BLOCK = 20_000


def _blocks(n: int) -> Any:
    return Mixture(seed=1).blocks(n, BLOCK)


def fit_whiten(n: int, _subsample: int) -> tuple[float, Any]:
    """Exact streaming moments: no sample, ``_subsample`` is unused."""
    from isotrope.transforms import Whiten

    whiten, seconds = Whiten(), 0.0
    for _, block in _blocks(n):
        start = time.perf_counter()
        whiten.partial_fit(block)
        seconds += time.perf_counter() - start
    start = time.perf_counter()
    whiten.get_state()  # partial_fit leaves the eigendecomposition to first use: it belongs to the fit
    return seconds + time.perf_counter() - start, whiten


def fit_quantile_materialised(n: int, subsample: int) -> tuple[float, Any]:
    from isotrope.transforms import Quantile

    matrix = np.empty((n, DIM), dtype=np.float32)
    for start, block in _blocks(n):
        matrix[start : start + len(block)] = block
    begin = time.perf_counter()
    quantile = Quantile(subsample=subsample).fit(matrix)
    return time.perf_counter() - begin, quantile


def fit_quantile_stream(n: int, subsample: int, seed: int = 0) -> tuple[float, Any]:
    from isotrope.transforms import Quantile

    rng = np.random.default_rng(seed)
    sample, keys, seconds = np.empty((0, DIM), dtype=np.float32), np.empty(0), 0.0
    for _, block in _blocks(n):
        start = time.perf_counter()
        sample = np.concatenate([sample, block])
        keys = np.concatenate([keys, rng.random(len(block))])
        if len(keys) > subsample:  # keep the smallest keys: a uniform sample of all rows so far
            keep = np.argpartition(keys, subsample)[:subsample]
            sample, keys = sample[keep], keys[keep]
        seconds += time.perf_counter() - start
    start = time.perf_counter()
    quantile = Quantile(subsample=subsample).fit(sample)
    return seconds + time.perf_counter() - start, quantile


FITS = {"whiten-stream": fit_whiten, "quantile-materialised": fit_quantile_materialised, "quantile-stream": fit_quantile_stream}


def _child(args: Any) -> dict[str, Any]:
    from isotrope.transforms import Quantile, Whiten  # noqa: F401  (imports before the baseline)

    Mixture(seed=1)
    baseline = current_rss_mb()
    start = time.perf_counter()
    fit_seconds, _ = FITS[args.method](args.n, args.subsample)
    total = time.perf_counter() - start
    return {
        "method": args.method,
        "n": args.n,
        "subsample": args.subsample,
        "fit_s": fit_seconds,
        "total_s": total,
        "baseline_rss_mb": baseline,
        "peak_delta_mb": peak_rss_mb() - baseline,
        "input_mb": args.n * DIM * 4 / 2**20,
    }


def run(*, quick: bool, threads: int) -> dict[str, Any]:
    """Every method at both sizes, one process each; memory growth between the sizes."""
    mode = "quick" if quick else "full"
    sizes, subsample = SIZES[mode], SUBSAMPLE[mode]
    results: dict[str, Any] = {"dim": DIM, "sizes": list(sizes), "block_rows": BLOCK, "subsample": subsample, "methods": {}}
    for method in METHODS:
        entry = {
            str(n): run_child("benchmarks.fitting", ["--method", method, "--n", str(n), "--subsample", str(subsample)], threads)
            for n in sizes
        }
        small, large = entry[str(sizes[0])], entry[str(sizes[-1])]
        entry["memory_growth"] = large["peak_delta_mb"] / max(small["peak_delta_mb"], 1.0)
        results["methods"][method] = entry
        logger.info("fitting %s: peak delta %s MB", method, [entry[str(n)]["peak_delta_mb"] for n in sizes])
    return results


def main() -> None:
    parser = child_parser("One fit at one size, in its own process (used by benchmarks.run).")
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--subsample", type=int, default=SUBSAMPLE["full"])
    child_main(parser, _child)


if __name__ == "__main__":
    main()
