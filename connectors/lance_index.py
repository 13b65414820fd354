"""A LanceDB store's vector index: when the ANN index is built (from the threshold, or the index plan for
"auto"), extended with new rows, rebuilt as the table grows, and its search breadth calibrated."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from isotrope.stores import index_plan
from isotrope.stores.base import Hit, as_vectors
from isotrope.stores.options import AUTO

from .lance_rows import LanceRows, to_numpy

logger = logging.getLogger(__name__)

LANCE_DISTANCE = {"ip": "dot", "cosine": "cosine", "l2": "l2"}
#: the index types ``index`` names, as pylance's index types
INDEX_TYPES = {"ivf_pq": "IVF_PQ", "hnsw_sq": "IVF_HNSW_SQ"}
#: ``lancedb.index`` config classes :meth:`LanceVectorIndex.create_index` takes, as pylance's index types
_LANCEDB_CONFIGS = {
    "IvfPq": "IVF_PQ",
    "IvfSq": "IVF_SQ",
    "IvfFlat": "IVF_FLAT",
    "HnswSq": "IVF_HNSW_SQ",
    "HnswPq": "IVF_HNSW_PQ",
    "HnswFlat": "IVF_HNSW_FLAT",
}
#: a ``lancedb.index`` config's parameters, as pylance's ``create_index`` names them
_LANCEDB_PARAMS = {
    "num_partitions": "num_partitions",
    "num_sub_vectors": "num_sub_vectors",
    "num_bits": "num_bits",
    "max_iterations": "max_iters",
    "sample_rate": "sample_rate",
    "m": "m",
    "ef_construction": "ef_construction",
    "target_partition_size": "target_partition_size",
}
#: delta segments of the vector index (one per commit that adds rows to it) merged into one from this many on
_MAX_INDEX_SEGMENTS = 4
#: the index asked for ("auto" or an index type) and the search breadth calibrated when it was built
META_INDEX = "isotrope.index"
META_NPROBES = "isotrope.nprobes"
META_EF = "isotrope.ef"
_META_RECALL = "isotrope.calibrated_recall"
_META_SOURCE = "isotrope.calibrated_on"
_META_PARAMS = "isotrope.index_params"
#: candidates per hit re-ranked by exact distance by default: IVF_PQ's coarse codes need 10; IVF_HNSW_SQ's
#: 8-bit codes 2 (200 real queries at 100,000 rows, 1 and 4 graphs: refine 2 and 10 reach the same recall@10
#: at every ef; 20 rows taken instead of 100, 0.8 to 1.3 ms less a query on a loaded machine)
REFINE = 10
REFINE_SQ = 2


def _from_lancedb(config: Any) -> tuple[str, dict[str, Any]]:
    """A ``lancedb.index`` vector index config as pylance's index type and ``create_index`` parameters."""
    kind = _LANCEDB_CONFIGS.get(type(config).__name__)
    if kind is None:
        raise ValueError(f"unsupported index config {type(config).__name__}; expected one of {', '.join(_LANCEDB_CONFIGS)}")
    values = {ours: getattr(config, theirs, None) for theirs, ours in _LANCEDB_PARAMS.items()}
    return kind, {name: value for name, value in values.items() if value is not None}


