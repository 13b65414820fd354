"""The faiss side of the FAISS store: which index a factory string builds, how it is keyed, searched with
a breadth and an id selector, written and read back (:mod:`isotrope.connectors.faiss_store` keeps the rows
in SQLite and decides when to build)."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np
from faiss.contrib.clustering import two_level_clustering

from isotrope.resources import usable_cores
from isotrope.stores.options import AUTO, FLAT

logger = logging.getLogger(__name__)

#: queries re-ranked together (their candidates' vectors are gathered into one array)
_REFINE_QUERIES = 256

#: the dimension an index_factory string is checked with before the store's own is known (2^6 x 3 x 5 x 7:
#: divisible by the usual PQ sub-quantizer counts)
CHECK_DIM = 6720


_READ_BLOCK = 1 << 22


#: the most vectors x dimensions an exact search of one query scans on the calling thread alone (87,000 vectors of
#: 384 dimensions: every auto-planned Flat index of up to 671): right after an encoder's own threads ran (torch's
#: spin a while) faiss's other threads wait for the cores. all-MiniLM-L6-v2 on torch, 2 cores, a query from text to
#: hits, one thread against two: 7.1 against 15.0 ms over 10,000 rows, 8.2 / 16.0 over 25,000, 10.3 / 18.6 over 50,000
SERIAL_SCAN = 1 << 25


@contextmanager
def omp_threads(threads: int) -> Iterator[None]:
    """faiss on ``threads`` OpenMP threads while the block runs in the calling thread (OpenMP's thread count is a
    per-thread setting); the caller's setting is back afterwards."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(threads)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


@contextmanager
def serial_if_small(queries: int, exact_scan: int | None) -> Iterator[None]:
    """faiss on the calling thread alone while it searches one query whose exact scan (vectors x dimensions;
    None: not an exact index) is at most :data:`SERIAL_SCAN`."""
    if queries != 1 or exact_scan is None or exact_scan > SERIAL_SCAN:
        yield
        return
    with omp_threads(1):
        yield


@contextmanager
def leaving_a_core() -> Iterator[bool]:
    """faiss on one thread fewer than this process's cores at most while the block runs in the calling thread, so a
    second thread's work has a core of its own: OpenMP threads spin-wait when more want the cores than there are,
    and hold a core a while after each search. Yields whether a core is left (not on one core)."""
    cores = usable_cores()
    if cores < 2:
        yield False
        return
    with omp_threads(min(faiss.omp_get_max_threads(), cores - 1)):
        yield True


def working_index(index: faiss.Index) -> faiss.Index:
    """The index doing the work under id maps, pre-transforms and refinement."""
    index = faiss.downcast_index(index)
    while True:
        if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
            index = faiss.downcast_index(index.index)
        elif isinstance(index, faiss.IndexRefine):
            index = faiss.downcast_index(index.base_index)
        else:
            return index


def default_threshold(index: faiss.Index) -> int:
    """Vectors needed before training: faiss's advice of 39 points per k-means centroid."""
    inner = working_index(index)
    need = 1
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        need = max(need, 39 * ivf.nlist)
    pq = getattr(inner, "pq", None)
    if pq is not None:
        need = max(need, 39 * pq.ksub)
    return need


def has_plain_lists(index: faiss.Index) -> bool:
    """Whether the IVF layer of ``index`` takes the vectors as given (under id maps and refinement only, no
    pre-transform) and finds its lists with a flat coarse quantizer: lists :func:`train_lists` can train."""
    index = faiss.downcast_index(index)
    while isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexRefine)):
        index = faiss.downcast_index(index.base_index if isinstance(index, faiss.IndexRefine) else index.index)
    return isinstance(index, faiss.IndexIVF) and isinstance(faiss.downcast_index(index.quantizer), faiss.IndexFlat)


