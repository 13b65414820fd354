"""Metadata filters: one internal form, a reference evaluator and translations to SQLite and LanceDB.

The internal form is a dict, as in MongoDB or Chroma::

    {"source": "a.txt", "year": {"$gte": 2020}, "lang": {"$in": ["en", "fr"]}}
    {"$or": [{"source": "a.txt"}, {"year": {"$lt": 2000}}]}

Several keys in one dict are combined with AND; a bare value means ``$eq``. Operators:
``$eq $ne $gt $gte $lt $lte $in $nin`` and top-level ``$and`` / ``$or`` lists.

Semantics (:func:`matches` is the reference every store is tested against):

* values compare only within one type: numbers with numbers (``2020 == 2020.0``),
  strings with strings (by code point), booleans with booleans (``True != 1``);
* ordering operators take a number or a string;
* a missing field, or one whose value is null, never matches, except under
  ``$ne`` and ``$nin``, which match it.

Field names are identifiers (``[A-Za-z_][A-Za-z0-9_]*``). :func:`parse_where` reads
the small SQL-like syntax of the command line, e.g. ``source = 'a.txt' and year >= 2020``.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Where = Mapping[str, Any]

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin")
_ORDERING = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
_PY_ORDERING = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: $and/$or levels (or parentheses) a filter may nest: far beyond any real one, well within Python's stack
MAX_DEPTH = 64


@dataclass(frozen=True)
class _Cond:
    field: str
    op: str
    values: tuple[Any, ...]  # one value, or the list of $in / $nin


@dataclass(frozen=True)
class _Bool:
    op: str  # "and" | "or"
    children: tuple[_Node, ...]


_Node = _Cond | _Bool


def _kind(value: Any) -> str | None:
    """The comparison type of a JSON scalar: "bool", "num", "str", or None (null, containers)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "num"
    if isinstance(value, str):
        return "str"
    return None


def _in_range(number: float) -> bool:
    """What SQLite and Arrow hold: a finite float, or an integer in int64."""
    return -(2**63) <= number < 2**63 if isinstance(number, int) else math.isfinite(number)


def _check_value(value: Any, field: str, op: str) -> Any:
    kind = _kind(value)
    if kind is None:
        raise ValueError(f"filter on {field!r}: {op} needs a string, number or boolean; got {value!r}")
    if kind == "num" and not _in_range(value):
        raise ValueError(f"filter on {field!r}: {op} value is not a finite 64-bit number: {value!r}")
    if op in _ORDERING and kind == "bool":
        raise ValueError(f"filter on {field!r}: {op} needs a number or a string; got {value!r}")
    return value


def _compile(where: Where, depth: int = 0) -> _Node:
    """Validate a filter dict and turn it into a tree of conditions."""
    if not isinstance(where, Mapping):
        raise ValueError(f"a filter must be a dict; got {type(where).__name__}")
    if depth > MAX_DEPTH:
        raise ValueError(f"a filter nests $and/$or deeper than {MAX_DEPTH} levels")
    nodes: list[_Node] = []
    for key, spec in where.items():
        if key in ("$and", "$or"):
            if not isinstance(spec, Sequence) or isinstance(spec, (str, bytes)) or not spec:
                raise ValueError(f"{key} needs a non-empty list of filters; got {spec!r}")
            nodes.append(_Bool(key[1:], tuple(_compile(child, depth + 1) for child in spec)))
            continue
        if not isinstance(key, str) or not _FIELD.match(key):
            raise ValueError(f"filter field {key!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")
        ops = spec if isinstance(spec, Mapping) else {"$eq": spec}
        if not ops:
            raise ValueError(f"filter on {key!r} has no operator")
        for op, value in ops.items():
            if op not in COMPARISONS:
                raise ValueError(f"filter on {key!r}: unknown operator {op!r}; expected one of {COMPARISONS}")
            if op in ("$in", "$nin"):
                if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
                    raise ValueError(f"filter on {key!r}: {op} needs a list; got {value!r}")
                values = tuple(_check_value(v, key, op) for v in value)
            else:
                values = (_check_value(value, key, op),)
            nodes.append(_Cond(key, op, values))
    return nodes[0] if len(nodes) == 1 else _Bool("and", tuple(nodes))  # {} -> an empty AND: true


