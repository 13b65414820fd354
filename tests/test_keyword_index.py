"""The FAISS store's keyword index against the float64 BM25 reference, through merges, saves and loads."""

import logging
import os

import numpy as np
import pytest

from isotrope.lexical import K1, B, analyze, bm25_scores, query_terms

pytest.importorskip("faiss")
from isotrope.connectors import keyword_index
from isotrope.connectors.keyword_index import KeywordIndex, _Segment
from test_hybrid import QUERIES, make_texts


def assert_exact(index, rows):
    keys = sorted(rows)
    documents = [rows[key] for key in keys]
    assert len(index) == sum(1 for d in documents if d)
    for query in QUERIES:
        expected = bm25_scores(documents, query_terms(query))
        found, scores = index.scores(query_terms(query))
        by_key = dict(zip(found.tolist(), scores.tolist()))
        assert set(by_key) == {key for key, s in zip(keys, expected) if s > 0}, query
        np.testing.assert_allclose([by_key[k] for k in sorted(by_key)], [s for s in expected if s > 0], rtol=1e-9)
        top_keys, top_scores = index.top(query_terms(query), 5)
        np.testing.assert_allclose(top_scores, [-s for s, _ in sorted((-s, k) for k, s in zip(keys, expected) if s > 0)[:5]])
        order = sorted((-s, k) for k, s in zip(keys, expected) if s > 0)[:5]  # ties by key
        assert top_keys.tolist() == [k for _, k in order], query


@pytest.mark.parametrize("merge_rows", [3, 50_000])
def test_upserts_deletes_merges_and_reload_stay_exact(merge_rows, tmp_path, monkeypatch):
    monkeypatch.setattr(keyword_index, "MERGE_ROWS", merge_rows)
    monkeypatch.setattr(keyword_index, "MERGE_SHARE", np.inf)
    texts = make_texts(80)
    rows = {key: analyze(text) for key, text in enumerate(texts)}
    index = KeywordIndex.build([list(rows.items())[:40], list(rows.items())[40:]], generation=3)
    assert_exact(index, rows)
    rng = np.random.default_rng(0)
    for step in range(6):
        changed = rng.choice(90, 7, replace=False).tolist()  # some new keys, some replaced
        new = {key: analyze(texts[(key * 7 + step) % 80]) for key in changed}
        index.upsert(new.items())
        rows.update(new)
        gone = rng.choice(90, 4, replace=False).tolist()
        index.delete(gone)
        for key in gone:
            rows.pop(key, None)
        assert_exact(index, rows)
    novel = {95: analyze("quokkas never merge " + texts[0])}  # terms the large matrix has no row for
    index.upsert(novel.items())
    rows.update(novel)
    if merge_rows > 100:  # nothing merged since the build: the file keeps dead columns and pending rows
        assert index._pending and index._main.alive < len(index._main.keys)
    KeywordIndex.install(index.save(tmp_path))
    assert KeywordIndex.saved_generation(tmp_path) == 3
    loaded = KeywordIndex.load(tmp_path)
    assert_exact(loaded, rows)
    assert loaded._pending.keys() == index._pending.keys()  # saved as they were: no merge at save
    for key, terms in index._pending.items():
        np.testing.assert_array_equal(loaded._pending[key], terms)
    np.testing.assert_array_equal(loaded._main.lengths, index._main.lengths)


@pytest.mark.parametrize(("merge_rows", "share"), [(5, np.inf), (10**9, 0.2)])
def test_pending_and_dead_rows_merge_beyond_merge_rows_or_share(merge_rows, share, monkeypatch):
    """Deletes alone (no pending row) merge too once the dead columns pass ``MERGE_ROWS``, or ``MERGE_SHARE``
    of the large matrix's live rows (0.2 of 25)."""
    monkeypatch.setattr(keyword_index, "MERGE_ROWS", merge_rows)
    monkeypatch.setattr(keyword_index, "MERGE_SHARE", share)
    rows = {key: [f"w{key % 4}", f"v{key}", "w1"] for key in range(30)}
    index = KeywordIndex.build([list(rows.items())], generation=1)
    index.delete([0, 1, 2, 3, 4])
    assert index._main.alive == 25 and len(index._main.keys) == 30  # 5 dead: not beyond
    index.upsert([(40, ["x"])])
    assert len(index._main.keys) == 26 and not index._pending  # 5 dead + 1 pending: merged
    for key in range(5):
        rows.pop(key)
    assert_exact(index, rows | {40: ["x"]})


