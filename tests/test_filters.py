"""Metadata filters: the parser, the reference semantics, and the SQLite / Lance translations
checked row by row against the reference on random filters."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from isotrope.stores.filters import matches, parse_where, to_lance, to_sqlite

# ----------------------------------------------------------------------------- parse_where


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("source = 'a.txt'", {"source": {"$eq": "a.txt"}}),
        ("year >= 2020", {"year": {"$gte": 2020}}),
        ("x < -1.5e3", {"x": {"$lt": -1500.0}}),
        ("x != 3 ", {"x": {"$ne": 3}}),
        ("x <> 'b'", {"x": {"$ne": "b"}}),
        ("flag == TRUE", {"flag": {"$eq": True}}),
        ("lang in ('en','fr')", {"lang": {"$in": ["en", "fr"]}}),
        ('lang NOT IN ("en", 2)', {"lang": {"$nin": ["en", 2]}}),
        ("name = 'O''Brien'", {"name": {"$eq": "O'Brien"}}),
        (
            "source = 'a.txt' and year >= 2020",
            {"$and": [{"source": {"$eq": "a.txt"}}, {"year": {"$gte": 2020}}]},
        ),
        (
            "a = 1 or b = 2 and c = 3",
            {"$or": [{"a": {"$eq": 1}}, {"$and": [{"b": {"$eq": 2}}, {"c": {"$eq": 3}}]}]},
        ),
        (
            "(a = 1 or b = 2) and c = 3",
            {"$and": [{"$or": [{"a": {"$eq": 1}}, {"b": {"$eq": 2}}]}, {"c": {"$eq": 3}}]},
        ),
        ("a = 1 or b = 2 or c = 3", {"$or": [{"a": {"$eq": 1}}, {"b": {"$eq": 2}}, {"c": {"$eq": 3}}]}),
        ("((a = 1))", {"a": {"$eq": 1}}),
    ],
)
def test_parse_where(expr, expected):
    result = parse_where(expr)
    assert result == expected
    assert type(_leaf_value(result)) is type(_leaf_value(expected))  # 3 stays int, 3.0 float


def _leaf_value(where):
    key, spec = next(iter(where.items()))
    return _leaf_value(spec[0]) if key.startswith("$") else next(iter(spec.values()))


@pytest.mark.parametrize(
    ("expr", "position"),
    [
        ("year >= ", 8),
        ("source = 'a.txt", 9),
        ("a = 1 b = 2", 6),
        ("(a = 1", 6),
        ("lang in 'en'", 8),
        ("= 3", 0),
        ("a = 1 and", 9),
        ("a ~ 1", 2),
        ("lang in ('en',)", 14),
        ("a not = 1", 6),
    ],
)
def test_parse_where_names_the_error_position(expr, position):
    with pytest.raises(ValueError, match=f"position {position}\\b"):
        parse_where(expr)


# ----------------------------------------------------------------------------- reference semantics

ROW = {"s": "b", "n": 5, "f": 2.5, "t": True, "z": None}


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({}, True),
        ({"s": "b"}, True),
        ({"s": {"$gt": "a"}}, True),
        ({"s": {"$lt": "a"}}, False),
        ({"n": 5.0}, True),  # numbers compare across int / float
        ({"n": "5"}, False),  # ... but never with strings
        ({"n": {"$gt": "1"}}, False),
        ({"t": True}, True),
        ({"t": 1}, False),  # a boolean is not the number 1
        ({"n": {"$in": [True, 5]}}, True),
        ({"missing": {"$ne": 1}}, True),  # missing matches only $ne / $nin
        ({"missing": {"$nin": [1]}}, True),
        ({"missing": {"$lt": 10}}, False),
        ({"missing": {"$in": [1]}}, False),
        ({"z": {"$ne": 1}}, True),  # null behaves as missing
        ({"z": {"$gte": 0}}, False),
        ({"n": {"$gte": 5, "$lt": 6}}, True),  # two operators on one field: AND
        ({"n": {"$in": []}}, False),
        ({"n": {"$nin": []}}, True),
        ({"$or": [{"s": "x"}, {"f": {"$lte": 2.5}}]}, True),
        ({"$and": [{"s": "b"}, {"f": {"$lt": 2.5}}]}, False),
        ({"s": "b", "n": 6}, False),
    ],
)
def test_matches_semantics(where, expected):
    assert matches(ROW, where) is expected


@pytest.mark.parametrize(
    "where",
    [
        {"a b": 1},
        {"a'": 1},
        {"x": {"$regex": "a"}},
        {"x": {"$gt": True}},
        {"x": {"$eq": None}},
        {"x": {"$eq": [1]}},
        {"x": {"$in": "abc"}},
        {"x": float("nan")},
        {"$or": []},
        {"$and": {"x": 1}},
        {"x": {}},
    ],
)
def test_invalid_filters_raise(where):
    with pytest.raises(ValueError):
        matches(ROW, where)
    with pytest.raises(ValueError):
        to_sqlite(where)
    with pytest.raises(ValueError):
        to_lance(where)


# ----------------------------------------------------------------------------- translations vs reference

FIELD_VALUES = {
    "a": [0, 1, 2, 3, 2.5, "2", True, None],
    "b": ["x", "y", "z", "x y", "it's", "é", "", 3],
    "c": [True, False, 0, "true"],
}


def random_rows(rng, n=80):
    rows = []
    for _ in range(n):
        row = {}
        for field, values in FIELD_VALUES.items():
            if rng.random() < 0.8:  # sometimes missing
                row[field] = values[rng.integers(len(values))]
        rows.append(row)
    return rows


def random_value(rng, field):
    values = [v for v in FIELD_VALUES[field] if v is not None]
    return values[rng.integers(len(values))]


def random_condition(rng):
    field = ["a", "b", "c"][rng.integers(3)]
    op = ["$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin"][rng.integers(8)]
    if op in ("$in", "$nin"):
        return {field: {op: [random_value(rng, field) for _ in range(rng.integers(0, 4))]}}
    value = random_value(rng, field)
    if op in ("$gt", "$gte", "$lt", "$lte") and isinstance(value, bool):
        value = 1
    return {field: {op: value}}


def random_filter(rng, depth=0):
    if depth < 2 and rng.random() < 0.4:
        op = ["$and", "$or"][rng.integers(2)]
        return {op: [random_filter(rng, depth + 1) for _ in range(rng.integers(1, 4))]}
    return random_condition(rng)


@pytest.fixture(scope="module")
def cases():
    rng = np.random.default_rng(7)
    rows = random_rows(rng)
    filters = [random_filter(rng) for _ in range(150)]
    return rows, filters


def test_sqlite_translation_agrees_with_reference(cases):
    rows, filters = cases
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (i INTEGER, metadata TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, json.dumps(r)) for i, r in enumerate(rows)])
    checked = 0
    for where in filters:
        sql, params = to_sqlite(where)
        got = {i for (i,) in conn.execute(f"SELECT i FROM t WHERE {sql}", params)}
        expected = {i for i, r in enumerate(rows) if matches(r, where)}
        assert got == expected, where
        checked += 0 < len(expected) < len(rows)
    assert checked > 50  # most filters split the rows


def test_sqlite_values_are_parameters():
    where = {"b": "x'); DROP TABLE t; --"}
    sql, params = to_sqlite(where)
    assert "DROP" not in sql
    assert where["b"] in params


def test_lance_translation_agrees_with_reference(cases, tmp_path):
    lancedb = pytest.importorskip("lancedb")
    pa = pytest.importorskip("pyarrow")
    rows, filters = cases
    table = lancedb.connect(tmp_path).create_table(
        "t",
        data=pa.table(
            {
                "i": pa.array(range(len(rows)), pa.int64()),
                "metadata": pa.array([json.dumps(r) for r in rows], pa.json_(pa.utf8())),
            }
        ),
    )
    dataset = table.to_lance()
    for where in filters[:60]:  # each Lance scan costs tens of milliseconds
        got = set(dataset.to_table(columns=["i"], filter=to_lance(where)).column("i").to_pylist())
        expected = {i for i, r in enumerate(rows) if matches(r, where)}
        assert got == expected, (where, to_lance(where))


def test_lance_literals_cannot_escape_the_string():
    predicate = to_lance({"b": "x') OR TRUE OR ('"})
    assert "'x'') OR TRUE OR ('''" in predicate