# --------------------------------------------------------------------------- reference semantics


def _equal(a: Any, b: Any) -> bool:
    return _kind(a) is not None and _kind(a) == _kind(b) and a == b


def _holds(value: Any, cond: _Cond) -> bool:
    if cond.op in ("$eq", "$in"):
        return any(_equal(value, v) for v in cond.values)
    if cond.op in ("$ne", "$nin"):
        return not any(_equal(value, v) for v in cond.values)
    target = cond.values[0]
    return _kind(value) == _kind(target) and _PY_ORDERING[cond.op](value, target)


def _evaluate(node: _Node, metadata: Mapping[str, Any]) -> bool:
    if isinstance(node, _Cond):
        return _holds(metadata.get(node.field), node)
    results = (_evaluate(child, metadata) for child in node.children)
    return all(results) if node.op == "and" else any(results)


def matches(metadata: Mapping[str, Any], where: Where | None) -> bool:
    """Whether one row's metadata satisfies ``where`` (``None`` or ``{}`` match everything)."""
    if not where:
        return True
    return _evaluate(_compile(where), metadata)


def compile_matcher(where: Where | None):
    """Validate ``where`` once and return a predicate over metadata dicts."""
    if not where:
        return lambda metadata: True
    node = _compile(where)
    return lambda metadata: _evaluate(node, metadata)


def field_names(where: Where | None) -> set[str]:
    """The metadata fields a filter names."""
    if not where:
        return set()

    def walk(node: _Node) -> set[str]:
        if isinstance(node, _Cond):
            return {node.field}
        return set().union(*(walk(child) for child in node.children))

    return walk(_compile(where))


def check_fields(where: Where | None, known: set[str] | frozenset[str]) -> None:
    """Raise a one-line ``ValueError`` naming a filter field no stored row has, and the fields that exist."""
    unknown = sorted(field_names(where) - set(known))
    if unknown:
        check_field(unknown[0], known, "filter")


def check_field(name: str, known: set[str] | frozenset[str], role: str) -> None:
    """Raise a one-line ``ValueError`` if no stored row has metadata field ``name`` (a ``role`` field: filter,
    group_by), naming the fields that exist."""
    if name not in known:
        stored = ", ".join(sorted(known)) if known else "none (no row has metadata)"
        raise ValueError(f"unknown {role} field {name!r}; the stored metadata fields are: {stored}")


# --------------------------------------------------------------------------- SQLite


