"""Sweeps: a grid of recipes (backbone x layers x pooling x weights x shape x fit corpus) over tasks.

Config (JSON)::

    {"data_dir": "../shared/data", "cache_dir": ".cache/isotrope",
     "tasks": {"sts": {"tasks": ["stsb", "sickr"]}, "retrieval": {"beir": "retrieval/scifact"}},
     "grid": {"model": ["static:all-MiniLM-L6-v2"], "weights": ["uniform", "sif"],
              "shape": ["none", "whiten"], "fit_corpus": ["corpus/general_english_sentences.txt.gz"]},
     "recipes": [{"model": "glove-6b-50d", "shape": "abtt"}]}

``grid`` is expanded as a Cartesian product (a list of grids is expanded one
after the other); ``recipes`` adds single points. A point may carry its own
``fit_corpus`` (a file, or ``"corpus"`` for the retrieval corpus) and
``context_corpus`` (the file that ``context:`` tables are averaged over).
Relative paths (task files, fit corpora, ``frequencies``, a word-vector
``model`` file) are resolved against ``data_dir``. A task's options may set
``fit_corpus``/``context_corpus`` defaults for the points that do not. The token-state cache makes
every text pass a transformer once. A sweep rerun with the same ``out`` keeps the
rows already written for the same point, task and task options, so an interrupted
sweep resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path
from typing import Any

from isotrope.config import FIELDS, EncoderConfig
from isotrope.errors import ConfigError
from isotrope.evaluate.commands import evaluate
from isotrope.evaluate.harness import Evaluator

logger = logging.getLogger(__name__)

_PATH_OPTIONS = ("beir", "jsonl", "texts_file", "pairs")
_RECIPE_PATHS = ("model", "frequencies")
_FIT_KEYS = {"fit_corpus", "context_corpus"}


def _points(config: dict[str, Any]) -> list[dict[str, Any]]:
    grids = config.get("grid", {})
    points = []
    for grid in grids if isinstance(grids, list) else [grids]:
        keys = list(grid)
        points += [dict(zip(keys, values)) for values in itertools.product(*(grid[key] for key in keys))] if keys else []
    points += list(config.get("recipes", []))
    for point in points:
        unknown = set(point) - FIELDS - _FIT_KEYS
        if unknown:
            raise ValueError(f"unknown recipe keys {sorted(unknown)}; use {sorted(FIELDS | _FIT_KEYS)}")
    return points


def _resolve(value: Any, data_dir: Path | None, files_only: bool = False) -> Any:
    """``value`` as a path under ``data_dir`` when one exists there (only a file, with ``files_only``:
    a recipe's ``frequencies="wordfreq"`` must stay a keyword even beside a ``wordfreq/`` folder)."""
    if isinstance(value, list):
        return [_resolve(item, data_dir, files_only) for item in value]
    if isinstance(value, str) and data_dir is not None:
        candidate = data_dir / value
        if candidate.is_file() or (candidate.exists() and not files_only):
            return candidate
    return value


def run_sweep(config_path: str | Path, out: str | Path) -> list[dict[str, Any]]:
    """Evaluate every point on every task; write ``out.json`` (all results) and ``out.md`` (one table per task)."""
    config_path = Path(config_path)
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_path}: not valid JSON ({error})") from None
    data_dir = Path(config["data_dir"]).expanduser() if config.get("data_dir") else None
    if data_dir is not None and not data_dir.is_absolute():
        data_dir = (config_path.parent / data_dir).resolve()
    evaluator = Evaluator(cache_dir=config.get("cache_dir"), fit_samples=config.get("fit_samples", 20_000))
    done = _finished_rows(Path(out), config.get("fit_samples", 20_000))
    rows = []
    for point in _points(config):
        recipe = _config(point, data_dir)
        for task, options in config.get("tasks", {}).items():
            key = _row_key(point, task, options, config.get("fit_samples", 20_000))
            if key in done:
                logger.info("sweep: %s on %s already in %s", recipe.label(), task, Path(out).with_suffix(".json"))
                rows.append(done[key])
                _write(rows, Path(out))
                continue
            task_options = options
            options = {key: _resolve(value, data_dir) if key in _PATH_OPTIONS else value for key, value in options.items()}
            # a task may set default fit corpora (e.g. retrieval: "corpus"); the point's own win
            fits = {key: point.get(key, options.pop(key, None)) for key in sorted(_FIT_KEYS)}
            fits = {key: value if value in (None, "corpus") else str(_resolve(value, data_dir)) for key, value in fits.items()}
            logger.info("sweep: %s on %s", recipe.label(), task)
            result = evaluate(task, recipe, evaluator, data_dir=data_dir, **fits, **options)
            row = {"point": point, "task_options": task_options, "fit_samples": evaluator.fit_samples, **result}
            rows.append(_relative_to(data_dir, row))
            _write(rows, Path(out))  # partial results survive an interrupted sweep
    return rows


def _config(point: dict[str, Any], data_dir: Path | None) -> EncoderConfig:
    """The recipe of a sweep point, its file names resolved against ``data_dir``."""
    try:
        return EncoderConfig.from_dict(
            {
                key: str(_resolve(value, data_dir, files_only=True)) if key in _RECIPE_PATHS else value
                for key, value in point.items()
                if key in FIELDS
            }
        )
    except ConfigError as error:
        raise ConfigError(f"sweep point {json.dumps(point)}: {error}", error.field) from None


def _row_key(point: dict[str, Any], task: str, options: dict[str, Any], fit_samples: int) -> str:
    return json.dumps([point, task, options, fit_samples], sort_keys=True)


def _finished_rows(out: Path, fit_samples: int) -> dict[str, dict[str, Any]]:
    """Rows of an earlier run of this sweep, keyed by what produced them."""
    path = out.with_suffix(".json")
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    return {
        _row_key(row["point"], row["task"], row["task_options"], row["fit_samples"]): row
        for row in rows
        if "task_options" in row and "fit_samples" in row
    }


def _relative_to(data_dir: Path | None, value: Any) -> Any:
    """``value`` with the paths under ``data_dir`` written relative to it (results read the same
    on every machine)."""
    if data_dir is None:
        return value
    if isinstance(value, dict):
        return {key: _relative_to(data_dir, item) for key, item in value.items()}
    if isinstance(value, list):
        return [_relative_to(data_dir, item) for item in value]
    return value.replace(f"{data_dir}/", "") if isinstance(value, str) else value


def _write(rows: list[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown_table(rows))


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """One table per task: recipe, what it was fitted on, then every score."""
    lines = []
    for task in dict.fromkeys(row["task"] for row in rows):
        task_rows = [row for row in rows if row["task"] == task]
        metrics = list(dict.fromkeys(metric for row in task_rows for metric in row["scores"]))
        has_average = any("average" in row for row in task_rows)
        header = ["recipe", "fitted on", *metrics, *(["avg"] if has_average else [])]
        lines += [f"### {task}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in task_rows:
            cells = [row["recipe"], row["fitted_on"], *(f"{row['scores'].get(m, '')}" for m in metrics)]
            if has_average:
                cells.append(f"{row.get('average', '')}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
