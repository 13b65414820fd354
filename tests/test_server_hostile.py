"""What schemathesis found in ``isotrope serve``'s OpenAPI document (each case kept as a regression test),
the server's limits (body size, query length, batch size, time, requests in flight, slow clients, CORS),
and the bounded schemathesis run itself (tests/reliability/fuzz_api.py against live servers)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import pytest

from conftest import make_sentences
from serving import build_store, live_server

pytest.importorskip("fastapi")
pytest.importorskip("lancedb")

import httpx
from fastapi.testclient import TestClient

from isotrope.connectors.server import NOT_BLANK, WHITESPACE, create_app
from isotrope.connectors.server.limits import ServerLimits
from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection

QUERY = "the cat runs in the city"
SEARCHES = [("/search", {"query": QUERY}), ("/search/batch", {"queries": [QUERY]}), ("/embed", {"texts": [QUERY]})]


@pytest.fixture(scope="module")
def collection(tmp_path_factory, tiny_glove_path):
    encoder = ShapedEncoder.create(tiny_glove_path, shape="center,l2").fit(make_sentences(100, seed=3))
    uri = f"lancedb:{tmp_path_factory.mktemp('hostile') / 'store'}"
    build_store(uri, encoder)
    with Collection.open(uri) as opened:
        yield opened


@pytest.fixture(scope="module")
def client(collection) -> TestClient:
    return TestClient(create_app(collection))


# ----------------------------------------------------------------------------- the OpenAPI document


def test_bearer_auth_is_declared_only_when_the_server_has_a_key(collection):
    open_doc = TestClient(create_app(collection)).get("/openapi.json").json()
    keyed_doc = TestClient(create_app(collection, api_key="k")).get("/openapi.json").json()
    assert "securitySchemes" not in open_doc.get("components", {})
    for path, methods in open_doc["paths"].items():
        for operation in methods.values():
            assert "security" not in operation and "401" not in operation["responses"], path
            assert all(parameter["in"] != "header" for parameter in operation.get("parameters", [])), path
    assert keyed_doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    guarded = [path for path, methods in keyed_doc["paths"].items() for operation in methods.values() if "security" in operation]
    assert sorted(guarded) == ["/embed", "/info", "/report", "/search", "/search/batch"]


def test_422_bodies_are_what_the_document_promises(client):
    doc = client.get("/openapi.json").json()
    problem = doc["components"]["schemas"]["Problem"]
    assert problem["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for path, _ in SEARCHES:
        declared = doc["paths"][path]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
        assert declared == {"$ref": "#/components/schemas/Problem"}
        body = client.post(path, content=b"").json()  # was {"detail": "body: Field required"} against an array schema
        assert set(body) == {"detail", "errors"} and isinstance(body["detail"], str) and "\n" not in body["detail"]
        assert body["errors"][0]["loc"] == ["body"]
    report_422 = doc["paths"]["/report"]["get"]["responses"]["422"]["content"]  # JSON, though the page is HTML
    assert list(report_422) == ["application/json"]
    assert client.get("/report?sample=9").headers["content-type"] == "application/json"


def test_text_items_declare_what_validation_enforces(client):
    """``{"texts": [""]}`` and ``{"queries": [""]}`` were valid by the schema and refused."""
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    items = [schemas["EmbedRequest"]["properties"]["texts"]["items"], schemas["BatchRequest"]["properties"]["queries"]["items"]]
    for schema in [*items, schemas["SearchRequest"]["properties"]["query"]]:
        assert schema["minLength"] == 1 and schema["maxLength"] == 10_000 and schema["pattern"] == NOT_BLANK
    for path, field in (("/embed", "texts"), ("/search/batch", "queries")):
        for blank in ("", " ", "\u3000\x1c"):
            response = client.post(path, json={field: ["a cat", blank]})
            assert response.status_code == 422 and response.json()["detail"].startswith(f"{field}.1: "), response.text


def test_the_not_blank_pattern_is_exactly_str_strip():
    import re

    assert set(WHITESPACE) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    for text in ("", " ", "\t\n", "\x1c\x85", "a", " a ", "\x00", "\u200b"):
        assert bool(re.search(NOT_BLANK, text)) == bool(text.strip()), repr(text)


def test_booleans_and_strings_are_not_numbers(client):
    """Found by schemathesis: ``"alpha": true`` and, in the 1,000-example run, ``"alpha": "0"`` were accepted."""
    for body in (
        {"query": QUERY, "k": True},
        {"query": QUERY, "mode": "hybrid", "alpha": False},
        {"query": QUERY, "k": "5"},
        {"query": QUERY, "mode": "hybrid", "alpha": "0"},
    ):
        response = client.post("/search", json=body)
        assert response.status_code == 422, body
    assert client.post("/search", json={"query": QUERY, "k": 3.0}).status_code == 200  # JSON Schema's integer


def test_alpha_outside_hybrid_is_a_422_the_schema_states(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]["SearchRequest"]
    assert schema["if"] == {"properties": {"mode": {"not": {"const": "hybrid"}}}}
    assert schema["then"] == {"properties": {"alpha": {"type": "null"}}}
    response = client.post("/search", json={"query": QUERY, "alpha": 0.5})
    assert response.status_code == 422 and "hybrid" in response.json()["detail"]


def test_lone_surrogates_are_422_not_a_500(client):
    body = b'{"query": "cat \\ud800 dog"}'  # valid JSON; would decode to a str no response can encode
    response = client.post("/search", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and "unicode" in response.json()["detail"]
    response = client.post("/embed", content=b'{"texts": ["\\udfff"]}', headers={"content-type": "application/json"})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "where",
    [{"year": 10**30}, "year = 99999999999999999999", "(" * 5000 + "year = 1" + ")" * 5000, "year = 1e999"],
)
def test_filters_beyond_what_a_store_holds_are_400_not_500(client, where):
    """An integer beyond int64 reached SQLite (OverflowError: a 500); deep parentheses overflowed the stack."""
    response = client.post("/search", json={"query": QUERY, "where": where})
    assert response.status_code == 400 and "\n" not in response.json()["detail"], response.text


def test_a_filter_nested_past_the_json_parser_is_a_400(client):
    body = '{"query": "cat", "where": ' + '{"$and": [' * 3000 + '{"year": 1}' + "]}" * 3000 + "}"
    response = client.post("/search", content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 400


def test_a_body_that_is_not_json_is_a_documented_400(client):
    doc = client.get("/openapi.json").json()
    response = client.post("/embed", content=b"\xff\xfe_R\x01", headers={"content-type": "application/json"})
    assert response.status_code in (400, 422)
    assert str(response.status_code) in doc["paths"]["/embed"]["post"]["responses"]


# ----------------------------------------------------------------------------- limits


def test_limits_refuse_with_one_line_naming_the_flag(collection):
    limits = ServerLimits(max_body_bytes=2000, max_query_chars=50, max_queries=3)
    client = TestClient(create_app(collection, limits=limits))
    big = client.post("/search", json={"query": "cat " * 600})
    assert big.status_code == 413 and big.json() == {"detail": "request body over 2000 bytes (--max-body-bytes)"}
    long = client.post("/search", json={"query": "cat " * 20})
    assert long.status_code == 422 and long.json()["detail"].startswith("query: String should have at most 50 characters")
    many = client.post("/search/batch", json={"queries": ["cat"] * 4})
    assert many.status_code == 422 and "at most 3 items" in many.json()["detail"]
    assert client.post("/embed", json={"texts": ["cat"] * 4}).status_code == 422
    assert client.post("/search/batch", json={"queries": ["cat"] * 3}).status_code == 200
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["BatchRequest"]["properties"]["queries"]["maxItems"] == 3
    assert schemas["SearchRequest"]["properties"]["query"]["maxLength"] == 50


def test_a_body_streamed_past_the_limit_without_content_length_is_413(collection):
    app = create_app(collection, limits=ServerLimits(max_body_bytes=1000))

    def chunks():
        for _ in range(10):
            yield b" " * 200

    with live_server(app) as url:
        response = httpx.post(url + "/search", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413


def test_a_slow_search_is_504_with_a_one_line_reason(collection, monkeypatch):
    app = create_app(collection, limits=ServerLimits(request_timeout=0.2))
    search = collection.search
    monkeypatch.setattr(collection, "search", lambda *a, **kw: (time.sleep(0.6), search(*a, **kw))[1])
    with TestClient(app) as client:  # one event loop for both requests, as in a server
        response = client.post("/search", json={"query": QUERY})
        assert response.status_code == 504 and response.json() == {"detail": "no answer within 0.2 s (--request-timeout)"}
        monkeypatch.setattr(collection, "search", search)
        time.sleep(0.6)  # the abandoned search finishes in the worker; the next request is answered
        assert client.post("/search", json={"query": QUERY}).status_code == 200


def test_requests_beyond_the_in_flight_limit_get_503_with_retry_after(collection, monkeypatch):
    app = create_app(collection, limits=ServerLimits(max_in_flight=2))
    search = collection.search
    monkeypatch.setattr(collection, "search", lambda *a, **kw: (time.sleep(0.5), search(*a, **kw))[1])

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.post("/search", json={"query": QUERY, "k": k}) for k in range(1, 6)))

    responses = asyncio.run(burst())
    statuses = sorted(response.status_code for response in responses)
    assert statuses == [200, 200, 503, 503, 503], statuses
    for response in responses:
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1" and "--max-in-flight" in response.json()["detail"]
    assert TestClient(app).get("/healthz").status_code == 200  # never refused for load


def test_a_client_that_sends_its_body_too_slowly_gets_408(collection):
    app = create_app(collection, limits=ServerLimits(client_timeout=0.3))
    with live_server(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(
                b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"
            )
            answer = connection.recv(4096).decode()
    assert answer.startswith("HTTP/1.1 408") and "--client-timeout" in answer


def test_cors_is_off_unless_origins_are_given(collection):
    origin = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    closed = TestClient(create_app(collection))
    assert "access-control-allow-origin" not in closed.post("/search", json={"query": QUERY}, headers=origin).headers
    assert "access-control-allow-origin" not in closed.options("/search", headers=origin).headers
    opened = TestClient(create_app(collection, cors=["https://app.example"]))
    assert opened.options("/search", headers=origin).headers["access-control-allow-origin"] == "https://app.example"
    other = {**origin, "Origin": "https://evil.example"}
    assert "access-control-allow-origin" not in opened.post("/search", json={"query": QUERY}, headers=other).headers


def test_errors_echo_no_secret_and_no_path(collection, monkeypatch):
    client = TestClient(create_app(collection, api_key="s3cret-key"), raise_server_exceptions=False)
    wrong = client.post("/search", json={"query": QUERY}, headers={"Authorization": "Bearer s3cret-kez"})
    assert wrong.status_code == 401 and "s3cret" not in wrong.text
    monkeypatch.setattr(collection, "search", lambda *a, **kw: (_ for _ in ()).throw(OSError("/home/me/secret/file")))
    failed = client.post("/search", json={"query": QUERY}, headers={"Authorization": "Bearer s3cret-key"})
    assert failed.status_code == 500 and "/home" not in failed.text and "s3cret" not in failed.text


def test_limits_are_checked():
    for bad in ({"max_body_bytes": 0}, {"max_in_flight": 0}, {"request_timeout": 0}, {"client_timeout": -1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServerLimits(**bad)


def test_serve_flags_reach_the_limits(monkeypatch):
    from typer.main import get_command

    from isotrope.cli import app

    seen = {}
    monkeypatch.setattr("isotrope.connectors.server.serve", lambda store, **kw: seen.update(kw))
    flags = ["--max-body-bytes", "10", "--max-query-chars", "20", "--max-queries", "3", "--request-timeout", "2"]
    flags += ["--max-in-flight", "4", "--client-timeout", "5", "--cors", "https://a.example", "--cors", "https://b.example"]
    get_command(app).main(["serve", "faiss:/nowhere", *flags], standalone_mode=False)
    assert seen["limits"] == ServerLimits(10, 20, 3, 2.0, 4, 5.0)
    assert list(seen["cors"]) == ["https://a.example", "https://b.example"]


# ----------------------------------------------------------------------------- schemathesis, bounded


@pytest.mark.slow
def test_schemathesis_finds_nothing_in_a_bounded_run(tmp_path):
    """Two live servers (FAISS without a key, LanceDB with one), every operation, all checks; ~60 s."""
    pytest.importorskip("schemathesis")
    pytest.importorskip("lancedb")
    sys.path.insert(0, str(Path(__file__).parent / "reliability"))
    from fuzz_api import main

    results = main(["--examples", "5", "--max-time", "20", "--servers", "faiss-open,lancedb-key", "--workdir", str(tmp_path)])
    for result in results:
        operations = result["operations"]
        assert len(operations) == 6, result
        assert all(op["requests"] > 0 and not op["failures"] for op in operations.values()), json.dumps(result)[:4000]
        assert not any(status.startswith("5") for op in operations.values() for status in op["statuses"]), result
        assert result["exit"] == 0 and result["server_errors_logged"] == 0, result.get("output")
