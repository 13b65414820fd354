"""The FAISS store's keyword index against the float64 BM25 reference, through merges, saves and loads."""

import os

import numpy as np
import pytest

from isotrope.lexical import analyze, bm25_scores, query_terms

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
    KeywordIndex.install(index.save(tmp_path))
    assert KeywordIndex.saved_generation(tmp_path) == 3
    assert_exact(KeywordIndex.load(tmp_path), rows)


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
