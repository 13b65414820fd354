"""The options every store takes under the same names, and the per-store names they replace.

``metric``
    ``"ip"`` (the default of every new store), ``"cosine"`` or ``"l2"``; an existing store keeps the metric
    it was created with (a different one given is an error)
``index``
    the approximate index: ``"auto"`` (exact below :data:`~isotrope.stores.index_plan.EXACT_BELOW` rows, then
    one sized from the row count), ``"flat"`` (always exact), or an engine's own index (FAISS: an
    ``index_factory`` string such as ``"HNSW32"``; LanceDB: ``"ivf_pq"``, ``"hnsw_sq"``)
``nprobe``
    IVF lists searched (default: the breadth calibrated when the index was built)
``ef``
    HNSW candidate list size, efSearch (default: calibrated, else the engine's)
``refine``
    re-rank ``refine * k`` candidates of an approximate index by their exact scores (0: off)
``threshold``
    rows at which an index that must be trained is built; until then search is exact

Each store maps them to its engine inside the store (FAISS ``nprobe`` / ``efSearch``, LanceDB ``nprobes`` /
``ef`` / ``refine_factor``). The names each store used before keep working for one release, with a
:class:`DeprecationWarning` (:data:`RENAMED`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

AUTO = "auto"
FLAT = "flat"
#: the shared option names
NAMES = ("metric", "index", "nprobe", "ef", "refine", "threshold")
#: a store's former option name -> the shared one (accepted for one release, with a DeprecationWarning)
RENAMED = {
    "factory": "index",
    "index_type": "index",
    "nprobes": "nprobe",
    "ef_search": "ef",
    "refine_factor": "refine",
    "train_min": "threshold",
    "index_threshold": "threshold",
}


def warn_renamed(old: str, new: str, owner: str, stacklevel: int = 3) -> None:
    """Warn that ``owner``'s ``old`` is now ``new``."""
    warnings.warn(
        f"{owner}: {old!r} is deprecated and will be removed in the next release; use {new!r}",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def renamed_options(owner: str, old: Mapping[str, Any], accepted: tuple[str, ...]) -> dict[str, Any]:
    """The shared names of the deprecated options ``old`` that ``owner`` accepts (each warned about);
    any other name is a TypeError, as an unknown keyword argument is."""
    out: dict[str, Any] = {}
    for name, value in old.items():
        if name not in accepted:
            raise TypeError(f"{owner} got an unexpected option {name!r}; its options are {', '.join(NAMES)}")
        warn_renamed(name, RENAMED[name], owner, stacklevel=4)
        out[RENAMED[name]] = value
    return out


def pick(name: str, given: Any, renamed: Mapping[str, Any]) -> Any:
    """The value of option ``name``: given under its shared name or a deprecated one (not both)."""
    if name in renamed:
        if given is not None:
            raise TypeError(f"{name!r} was given twice: under its name and a deprecated one")
        return renamed[name]
    return given


def check_count(name: str, value: Any, least: int = 1) -> int | None:
    """An integer option of at least ``least`` (None: the store's default)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an integer of at least {least}; got {value!r}")
    return int(value)


class renamed_attribute:
    """A store attribute's former name: reads and writes ``new``, with a DeprecationWarning."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.old = new

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        warn_renamed(self.old, self.new, type(obj).__name__)
        return getattr(obj, self.new)

    def __set__(self, obj: Any, value: Any) -> None:
        warn_renamed(self.old, self.new, type(obj).__name__)
        setattr(obj, self.new, value)
