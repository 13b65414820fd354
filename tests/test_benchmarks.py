"""The benchmark suite's discipline and its generated docs: load guard, alternation, per-stage peak
memory, rendering between markers, and the committed tables equal to what the committed results render."""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import harness, render
from benchmarks.harness import (
    REPO_ROOT,
    LoadedMachineError,
    StageMemory,
    alternate,
    check_load,
    measured,
    peak_rss_mb,
    summarize,
    wait_for_load,
)

ENCODE_RESULT = {
    "model": "all-MiniLM-L6-v2",
    "texts": 512,
    "quality_pairs": 1379,
    "batch_size": 32,
    "max_seq_length": 256,
    "rounds": 3,
    "sides": {
        "isotrope_onnx": {
            **summarize([2.0, 1.0, 1.5], [2.0, 2.0, 2.0]),
            "texts_per_s": 341.3,
            "x_st_torch": 2.0,
            "mean_cosine_to_torch": 0.999999,
            "min_cosine_to_torch": 0.99999,
            "stsb_spearman": 82.03,
            "stsb_share_of_torch": 1.0,
        },
        "st_torch": {
            **summarize([3.0, 3.0, 3.0], [6.0, 6.0, 6.0]),
            "texts_per_s": 170.7,
            "x_st_torch": 1.0,
            "stsb_spearman": 82.03,
            "stsb_share_of_torch": 1.0,
        },
    },
    "gates": {"onnx_cosine_ge_0.9999": True},
}


def document(loaded: bool = False) -> dict:
    return {
        "topic": "encode",
        "command": "python -m benchmarks encode --quick --data-dir DATA",
        "mode": "quick",
        "started": "2026-11-27T04:00:00+00:00",
        "loaded": loaded,
        "load_average_before": [0.4, 0.3, 0.2],
        "load_average_after": [1.9, 1.1, 0.6],
        "machine": {"cpu": "Test CPU", "usable_cores": 2, "ram_gb": 8.0, "git_commit": "abc1234"},
        "threads": {"requested": 2, "torch": 2, "onnxruntime": 2},
        "result": copy.deepcopy(ENCODE_RESULT),
    }


def test_wait_for_load_waits_until_the_load_falls_and_gives_up_at_its_timeout(monkeypatch, caplog):
    loads = iter([2.4, 1.6, 0.9, 0.9])
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (next(loads), 1.2, 1.1))
    slept = []
    monkeypatch.setattr(harness.time, "sleep", slept.append)
    assert wait_for_load(limit=1.0, poll_s=5) == [0.9, 1.2, 1.1]
    assert slept == [5, 5]  # polled at 2.4 and 1.6, not at 0.9
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    slept.clear()
    assert wait_for_load(limit=1.0, poll_s=1, timeout_s=0) == [3.0, 3.0, 3.0]
    assert slept == [] and "still 3.00" in caplog.text


def test_load_guard_refuses_a_busy_machine_unless_allowed(monkeypatch):
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (3.5, 2.0, 1.0))
    with pytest.raises(LoadedMachineError, match=r"3\.50"):
        check_load(allow_loaded=False)
    assert check_load(allow_loaded=True) is True
    with pytest.raises(LoadedMachineError):
        measured("encode", "cmd", "quick", False, lambda: pytest.fail("ran on a loaded machine"))
    result = measured("encode", "cmd", "quick", True, lambda: {"x": 1})
    assert result["loaded"] is True and result["result"] == {"x": 1}
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(harness, "machine_cpu_seconds", lambda: 100.0)  # nothing else ran
    assert measured("encode", "cmd", "quick", False, lambda: {})["loaded"] is False
    loads = iter([0.5, 0.5, 2.5])  # the guard, the load before, then a load that stays up after the run
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (next(loads, 2.5), 1.0, 1.0))
    monkeypatch.setattr(harness, "SETTLE_S", 0.0)
    result = measured("encode", "cmd", "quick", False, lambda: {})
    assert result["loaded"] is True and result["load_average_after"][0] == 2.5


def test_cpu_used_by_other_processes_during_a_run_marks_it_loaded(monkeypatch):
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    busy = iter([100.0, 160.0])  # the machine's busy seconds at the start and the end: 60 s not ours
    monkeypatch.setattr(harness, "machine_cpu_seconds", lambda: next(busy))
    result = measured("encode", "cmd", "quick", False, lambda: {"x": 1})
    assert result["loaded"] is True and result["others_cpu_s"] >= 59.0 and result["others_cpu_share"] > 0.1
    assert "other processes" in render.provenance({**document(), "others_cpu_share": 0.004})


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="/proc/stat is Linux's")
def test_others_cpu_sees_a_process_this_one_has_not_waited_for():
    others = harness.OthersCpu()
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 1.2: pass"])
    os.waitid(os.P_PID, spinner.pid, os.WEXITED | os.WNOWAIT)  # it has exited, unreaped: its CPU is not ours yet
    figures = others.figures()
    spinner.wait()
    assert figures is not None and figures["others_cpu_s"] >= 1.0


