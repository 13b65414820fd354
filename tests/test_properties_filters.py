"""Property tests of the filter language (hypothesis): any string parses or is a one-line error naming
its position; a parsed filter selects exactly what an independent Python predicate selects, in the
memory, FAISS and LanceDB stores."""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("faiss")
pytest.importorskip("lancedb")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.stores.filters import parse_where
from isotrope.stores.memory import MemoryStore

FIELDS = ("a", "b", "c")
STRINGS = ("x", "y", "", "it's", 'say "hi"', "é", "x y", "2", "true", "\u05d0\u05d1", "e\u0301", "🙂")
NUMBERS = (-3, 0, 1, 2, 3, 2.5, -0.5, 1e-5, 3.0, 9223372036854775807)
VALUES = (*STRINGS, *NUMBERS, True, False)
#: pieces of the filter syntax, valid and not, for strings that get past the tokenizer
TOKENS = ("a", "b", "x_1", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "and", "or", "not", "in", "(", ")", ",")
TOKENS += ("'x'", "'it''s'", '"q"', "'", '"', "3", "-2.5e3", "1e999", "true", "FALSE", "~", "\x00", "\u202e", " ")


# ----------------------------------------------------------------------------- any string


def assert_parses_or_names_position(text: str) -> None:
    try:
        where = parse_where(text)
    except ValueError as error:
        message = str(error)
        assert "\n" not in message, message
        found = re.match(r"filter syntax error at position (\d+): ", message)
        assert found, message
        assert 0 <= int(found.group(1)) <= len(text), message
    else:
        assert isinstance(where, dict) and where


@settings(max_examples=examples(1000))
@given(st.text())
def test_any_text_parses_or_is_a_one_line_error_naming_the_position(text):
    assert_parses_or_names_position(text)


@pytest.mark.slow
@settings(max_examples=examples(1000))
@given(st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join))
def test_any_sequence_of_filter_tokens_parses_or_names_the_position(text):
    assert_parses_or_names_position(text)


def test_deep_nesting_and_huge_numbers_are_position_errors_not_crashes():
    """Found by the properties above: 5000 '(' overflowed the stack, 1e999 and 5000-digit integers were
    refused without a position, integers beyond int64 reached SQLite (OverflowError), and an ordering of a boolean
    (``a < true``) was refused without a position."""
    for text in (
        "(" * 5000 + "a = 1" + ")" * 5000,
        "a = 1e999",
        "a = " + "9" * 5000,
        "a in (1, 9223372036854775808)",
        "a < true",
    ):
        assert_parses_or_names_position(text)
        with pytest.raises(ValueError, match="position"):
            parse_where(text)
    nested = "(" * 64 + "a = 1" + ")" * 64
    assert parse_where(nested) == {"a": {"$eq": 1}}


# ----------------------------------------------------------------------------- selection vs a predicate


def literal(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def kind_of(value) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "string" if isinstance(value, str) else None


def same(x, y) -> bool:
    return kind_of(x) is not None and kind_of(x) == kind_of(y) and x == y


ORDER = {"<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, ">=": lambda x, y: x >= y}


@st.composite
def condition(draw):
    """(filter text, predicate over one row's metadata), written from the documented semantics."""
    field = draw(st.sampled_from(FIELDS))
    op = draw(st.sampled_from(("=", "==", "!=", "<>", "<", "<=", ">", ">=", "in", "not in")))
    if op in ("in", "not in"):
        values = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=4))
        text = f"{field} {op} ({', '.join(literal(v) for v in values)})"
        if op == "in":
            return text, lambda row: any(same(row.get(field), v) for v in values)
        return text, lambda row: not any(same(row.get(field), v) for v in values)
    value = draw(st.sampled_from(VALUES if op in ("=", "==", "!=", "<>") else (*STRINGS, *NUMBERS)))
    text = f"{field} {op} {literal(value)}"
    if op in ("=", "=="):
        return text, lambda row: same(row.get(field), value)
    if op in ("!=", "<>"):
        return text, lambda row: not same(row.get(field), value)
    compare = ORDER[op]
    return text, lambda row: kind_of(row.get(field)) == kind_of(value) and compare(row.get(field), value)


def combine(children):
    def joined(parts, word):
        texts = [f"({text})" for text, _ in parts]
        predicates = [predicate for _, predicate in parts]
        if word == "and":
            return f" {word} ".join(texts), lambda row: all(p(row) for p in predicates)
        return f" {word} ".join(texts), lambda row: any(p(row) for p in predicates)

    return st.tuples(st.sampled_from(("and", "or")), st.lists(children, min_size=1, max_size=3)).map(
        lambda pair: joined(pair[1], pair[0])
    )


FILTERS = st.recursive(condition(), combine, max_leaves=6)


def make_rows(n: int = 120) -> list[dict]:
    """Metadata of every kind a filter meets: each field a string, number, boolean, null or missing."""
    rng = np.random.default_rng(36)
    pool = [*VALUES, None, -1, 2.0001]
    rows = []
    for _ in range(n):
        rows.append({field: pool[rng.integers(len(pool))] for field in FIELDS if rng.random() < 0.85})
    return rows


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    rows = make_rows()
    ids = [f"r{i}" for i in range(len(rows))]
    vectors = np.random.default_rng(0).standard_normal((len(rows), 8)).astype(np.float32)
    opened = {
        "memory": MemoryStore(8, "ip"),
        "faiss": FaissStore(root / "faiss", 8, factory="Flat", metric="ip"),
        "lancedb": LanceDBStore(root / "lance", dim=8, metric="ip", index_threshold=None),
    }
    for store in opened.values():
        store.add(ids, vectors, [f"row {i}" for i in range(len(rows))], rows)
        store.commit()
    yield rows, ids, vectors, opened
    for store in opened.values():
        store.close()


@pytest.mark.slow
@settings(max_examples=examples(500), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(FILTERS)
def test_a_parsed_filter_selects_what_the_predicate_selects_in_every_store(stores, case):
    rows, ids, vectors, opened = stores
    text, predicate = case
    expected = {i for i, row in zip(ids, rows) if predicate(row)}
    where = parse_where(text)
    for name, store in opened.items():
        assert set(store.ids(where=where)) == expected, (name, text, where)
    # a search sees the same rows: the whole store asked for, restricted by the filter (one store per example)
    store = opened[("memory", "faiss", "lancedb")[len(text) % 3]]
    hits = store.search(vectors[:1], k=len(ids), where=where)[0]
    assert {hit.id for hit in hits} == expected, (text, where)