def _group(values: tuple[Any, ...]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for value in values:
        groups.setdefault(_kind(value), []).append(value)  # type: ignore[arg-type]
    return groups


_SQLITE_TYPES = {"num": "('integer', 'real')", "str": "('text')"}


def _sqlite_cond(cond: _Cond, column: str, params: list[Any]) -> str:
    path = f"$.{cond.field}"
    if cond.op in _ORDERING:
        kind = _kind(cond.values[0])
        assert kind is not None, "ordering operators take numbers or strings (checked when the filter is parsed)"
        params.extend([path, path, cond.values[0]])
        return f"(json_type({column}, ?) IN {_SQLITE_TYPES[kind]} AND json_extract({column}, ?) {_ORDERING[cond.op]} ?)"
    parts = []
    for kind, values in _group(cond.values).items():
        if kind == "bool":
            params.append(path)
            parts.append(f"json_type({column}, ?) IN ({', '.join(repr('true' if v else 'false') for v in values)})")
        else:
            params.extend([path, path, *values])
            marks = ", ".join("?" * len(values))
            typed = f"json_type({column}, ?) IN {_SQLITE_TYPES[kind]}"
            parts.append(f"({typed} AND json_extract({column}, ?) IN ({marks}))")
    positive = " OR ".join(parts) or "0"
    return f"({positive})" if cond.op in ("$eq", "$in") else f"(COALESCE(({positive}), 0) = 0)"


def _sqlite(node: _Node, column: str, params: list[Any]) -> str:
    if isinstance(node, _Cond):
        return _sqlite_cond(node, column, params)
    if not node.children:
        return "1" if node.op == "and" else "0"
    joiner = " AND " if node.op == "and" else " OR "
    return "(" + joiner.join(_sqlite(child, column, params) for child in node.children) + ")"


def to_sqlite(where: Where, column: str = "metadata") -> tuple[str, list[Any]]:
    """Translate ``where`` to a parameterised SQLite condition over a JSON text column.

    Returns ``(sql, params)`` for ``... WHERE {sql}``; values only ever travel as parameters.
    """
    if not _FIELD.match(column):
        raise ValueError(f"column {column!r} is not an identifier")
    params: list[Any] = []
    sql = _sqlite(_compile(where), column, params)
    return sql, params


# --------------------------------------------------------------------------- LanceDB


def lance_literal(value: Any) -> str:
    """A Lance SQL literal: strings quoted with ``''`` doubling (backslashes are literal), numbers as floats."""
    kind = _kind(value)
    if kind == "str":
        return "'" + value.replace("'", "''") + "'"
    if kind == "bool":
        return "TRUE" if value else "FALSE"
    if kind == "num":
        return repr(float(value))
    raise ValueError(f"cannot write {value!r} as a Lance literal")


def _lance_cond(cond: _Cond, column: str) -> str:
    extract = f"json_extract({column}, '$.{cond.field}')"
    number = f"TRY_CAST({extract} AS DOUBLE)"
    is_string = f"{extract} LIKE '\"%'"
    string = f"json_get_string({column}, '{cond.field}')"
    if cond.op in _ORDERING:
        value = cond.values[0]
        sign = _ORDERING[cond.op]
        if _kind(value) == "num":
            return f"({number} {sign} {lance_literal(value)})"
        return f"({is_string} AND {string} {sign} {lance_literal(value)})"
    parts = []
    for kind, values in _group(cond.values).items():
        if kind == "bool":
            parts.append(f"{extract} IN ({', '.join(repr('true' if v else 'false') for v in values)})")
        elif kind == "num":
            parts.append(f"{number} IN ({', '.join(lance_literal(v) for v in values)})")
        else:
            parts.append(f"({is_string} AND {string} IN ({', '.join(lance_literal(v) for v in values)}))")
    positive = " OR ".join(parts) or "FALSE"
    return f"({positive})" if cond.op in ("$eq", "$in") else f"(({positive}) IS NOT TRUE)"


def _lance(node: _Node, column: str) -> str:
    if isinstance(node, _Cond):
        return _lance_cond(node, column)
    if not node.children:
        return "TRUE" if node.op == "and" else "FALSE"
    joiner = " AND " if node.op == "and" else " OR "
    return "(" + joiner.join(_lance(child, column) for child in node.children) + ")"


def to_lance(where: Where, column: str = "metadata") -> str:
    """Translate ``where`` to a Lance SQL predicate over a ``lance.json`` (JSONB) column.

    Lance filters are strings; every value is written with :func:`lance_literal` and every
    field name is an identifier, so no input can change the predicate's structure.
    """
    if not _FIELD.match(column):
        raise ValueError(f"column {column!r} is not an identifier")
    return _lance(_compile(where), column)


# --------------------------------------------------------------------------- the command-line syntax

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>'(?:[^']|'')*'|"(?:[^"]|"")*")
      | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op>>=|<=|!=|<>|==|=|>|<)
      | (?P<punct>[(),])
    )""",
    re.VERBOSE,
)
_OPS = {"=": "$eq", "==": "$eq", "!=": "$ne", "<>": "$ne", ">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}
_KEYWORDS = {"and", "or", "not", "in", "true", "false"}


@dataclass(frozen=True)
class _Token:
    kind: str  # string | number | name | keyword | op | punct | end
    text: str
    pos: int


def _tokenize(expr: str) -> list[_Token]:
    tokens = []
    pos = 0
    while True:
        while pos < len(expr) and expr[pos].isspace():
            pos += 1
        if pos == len(expr):
            break
        match = _TOKEN.match(expr, pos)
        if not match:
            raise ValueError(f"filter syntax error at position {pos}: unexpected {expr[pos : pos + 10]!r} in {expr!r}")
        kind = match.lastgroup or ""
        text, start = match.group(kind), match.start(kind)
        if kind == "name" and text.lower() in _KEYWORDS:
            kind, text = "keyword", text.lower()
        tokens.append(_Token(kind, text, start))
        pos = match.end()
    tokens.append(_Token("end", "", len(expr)))
    return tokens


class _Parser:
    """Recursive descent over: or_expr := and_expr ('or' and_expr)*; and_expr := atom ('and' atom)*;
    atom := '(' or_expr ')' | name op literal | name ['not'] 'in' '(' literal (',' literal)* ')'."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = _tokenize(expr)
        self.i = 0
        self.depth = 0  # parentheses open

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def fail(self, expected: str) -> ValueError:
        token = self.peek()
        got = "end of input" if token.kind == "end" else repr(token.text)
        return ValueError(f"filter syntax error at position {token.pos}: expected {expected}, got {got} in {self.expr!r}")

    def accept(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        if token.kind == kind and (text is None or token.text == text):
            self.i += 1
            return True
        return False

    def parse(self) -> dict[str, Any]:
        node = self.or_expr()
        if self.peek().kind != "end":
            raise self.fail("'and', 'or' or end of input")
        return node

    def or_expr(self) -> dict[str, Any]:
        parts = [self.and_expr()]
        while self.accept("keyword", "or"):
            parts.append(self.and_expr())
        return parts[0] if len(parts) == 1 else {"$or": _flatten(parts, "$or")}

    def and_expr(self) -> dict[str, Any]:
        parts = [self.atom()]
        while self.accept("keyword", "and"):
            parts.append(self.atom())
        return parts[0] if len(parts) == 1 else {"$and": _flatten(parts, "$and")}

    def atom(self) -> dict[str, Any]:
        if self.peek().kind == "punct" and self.peek().text == "(":
            if self.depth == MAX_DEPTH:
                raise self.fail(f"at most {MAX_DEPTH} nested parentheses")
            self.i += 1
            self.depth += 1
            node = self.or_expr()
            if not self.accept("punct", ")"):
                raise self.fail("')'")
            self.depth -= 1
            return node
        if self.peek().kind != "name":
            raise self.fail("a field name or '('")
        field = self.take().text
        if self.peek().kind == "op":
            op = _OPS[self.take().text]
            return {field: {op: self.checked_literal(field, op)}}
        negated = self.accept("keyword", "not")
        if not self.accept("keyword", "in"):
            raise self.fail("'in'" if negated else "a comparison operator or 'in'")
        if not self.accept("punct", "("):
            raise self.fail("'('")
        op = "$nin" if negated else "$in"
        values = [self.checked_literal(field, op)]
        while self.accept("punct", ","):
            values.append(self.checked_literal(field, op))
        if not self.accept("punct", ")"):
            raise self.fail("',' or ')'")
        return {field: {op: values}}

    def checked_literal(self, field: str, op: str) -> Any:
        """:meth:`literal`, checked as the filter dict checks ``op``'s value, its error at the literal's position
        (``a < true``: an ordering of a boolean)."""
        position = self.peek().pos
        value = self.literal()
        try:
            return _check_value(value, field, op)
        except ValueError as error:
            raise ValueError(f"filter syntax error at position {position}: {error} in {self.expr!r}") from None

    def literal(self) -> Any:
        token = self.peek()
        if token.kind == "string":
            self.i += 1
            quote = token.text[0]
            return token.text[1:-1].replace(quote * 2, quote)
        if token.kind == "number":
            is_int = re.fullmatch(r"[-+]?\d+", token.text) is not None
            try:
                number = int(token.text) if is_int else float(token.text)
            except ValueError:  # more digits than Python converts
                number = math.inf
            if not _in_range(number):
                raise self.fail("a number within 64-bit range")
            self.i += 1
            return number
        if token.kind == "keyword" and token.text in ("true", "false"):
            self.i += 1
            return token.text == "true"
        raise self.fail("a quoted string, a number, true or false")


def _flatten(parts: list[dict[str, Any]], op: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in parts:
        out.extend(part[op] if list(part) == [op] else [part])
    return out


def parse_where(expr: str) -> dict[str, Any]:
    """Parse ``source = 'a.txt' and (year >= 2020 or lang in ('en', 'fr'))`` into the filter dict form.

    Comparisons: ``= == != <> > >= < <=``, ``in (...)``, ``not in (...)``; literals: quoted strings
    (``''`` escapes a quote), numbers, ``true``/``false``; ``and`` binds tighter than ``or``.
    Raises ``ValueError`` naming the position of a syntax error.
    """
    where = _Parser(expr).parse()
    _compile(where)
    return where
