"""The suite's one measurement discipline: load guard, threads, alternated rounds, CPU time, memory.

Every topic runs under :func:`measured`: it records the load average before and after and refuses to
write a result when the 1-minute load at the start is above :data:`MAX_LOAD` (``--allow-loaded``
writes it marked ``"loaded": true``, which the renderer refuses to cite). The load at the end counts
the run's own threads, so it also records the CPU time every *other* process used while it ran
(:class:`OthersCpu`), and reads the load after once its own threads have left the 1-minute average
(at most :data:`SETTLE_S`); above :data:`MAX_OTHERS_CPU` of the machine, or a load after still above
:data:`MAX_LOAD`, the result is marked loaded. Sides of a comparison are
timed by :func:`alternate` in rounds whose order rotates, each run's wall and CPU time recorded, and
summarised as median and spread. :func:`set_threads` pins torch, ONNX Runtime (through
``OMP_NUM_THREADS``, which isotrope's sessions read), OpenMP/BLAS and faiss, and returns what it set.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import resource
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from isotrope.resources import usable_cores

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
#: the 1-minute load average above which a result is not written (unless --allow-loaded)
MAX_LOAD = 1.0
#: the share of the machine's CPU time other processes may use during a run before it counts as loaded
MAX_OTHERS_CPU = 0.10
#: ... once they used at least this many CPU seconds (/proc/stat counts in ticks: a short run's share is noise)
MIN_OTHERS_CPU_S = 1.0
#: how long a run's end waits for its own threads to leave the 1-minute load average before reading it
SETTLE_S = 240.0
LIBRARIES = (
    "isotrope", "torch", "onnxruntime", "onnx", "transformers", "tokenizers", "sentence-transformers", "optimum",
    "optimum-onnx", "numpy", "faiss-cpu", "lancedb", "pylance", "pyarrow", "llama-index-core",
    "llama-index-embeddings-huggingface",
)  # fmt: skip


class LoadedMachineError(RuntimeError):
    """The machine is busy: a timing taken now would measure the load, not the code."""


# -- threads ------------------------------------------------------------------------
def thread_env(threads: int) -> dict[str, str]:
    """Environment that pins OpenMP / MKL / BLAS / tokenizers threading (for this or a child process)."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "RAYON_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "true",
    }


