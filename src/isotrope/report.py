"""The shaping report: what the fitted shaping did to a store's vectors, as one self-contained HTML page.

It samples stored vectors and compares the raw (pre-shaping) vectors with the shaped ones:
the eigenvalue spectrum of their covariance, the distribution of pairwise cosines, the
isotropy measures of :mod:`isotrope.isotropy`, what the shaping was fitted on and,
when ``--shape auto`` chose it, the candidates it weighed. Plots are inline SVG drawn from
NumPy: the page needs no network and no plotting library. Raw vectors are kept by LanceDB
stores; for other stores the report shows the shaped vectors alone and says so.
"""

from __future__ import annotations

import html
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from isotrope.search import Collection

logger = logging.getLogger(__name__)

DEFAULT_SAMPLE = 2000
COSINE_BINS = 80
RAW_COLOUR, SHAPED_COLOUR = "#c0504d", "#1f6fb2"


@dataclass
class VectorSummary:
    """Statistics of one set of vectors."""

    eigenvalues: np.ndarray  # covariance eigenvalues, descending, as fractions of the total variance
    cosine_histogram: np.ndarray  # pair counts per bin over [-1, 1]
    isotropy: dict[str, float]


@dataclass
class ShapingReport:
    """Everything the page shows, computed once."""

    info: dict[str, Any]
    sample_size: int
    shaped: VectorSummary | None
    raw: VectorSummary | None = None
    notes: list[str] = field(default_factory=list)


def summarize(vectors: np.ndarray) -> VectorSummary:
    """Covariance spectrum, pairwise-cosine histogram (distinct pairs) and isotropy of ``vectors``."""
    from isotrope.isotropy import isotropy_report

    x = np.asarray(vectors, dtype=np.float64)
    centred = x - x.mean(axis=0)
    eigenvalues = np.clip(np.linalg.eigvalsh(centred.T @ centred / max(len(x) - 1, 1))[::-1], 0.0, None)
    total = eigenvalues.sum()
    norms = np.linalg.norm(x, axis=1)
    unit = x[norms > 0] / norms[norms > 0, None]
    cosines = (unit @ unit.T)[np.triu_indices(len(unit), k=1)]
    histogram, _ = np.histogram(np.clip(cosines, -1.0, 1.0), bins=COSINE_BINS, range=(-1.0, 1.0))
    return VectorSummary(eigenvalues / total if total > 0 else eigenvalues, histogram, isotropy_report(x))