def train_lists(ivf: faiss.IndexIVF, sample: np.ndarray, coarse_iterations: int) -> None:
    """Fill the empty coarse quantizer of ``ivf`` with k-means centroids of ``sample`` (its clustering
    parameters: ``ivf.cp``), started from a two-level clustering instead of faiss's random sample rows: sqrt(nlist)
    clusters of ``coarse_iterations``, each split in proportion to its points
    (``faiss.contrib.clustering.two_level_clustering``). The index's own ``train`` then keeps these lists
    and trains the rest (its codes)."""
    nlist = ivf.nlist
    spherical = ivf.metric_type == faiss.METRIC_INNER_PRODUCT
    start, _ = two_level_clustering(
        sample,
        max(1, round(math.sqrt(nlist))),
        nlist,
        clustering_niter=coarse_iterations,
        spherical=spherical,
        min_points_per_centroid=1,  # the sample is sized by the plan: no warning for fewer than 39 a list
    )
    ivf.cp.min_points_per_centroid = 1
    clustering = faiss.Clustering(ivf.d, nlist, ivf.cp)
    faiss.copy_array_to_vector(np.ascontiguousarray(start, dtype=np.float32).ravel(), clustering.centroids)
    clustering.train(sample, ivf.quantizer)  # leaves the centroids in the quantizer


class SelectorUnsupported(Exception):
    """An index that cannot restrict its search to an id selector."""


def params_for(
    index: faiss.Index, selector: faiss.IDSelector | None, nprobe: int, ef_search: int
) -> faiss.SearchParameters | None:
    """Search parameters shaped like the index: id maps and pre-transforms pass them down,
    a refinement stage wraps those of its base index."""
    index = faiss.downcast_index(index)
    if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2, faiss.IndexPreTransform)):
        return params_for(index.index, selector, nprobe, ef_search)
    if isinstance(index, faiss.IndexRefine):
        if selector is not None:  # the refine stage would not translate it through an id map
            raise SelectorUnsupported(type(index).__name__)
        base = params_for(index.base_index, selector, nprobe, ef_search)
        # re-rank at least 4k candidates: the factory's default (k_factor 1) makes refinement a no-op
        params = faiss.IndexRefineSearchParameters(  # type: ignore[call-arg]  # the stubs lack the SWIG keyword constructor
            k_factor=max(index.k_factor, 4.0), base_index_params=base
        )
        params.referenced_objects = [base]  # type: ignore[attr-defined]  # keeps base alive (SWIG attribute, not in the stubs)
        return params
    if isinstance(index, faiss.IndexIVF):
        return faiss.SearchParametersIVF(sel=selector, nprobe=min(nprobe, index.nlist))  # type: ignore[call-arg]  # stubs lack the keyword constructor
    if isinstance(index, faiss.IndexHNSW):
        return faiss.SearchParametersHNSW(sel=selector, efSearch=ef_search)  # type: ignore[attr-defined]  # missing from the stubs
    return None if selector is None else faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]  # stubs lack the keyword constructor


def factory_of(index: str) -> str:
    """The faiss index_factory string of a shared ``index`` value ("flat" is faiss's "Flat")."""
    return "Flat" if index == FLAT else index


def checked_factory(factory: str, dim: int) -> str:
    """``factory`` ("auto" or an index_factory string faiss can build), or a ValueError naming it."""
    if factory != AUTO:
        try:
            faiss.index_factory(dim, factory)
        except RuntimeError as error:
            reason = re.sub(r"^Error in .* at \S+:\d+: ", "", str(error).strip())  # faiss's C++ function and source line
            raise ValueError(
                f"invalid index {factory!r}: neither auto, flat nor a faiss index_factory string ({reason})"
            ) from error
    return factory


