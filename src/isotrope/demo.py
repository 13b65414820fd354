"""``isotrope demo``: index the installed standard library's docstrings and answer a few questions.

Docstrings are read from the source files with :mod:`ast`; no module is imported
(importing runs code: ``antigravity`` opens a browser).
"""

from __future__ import annotations

import ast
import logging
import os
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from isotrope.ingest.loaders import Document

logger = logging.getLogger(__name__)

QUESTIONS = (
    "how do I parse command-line arguments",
    "read a gzip file",
    "compare two sequences and show the differences",
    "run a shell command and capture its output",
    "serialize an object to JSON",
)
#: packages left out: tests, GUI and tooling that would crowd the answers, and private internals
_SKIPPED_DIRS = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "ensurepip",
    "__pycache__",
    "pydoc_data",
    "venv",
    "tkinter",
    "__phello__",
}
_DEFINITIONS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _module_name(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]]:
    """Public classes and functions under ``node`` with their qualified names."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _DEFINITIONS[1:]) and not child.name.startswith("_"):
            name = f"{prefix}.{child.name}" if prefix else child.name
            yield name, child
            if isinstance(child, ast.ClassDef):
                yield from _walk(child, name)


def stdlib_docstrings(root: Path | None = None, max_chars: int = 400) -> Iterator[Document]:
    """One Document per public module, class and function docstring of the standard library."""
    root = root or stdlib_root()
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d not in _SKIPPED_DIRS and not d.startswith((".", "config-")))
        for filename in sorted(files):
            if not filename.endswith(".py") or (filename.startswith("_") and filename != "__init__.py"):
                continue
            path = Path(directory) / filename
            relative = path.relative_to(root)
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError) as error:
                logger.debug("skipping %s: %s", path, error)
                continue
            module = _module_name(relative)
            nodes: list[tuple[str, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]] = [
                ("", tree),
                *_walk(tree, ""),
            ]
            for qualname, node in nodes:
                docstring = ast.get_docstring(node)
                if not docstring:
                    continue
                name = f"{module}.{qualname}" if qualname else module
                yield Document(
                    source=relative.as_posix(),
                    text=f"{name}: {docstring[:max_chars]}",
                    metadata={"name": name, "line": getattr(node, "lineno", 1), "kind": type(node).__name__},
                    position=getattr(node, "lineno", 0),
                )


def run_demo(store: str, show_progress: bool = True) -> tuple[list[tuple[str, list]], Any, dict[str, float], dict]:
    """Index the docstrings into ``store`` (reused when it exists) and answer :data:`QUESTIONS`."""
    from isotrope.ingest.pipeline import index_documents
    from isotrope.search import Collection

    timings: dict[str, float] = {}
    tick = time.perf_counter()
    documents = list(stdlib_docstrings())
    timings["read docstrings"] = time.perf_counter() - tick
    logger.info("read %d docstrings from %s", len(documents), stdlib_root())
    tick = time.perf_counter()
    report = index_documents(documents, store, chunk_tokens=128, overlap_tokens=16, show_progress=show_progress)
    timings["index"] = time.perf_counter() - tick
    tick = time.perf_counter()
    with Collection.open(store) as collection:
        answers = [(question, collection.search(question, k=3)) for question in QUESTIONS]
        timings["answer"] = time.perf_counter() - tick
        info = collection.info()
    return answers, report, timings, info