def sample_vectors(collection: Collection, size: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """A uniform sample of stored ids: their shaped vectors, their raw vectors (None when the store
    keeps none) and notes for the reader."""
    store = collection.store
    ids = store.ids()
    if len(ids) < 3:
        raise ValueError(f"the store holds {len(ids)} chunks; the report needs at least 3")
    rng = np.random.default_rng(seed)
    chosen = [ids[i] for i in np.sort(rng.choice(len(ids), size=min(size, len(ids)), replace=False))]
    shaped = np.asarray(store.vectors(chosen), dtype=np.float32)
    notes: list[str] = []
    raw = None
    if store.stores_raw_vectors:
        try:
            raw = np.asarray(store.raw_vectors(chosen), dtype=np.float32)
        except ValueError as error:  # rows written without their raw vector
            notes.append(f"raw vectors unavailable: {error}")
    else:
        notes.append(
            f"this {collection.kind} store does not keep the raw (pre-shaping) vectors, so only the "
            "shaped vectors are shown; LanceDB stores keep both"
        )
    return shaped, raw, notes


def build_report(collection: Collection, sample: int = DEFAULT_SAMPLE, seed: int = 0) -> ShapingReport:
    """Sample the store and compute the statistics of its shaped (and raw) vectors."""
    shaped, raw, notes = sample_vectors(collection, sample, seed)
    logger.info("shaping report over %d sampled vectors", len(shaped))
    return ShapingReport(
        info=collection.info(),
        sample_size=len(shaped),
        shaped=summarize(shaped),
        raw=summarize(raw) if raw is not None else None,
        notes=notes,
    )


# --------------------------------------------------------------------------- SVG


def _polyline(xs: np.ndarray, ys: np.ndarray, colour: str) -> str:
    points = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'


def _frame(
    width: int,
    height: int,
    margin: int,
    title: str,
    body: str,
    x_label: str,
    y_label: str,
    x_ticks: list[tuple[float, str]],
    y_ticks: list[tuple[float, str]],
    legend: list[tuple[str, str]],
) -> str:
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{html.escape(title)}" font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="14" text-anchor="middle" font-size="13">{html.escape(title)}</text>',
        f'<rect x="{margin}" y="24" width="{width - margin - 10}" height="{height - margin - 24}" fill="none" stroke="#999"/>',
    ]
    for x, label in x_ticks:
        parts.append(f'<text x="{x:.1f}" y="{height - margin + 14}" text-anchor="middle">{html.escape(label)}</text>')
    for y, label in y_ticks:
        parts.append(
            f'<line x1="{margin}" x2="{width - 10}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{margin - 4}" y="{y + 4:.1f}" text-anchor="end">{html.escape(label)}</text>'
        )
    parts.append(f'<text x="{width / 2}" y="{height - 6}" text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(f'<text transform="translate(12 {height / 2}) rotate(-90)" text-anchor="middle">{html.escape(y_label)}</text>')
    parts.append(body)
    for row, (name, colour) in enumerate(legend):
        y = 40 + 16 * row
        parts.append(
            f'<rect x="{width - 130}" y="{y - 9}" width="12" height="10" fill="{colour}"/>'
            f'<text x="{width - 114}" y="{y}">{html.escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def spectrum_svg(series: list[tuple[str, np.ndarray, str]], width: int = 520, height: int = 300, margin: int = 56) -> str:
    """Eigenvalues (fraction of variance, log scale) against their rank, one line per series."""
    floor = 1e-6
    logs = [np.log10(np.maximum(values, floor)) for _, values, _ in series]
    low, high = min(float(v.min()) for v in logs), max(float(v.max()) for v in logs)
    low, high = np.floor(low), np.ceil(high) if np.ceil(high) > np.floor(low) else np.floor(low) + 1
    n = max(len(values) for _, values, _ in series)
    left, right, top, bottom = margin, width - 10, 24, height - margin

    def px(rank: np.ndarray) -> np.ndarray:
        return left + (rank - 1) / max(n - 1, 1) * (right - left)

    def py(log_value: np.ndarray) -> np.ndarray:
        return bottom - (log_value - low) / (high - low) * (bottom - top)

    body = "".join(_polyline(px(np.arange(1, len(v) + 1)), py(v), colour) for (_, _, colour), v in zip(series, logs))
    x_ticks = [(float(px(np.array(r))), str(r)) for r in sorted({1, max(n // 2, 1), n})]
    y_ticks = [(float(py(np.array(e))), f"1e{int(e)}") for e in range(int(low), int(high) + 1)]
    return _frame(
        width,
        height,
        margin,
        "Eigenvalue spectrum (covariance)",
        body,
        "rank",
        "share of variance",
        x_ticks,
        y_ticks,
        [(name, colour) for name, _, colour in series],
    )


def cosine_svg(series: list[tuple[str, np.ndarray, str]], width: int = 520, height: int = 300, margin: int = 56) -> str:
    """Pairwise-cosine distributions (share of pairs per bin over [-1, 1]), one line per series."""
    shares = [counts / max(counts.sum(), 1) for _, counts, _ in series]
    high = max(float(s.max()) for s in shares) or 1.0
    left, right, top, bottom = margin, width - 10, 24, height - margin
    centres = np.linspace(-1, 1, COSINE_BINS + 1)[:-1] + 1.0 / COSINE_BINS

    def px(value: np.ndarray) -> np.ndarray:
        return left + (value + 1) / 2 * (right - left)

    def py(share: np.ndarray) -> np.ndarray:
        return bottom - share / high * (bottom - top)

    body = "".join(_polyline(px(centres), py(s), colour) for (_, _, colour), s in zip(series, shares))
    x_ticks = [(float(px(np.array(v))), f"{v:g}") for v in (-1, -0.5, 0, 0.5, 1)]
    y_ticks = [(float(py(np.array(v))), f"{v:.0%}") for v in np.linspace(0, high, 4)]
    return _frame(
        width,
        height,
        margin,
        "Pairwise cosine similarity",
        body,
        "cosine",
        "share of pairs",
        x_ticks,
        y_ticks,
        [(name, colour) for name, _, colour in series],
    )


# --------------------------------------------------------------------------- HTML

_STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}.plots{display:flex;flex-wrap:wrap;gap:1em}.note{background:#fff6e0;padding:.5em 1em;border-left:4px solid #e0a000}
.chosen{font-weight:bold;background:#eef6ff}code{background:#f3f3f3;padding:0 .2em}
"""


def _table(header: list[str], rows: list[list[Any]], highlight: int | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = []
    for index, row in enumerate(rows):
        cls = ' class="chosen"' if index == highlight else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


MAX_CELL = 300


def _cell(value: Any) -> str:
    """A table cell's text; long values are cut (a fit sample passed as a list is recorded by its repr)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else "" if value is None else str(value)
    return text if len(text) <= MAX_CELL else f"{text[:MAX_CELL]}… ({len(text):,} characters)"


def _auto_shape_section(auto: dict[str, Any] | None) -> str:
    if not auto:
        return "<p>The shaping was given explicitly (not chosen by <code>--shape auto</code>).</p>"
    candidates = auto.get("candidates", [])
    keys = [
        k for k in dict.fromkeys(key for row in candidates for key in row) if k not in ("mrr@10", "standard_errors_below_best")
    ]
    chosen = auto.get("chosen", {})
    highlight = next((i for i, row in enumerate(candidates) if all(row.get(k) == v for k, v in chosen.items())), None)
    rows = [[*(row.get(k) for k in keys), row.get("mrr@10"), row.get("standard_errors_below_best")] for row in candidates]
    return (
        f"<p><code>--shape auto</code> chose <b>{html.escape(_cell(chosen))}</b> by the rule: "
        f"{html.escape(str(auto.get('rule', '')))}; scored on {auto.get('pseudo_queries')} pseudo-queries over "
        f"{auto.get('held_aside_texts')} held-aside texts.</p>"
        + _table([*keys, "pseudo-query MRR@10", "standard errors below best"], rows, highlight)
    )


def render_html(report: ShapingReport) -> str:
    """The report as one HTML page with inline SVG plots and no external assets."""
    info = report.info
    series_spectrum, series_cosine, isotropy_rows = [], [], []
    for name, summary, colour in (("raw", report.raw, RAW_COLOUR), ("shaped", report.shaped, SHAPED_COLOUR)):
        if summary is None:
            continue
        series_spectrum.append((name, summary.eigenvalues, colour))
        series_cosine.append((name, summary.cosine_histogram, colour))
        iso = summary.isotropy
        top = summary.eigenvalues[:10].sum() if len(summary.eigenvalues) else float("nan")
        isotropy_rows.append([name, iso["dim"], iso["mean_cosine"], iso["partition_ratio"], iso["effective_rank"], float(top)])
    fit = info.get("fit") or {}
    info_rows = [[key, value] for key, value in info.items() if key not in ("fit", "auto_shape")]
    notes = "".join(f'<p class="note">{html.escape(note)}</p>' for note in report.notes)
    title = f"Shaping report: {info.get('store', '')}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{_STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p>Model <b>{html.escape(str(info.get("model", "?")))}</b>, shaping <b>{html.escape(str(info.get("shape", "?")))}</b>,
{info.get("chunks", "?")} chunks; statistics over a uniform sample of <b>{report.sample_size}</b> stored vectors.</p>
{notes}
<h2>Spectrum and cosines</h2>
<div class="plots">{spectrum_svg(series_spectrum)}{cosine_svg(series_cosine)}</div>
<p>An isotropic space spreads its variance over many directions (a flat spectrum) and puts
unrelated texts near cosine 0; raw transformer vectors crowd into a narrow cone (every cosine high).</p>
<h2>Isotropy</h2>
{_table(["vectors", "dim", "mean cosine", "partition ratio I(W)", "effective rank", "top-10 variance share"], isotropy_rows)}
<h2>Fit</h2>
{_table(["fitted on", "texts in the fit sample"], [[fit.get("fitted_on", "not recorded"), fit.get("n_texts", "not recorded")]])}
{_auto_shape_section(info.get("auto_shape"))}
<h2>Store</h2>
{_table(["property", "value"], info_rows)}
</body></html>
"""
