"""Flow fitting time on real sentence vectors: ``python -m benchmarks.flow_fit --data-dir DIR [--n 50000]``.

Encodes ``n`` general-corpus sentences with the static MiniLM table (a cheap, strongly
anisotropic backbone, d = 384), fits the ``flow`` transform with its defaults on the raw
vectors and reports the wall time, the epochs run and the held-aside negative log-likelihood
per epoch (the flow's own 10 % validation split), as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from isotrope.corpus import iter_texts
from isotrope.encoder import ShapedEncoder, reservoir_sample
from isotrope.transforms.flow import FlowTransform


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flow_fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="data root with corpus/")
    parser.add_argument("--n", type=int, default=50_000, help="vectors to fit on")
    args = parser.parse_args(argv)
    texts = reservoir_sample(iter_texts(args.data_dir / "corpus" / "general_english_sentences.txt.gz"), args.n)
    vectors = ShapedEncoder.create("static:all-MiniLM-L6-v2").embed_raw(texts)
    start = time.perf_counter()
    flow = FlowTransform().fit(vectors)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "n": len(vectors),
                "dim": vectors.shape[1],
                "fit_seconds": round(seconds, 1),
                "epochs": flow.history_[-1]["epoch"],
                "history": flow.history_,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
