"""The HTTP API of ``isotrope serve`` (FastAPI's test client, and a real uvicorn process) and the
shaping report, checked against the collection's own search and float64 NumPy references."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from conftest import make_sentences
from serving import SOURCES, build_store, free_port

pytest.importorskip("fastapi")
pytest.importorskip("lancedb")
pytest.importorskip("faiss")

from fastapi.testclient import TestClient

from isotrope.cli import main
from isotrope.connectors.server import STATIC_DIR, collection_worker, create_app
from isotrope.connectors.server.limits import ServerLimits
from isotrope.encoder import ShapedEncoder
from isotrope.report import COSINE_BINS, build_report, render_html, summarize
from isotrope.search import Collection

QUERY = "the cat runs in the city"


@pytest.fixture(scope="module")
def encoder(tiny_bert_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu").fit(make_sentences(200, seed=3))


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory, encoder) -> str:
    uri = f"lancedb:{tmp_path_factory.mktemp('served') / 'store'}"
    build_store(uri, encoder)
    return uri


@pytest.fixture(scope="module")
def collection(store_uri):
    with Collection.open(store_uri) as opened:
        yield opened


@pytest.fixture(scope="module")
def client(collection) -> TestClient:
    return TestClient(create_app(collection))


def hits_of(collection: Collection, query: str, k: int, where=None) -> list[dict]:
    return [
        {"id": h.id, "score": h.score, "text": h.text, "source": h.metadata.get("source"), "metadata": h.metadata}
        for h in collection.search(query, k=k, where=where)
    ]


def assert_same_hits(got: list[dict], expected: list[dict]) -> None:
    assert [h["id"] for h in got] == [h["id"] for h in expected]
    np.testing.assert_allclose([h["score"] for h in got], [h["score"] for h in expected], rtol=1e-6)
    assert [(h["text"], h["source"], h["metadata"]) for h in got] == [(h["text"], h["source"], h["metadata"]) for h in expected]


# ----------------------------------------------------------------------------- routes


def test_healthz_and_info(client, collection):
    assert client.get("/healthz").json() == {"status": "ok"}
    info = client.get("/info").json()
    assert info["chunks"] == len(collection.store) == 60
    assert info["fingerprint"] == collection.encoder.fingerprint
    assert info["store"] == f"lancedb:{collection.path}"
    assert info["server"]["modes"] == ["dense", "lexical", "hybrid"]


def test_search_returns_the_collections_hits_with_the_cli_json_fields(client, collection, store_uri, capsys, monkeypatch):
    response = client.post("/search", json={"query": QUERY, "k": 7})
    assert response.status_code == 200
    body = response.json()
    assert body["query"] == QUERY and len(body["hits"]) == 7
    assert_same_hits(body["hits"], hits_of(collection, QUERY, 7))
    assert all(hit["source"] in SOURCES and hit["source"] == hit["metadata"]["source"] for hit in body["hits"])
    monkeypatch.setattr(sys, "argv", ["isotrope", "search", store_uri, QUERY, "-k", "7", "--json"])
    main()
    cli_hits = json.loads(capsys.readouterr().out)
    assert [{key: hit[key] for key in cli_hits[0]} for hit in body["hits"]] == cli_hits


def test_scores_are_cosines_of_the_encoded_query_and_stored_vectors(client, collection):
    hits = client.post("/search", json={"query": QUERY, "k": 60}).json()["hits"]
    query = collection.encoder.encode([QUERY], kind="query")[0].astype(np.float64)
    stored = collection.store.vectors([h["id"] for h in hits]).astype(np.float64)
    cosines = stored @ query / np.linalg.norm(stored, axis=1) / np.linalg.norm(query)
    np.testing.assert_allclose([h["score"] for h in hits], cosines, atol=1e-5)
    assert np.all(np.diff(cosines) <= 1e-6)  # best first


@pytest.mark.parametrize("where", ["source = 'a.md' and year >= 2003", {"source": "a.md", "year": {"$gte": 2003}}])
def test_where_filters_as_text_or_dict(client, collection, where):
    hits = client.post("/search", json={"query": QUERY, "k": 50, "where": where}).json()["hits"]
    expected = [d for d in collection.store.ids() if d]  # every stored id, filtered below by metadata
    matching = [h for h in collection.store.get(expected) if h.metadata["source"] == "a.md" and h.metadata["year"] >= 2003]
    assert {h["id"] for h in hits} == {h.id for h in matching}
    assert_same_hits(hits, hits_of(collection, QUERY, 50, where={"source": "a.md", "year": {"$gte": 2003}}))


def test_batch_equals_single_searches(client):
    queries = [QUERY, "a big red car", "music and rain"]
    body = client.post("/search/batch", json={"queries": queries, "k": 4, "where": "source != 'c.txt'"}).json()
    assert [r["query"] for r in body["results"]] == queries
    for result in body["results"]:
        single = client.post("/search", json={"query": result["query"], "k": 4, "where": "source != 'c.txt'"}).json()
        assert_same_hits(result["hits"], single["hits"])


def test_embed_returns_the_encoders_vectors(client, collection):
    texts = ["a cat", "the river in the city"]
    for kind in ("query", "document"):
        body = client.post("/embed", json={"texts": texts, "kind": kind}).json()
        assert body["fingerprint"] == collection.encoder.fingerprint and body["dim"] == collection.encoder.dim
        np.testing.assert_allclose(body["vectors"], collection.encoder.encode(texts, kind=kind), rtol=1e-5, atol=1e-6)


def test_curl_style_form_content_type_is_read_as_json(client):
    response = client.post(
        "/search", content=json.dumps({"query": QUERY, "k": 2}), headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert response.status_code == 200 and len(response.json()["hits"]) == 2


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": QUERY, "k": 0}, "k"),
        ({"query": QUERY, "k": "ten"}, "k"),
        ({"k": 3}, "query"),
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": QUERY, "mode": "semantic"}, "mode"),
        ({"query": QUERY, "colour": "red"}, "colour"),
        ({"query": QUERY, "where": ["source"]}, "where"),
    ],
)
def test_validation_errors_are_422_naming_the_field(client, body, field):
    response = client.post("/search", json=body)
    assert response.status_code == 422
    assert re.match(rf"{field}\b", response.json()["detail"]), response.json()


def test_embed_and_batch_validation(client):
    assert client.post("/embed", json={"texts": []}).json()["detail"].startswith("texts")
    assert client.post("/embed", json={"texts": ["a", ""]}).status_code == 422
    assert client.post("/search/batch", json={"queries": ["a cat", " "]}).json()["detail"].startswith("queries.1")


@pytest.mark.parametrize("where", ["source == ", "year >>= 3", {"year": {"$near": 3}}])
def test_bad_filter_is_400_with_a_message(client, where):
    response = client.post("/search", json={"query": QUERY, "where": where})
    assert response.status_code == 400
    assert response.json()["detail"] and "Traceback" not in response.text


def test_no_mode_searches_the_stores_default(client, collection):
    dense = [hit.id for hit in collection.search(QUERY, k=6, mode="dense")]
    assert client.get("/info").json()["default_search"]["mode"] == "dense"  # too few chunks to calibrate: dense
    assert [hit["id"] for hit in client.post("/search", json={"query": QUERY, "k": 6}).json()["hits"]] == dense
    stored = collection.store.properties.get("default_search", "")
    collection.store.set_properties(default_search=json.dumps({"mode": "lexical", "alpha": None}))
    try:
        body = client.post("/search", json={"query": QUERY, "k": 6}).json()
        assert [hit["id"] for hit in body["hits"]] == [hit.id for hit in collection.search(QUERY, k=6, mode="lexical")] != dense
        assert client.get("/info").json()["default_search"]["mode"] == "lexical"
    finally:
        collection.store.set_properties(default_search=stored)  # as it was, for the other tests


@pytest.mark.parametrize("mode", ["lexical", "hybrid"])
def test_lexical_and_hybrid_modes_return_the_collections_hits(client, collection, mode):
    extra = {"alpha": 0.3} if mode == "hybrid" else {}
    body = client.post("/search", json={"query": QUERY, "k": 6, "mode": mode, **extra}).json()
    expected = collection.search(QUERY, k=6, mode=mode, **extra)
    assert_same_hits(
        body["hits"],
        [
            {"id": h.id, "score": h.score, "text": h.text, "source": h.metadata.get("source"), "metadata": h.metadata}
            for h in expected
        ],
    )
    assert client.post("/search", json={"query": QUERY, "mode": "dense", "alpha": 0.3}).status_code == 422


def test_group_by_keeps_one_hit_per_source(client):
    hits = client.post("/search", json={"query": QUERY, "k": 3, "group_by": "source"}).json()["hits"]
    assert sorted(hit["source"] for hit in hits) == sorted(SOURCES)
    best = client.post("/search", json={"query": QUERY, "k": 1}).json()["hits"][0]
    assert hits[0]["id"] == best["id"]


def test_unknown_where_field_is_400_naming_it(client):
    response = client.post("/search", json={"query": QUERY, "where": "colour = 'red'"})
    assert response.status_code == 400 and "colour" in response.json()["detail"]


def test_internal_errors_are_500_without_a_traceback(collection, monkeypatch):
    app = create_app(collection)
    monkeypatch.setattr(collection, "search", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("boom at /secret/path")))
    response = TestClient(app, raise_server_exceptions=False).post("/search", json={"query": QUERY})
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error (RuntimeError); see the server log"}


# ----------------------------------------------------------------------------- auth


def test_api_key_guards_every_route_but_healthz(collection):
    client = TestClient(create_app(collection, api_key="s3cret"))
    guarded = [
        ("get", "/info", None),
        ("post", "/search", {"query": QUERY}),
        ("post", "/search/batch", {"queries": [QUERY]}),
        ("post", "/embed", {"texts": [QUERY]}),
        ("get", "/report?sample=20", None),
    ]
    for method, path, body in guarded:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
            response = (
                getattr(client, method)(path, json=body, headers=headers)
                if body
                else getattr(client, method)(path, headers=headers)
            )
            assert response.status_code == 401, (path, headers)
        good = {"Authorization": "Bearer s3cret"}
        response = getattr(client, method)(path, json=body, headers=good) if body else getattr(client, method)(path, headers=good)
        assert response.status_code == 200, path
    assert client.get("/healthz").status_code == 200
    assert client.get("/").status_code == 200  # the page holds no data; it asks for the key


def test_default_threads_follow_the_encoder():
    from isotrope.backbones.onnx import physical_cores
    from isotrope.connectors.server import default_threads

    assert default_threads("fast") == default_threads("static:all-MiniLM-L6-v2") == 1
    assert default_threads("all-MiniLM-L6-v2") == physical_cores()


def test_api_key_from_the_environment(store_uri, monkeypatch):
    from typer.main import get_command

    from isotrope.cli import app

    captured = {}
    monkeypatch.setattr("isotrope.connectors.server.serve", lambda store, **kw: captured.update(kw, store=store))
    monkeypatch.setenv("ISOTROPE_API_KEY", "from-env")
    get_command(app).main(
        ["serve", store_uri, "--port", "9", "--max-batch", "16", "--batch-wait-ms", "0.5", "--ef", "64", "--backend", "onnx"],
        standalone_mode=False,
    )
    assert captured == {
        "store": store_uri,
        "host": "127.0.0.1",
        "port": 9,
        "api_key": "from-env",
        "log_level": "info",
        "threads": None,
        "max_batch": 16,
        "batch_wait_ms": 0.5,
        "store_options": {"ef": 64},
        "backend": "onnx",
        "limits": ServerLimits(),  # the documented defaults
        "cors": (),
    }


def test_demo_ends_with_the_serve_command_for_its_store(collection, monkeypatch, capsys):
    from types import SimpleNamespace

    hits = collection.search(QUERY, k=2)
    report = SimpleNamespace(summary=lambda: "60 chunks")
    info = {"model": "tiny", "shape": "whiten", "fingerprint": "f" * 64}
    monkeypatch.setattr("isotrope.demo.run_demo", lambda store: ([(QUERY, hits)], report, {"index": 1.0}, info))
    monkeypatch.setattr(sys, "argv", ["isotrope", "demo", "--store", "lancedb:/tmp/where-the-demo-is"])
    main()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert f"Q: {QUERY}" in lines and any(f"{hits[0].score:.3f}" in line for line in lines)
    assert "isotrope serve lancedb:/tmp/where-the-demo-is" in lines[-2] and "curl -X POST localhost:8000/search" in lines[-1]


# ----------------------------------------------------------------------------- page and docs


def test_page_and_static_files_are_served_and_offline(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    for path in STATIC_DIR.iterdir():
        assert not re.search(r"(src|href)=\"(https?:)?//", path.read_text()), f"{path.name} loads an external asset"
        assert "http://" not in path.read_text() and "https://" not in path.read_text()


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_api_docs_pages_load_their_assets_from_the_server(client, path):
    page = client.get(path)
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assets = re.findall(r'(?:src|href|spec-url|url)\s*[=:]\s*["\']([^"\']+)["\']', page.text)
    assert any(asset.endswith(".js") for asset in assets) and "/openapi.json" in assets
    assert not re.search(r"https?://|(src|href)=[\"']//", page.text), "the docs page names an external URL"
    for asset in assets:
        assert client.get(asset).status_code == 200, asset


def test_openapi_lists_every_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/search", "/search/batch", "/embed", "/info", "/healthz", "/report"} <= set(paths)


# ----------------------------------------------------------------------------- report


def test_summarize_against_numpy_references():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6)) @ np.diag([5, 2, 1, 1, 0.5, 0.1]) + 3.0
    summary = summarize(x)
    reference = np.sort(np.linalg.eigvalsh(np.cov(x, rowvar=False)))[::-1]
    np.testing.assert_allclose(summary.eigenvalues, reference / reference.sum(), rtol=1e-9, atol=1e-12)
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cosines = [float(unit[i] @ unit[j]) for i in range(50) for j in range(i + 1, 50)]
    expected, _ = np.histogram(cosines, bins=COSINE_BINS, range=(-1, 1))
    np.testing.assert_array_equal(summary.cosine_histogram, expected)
    assert summary.cosine_histogram.sum() == 50 * 49 // 2
    assert summary.isotropy["n_vectors"] == 50


def test_report_compares_raw_and_shaped_vectors(collection):
    report = build_report(collection, sample=40)
    assert report.sample_size == 40 and report.raw is not None and not report.notes
    assert report.raw.isotropy["dim"] == collection.encoder.backbone.dim
    # whitening spreads the variance: the shaped spectrum is flatter than the raw one
    assert report.shaped.eigenvalues[0] < report.raw.eigenvalues[0]
    page = render_html(report)
    assert page.count("<svg") == 2 and "raw" in page and "shaped" in page
    assert f"{report.raw.isotropy['mean_cosine']:.4g}" in page and f"{report.shaped.isotropy['effective_rank']:.4g}" in page
    assert "texts passed to fit()" in page and ">200<" in page  # what and how much the shaping was fitted on
    assert not re.search(r"(src|href)=\"(https?:)?//", page)


def test_report_cuts_long_values(collection, monkeypatch):
    monkeypatch.setitem(collection.encoder.metadata, "fit", {"fitted_on": "x" * 10_000, "n_texts": 200})
    page = render_html(build_report(collection, sample=20))
    assert "x" * 300 + "… (10,000 characters)" in page and "x" * 301 not in page


def test_report_shows_auto_shape_candidates(collection, monkeypatch):
    auto = {
        "chosen": {"shape": "center"},
        "rule": "simplest close to best",
        "pseudo_queries": 42,
        "held_aside_texts": 99,
        "candidates": [
            {"shape": "none", "mrr@10": 30.5, "standard_errors_below_best": 2.1},
            {"shape": "center", "mrr@10": 33.25, "standard_errors_below_best": 0.0},
        ],
    }
    monkeypatch.setitem(collection.encoder.metadata, "auto_shape", auto)
    page = render_html(build_report(collection, sample=20))
    assert "33.25" in page and "30.5" in page and "42 pseudo-queries" in page
    assert re.search(r'<tr class="chosen"><td>center</td>', page)


def test_report_of_a_store_without_raw_vectors_says_so(tmp_path, encoder):
    uri = f"faiss:{tmp_path / 'f'}"
    build_store(uri, encoder)
    with Collection.open(uri) as opened:
        report = build_report(opened, sample=30)
    assert report.raw is None and "does not keep the raw" in report.notes[0]
    page = render_html(report)
    assert "does not keep the raw" in page and page.count("<svg") == 2


def test_a_faiss_store_is_served_from_the_thread_that_opened_it(tmp_path, encoder):
    uri = f"faiss:{tmp_path / 'f'}"
    build_store(uri, encoder)
    worker = collection_worker()
    opened = worker.submit(Collection.open, uri).result()
    try:
        client = TestClient(create_app(opened, worker=worker))
        response = client.post("/search", json={"query": QUERY, "k": 4, "where": "source = 'b.md'"})
        assert response.status_code == 200, response.text
        expected = worker.submit(hits_of, opened, QUERY, 4, {"source": "b.md"}).result()
        assert_same_hits(response.json()["hits"], expected)
        assert client.get("/info").json()["store"] == uri
    finally:
        worker.submit(opened.close).result()
        worker.shutdown()


def test_report_route_and_command(client, store_uri, tmp_path, monkeypatch, capsys):
    response = client.get("/report?sample=30")
    assert response.status_code == 200 and "<svg" in response.text
    assert client.get("/report?sample=3").status_code == 422
    out = tmp_path / "report.html"
    monkeypatch.setattr(sys, "argv", ["isotrope", "report", store_uri, "--out", str(out), "--sample", "30"])
    main()
    assert out.read_text().count("<svg") == 2 and "wrote the shaping report" in capsys.readouterr().out


# ----------------------------------------------------------------------------- a real process


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lancedb", "faiss"])
def test_isotrope_serve_process_answers_http(kind, store_uri, tmp_path, encoder):
    import httpx

    if kind == "faiss":  # SQLite objects belong to the thread that opened the store: startup must use it too
        store_uri = f"faiss:{tmp_path / 'f'}"
        build_store(store_uri, encoder)
    queries = make_sentences(16, seed=41)
    with Collection.open(store_uri) as opened:  # what each concurrent request must get back
        expected = [[hit.id for hit in opened.search(query, k=1 + i % 4)] for i, query in enumerate(queries)]
    port = free_port()
    command = [str(Path(sys.executable).parent / "isotrope"), "serve", store_uri, "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(
        command, env={**os.environ, "ISOTROPE_API_KEY": "k1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            assert time.monotonic() < deadline, "isotrope serve did not answer /healthz within 120 s"
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert httpx.post(url + "/search", json={"query": QUERY}).status_code == 401
        response = httpx.post(
            url + "/search",
            content=json.dumps({"query": QUERY, "k": 3}),
            headers={"Authorization": "Bearer k1", "content-type": "application/x-www-form-urlencoded"},
        )
        assert response.status_code == 200 and len(response.json()["hits"]) == 3

        def ask(i: int) -> httpx.Response:  # 16 requests from 8 threads: batched; one has a bad filter
            body = {"query": queries[i], "k": 1 + i % 4, **({"where": "colour = 'red'"} if i == 5 else {})}
            return httpx.post(url + "/search", json=body, headers={"Authorization": "Bearer k1"}, timeout=60)

        with ThreadPoolExecutor(max_workers=8) as clients:
            answers = list(clients.map(ask, range(16)))
        assert answers[5].status_code == 400 and "colour" in answers[5].json()["detail"]
        for i, answer in enumerate(answers):
            if i != 5:
                assert answer.status_code == 200 and [hit["id"] for hit in answer.json()["hits"]] == expected[i], i
    finally:
        process.terminate()
        process.wait(timeout=30)