def process_alive(pid: str) -> bool:
    """Whether ``pid`` (as written in a temporary file's name) is a running process."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (read in 4 MiB blocks), as committed beside the index it checks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def read_index(path: Path, mmap: bool) -> tuple[faiss.Index, bool]:
    """The index file, memory-mapped (read-only) if asked and faiss can, else read into memory; and whether it is mapped."""
    if mmap:
        try:
            return faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY), True
        except RuntimeError:
            logger.info("%s cannot be memory-mapped; reading it", path)
    return faiss.read_index(str(path)), False


def fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rerank(
    q: np.ndarray, labels: np.ndarray, keys: np.ndarray, stored: np.ndarray, metric: str, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` of each query's candidate ``labels`` (-1: none) by exact scores against ``stored``,
    the vectors of the sorted ``keys``, as faiss returns them: (distances, labels), squared distances for l2."""
    better = np.empty(labels.shape, dtype=np.float32)  # exact scores, higher is better
    for start in range(0, len(q), _REFINE_QUERIES):
        block = slice(start, start + _REFINE_QUERIES)
        candidates = stored[np.searchsorted(keys, np.maximum(labels[block], 0))]  # (queries, refine * k, dim)
        if metric == "l2":
            difference = candidates - q[block, None, :]
            better[block] = -np.einsum("qcd,qcd->qc", difference, difference)
        else:
            better[block] = np.einsum("qcd,qd->qc", candidates, q[block])
    better[labels < 0] = -np.inf
    best = np.argsort(-better, axis=1, kind="stable")[:, :k]
    rows = np.arange(len(q))[:, None]
    out_labels = np.where(np.isfinite(better[rows, best]), labels[rows, best], -1)
    out_scores = (-better if metric == "l2" else better)[rows, best].astype(np.float32)
    return out_scores, out_labels


def over_fetch(
    index: faiss.Index, q: np.ndarray, k: int, keys: np.ndarray, params: faiss.SearchParameters | None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best hits among ``keys`` of an index that takes no id selector: fetch four times more
    until enough of them are allowed (or the whole index is fetched), and keep those."""
    allowed = set(keys.tolist())
    fetch = k
    while True:
        fetch = min(fetch * 4, index.ntotal)
        distances, labels = index.search(q, fetch, params=params)
        keep = np.isin(labels, keys)
        if fetch >= index.ntotal or (keep.sum(axis=1) >= min(k, len(allowed))).all():
            break
    out_d = np.full((len(q), k), np.nan, dtype=np.float32)
    out_l = np.full((len(q), k), -1, dtype=np.int64)
    for row in range(len(q)):
        row_d, row_l = distances[row][keep[row]][:k], labels[row][keep[row]][:k]
        out_d[row, : len(row_d)], out_l[row, : len(row_l)] = row_d, row_l
    return out_d, out_l


def keyed(index: faiss.Index) -> faiss.Index:
    """Key the index by int64: IVF indexes hold ids natively, others get an ``IndexIDMap2``."""
    top = faiss.downcast_index(index)
    if isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        return index
    if isinstance(top, faiss.IndexIVF) or (
        isinstance(top, faiss.IndexPreTransform) and isinstance(faiss.downcast_index(top.index), faiss.IndexIVF)
    ):
        return index
    return faiss.IndexIDMap2(index)


def can_remove(index: faiss.Index) -> bool:
    """Whether ``remove_ids`` works on the index (else rows are deleted by refilling it)."""
    top = faiss.downcast_index(index)
    if isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        return isinstance(faiss.downcast_index(top.index), faiss.IndexFlatCodes)
    return faiss.try_extract_index_ivf(top) is not None


def write_copy(index: faiss.Index, path: Path) -> Path:
    """Write ``index`` beside ``path`` under a name of this process (``index.faiss.PID.tmp``), synced to disk;
    the copy's path (streamed to disk: no serialized copy in memory)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    faiss.write_index(index, str(tmp))
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    return tmp


def remove_stale_copies(path: Path) -> None:
    """Remove the copies :func:`write_copy` left beside ``path`` whose process is gone (a live writer's stays)."""
    for stale in path.parent.glob(path.name + ".*.tmp"):
        if not process_alive(stale.name[len(path.name) + 1 : -len(".tmp")]):
            stale.unlink(missing_ok=True)
