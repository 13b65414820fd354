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
    reference, ceilings = index._main.ceilings()
    assert loaded._main._ceilings[0] == reference  # the term ceilings were saved, not computed again
    np.testing.assert_array_equal(loaded._main._ceilings[1], ceilings)


def test_pending_and_dead_rows_merge_beyond_merge_rows(monkeypatch):
    """Deletes alone (no pending row) merge too once the dead columns pass ``MERGE_ROWS``."""
    monkeypatch.setattr(keyword_index, "MERGE_ROWS", 5)
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
    assert "version 3" in caplog.text


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


# ----------------------------------------------------------------------------- the early-stopping top k


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


@pytest.mark.parametrize("check", [1, 16, None])
@pytest.mark.parametrize("state", ["built", "tight", "pending", "merged"])
def test_the_pruned_top_k_is_the_exhaustive_top_k(state, check, monkeypatch, caplog):
    """Keys, order (ties by key) and scores of every top k equal the brute force over the unpruned scores,
    for k from 1 to more than the matches, with and without a key filter, the k-th score brought up to
    date before every term or only before those of ``check`` postings or more; and the pruning did stop
    early (postings looked up instead of scored) on part of the queries. ``None``: every query's postings
    are below ``PRUNE_FROM``, so none stops early. With ``check`` 1 the column ranges of the block-max bounds
    are 8 columns wide (about 300 ranges), else 128 (about 20)."""
    monkeypatch.setattr(keyword_index, "_CHECK", check or 1)
    monkeypatch.setattr(keyword_index, "_RANGE_WIDTH", 8 if check == 1 else 128)
    monkeypatch.setattr(keyword_index, "PRUNE_FROM", 10**9 if check is None else 0)
    monkeypatch.setattr(keyword_index, "PRUNE_ROWS", 0)
    index, rows = zipf_index(state, monkeypatch)
    rng = np.random.default_rng(2)
    allowed = np.sort(rng.choice(len(rows) + 300, len(rows) // 3, replace=False))  # some keys not stored
    kept = set(allowed.tolist())
    stopped = 0
    for terms in zipf_queries(40):
        by_key = exhaustive(index, rows, terms)
        for k in (1, 2, 5, 10, 50, len(by_key) + 5):
            for keys in (None, allowed):
                eligible = sorted((-s, key) for key, s in by_key.items() if keys is None or key in kept)
                with caplog.at_level(logging.DEBUG, logger=keyword_index.logger.name):
                    caplog.clear()
                    found, scores = index.top(terms, k, keys)
                assert found.tolist() == [key for _, key in eligible[:k]], (terms, k)
                assert scores.tolist() == [-s for s, _ in eligible[:k]], (terms, k)
                if by_key:
                    _, _, scored, total, looked_up = caplog.records[-1].args
                    stopped += scored < total and looked_up > 0
                    assert check is not None or (scored, looked_up) == (total, 0)
    assert stopped > 100 if check is not None else stopped == 0


def test_the_early_stop_starts_at_prune_rows_and_prune_from_postings(monkeypatch, caplog):
    """A segment stops early only with at least ``PRUNE_ROWS`` live rows, for a query whose postings there
    number at least ``PRUNE_FROM``; the top k is the same either way."""
    monkeypatch.setattr(keyword_index, "_CHECK", 1)
    index, rows = zipf_index("built", monkeypatch)
    terms = ["t0", "t1", "t40", "t57"]
    _, segments = index._plan(terms)
    postings = sum(len(columns) for _, parts in segments for columns, _ in parts)
    best = sorted((-s, key) for key, s in exhaustive(index, rows, terms).items())[:5]
    for prune_rows, prune_from, stops in (
        (len(rows), postings, True),
        (len(rows), postings + 1, False),
        (len(rows) + 1, postings, False),
    ):
        monkeypatch.setattr(keyword_index, "PRUNE_ROWS", prune_rows)
        monkeypatch.setattr(keyword_index, "PRUNE_FROM", prune_from)
        with caplog.at_level(logging.DEBUG, logger=keyword_index.logger.name):
            found, scores = index.top(terms, 5)
        _, _, scored, total, looked_up = caplog.records[-1].args
        assert total == postings and (scored < total) == stops and (looked_up > 0) == stops
        assert found.tolist() == [key for _, key in best] and scores.tolist() == [-s for s, _ in best]


@pytest.mark.parametrize("prunes", [True, False])
def test_lookups_equal_the_scores_of_the_exhaustive_path(prunes, monkeypatch):
    """``lookup``, and ``top_and_lookup``'s BM25 of the keys asked (read from the scores of a pass that scored
    every posting, else looked up), give each row the exhaustive path's floats; its top is ``top``'s."""
    monkeypatch.setattr(keyword_index, "_CHECK", 1)
    monkeypatch.setattr(keyword_index, "PRUNE_FROM", 0)
    monkeypatch.setattr(keyword_index, "PRUNE_ROWS", 0 if prunes else 10**9)
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
def test_term_ceilings_bound_every_contribution_at_any_average(block, monkeypatch):
    """Each term's ceiling is the largest ``tf / (tf + norm)`` over its postings (NumPy on the dense
    matrix), and the bounds derived from it for other averages hold for every row."""
    monkeypatch.setattr(keyword_index, "_SCATTER_BLOCK", block)
    rng = np.random.default_rng(block)
    terms = 40  # the last ones held by no row
    rows = [(key, rng.integers(0, 30, rng.integers(1, 20)).astype(np.int32)) for key in range(60)]
    segment = _Segment.of(rows, terms)
    reference, ceilings = segment.ceilings()
    lengths = np.array([len(ids) for _, ids in rows], dtype=np.float64)
    assert reference == lengths.mean()
    counts = segment.counts.toarray().astype(np.float64)
    ratios = np.where(counts > 0, counts / (counts + K1 * (1 - B + B * lengths / reference)), 0.0)
    np.testing.assert_array_equal(ceilings, ratios.max(axis=1))
    assert (ceilings[30:] == 0).all() and (ceilings[:30] > 0).all()
    weights = rng.uniform(0.5, 3.0, terms + 5)
    for average in (reference / 3, reference * 0.9, reference, reference * 1.3, reference * 4):
        query = keyword_index._Query(np.arange(terms + 5), weights, average)  # 5 terms beyond the segment's
        bounds = segment.bounds(query)
        ratios = np.where(counts > 0, counts / (counts + K1 * (1 - B + B * lengths / average)), 0.0)
        assert (weights[:terms] * ratios.max(axis=1) <= bounds[:terms] * (1 + 1e-12)).all()  # (ulps apart at most)
        assert (bounds[terms:] == 0).all()
        if average <= reference:  # a shorter average lowers every ratio: the ceiling itself bounds them
            np.testing.assert_array_equal(bounds[:terms], weights[:terms] * ceilings)


# ----------------------------------------------------------------------------- block-max: bounds per column range


@pytest.mark.parametrize("width", [1, 8, 64])
def test_range_ceilings_are_the_least_steps_above_each_ranges_largest_ratio(width, monkeypatch):
    """Each kept term's level in each range of columns is the least of 255 steps of its ceiling at or above
    the largest ``tf / (tf + norm)`` there (NumPy on the dense matrix), 0 where it has no posting; terms
    of fewer postings than a quarter of the ranges are not kept."""
    monkeypatch.setattr(keyword_index, "_RANGE_WIDTH", width)
    monkeypatch.setattr(keyword_index, "_SCATTER_BLOCK", 50)  # several blocks of terms
    rows = zip_rows(300, seed=width)
    segment = _Segment.of(rows, 90)
    segment.kill(np.array([3, 50, 51], dtype=np.int64))  # dead columns still bound
    reference, ceilings = segment.ceilings()
    ranges = segment.ranges()
    shift = ranges.shift
    assert 2**shift >= max(width, -(-300 // keyword_index._RANGES))
    count = (300 - 1 >> shift) + 1
    counts = segment.counts.toarray().astype(np.float64)
    ratios = np.where(counts > 0, counts / (counts + K1 * (1 - B + B * segment.lengths / reference)), 0.0)
    held = (counts > 0).sum(axis=1)
    assert np.array_equal(ranges.rows >= 0, held >= max(1, count // 4))
    for term in np.flatnonzero(ranges.rows >= 0):
        levels = ranges.ceilings[ranges.rows[term]].astype(np.float64)
        largest = np.array([ratios[term, r << shift : (r + 1) << shift].max(initial=0.0) for r in range(count)])
        assert (levels * ceilings[term] / 255 >= largest).all()  # a bound in every range
        assert ((levels - 1) * ceilings[term] / 255 < largest).all()  # the least such step
        np.testing.assert_array_equal(levels == 0, largest == 0)


def zip_rows(n, seed):
    """``n`` rows of Zipf-drawn term ids (some repeated within a row) over 90 terms."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 91) ** 1.2
    return [(key, rng.choice(90, int(rng.integers(1, 30)), p=weights / weights.sum()).astype(np.int32)) for key in range(n)]


@pytest.mark.parametrize("average_ratio", [0.5, 1.0, 1.7])
def test_range_reach_bounds_what_the_terms_left_add_to_each_row(average_ratio, monkeypatch):
    """``reach[t, r]`` is at least the most the query's terms from ``t`` on add to any row of range ``r``
    (float64 on the dense matrix), at averages below and above the reference."""
    monkeypatch.setattr(keyword_index, "_RANGE_WIDTH", 8)
    rows = zip_rows(400, seed=11)
    segment = _Segment.of(rows, 100)
    reference, _ = segment.ceilings()
    terms = np.array([60, 33, 7, 2, 1, 0, 95])  # rare first; the last held by no row
    weights = np.linspace(3.0, 0.5, len(terms))
    query = keyword_index._Query(terms, weights, reference * average_ratio)
    parts = [segment.postings(int(t)) for t in terms]
    shift, reach = segment.reach(query, parts)
    counts = segment.counts.toarray().astype(np.float64)
    lengths = np.array([len(ids) for _, ids in rows], dtype=np.float64)
    norm = K1 * (1 - B + B * lengths / query.average)
    padded = np.vstack([counts, np.zeros((10, counts.shape[1]))])
    added = weights[:, None] * padded[terms] / (padded[terms] + norm)  # each term's BM25 in each row
    left = np.cumsum(added[::-1], axis=0)[::-1]
    for r in range(reach.shape[1]):
        block = slice(r << shift, (r + 1) << shift)
        assert (reach[: len(terms), r] >= left[:, block].max(axis=1, initial=0.0) * (1 - 1e-12)).all()
    assert (reach[len(terms)] == 0).all()
    assert (reach[:, :] <= np.append(np.cumsum(segment.bounds(query)[::-1])[::-1], 0.0)[:, None] + 1e-12).all()


def test_range_bounds_score_fewer_postings_for_the_same_top_k(monkeypatch, caplog):
    """Narrow column ranges prune postings a single range scores, with the same keys and floats."""
    monkeypatch.setattr(keyword_index, "_CHECK", 1)
    monkeypatch.setattr(keyword_index, "PRUNE_FROM", 0)
    monkeypatch.setattr(keyword_index, "PRUNE_ROWS", 0)
    monkeypatch.setattr(keyword_index, "PRUNE_ROWS", 0)
    index, _ = zipf_index("merged", monkeypatch)
    found, scored = {}, {}
    for width in (16, 1 << 20):
        monkeypatch.setattr(keyword_index, "_RANGE_WIDTH", width)
        for segment in (index._main, index._pending_segment()):
            segment._ranges = None
        runs, count = [], 0
        for terms in zipf_queries(40):
            for k in (1, 10, 50):
                with caplog.at_level(logging.DEBUG, logger=keyword_index.logger.name):
                    runs.append([array.tolist() for array in index.top(terms, k)])
                count += caplog.records[-1].args[2]
        found[width], scored[width] = runs, count
    assert found[16] == found[1 << 20]
    assert scored[16] < 0.95 * scored[1 << 20]
