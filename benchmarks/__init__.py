"""isotrope's benchmark suite: ``python -m benchmarks.run [--quick] --data-dir DIR --out results.json``.

One module per measured item (encode, ingest, shaping, static, search, fitting, gpu),
shared helpers in :mod:`benchmarks.common`, Markdown tables in :mod:`benchmarks.report`.
"""