def test_alternate_rotates_the_order_and_records_wall_and_cpu_time():
    order: list[str] = []

    def side(name: str, seconds: float):
        def call() -> None:
            order.append(name)
            end = time.process_time() + seconds  # busy: CPU time as well as wall time
            while time.process_time() < end:
                pass

        return call

    timings = alternate({"a": side("a", 0.02), "b": side("b", 0.0)}, rounds=4, warmups={"a": lambda: None, "b": lambda: None})
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    a = timings["a"]
    assert len(a["runs_s"]) == len(a["cpu_runs_s"]) == 4
    assert a["median_s"] == pytest.approx(statistics.median(a["runs_s"]), abs=1e-6)
    assert a["cpu_median_s"] >= 0.015 > timings["b"]["cpu_median_s"]
    # runs_s are rounded to the microsecond, the spread is not: 1e-6 s of 0.02 s moves it by 1e-4
    assert a["spread"] == pytest.approx((max(a["runs_s"]) - min(a["runs_s"])) / statistics.median(a["runs_s"]), abs=5e-4)


def test_profile_attribution_gives_library_time_to_the_owned_code_that_called_it():
    frameworks = pytest.importorskip("benchmarks.frameworks")
    loop = (f"{REPO_ROOT}/benchmarks/frameworks.py", 1, "each")
    retrieve = ("/venv/site-packages/llama_index/core/base/base_retriever.py", 2, "retrieve")
    query = (f"{REPO_ROOT}/connectors/llama_index.py", 3, "query")
    search = (f"{REPO_ROOT}/src/isotrope/fusion.py", 4, "search_store")
    loads = ("/python/json/__init__.py", 5, "loads")  # library code called by the adapter and by LlamaIndex
    length = ("~", 0, "<built-in method len>")  # called by loads only
    deepcopy = ("/python/copy.py", 6, "deepcopy")  # recursive, entered by LlamaIndex
    # cProfile's layout: (primitive calls, calls, self s, cumulative s, {caller: (.., .., self s, cumulative s)})
    stats = {
        loop: (1, 1, 0.1, 19.6, {}),
        retrieve: (1, 1, 1.0, 17.0, {loop: (1, 1, 1.0, 17.0)}),
        query: (1, 1, 0.5, 10.0, {retrieve: (1, 1, 0.5, 10.0)}),
        search: (1, 1, 7.0, 7.0, {query: (1, 1, 7.0, 7.0)}),
        loads: (2, 2, 4.0, 6.0, {query: (1, 1, 1.0, 1.5), retrieve: (1, 1, 3.0, 4.5)}),
        length: (1, 1, 2.0, 2.0, {loads: (1, 1, 2.0, 2.0)}),
        deepcopy: (1, 3, 5.0, 6.0, {retrieve: (1, 1, 2.0, 6.0), deepcopy: (0, 2, 3.0, 4.0)}),
    }
    seconds = frameworks.attribute(stats)
    # loads' 2 s of len() follow loads' callers by the time each call carried (1.5 : 4.5)
    assert seconds == pytest.approx({loop: 0.1, retrieve: 1.0 + 3.0 + 1.5 + 5.0, query: 0.5 + 1.0 + 0.5, search: 7.0})
    assert sum(seconds.values()) == pytest.approx(sum(entry[2] for entry in stats.values()))
    owners = {frameworks._owner(func[0]) for func in seconds}
    assert owners == {frameworks.LOOP, frameworks.LLAMA_INDEX, frameworks.ADAPTER, frameworks.SHARED}


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="per-stage peaks need Linux's clear_refs")
def test_stage_memory_sees_each_stages_own_peak():
    memory = StageMemory()
    with memory.stage("big"):
        block = np.ones(64 * 2**20 // 8)  # 64 MiB touched
        del block
    with memory.stage("small"):
        pass
    big, small = memory.stages["big"], memory.stages["small"]
    assert big["peak_rss_mb"] - big["rss_before_mb"] >= 60
    assert small["peak_rss_mb"] - small["rss_before_mb"] < 30  # the first stage's peak was reset


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="per-stage peaks need Linux's clear_refs")
def test_stage_memory_keeps_a_repeated_stages_largest_peak_and_the_outer_peak():
    memory = StageMemory()
    with memory.stage("outer"):
        block = np.ones(256 * 2**20 // 8)  # 256 MiB touched before the inner stages reset VmHWM
        del block
        for size in (160, 0):
            with memory.stage("batch"):
                block = np.ones(size * 2**20 // 8)
                del block
    outer, batch = memory.stages["outer"], memory.stages["batch"]
    assert batch["entries"] == 2 and outer["entries"] == 1
    # margins of tens of MB: the allocator may hand back other freed memory between the readings
    assert batch["peak_rss_mb"] - batch["rss_before_mb"] >= 120  # the first entry's, not the last's
    assert outer["peak_rss_mb"] - outer["rss_before_mb"] >= 200  # seen before the inner resets
    assert (
        round(peak_rss_mb(), 1) >= outer["peak_rss_mb"]
    )  # the process's peak survives the stages' resets (stages round to 0.1 MB)


def test_render_states_provenance_and_the_figures():
    text = render.render_topic(document())
    assert "`python -m benchmarks encode --quick --data-dir DATA`" in text
    assert "Test CPU (2 cores" in text and "load 0.40 before / 1.90 after" in text and "commit abc1234" in text
    onnx_row = next(line for line in text.splitlines() if line.startswith("| isotrope `onnx`"))
    cells = [cell.strip() for cell in onnx_row.strip("|").split("|")]
    assert cells[1:4] == ["341.30", "2.00", f"{(2.0 - 1.0) / 1.5:.2f}"]
    assert cells[5] == "0.999999 / 0.999990" and cells[6] == "82.03"


def test_a_loaded_result_is_refused():
    with pytest.raises(render.LoadedResultError, match="loaded"):
        render.render_topic(document(loaded=True))


def test_check_finds_drift_and_render_fixes_it(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "encode.json").write_text(json.dumps(document()))
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- bench:encode -->\nold figures\n<!-- /bench:encode -->\nend\n")
    assert render.main(check=True, root=tmp_path, results_dir=results) == 1
    assert readme.read_text().count("old figures") == 1  # --check writes nothing
    assert render.main(root=tmp_path, results_dir=results) == 0
    assert "old figures" not in readme.read_text() and "| isotrope `onnx`" in readme.read_text()
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("<!-- /bench:encode -->\nend\n")
    assert render.main(check=True, root=tmp_path, results_dir=results) == 0
    (results / "encode.json").write_text(json.dumps(document(loaded=True)))
    assert render.main(check=True, root=tmp_path, results_dir=results) == 2


def test_committed_tables_equal_what_the_committed_results_render():
    assert render.main(check=True, root=REPO_ROOT) == 0


def test_a_scifact_subset_keeps_every_judged_abstract_and_a_seeded_sample_of_the_others(tmp_path):
    from benchmarks.build_retrieval_sets import scifact_subset, write_beir

    corpus = {f"d{i}": {"title": f"t{i}", "text": f"abstract {i}"} for i in range(30)}
    queries = {"q1": "a claim", "q2": "another claim"}
    write_beir(tmp_path / "full", corpus, queries, {"q1": {"d3": 1, "d7": 1}, "q2": {"d20": 1}})
    kept, kept_queries, qrels = scifact_subset(tmp_path / "full", 10, seed=0)
    assert len(kept) == 10 and {"d3", "d7", "d20"} <= set(kept)
    assert list(kept) == [doc for doc in corpus if doc in kept]  # corpus order
    assert kept_queries == queries and qrels == {"q1": {"d3": 1, "d7": 1}, "q2": {"d20": 1}}
    assert scifact_subset(tmp_path / "full", 10, seed=0)[0] == kept
    assert scifact_subset(tmp_path / "full", 10, seed=1)[0] != kept
    with pytest.raises(ValueError, match="at least the 3 judged"):
        scifact_subset(tmp_path / "full", 2, seed=0)


def test_the_question_set_pairs_our_questions_with_the_corpus_and_checks_every_judgement(tmp_path):
    from benchmarks.build_retrieval_sets import QUESTIONS, questions, write_beir

    corpus = {f"d{i}": {"title": f"t{i}", "text": f"abstract {i}"} for i in range(5)}
    write_beir(tmp_path / "full", corpus, {"q1": "a claim"}, {"q1": {"d1": 1}})
    table = tmp_path / "questions.tsv"
    table.write_text("query-id\tcorpus-id\tquestion\nx1\td3\twhat is in abstract three?\nx2\td0\tand zero?\n")
    kept, queries, qrels = questions(tmp_path / "full", table)
    assert kept == corpus and queries == {"x1": "what is in abstract three?", "x2": "and zero?"}
    assert qrels == {"x1": {"d3": 1}, "x2": {"d0": 1}}
    table.write_text("query-id\tcorpus-id\tquestion\nx1\td9\tnowhere?\n")
    with pytest.raises(ValueError, match="x1 is judged to d9"):
        questions(tmp_path / "full", table)
    rows = QUESTIONS.read_text().splitlines()[1:]  # the committed set: unique ids, one judgement each
    assert len(rows) >= 40 and len({row.split("\t")[0] for row in rows}) == len(rows)


def test_a_cold_process_reports_its_own_wall_time_and_peak_memory():
    from benchmarks import cold

    small_wall, small_peak = cold.timed_process([sys.executable, "-c", "pass"], threads=1)
    big_wall, big_peak = cold.timed_process(
        [sys.executable, "-c", "import time; b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096]); time.sleep(0.3)"],
        threads=1,
    )
    assert big_peak - small_peak > 150  # the 200 MB the second process touched, not this process's peak
    assert big_wall >= 0.3 and small_wall < big_wall
    with pytest.raises(RuntimeError, match="exited 3: boom"):
        cold.timed_process([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"], threads=1)
    entry = cold.summary([2.0, 1.0, 4.0], [100.0, 300.0, 200.0])
    assert entry["median_s"] == 2.0 and entry["spread"] == 1.5 and entry["peak_rss_mb"] == 300.0


def test_the_scale_table_shows_each_mode_and_hybrid_against_dense():
    mode = {"p50_ms": 2.0, "p99_ms": 9.0}
    store = {
        "indexing": {"chunks": 10, "index_wall_s": 1.0, "chunks_per_s": 10.0, "peak_rss_mb": 100.0, "disk_bytes_per_chunk": 4.0},
        "search": {
            "text_modes": {"dense": mode, "keyword": {"p50_ms": 1.0, "p99_ms": 3.0}, "hybrid": {"p50_ms": 3.0, "p99_ms": 5.0}},
            "ivf": {
                "recall_at_10": 0.98,
                "p50_ms_single": 0.5,
                "bare_p50_ms_single": 0.4,
                "overhead_pct_single": 25.0,
                "p50_ms_batch": 10.0,
                "bare_p50_ms_batch": 9.0,
            },
        },
    }
    item = {"chunks": 10, "passages": "windows", "queries": 2, "single_queries": 2, "k": 10, "stores": {"faiss": store}}
    text = render.render_scale(item)
    modes_row = next(line for line in text.splitlines() if line.startswith("| faiss | 2.00 / 9.00"))
    assert "| 1.00 / 3.00 |" in modes_row and "| 3.00 / 5.00 | 1.50x |" in modes_row
    assert "| faiss | ivf | 0.98 | 0.50 | 0.40 | +25.0 | 10.00 / 9.00 |" in text


def scale_document(store_name: str, loaded: bool = False) -> dict:
    """A ``benchmarks.scale`` result of one store (the fields :func:`render.render_scale_modes` reads)."""
    auto = {"recall_at_10": 0.961, "bare_recall_at_10": 0.96, "p50_ms_single": 4.0, "p99_ms_single": 5.0}
    auto |= {"bare_p50_ms_single": 3.5, "p50_ms_single_with_encode": 4.5}
    index = {"index_built": "IVF4096,SQ8", "nprobe": 384} if store_name == "faiss" else {"index_built": "IvfHnswSq"}
    index |= {} if store_name == "faiss" else {"num_partitions": 5, "ef": 256, "refine": 2}
    modes = {"dense": {"p50_ms": 5.0, "p99_ms": 7.0}, "keyword": {"p50_ms": 3.0, "p99_ms": 30.0}}
    modes |= {"keyword_bare": {"p50_ms": 2.5, "p99_ms": 20.0}, "hybrid": {"p50_ms": 9.0, "p99_ms": 60.0}}
    store = {
        "indexing": {"chunks": 1_083_961, "index_wall_s": 462.0, "peak_rss_mb": 2585.0, "disk_bytes_per_chunk": 4196.0}
        | {"load_average_before_after": [0.5, 0.4, 0.3, 1.9, 1.0, 0.5], "others_cpu_share": 0.004},
        "search": {"auto": auto, "auto_index": index, "text_modes": modes, "load_average_at_start": [0.7, 0.5, 0.4]},
    }
    return {
        "command": "python -m benchmarks.scale --chunks 1000000 --data-dir DATA",
        "started": "2026-11-27T19:00:00+00:00",
        "loaded": loaded,
        "machine": {"cpu": "Test CPU", "usable_cores": 2, "ram_gb": 8.0, "git_commit": "abc1234", "threads": 2}
        | {"search_threads": 1},
        "stores": {store_name: store},
    }


def test_the_scale_section_puts_each_store_in_a_column_with_its_provenance(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for name in ("faiss", "lancedb"):
        (results / f"scale-1m-{name}-modes.json").write_text(json.dumps(scale_document(name)))
    text = render.render_section("scale-1m", results)
    assert text.count("- Measured with `python -m benchmarks.scale --chunks 1000000 --data-dir DATA`") == 2
    assert "children started at load 0.50–0.70, other processes ≤ 0.4 % of the CPU" in text and "commit abc1234" in text
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")]
    rows = {row[0]: row[1:] for row in cells}
    assert rows["indexing wall, keyword index included"][0] == "7.7 min" and rows["indexing peak RSS"][0] == "2.58 GB"
    assert rows["auto index, breadth calibrated at build on pseudo-queries"] == [
        "IVF4096,SQ8, nprobe 384",
        "IvfHnswSq (5 graphs), ef 256, refine ×2",
    ]
    assert rows["keyword p50 / p99 ms, cold (bare engine)"][0] == "3.00 / 30.00 (2.50 / 20.00)"
    assert rows["hybrid p50 / p99 ms, cold"][0] == "9.00 / 60.00: 1.80× dense"
    (results / "scale-1m-lancedb-modes.json").write_text(json.dumps(scale_document("lancedb", loaded=True)))
    with pytest.raises(render.LoadedResultError, match="loaded"):
        render.render_section("scale-1m", results)
    (results / "scale-1m-lancedb-modes.json").unlink()
    assert "scale-1m-lancedb-modes.json missing" in render.render_section("scale-1m", results)


def test_an_ingestion_child_imports_no_side_before_it_starts_and_frees_its_warmup():
    """Each side's child imports what its side needs, when it runs: the module and the thread pinning
    bring in no LlamaIndex, no LanceDB and no isotrope store; the warm-up's garbage held in a cycle
    is freed before the timed run."""
    script = (
        "import sys, numpy as np\n"
        "from benchmarks import ingest\n"
        "from benchmarks.harness import current_rss_mb, set_threads\n"
        "set_threads(1)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'llama_index', 'lancedb', 'lance', 'connectors'}))\n"
        "import gc; gc.disable()\n"  # the collector runs in release_warmup only
        "cycle = {'states': np.ones(2**24)}\n"  # 128 MB, touched, held by a cycle once its name is gone
        "cycle['self'] = cycle\n"
        "del cycle\n"
        "before = current_rss_mb()\n"
        "ingest.release_warmup()\n"
        "print(before - current_rss_mb())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO_ROOT, env=env)
    imported, freed = done.stdout.splitlines()
    assert imported == "[]"
    assert float(freed) > 100


def test_the_ingestion_corpus_joins_abstracts_and_repeats_under_distinct_ids(tmp_path):
    from benchmarks.build_retrieval_sets import write_beir
    from benchmarks.ingest import read_records, write_corpus

    corpus = {f"d{i}": {"title": f"t{i}", "text": f"abstract {i}"} for i in range(5)}
    write_beir(tmp_path / "retrieval" / "scifact", corpus, {"q": "a claim"}, {"q": {"d0": 1}})
    out = tmp_path / "corpus.jsonl"
    assert write_corpus(tmp_path, out, None, join=2, copies=3) == 9
    records = read_records(out)
    assert [r["_id"] for r in records] == ["d0", "d2", "d4", "d0~2", "d2~2", "d4~2", "d0~3", "d2~3", "d4~3"]
    assert records[0]["text"] == "t0 abstract 0\n\nt1 abstract 1" and records[5]["text"] == "t4 abstract 4"
    assert [r["text"] for r in records[3:6]] == [r["text"] for r in records[:3]]


def test_ingest_options_name_the_sides_run_and_refuse_unknown_ones(tmp_path, capsys):
    from benchmarks.__main__ import names, parse_args

    args = parse_args(["ingest", "--data-dir", str(tmp_path), "--sides", "", "--variants", "fast", "--copies", "13"])
    assert names(args.sides) == () and names(args.variants) == ("fast",) and args.copies == 13
    with pytest.raises(SystemExit):
        parse_args(["ingest", "--data-dir", str(tmp_path), "--sides", "llamaindex-faiss,nope"])
    assert "--sides: unknown nope" in capsys.readouterr().err