class LanceVectorIndex(LanceRows):
    """The ANN index on the ``vector`` column (none: exact search)."""

    metric: str
    index: str
    threshold: int | None
    nprobe: int
    ef: int | None
    _refine: int | None
    _deferring: bool
    _indexed_rows: int
    _compaction_due: bool
    calibration_queries: Callable[[], np.ndarray | None] | None

    if TYPE_CHECKING:

        def search(self, queries: Any, k: int, where: Mapping[str, Any] | None = None, with_text: bool = True) -> list[list[Hit]]:
            """The store's vector search (calibration searches as users do)."""

    @property
    def refine(self) -> int:
        """Candidates per hit re-ranked by exact distance: as set, else :data:`REFINE_SQ` for an IVF_HNSW_SQ
        index and :data:`REFINE` for others."""
        if self._refine is not None:
            return self._refine
        return REFINE_SQ if "Hnsw" in (self.vector_index or "") else REFINE

    @refine.setter
    def refine(self, value: int | None) -> None:
        self._refine = value

    @property
    def vector_index(self) -> str | None:
        """The type of the ANN index on ``vector`` (e.g. "IvfPq", "IvfHnswSq"), or None: exact search.

        Looked up once and remembered until this store changes the table's indexes or version.
        """
        if self._vector_index is False:
            self._vector_index = next((kind for _, kind, columns in self._indices() if "vector" in columns), None)
        return cast("str | None", self._vector_index)  # never True: only False ("not looked up") or the found type

    @contextmanager
    def deferred_index(self) -> Iterator[None]:
        """A bulk load: inside, writes and commits neither build nor rebuild nor extend the ANN index, nor
        refresh the full-text index; the first commit after it builds the index that is due, once, over every
        row, and brings the full-text index up to date."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def _maybe_index(self) -> None:
        if self.threshold is None or self._deferring:
            return
        n = len(self)
        if self.vector_index is None and n >= self.threshold:
            logger.info("table %r reached %d rows: building a %s index", self.table_name, n, self.index)
            self.create_index()
        elif self.index == AUTO and self.vector_index is not None and index_plan.outgrown(n, self._indexed_rows):
            logger.info("table %r grew to %d rows: rebuilding its index", self.table_name, n)
            self.create_index()
        elif self.vector_index is not None:
            self._index_new_rows()

    def _index_new_rows(self) -> None:
        """Add rows written since the ANN index was built to it (no retraining): LanceDB scans rows
        outside the index by brute force, which made a 100,000-row store answer in 54 ms, not 10 ms.
        Each addition is a delta segment that every query searches too (13 of them at 100,000 rows: 11.9
        against 8.4 ms a query merged), so from ``_MAX_INDEX_SEGMENTS`` on, all are merged into one (76 ms)."""
        name = next(name for name, _, columns in self._indices() if "vector" in columns)
        stats = self.index_stats(name)
        if stats["num_unindexed_rows"]:
            merge = stats["num_indices"] if stats["num_indices"] >= _MAX_INDEX_SEGMENTS else 0  # 0: a new delta
            self._writable().optimize.optimize_indices(index_names=[name], num_indices_to_merge=merge)
            self._vector_index = False

    def index_stats(self, name: str) -> dict[str, Any]:
        """Lance's statistics of the index ``name`` (``num_indexed_rows``, ``num_unindexed_rows``, ``num_indices``, ...)."""
        return dict(self._dataset().stats.index_stats(name))

    def _planned_index(self) -> tuple[str, dict[str, Any]]:
        """The pylance index type and parameters of the index ``index`` asks for at the table's size."""
        if self.index != AUTO:
            return INDEX_TYPES.get(self.index, "IVF_PQ"), {}
        plan = index_plan.lancedb_index_for(max(len(self), index_plan.EXACT_BELOW), self.dim)
        assert plan is not None  # at EXACT_BELOW rows or more the plan is an index, never exact search
        return INDEX_TYPES[plan.pop("type")], plan

    def calibrate(self, target: float | None = None, queries: Any = None) -> dict[str, str]:
        """Set the search breadth (``ef`` of an HNSW index, else ``nprobe``) to the smallest reaching
        ``target`` recall@10 against exact search (:func:`index_plan.calibrate_breadth`) on ``queries``, else
        on those :attr:`calibration_queries` makes, else on queries made from stored vectors; saved in the
        table's metadata; the settings chosen."""
        if self.vector_index is None:
            return {}
        graph = "Hnsw" in self.vector_index
        knob = "ef" if graph else "nprobe"
        ladder: tuple[int, ...] = index_plan.EF_LADDER if graph else index_plan.NPROBE_LADDER
        if graph:  # a search's ef is at least the candidates it refines (10 x refine for 10 hits)
            ladder = tuple(v for v in ladder if v >= index_plan.CALIBRATION_K * max(self.refine, 1)) or ladder[-1:]
        dataset = self._dataset()
        # id -> row position in the scan, the key of the exact search
        positions = {id_: row for row, id_ in enumerate(dataset.to_table(columns=["id"]).column("id").to_pylist())}

        def batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
            start = 0
            for batch in dataset.to_batches(columns=["id", "vector"], batch_size=65_536):
                if batch.num_rows:
                    yield (
                        np.arange(start, start + batch.num_rows, dtype=np.int64),
                        to_numpy(batch.column("vector"), self.dim, batch.column("id"), "vector"),
                    )
                    start += batch.num_rows

        def sample(chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rows = dataset.take(chosen, columns=["id", "vector"])
            sources = np.array([positions[i] for i in rows.column("id").to_pylist()], dtype=np.int64)
            return sources, to_numpy(rows.column("vector"), self.dim, rows.column("id"), "vector")

        def search(q: np.ndarray, k: int, value: int) -> list[list[int]]:
            setattr(self, knob, value)
            return [[positions[h.id] for h in hits] for hits in self.search(q, k)]

        given, source = index_plan.calibration_queries(queries, self.calibration_queries)
        q = None if given is None else as_vectors(given, self.dim, "queries")
        keys = np.arange(len(positions), dtype=np.int64)
        value, reached = index_plan.calibrate_breadth(ladder, keys, sample, batches, search, self.metric, target, q, source)
        setattr(self, knob, value)
        logger.info("table %r: %s=%d reaches recall@10 %.3f on %s", self.table_name, knob, value, reached, source)
        recall = f"{reached:.4f}"
        self._set_meta({META_EF if graph else META_NPROBES: str(value), _META_RECALL: recall, _META_SOURCE: source})
        return {knob: str(value), "calibrated_recall": recall, "calibrated_on": source}

    def index_info(self) -> dict[str, Any]:
        """The index type as asked and as built, and its search settings."""
        meta = {k.decode(): v.decode() for k, v in (self._schema.metadata or {}).items()}
        info: dict[str, Any] = {"index": self.index, "index_built": self.vector_index or "exact"}
        if self.vector_index is not None:
            info.update(json.loads(meta.get(_META_PARAMS, "{}")))
            info.update(nprobe=self.nprobe, refine=self.refine, **({"ef": self.ef} if self.ef else {}))
            if _META_RECALL in meta:
                info["calibrated_recall_at_10"] = float(meta[_META_RECALL])
                info["calibrated_on"] = meta.get(_META_SOURCE, index_plan.STORED_VECTORS)
        return info

    def create_index(self, config: Any = None) -> None:
        """Build (or rebuild) the ANN index on ``vector``.

        ``config`` is a ``lancedb.index`` config (``IvfPq``, ``HnswSq``, ...: read, not imported here) whose
        distance type must match the store's metric; by default one of ``index`` (IVF_PQ for "flat"), an IVF_PQ
        index with the index plan's partitions and sub-vectors (:func:`index_plan.lancedb_ivf_pq_for`) where not
        given. Built through pylance, named as LanceDB names it (``vector_idx``).
        """
        distance = LANCE_DISTANCE[self.metric]
        if config is None:
            kind, build = self._planned_index()
        else:
            kind, build = _from_lancedb(config)
            if getattr(config, "distance_type", distance) != distance:
                raise ValueError(
                    f"index distance_type {config.distance_type!r} does not match the store metric {self.metric!r} ({distance!r})"
                )
        if "PQ" in kind:  # Lance needs the sub-vectors of PQ: the index plan's, and its partitions where none are given
            build = {**index_plan.lancedb_ivf_pq_for(len(self), self.dim), **build}
        self._vector_index = False
        self._writable().create_index("vector", kind, name="vector_idx", metric=distance, replace=True, **build)
        self._indexed_rows = len(self)
        self._compaction_due = True
        params = {name: build[name] for name in ("num_partitions", "num_sub_vectors", "m", "ef_construction") if name in build}
        meta = {_META_PARAMS: json.dumps(params)}
        if "Hnsw" in (self.vector_index or "") and "num_partitions" in params:
            self.nprobe = params["num_partitions"]  # every graph searched: ef alone sets the breadth
            meta[META_NPROBES] = str(self.nprobe)
        self._set_meta(meta)
        if self.index == AUTO:
            self.calibrate()

    def _compact(self) -> None:
        """Merge the table's fragments (one per write) into few: a search takes rows (refinement, the hits,
        hybrid's candidates) from each fragment they lie in, and at 100,000 rows in 50 fragments a take of
        200 rows cost 2.4 times, a hybrid query 1.5 times, what they cost in one (loaded machine). Rows and
        indexes stay as they were (Lance remaps the indexes; fragments covered by different indexes are merged
        apart). Done at the first commit after an index build, O(n) work as the build is."""
        self._compaction_due = False
        with self._rows_kept():
            self._writable().optimize.compact_files()
        self._vector_index = False

    def optimize(self) -> None:
        """Compact files, prune versions older than a week and add new rows to the indexes (what LanceDB.s
        ``optimize`` does); an auto table also gets the index its size calls for, rebuilt and recalibrated."""
        self._vector_index = False
        with self._rows_kept():
            writer = self._writable()
            writer.optimize.compact_files()
            writer.cleanup_old_versions(older_than=timedelta(days=7))
            writer.optimize.optimize_indices()
        self._vector_index = False
        if self.index == AUTO and len(self) >= index_plan.EXACT_BELOW:
            self.create_index()