def set_threads(threads: int) -> dict[str, Any]:
    """Use ``threads`` threads in torch, ONNX Runtime, faiss and BLAS/OpenMP; returns what each reports."""
    from threadpoolctl import threadpool_limits

    os.environ.update(thread_env(threads))
    threadpool_limits(limits=threads)
    recorded: dict[str, Any] = {"requested": threads, "omp_env": threads}
    try:
        import torch

        torch.set_num_threads(threads)
        recorded["torch"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
        recorded["faiss"] = faiss.omp_get_max_threads()
    except ImportError:
        pass
    try:
        from isotrope.backbones.onnx import session_threads

        recorded["onnxruntime"] = session_threads()
    except ImportError:
        pass
    return recorded


# -- timing -------------------------------------------------------------------------
def cpu_seconds() -> float:
    """User + system CPU time of this process (all threads) and its finished children."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def machine_cpu_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq, softirq in /proc/stat),
    None where /proc is missing."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(value) for value in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


@dataclass
class OthersCpu:
    """CPU time other processes used while a run went on: the machine's busy time less this process's and its
    waited-for children's (:func:`cpu_seconds`), as seconds and as a share of every core's wall time."""

    start_machine: float | None = field(default_factory=lambda: machine_cpu_seconds())
    start_own: float = field(default_factory=cpu_seconds)
    start_wall: float = field(default_factory=time.perf_counter)

    def figures(self) -> dict[str, float] | None:
        end_machine = machine_cpu_seconds()
        if self.start_machine is None or end_machine is None:
            return None
        others = max(0.0, (end_machine - self.start_machine) - (cpu_seconds() - self.start_own))
        capacity = (time.perf_counter() - self.start_wall) * (os.cpu_count() or 1)
        return {"others_cpu_s": round(others, 1), "others_cpu_share": round(others / capacity, 4) if capacity else 0.0}


def loaded_by_others(figures: Mapping[str, float] | None) -> bool:
    """Whether other processes used more than :data:`MAX_OTHERS_CPU` of the machine during a run
    (:meth:`OthersCpu.figures`), warning when they did."""
    if not figures or figures["others_cpu_s"] < MIN_OTHERS_CPU_S or figures["others_cpu_share"] <= MAX_OTHERS_CPU:
        return False
    logger.warning(
        "other processes used %.0f %% of the CPU during the run: it counts as loaded", 100 * figures["others_cpu_share"]
    )
    return True


def summarize(wall: list[float], cpu: list[float] | None = None) -> dict[str, Any]:
    """Median, spread ((max - min) / median) and every run, wall and CPU seconds."""
    median = statistics.median(wall)
    summary: dict[str, Any] = {
        "median_s": median,
        "min_s": min(wall),
        "max_s": max(wall),
        "spread": (max(wall) - min(wall)) / median if median else None,
        "runs_s": [round(t, 6) for t in wall],
    }
    if cpu:
        summary["cpu_median_s"] = statistics.median(cpu)
        summary["cpu_runs_s"] = [round(t, 6) for t in cpu]
    return summary


def alternate(
    sides: Mapping[str, Callable[[], Any]], rounds: int, warmups: Mapping[str, Callable[[], Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """Time each side ``rounds`` times after one untimed warm-up per side.

    Rounds are interleaved and the order rotates every round (A B C, B C A, ...), so a slow spell of
    the machine falls on every side alike. Wall and CPU time of every run; a summary per side.
    """
    names = list(sides)
    for name in names:
        (warmups or sides)[name]()
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            cpu_start, start = cpu_seconds(), time.perf_counter()
            sides[name]()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(cpu_seconds() - cpu_start)
    return {name: summarize(wall[name], cpu[name]) for name in names}


# -- memory -------------------------------------------------------------------------
def _status_mb(field: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


#: the process's peak before the last reset of VmHWM (StageMemory resets it per stage)
_peak_before_reset_mb = 0.0


def _hwm_mb() -> float:
    """VmHWM: the peak since the last reset (ru_maxrss, the process's, where /proc is missing)."""
    value = _status_mb("VmHWM")
    if value is None:
        scale = 1024 * 1024 if sys.platform == "darwin" else 1024
        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / scale
    return value


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, across the resets of per-stage peaks."""
    return max(_hwm_mb(), _peak_before_reset_mb)


def current_rss_mb() -> float:
    """Resident memory of this process now (VmRSS; the peak where /proc is missing)."""
    value = _status_mb("VmRSS")
    return peak_rss_mb() if value is None else value


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux: ``5`` to clear_refs), keeping the peak so far
    for :func:`peak_rss_mb`; False where unsupported."""
    global _peak_before_reset_mb
    _peak_before_reset_mb = peak_rss_mb()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@dataclass
class StageMemory:
    """Peak RSS per named stage of one process (``with memory.stage("fit"): ...``).

    A stage entered again (one per batch) keeps its largest peak, its first ``rss_before_mb``, its
    last ``rss_after_mb`` and the number of entries; a stage inside another counts in both."""

    stages: dict[str, dict[str, float]] = field(default_factory=dict)
    #: the peak seen so far by each open stage, innermost last (its VmHWM is reset by an inner stage)
    _open: list[float] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        before = current_rss_mb()
        if self._open:  # the enclosing stage's peak so far, before this stage resets VmHWM
            self._open[-1] = max(self._open[-1], _hwm_mb())
        resettable = _reset_peak()
        self._open.append(0.0)
        try:
            yield
        finally:
            peak = max(self._open.pop(), _hwm_mb())
            if self._open:
                self._open[-1] = max(self._open[-1], peak)
            entry = self.stages.setdefault(name, {"rss_before_mb": round(before, 1), "entries": 0})
            entry["rss_after_mb"] = round(current_rss_mb(), 1)
            entry["entries"] += 1
            if resettable:
                entry["peak_rss_mb"] = round(max(entry.get("peak_rss_mb", 0.0), peak), 1)


# -- machine ------------------------------------------------------------------------
def _proc_field(path: str, key: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_commit(root: Path = REPO_ROOT) -> str | None:
    """The short commit at ``root`` (``+dirty`` with uncommitted tracked changes), or None outside git."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """Facts that make the numbers reproducible: CPU, cores, RAM, versions, commit."""
    memory = _proc_field("/proc/meminfo", "MemTotal")
    return {
        "cpu": _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "ram_gb": round(int(memory.split()[0]) / 1024**2, 1) if memory else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": library_versions(),
        "git_commit": git_commit(),
    }


# -- one topic's run ----------------------------------------------------------------
def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def wait_for_load(limit: float = MAX_LOAD, poll_s: float = 5.0, timeout_s: float = 600.0) -> list[float]:
    """Wait until the 1-minute load average is at most ``limit`` (a previous step's own threads still count
    in it for a minute or two), at most ``timeout_s``; the load averages then."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] > limit and time.monotonic() < deadline:
        time.sleep(poll_s)
    load = load_now()
    if load[0] > limit:
        logger.warning("1-minute load average still %.2f after %.0f s: the next step runs loaded", load[0], timeout_s)
    return load


def check_load(allow_loaded: bool, limit: float = MAX_LOAD) -> bool:
    """True when the machine is loaded (and that is allowed); raises LoadedMachineError when it is not allowed."""
    load = os.getloadavg()[0]
    if load <= limit:
        return False
    if not allow_loaded:
        raise LoadedMachineError(
            f"1-minute load average is {load:.2f} (> {limit}): timings now would measure the load; "
            "wait for an idle machine or pass --allow-loaded (the result is then marked loaded and never cited)"
        )
    return True


def measured(topic: str, command: str, mode: str, allow_loaded: bool, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``work`` under the discipline and return the result document (``work``'s figures under ``"result"``)."""
    loaded = check_load(allow_loaded)
    before, cpu_start, start, others = load_now(), cpu_seconds(), time.perf_counter(), OthersCpu()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = work()
    others_cpu, wall, cpu = others.figures(), time.perf_counter() - start, cpu_seconds() - cpu_start
    # the load after: once the run's own threads have left the 1-minute average; still high, others run
    after = load_now() if loaded else wait_for_load(timeout_s=SETTLE_S)
    loaded = loaded or loaded_by_others(others_cpu) or after[0] > MAX_LOAD
    return {
        "topic": topic,
        "command": command,
        "mode": mode,
        "started": started,
        "loaded": loaded,
        "load_average_before": before,
        "load_average_after": after,
        **(others_cpu or {}),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "machine": machine_info(),
        "result": result,
    }


def write_result(document: dict[str, Any], path: Path) -> Path:
    """Write a result document atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.write_text(json.dumps(document, indent=1) + "\n")
    staging.replace(path)
    return path
