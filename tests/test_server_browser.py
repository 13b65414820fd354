"""The search page in a real headless browser (Debian's chromium driven by playwright), against a
live uvicorn server: type a query, see result cards, change k, see the error of a bad filter.

Skipped, saying why, when playwright or a chromium executable is missing (CI installs both:
.ci/browser_setup.sh). Playwright's own browser download is never used.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from conftest import make_sentences
from serving import build_store, live_server

pytest.importorskip("fastapi")
pytest.importorskip("lancedb")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from isotrope.connectors.server import create_app  # noqa: E402
from isotrope.encoder import ShapedEncoder  # noqa: E402
from isotrope.search import Collection  # noqa: E402

CHROMIUM = os.environ.get("ISOTROPE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
QUERY = "the cat runs in the city"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium executable (apt-get install chromium, or set ISOTROPE_CHROMIUM)"),
]


@pytest.fixture(scope="module")
def collection(tiny_bert_path, tmp_path_factory):
    encoder = ShapedEncoder.create(tiny_bert_path, shape="center", device="cpu").fit(make_sentences(100, seed=3))
    uri = f"lancedb:{tmp_path_factory.mktemp('browser') / 'store'}"
    build_store(uri, encoder)
    with Collection.open(uri) as opened:
        yield opened


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    opened = browser.new_page()
    opened.set_default_timeout(30_000)
    yield opened
    opened.close()


def test_query_cards_k_and_a_bad_filter(collection, page):
    expected = collection.search(QUERY, k=10)
    with live_server(create_app(collection)) as url:
        page.goto(url + "/")
        sync_api.expect(page.locator("#info")).to_contain_text("60 chunks")
        sync_api.expect(page.locator("#token-form")).to_be_hidden()  # no key asked for
        page.fill("#query", QUERY)
        page.press("#query", "Enter")
        cards = page.locator("#results .card")
        sync_api.expect(cards).to_have_count(10)
        first = cards.nth(0)
        assert first.locator(".score").inner_text() == f"{expected[0].score:.3f}"
        assert first.locator(".source").inner_text().startswith(expected[0].metadata["source"])
        assert first.locator(".id").inner_text() == expected[0].id
        marked = {text.lower() for text in page.locator("#results mark").all_inner_texts()}
        assert marked and marked <= {"cat", "runs", "city"}  # whole query words, no stopwords
        for card in range(10):  # marks hold whole words
            assert not re.search(r"\w<mark>|</mark>\w", cards.nth(card).locator(".text").inner_html())

        page.fill("#k", "3")
        page.dispatch_event("#k", "change")
        sync_api.expect(cards).to_have_count(3)
        assert [page.locator(".id").nth(i).inner_text() for i in range(3)] == [hit.id for hit in expected[:3]]

        page.fill("#where", "source = 'b.md'")
        page.press("#query", "Enter")
        sync_api.expect(page.locator("#results .source")).to_have_text([re.compile(r"^b\.md")] * 3)

        page.fill("#where", "year >>= 3")
        page.press("#query", "Enter")
        sync_api.expect(page.locator("#error")).to_be_visible()
        sync_api.expect(page.locator("#error")).not_to_be_empty()
        sync_api.expect(cards).to_have_count(0)


def test_the_page_asks_for_the_api_key(collection, page):
    with live_server(create_app(collection, api_key="page-key")) as url:
        page.goto(url + "/")
        sync_api.expect(page.locator("#token-form")).to_be_visible()
        page.fill("#token", "page-key")
        page.click("#token-form button")
        sync_api.expect(page.locator("#info")).to_contain_text("60 chunks")
        page.fill("#query", QUERY)
        page.press("#query", "Enter")
        sync_api.expect(page.locator("#results .card")).to_have_count(10)


def test_the_api_docs_render_without_the_network(collection, page):
    """Swagger UI at /docs draws the API from the server's own copy of its scripts: no request
    leaves the server's origin, and the routes show up."""
    with live_server(create_app(collection)) as url:
        outside: list[str] = []
        page.on("request", lambda request: None if request.url.startswith(url) else outside.append(request.url))
        page.goto(url + "/docs")
        sync_api.expect(page.locator(".swagger-ui .info .title")).to_contain_text("isotrope")
        sync_api.expect(page.locator(".opblock-summary-path", has_text="/search/batch")).to_be_visible()
        assert outside == []