def test_a_version_1_file_is_read_and_a_later_version_is_not(tmp_path, caplog):
    rows = {key: analyze(text) for key, text in enumerate(make_texts(40))}
    index = KeywordIndex.build([list(rows.items())], generation=2)
    main = index._main
    saved = {
        "generation": np.int64(2),
        "vocabulary": np.array(list(index._vocabulary)),
        "indptr": main.counts.indptr,
        "indices": main.counts.indices,
        "data": main.counts.data,
        "keys": main.keys,
        "lengths": main.lengths,
    }
    np.savez(tmp_path / keyword_index.FILE_NAME, **saved)  # as version 1 wrote it (merged, no ceilings)
    assert_exact(KeywordIndex.load(tmp_path), rows)
    np.savez(tmp_path / keyword_index.FILE_NAME, **saved, version=np.int64(keyword_index.VERSION + 1))
    assert KeywordIndex.load(tmp_path) is None
    assert f"version {keyword_index.VERSION + 1}" in caplog.text
    version_2 = {**saved, "version": np.int64(2), "reference": np.float64(1.0), "ceilings": np.ones(3)}
    version_2 |= {"range_shift": np.int64(7), "range_terms": np.zeros(0, np.int64), "range_ceilings": np.zeros((0, 1))}
    version_2 |= {"pending_keys": np.array([99]), "pending_lengths": np.array([2]), "pending_terms": np.array([0, 1])}
    np.savez(tmp_path / keyword_index.FILE_NAME, **version_2)  # with the early stop's bounds, which are ignored
    assert_exact(KeywordIndex.load(tmp_path), rows | {99: list(index._vocabulary)[:2]})


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
@pytest.mark.parametrize("appended", [True, False])
def test_joined_segments_hold_the_live_counts_in_key_order(block, appended, monkeypatch):
    """The merge copies entries a block of terms at a time into preallocated arrays: the result is the
    count matrix of the live rows, built here with NumPy, columns in key order, indices sorted."""
    monkeypatch.setattr(keyword_index, "_SCATTER_BLOCK", block)
    rng = np.random.default_rng(block)
    sizes, terms = (25, 0, 12, 9), 30
    all_keys = np.arange(sum(sizes)) * 3 if appended else rng.permutation(1000)[: sum(sizes)]
    segments, expected, start = [], {}, 0
    for i, size in enumerate(sizes):
        known = 10 + 6 * i  # the vocabulary grows: earlier segments have fewer term rows
        rows = [
            (int(key), rng.integers(0, known, rng.integers(1, 15)).astype(np.int32)) for key in all_keys[start : start + size]
        ]
        start += size
        segment = _Segment.of(rows, known)
        dead = [key for key, _ in rows[::4]]
        segment.kill(np.array(dead, dtype=np.int64))
        segments.append(segment)
        expected.update({key: np.bincount(ids, minlength=terms) for key, ids in rows if key not in dead})
    joined = _Segment.joined(segments, terms)
    keys = sorted(expected)
    assert joined.keys.tolist() == keys and joined.alive == len(keys)
    np.testing.assert_array_equal(joined.counts.toarray(), np.stack([expected[key] for key in keys], axis=1))
    np.testing.assert_array_equal(joined.lengths, [expected[key].sum() for key in keys])
    assert joined.counts.has_canonical_format and joined.counts.indices.dtype == np.int32


def test_an_unreadable_file_is_none(tmp_path):
    (tmp_path / keyword_index.FILE_NAME).write_bytes(b"not a zip")
    assert KeywordIndex.load(tmp_path) is None and KeywordIndex.saved_generation(tmp_path) is None


def test_saves_use_their_own_file_and_install_drops_leftovers_of_dead_processes(tmp_path):
    index = KeywordIndex.build([[(1, ["a", "b"]), (2, ["b"])]], generation=1)
    dead = tmp_path / f"{keyword_index.FILE_NAME}.999999999-1.tmp"  # no such pid
    dead.write_bytes(b"half written")
    alive = tmp_path / f"{keyword_index.FILE_NAME}.{os.getpid()}-0.tmp"  # a save in progress in this process
    alive.write_bytes(b"in progress")
    first, second = index.save(tmp_path), index.save(tmp_path)
    assert first == second != alive  # one name per process and thread
    KeywordIndex.install(first)
    assert not dead.exists() and alive.exists()
    assert KeywordIndex.saved_generation(tmp_path) == 1


# ----------------------------------------------------------------------------- the top-n pass


def zipf_rows(n, vocabulary=300, seed=0, tight=False):
    """Rows of ``t<i>`` terms drawn by a Zipf law: a few terms are in most rows (long postings), most in
    few; every 7th row repeats an earlier row's terms (tied scores). ``tight``: each term at most once in
    a row and every row 8 terms long (padded with a term of its own), so that every posting adds exactly
    its term's bound, and a bound set any lower makes the pruning drop rows of the true top k."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocabulary + 1) ** 1.1
    rows = {}
    for key in range(n):
        if key % 7 == 6:
            rows[key] = list(rows[key - 5])
        elif tight:
            drawn = rng.choice(vocabulary, int(rng.integers(1, 8)), replace=False, p=weights / weights.sum())
            rows[key] = [f"t{i}" for i in drawn] + [f"pad{key}"] * (8 - len(drawn))
        else:
            rows[key] = [f"t{i}" for i in rng.choice(vocabulary, int(rng.integers(1, 25)), p=weights / weights.sum())]
    return rows


def zipf_queries(count, vocabulary=300, seed=1):
    """Queries mixing frequent terms (long postings) and rare or unknown ones, some repeated."""
    rng = np.random.default_rng(seed)
    queries = [["t0"], ["t0", "t1", "t2", "t3"], [f"t{vocabulary + 5}"]]  # frequent terms only; an unknown one
    for _ in range(count - len(queries)):
        frequent = [f"t{i}" for i in rng.integers(0, 6, int(rng.integers(1, 5)))]
        rare = [f"t{i}" for i in rng.integers(6, vocabulary + 10, int(rng.integers(0, 4)))]
        queries.append([str(t) for t in rng.permutation(frequent + rare + frequent[:1])])
    return queries


def exhaustive(index, rows, terms):
    """Every matching row's score from the unpruned path (each row once), checked against the float64
    reference: the brute force the pruned top k must reproduce, floats and ties included."""
    keys = sorted(rows)
    reference = bm25_scores([rows[key] for key in keys], terms)
    found, scores = index.scores(terms)
    assert len(set(found.tolist())) == len(found)
    by_key = dict(zip(found.tolist(), scores.tolist()))
    assert set(by_key) == {key for key, s in zip(keys, reference) if s > 0}, terms
    np.testing.assert_allclose([by_key[key] for key in sorted(by_key)], reference[reference > 0], rtol=1e-9)
    return by_key


def zipf_index(state, monkeypatch, n=2500):
    """An index of Zipf rows in one of four states, and its rows: ``built`` (several batches joined),
    ``tight`` (the same, of :func:`zipf_rows`' tight rows), ``pending`` (rows replaced and deleted since:
    dead columns and a second segment), ``merged``."""
    monkeypatch.setattr(keyword_index, "MERGE_ROWS", 10**9)
    monkeypatch.setattr(keyword_index, "MERGE_SHARE", np.inf)
    rows = zipf_rows(n, tight=state == "tight")
    items = list(rows.items())
    index = KeywordIndex.build([items[i : i + 600] for i in range(0, n, 600)], generation=1)
    if state in ("pending", "merged"):
        rng = np.random.default_rng(5)
        fresh = zipf_rows(400, seed=9)
        changed = {int(key): fresh[i] for i, key in enumerate(rng.choice(n + 200, 400, replace=False))}
        index.upsert(changed.items())
        rows.update(changed)
        gone = rng.choice(n + 200, 150, replace=False).tolist()
        index.delete(gone)
        for key in gone:
            rows.pop(key, None)
        if state == "merged":
            index.merge()
    return index, rows


def asked_of(caplog):
    """The top n each segment asked for in the last query (0: every posting scored)."""
    return caplog.records[-1].args[3]


@pytest.mark.parametrize("drift", [None, 0.6, 1.5])
@pytest.mark.parametrize("state", ["built", "tight", "pending", "merged"])
def test_the_top_n_pass_gives_the_exhaustive_top_k(state, drift, monkeypatch, caplog):
    """Keys, order (ties by key) and scores of every top k equal the brute force over the scores of every
    posting, for k from 1 to more than the matches, with and without a key filter. ``drift``: the impacts
    were computed at that multiple of the live average and kept (a shorter or a longer average than the
    query's), so each top n is proved against a looser bound and reads deeper."""
    monkeypatch.setattr(keyword_index, "TOP_N_FROM", 0)
    index, rows = zipf_index(state, monkeypatch)
    if drift is not None:
        monkeypatch.setattr(keyword_index, "DRIFT", 10.0)
        query, segments = index._plan(["t0"])
        for segment, _ in segments:
            segment.impacts(query.average * drift)
            assert segment.impacts(query.average)[0] == query.average * drift  # kept within DRIFT
    rng = np.random.default_rng(2)
    allowed = np.sort(rng.choice(len(rows) + 300, len(rows) // 3, replace=False))  # some keys not stored
    kept = set(allowed.tolist())
    asked = []
    for terms in zipf_queries(40):
        by_key = exhaustive(index, rows, terms)
        for k in (1, 2, 5, 10, 50, len(by_key) + 5):
            for keys in (None, allowed):
                eligible = sorted((-s, key) for key, s in by_key.items() if keys is None or key in kept)
                with caplog.at_level(logging.DEBUG, logger=keyword_index.logger.name):
                    found, scores = index.top(terms, k, keys)
                assert found.tolist() == [key for _, key in eligible[:k]], (terms, k)
                assert scores.tolist() == [-s for s, _ in eligible[:k]], (terms, k)
                if by_key:
                    asked.append(asked_of(caplog)[0])
    first = int(10 * len(index._main.keys) / index._main.alive) + 16  # the first n of a top 10
    assert sum(n > 0 for n in asked) > 100  # the top-n pass answered, not only the exhaustive one
    assert max(asked) > first  # and some top k needed a deeper pass (ties at the n-th, or a drifted average)


def test_the_top_n_pass_starts_at_top_n_from_postings(monkeypatch, caplog):
    """A query's top k is the top-n pass from ``TOP_N_FROM`` postings in a segment, scored in full below;
    the top k is the same either way."""
    index, rows = zipf_index("built", monkeypatch)
    terms = ["t0", "t1", "t40", "t57"]
    _, segments = index._plan(terms)
    postings = sum(len(columns) for _, parts in segments for columns, _ in parts)
    best = sorted((-s, key) for key, s in exhaustive(index, rows, terms).items())[:5]
    for top_n_from, passes in ((postings, True), (postings + 1, False)):
        monkeypatch.setattr(keyword_index, "TOP_N_FROM", top_n_from)
        with caplog.at_level(logging.DEBUG, logger=keyword_index.logger.name):
            found, scores = index.top(terms, 5)
        assert caplog.records[-1].args[2] == postings and (asked_of(caplog)[0] > 0) == passes
        assert found.tolist() == [key for _, key in best] and scores.tolist() == [-s for s, _ in best]


@pytest.mark.parametrize("top_n", [True, False])
def test_lookups_equal_the_scores_of_the_exhaustive_path(top_n, monkeypatch):
    """``lookup``, and ``top_and_lookup``'s BM25 of the keys asked (read from the scores of a pass that scored
    every posting, else looked up), give each row the exhaustive path's floats; its top is ``top``'s."""
    monkeypatch.setattr(keyword_index, "TOP_N_FROM", 0 if top_n else 10**9)
    index, rows = zipf_index("pending", monkeypatch)
    probe = np.array([*range(-3, len(rows) + 250, 3)], dtype=np.int64)  # stored, deleted and unknown keys
    allowed = probe[probe % 2 == 0]
    for terms in zipf_queries(12):
        by_key = exhaustive(index, rows, terms)
        expected = [by_key.get(key, 0.0) for key in probe.tolist()]
        assert index.lookup(terms, probe).tolist() == expected
        found, scores = index.top(terms, 10)
        best = sorted((-s, key) for key, s in by_key.items())[:10]
        assert found.tolist() == [key for _, key in best] and scores.tolist() == [-s for s, _ in best]
        for keys in (None, allowed):
            top_keys, top_scores, looked = index.top_and_lookup(terms, 10, keys, probe)
            assert looked.tolist() == expected
            assert [a.tolist() for a in (top_keys, top_scores)] == [a.tolist() for a in index.top(terms, 10, keys)]


@pytest.mark.parametrize("block", [1, 7, 1 << 20])
def test_impacts_are_each_postings_ratio_and_follow_the_average_beyond_drift(block, monkeypatch):
    """The impacts are ``tf / (tf + k1 (1 - b + b dl / avgdl))`` of every posting (NumPy on the dense matrix,
    dead columns included) at the average first asked, kept while the average stays within ``DRIFT`` of
    it and computed again beyond."""
    monkeypatch.setattr(keyword_index, "_SCATTER_BLOCK", block)
    rows = zip_rows(200, seed=block)
    segment = _Segment.of(rows, 100)
    segment.kill(np.array([3, 50, 51], dtype=np.int64))
    counts = segment.counts.toarray().astype(np.float64)
    lengths = segment.lengths  # 0 in a dead column
    average = lengths.sum() / segment.alive
    for asked, reference in (
        (average, average),
        (average * 1.005, average),
        (average / 1.005, average),
        (average * 1.2, average * 1.2),
    ):
        found, impacts = segment.impacts(asked)
        assert found == reference
        expected = np.where(counts > 0, counts / (counts + K1 * (1 - B + B * lengths / reference)), 0.0)
        np.testing.assert_allclose(impacts.toarray(), expected, rtol=1e-15, atol=0)
        assert np.shares_memory(impacts.indices, segment.counts.indices)  # the counts' structure, not a copy


def zip_rows(n, seed):
    """``n`` rows of Zipf-drawn term ids (some repeated within a row) over 90 terms."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 91) ** 1.2
    return [(key, rng.choice(90, int(rng.integers(1, 30)), p=weights / weights.sum()).astype(np.int32)) for key in range(n)]
