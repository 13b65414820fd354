"""Dynamic micro-batching of ``isotrope serve``'s searches: each of many concurrent requests gets
exactly its own answer, equal to a direct search; a failing request does not fail the others; a
batch holds at most ``max_batch`` queries; a lone request is not held back.

The batcher is checked with a recording search function (what was searched together, in which
order) and, through the API, against ``Collection.search`` on a real store.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import make_sentences
from serving import build_store

pytest.importorskip("fastapi")
pytest.importorskip("lancedb")
pytest.importorskip("faiss")

import httpx

from isotrope.connectors.server import collection_worker, create_app
from isotrope.connectors.server.batching import SearchBatcher, options_key, run_batch
from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection
from isotrope.stores.base import Hit


class RecordingSearch:
    """A search answering query text ``q`` with k hits ``q:0 .. q:k-1``; it records each call's
    texts and options, takes ``delay`` seconds (so requests pile up), and rejects ``k == 13``."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[tuple[list[str], dict]] = []
        self.threads: set[int] = set()

    def __call__(self, queries: list[str], k: int = 10, **options) -> list[list[Hit]]:
        self.calls.append((list(queries), {"k": k, **options}))
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        if k == 13:
            raise ValueError("k=13 is unlucky")
        return [[Hit(f"{query}:{rank}", float(-rank), query, dict(options)) for rank in range(k)] for query in queries]


def expected(query: str, k: int, **options) -> list[Hit]:
    return [Hit(f"{query}:{rank}", float(-rank), query, dict(options)) for rank in range(k)]


async def gather(batcher: SearchBatcher, requests: list[tuple[list[str], dict]]) -> list:
    return await asyncio.gather(*(batcher.search(queries, **options) for queries, options in requests), return_exceptions=True)


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.fixture
def worker():
    pool = ThreadPoolExecutor(max_workers=1)
    yield pool
    pool.shutdown()


def test_each_concurrent_request_gets_its_own_answer_and_requests_are_batched(worker):
    search = RecordingSearch(delay=0.01)
    batcher = SearchBatcher(search, worker, max_batch=16)
    requests = [([f"q{i}"], {"k": 1 + i % 4, "where": {"year": {"$gte": 2000 + i % 3}}}) for i in range(60)]
    requests.append((["many-a", "many-b", "many-c"], {"k": 2, "where": None}))
    answers = run(gather(batcher, requests))
    for (queries, options), answer in zip(requests, answers):
        assert answer == [expected(query, **options) for query in queries]
    assert batcher.requests == len(requests)
    assert batcher.batches < len(requests) / 3  # while one batch ran, the others queued and went together
    assert len(search.calls) < len(requests)
    for texts, options in search.calls:  # every call is one options group, at most max_batch texts
        members = [r for r in requests if r[1] == options and set(r[0]) & set(texts)]
        assert sorted(texts) == sorted(t for r in members for t in r[0] if t in texts)
        assert len(texts) <= 16
    assert len(search.threads) == 1  # all in the collection's thread


def test_requests_keep_their_arrival_order_within_a_call(worker):
    search = RecordingSearch(delay=0.02)
    batcher = SearchBatcher(search, worker)
    requests = [([f"q{i}"], {"k": 3}) for i in range(20)]
    run(gather(batcher, requests))
    searched = [text for texts, _ in search.calls for text in texts]
    assert searched == [f"q{i}" for i in range(20)]


def test_a_failing_request_does_not_fail_the_others(worker):
    search = RecordingSearch(delay=0.01)
    batcher = SearchBatcher(search, worker)
    requests = [([f"q{i}"], {"k": 13 if i in (3, 7) else 5}) for i in range(12)]
    answers = run(gather(batcher, requests))
    for i, answer in enumerate(answers):
        if i in (3, 7):
            assert isinstance(answer, ValueError) and "unlucky" in str(answer)
        else:
            assert answer == [expected(f"q{i}", k=5)]


def test_a_failing_call_is_retried_request_by_request_within_its_group():
    class FailsOnBadText(RecordingSearch):
        def __call__(self, queries, k=10, **options):
            if "bad" in queries:
                self.calls.append((list(queries), {"k": k}))
                raise KeyError("no field 'colour'")
            return super().__call__(queries, k=k, **options)

    search = FailsOnBadText()
    work = [
        (["a"], {"k": 2}, options_key({"k": 2})),
        (["bad"], {"k": 2}, options_key({"k": 2})),
        (["b", "c"], {"k": 2}, options_key({"k": 2})),
        (["d"], {"k": 1}, options_key({"k": 1})),
    ]
    outcomes = run_batch(search, work)
    assert outcomes[0] == [expected("a", 2)]
    assert isinstance(outcomes[1], KeyError)
    assert outcomes[2] == [expected("b", 2), expected("c", 2)]
    assert outcomes[3] == [expected("d", 1)]
    assert search.calls[0] == (["a", "bad", "b", "c"], {"k": 2})  # tried together first


def test_options_key_ignores_key_order():
    assert options_key({"k": 3, "where": {"a": 1, "b": {"$gte": 2}}}) == options_key(
        {"where": {"b": {"$gte": 2}, "a": 1}, "k": 3}
    )
    assert options_key({"k": 3}) != options_key({"k": 4})


def test_max_batch_caps_the_queries_of_a_batch_but_a_big_request_goes_whole(worker):
    search = RecordingSearch(delay=0.01)
    batcher = SearchBatcher(search, worker, max_batch=4)
    requests = [([f"q{i}"], {"k": 1}) for i in range(17)] + [([f"big{j}" for j in range(9)], {"k": 1})]
    answers = run(gather(batcher, requests))
    assert answers[-1] == [expected(f"big{j}", 1) for j in range(9)]
    assert all(len(texts) <= 4 for texts, _ in search.calls if not texts[0].startswith("big"))
    assert max(len(texts) for texts, _ in search.calls) == 9


def test_a_lone_request_is_sent_at_once(worker):
    search = RecordingSearch()
    batcher = SearchBatcher(search, worker)

    assert run(batcher.search(["alone"], k=2)) == [expected("alone", 2)]
    assert search.calls == [(["alone"], {"k": 2})] and batcher.batches == 1


def test_max_wait_gathers_requests_arriving_close_together(worker):
    search = RecordingSearch()
    batcher = SearchBatcher(search, worker, max_batch=8, max_wait=0.2)

    async def staggered() -> list:
        async def later(i: int):
            await asyncio.sleep(0.01 * i)
            return await batcher.search([f"q{i}"], k=1)

        return await asyncio.gather(*(later(i) for i in range(5)))

    answers = run(staggered())
    assert answers == [[expected(f"q{i}", 1)] for i in range(5)]
    assert search.calls == [([f"q{i}" for i in range(5)], {"k": 1})]  # one call: all came within 0.2 s


def test_max_wait_is_cut_short_by_a_full_batch(worker):
    search = RecordingSearch()
    batcher = SearchBatcher(search, worker, max_batch=3, max_wait=30.0)

    async def full() -> list:  # sent when the third arrives, not after 30 s
        return await asyncio.wait_for(gather(batcher, [([f"q{i}"], {"k": 1}) for i in range(3)]), timeout=10)

    assert run(full()) == [[expected(f"q{i}", 1)] for i in range(3)]
    assert search.calls == [(["q0", "q1", "q2"], {"k": 1})]


def test_a_cancelled_request_is_not_searched(worker):
    search = RecordingSearch(delay=0.05)
    batcher = SearchBatcher(search, worker)

    async def cancel_one() -> list:
        first = asyncio.ensure_future(batcher.search(["first"], k=1))
        await asyncio.sleep(0.01)  # "first" is running; the next two wait
        gone = asyncio.ensure_future(batcher.search(["gone"], k=1))
        kept = asyncio.ensure_future(batcher.search(["kept"], k=1))
        await asyncio.sleep(0)
        gone.cancel()
        return await asyncio.gather(first, kept)

    assert run(cancel_one()) == [[expected("first", 1)], [expected("kept", 1)]]
    assert [texts for texts, _ in search.calls] == [["first"], ["kept"]]


def test_bad_settings_are_refused(worker):
    with pytest.raises(ValueError, match="max_batch"):
        SearchBatcher(RecordingSearch(), worker, max_batch=0)
    with pytest.raises(ValueError, match="max_wait"):
        SearchBatcher(RecordingSearch(), worker, max_wait=-1)


# ----------------------------------------------------------------------------- through the API


@pytest.fixture(scope="module", params=["lancedb", "faiss"])
def served(request, tiny_bert_path, tmp_path_factory):
    """A store of either kind opened in its worker thread, and its app."""
    encoder = ShapedEncoder.create(tiny_bert_path, shape="whiten", device="cpu").fit(make_sentences(200, seed=3))
    uri = f"{request.param}:{tmp_path_factory.mktemp('batched') / 'store'}"
    build_store(uri, encoder)
    worker = collection_worker()
    opened = worker.submit(Collection.open, uri).result()
    yield opened, worker, create_app(opened, worker=worker, max_batch=8)
    worker.submit(opened.close).result()
    worker.shutdown()


def hit_dicts(hits: list[Hit]) -> list[dict]:
    return [
        {"id": h.id, "score": h.score, "text": h.text, "source": h.metadata.get("source"), "metadata": h.metadata} for h in hits
    ]


def test_concurrent_api_requests_each_equal_a_direct_search(served):
    collection, worker, app = served
    queries = make_sentences(40, seed=29)
    bodies = [
        {"query": query, "k": 1 + i % 5, **({"where": "source = 'b.md'"} if i % 3 == 0 else {})}
        for i, query in enumerate(queries)
    ]
    bodies += [
        {"query": queries[0], "where": "colour = 'red'"},
        {"query": queries[1], "where": "year >>= 3"},
        {"query": queries[2], "mode": "lexical", "k": 3},
        {"query": queries[3], "mode": "hybrid", "k": 4},
    ]

    async def send_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.post("/search", json=body) for body in bodies))

    responses = asyncio.run(send_all())
    batcher = app.state.searcher.batcher
    assert batcher.batches < batcher.requests == len(bodies)  # some requests were searched together
    for body, response in zip(bodies, responses):
        if "colour" in body.get("where", "") or ">>=" in body.get("where", ""):
            assert response.status_code == 400, response.text
            continue
        assert response.status_code == 200, (body, response.text)
        options = {key: value for key, value in body.items() if key != "query"}
        direct = worker.submit(collection.search, body["query"], **options).result()
        got = response.json()
        assert got["query"] == body["query"]
        assert [h["id"] for h in got["hits"]] == [h.id for h in direct]
        for hit, reference in zip(got["hits"], hit_dicts(direct)):
            assert hit["score"] == pytest.approx(reference.pop("score"), rel=1e-5, abs=1e-6)
            assert {key: value for key, value in hit.items() if key != "score"} == reference
    unknown = responses[len(queries)].json()["detail"]
    assert "colour" in unknown


def test_a_shut_down_worker_fails_the_requests_without_hanging():
    pool = ThreadPoolExecutor(max_workers=1)
    batcher = SearchBatcher(RecordingSearch(), pool)
    assert run(batcher.search(["before"], k=1)) == [expected("before", 1)]
    pool.shutdown()

    async def after() -> list:
        return await asyncio.wait_for(gather(batcher, [(["a"], {"k": 1}), (["b"], {"k": 1})]), timeout=10)

    assert all(isinstance(outcome, RuntimeError) for outcome in run(after()))


def test_answers_with_numpy_scalars_are_plain_json():
    import json

    import numpy as np

    from isotrope.connectors.server import json_response

    payload = {
        "query": "q",
        "hits": [{"id": "a", "score": np.float32(0.25), "text": None, "source": None, "metadata": {"n": np.int64(3), "x": 1.5}}],
    }
    assert json.loads(json_response(payload).body) == {
        "query": "q",
        "hits": [{"id": "a", "score": 0.25, "text": None, "source": None, "metadata": {"n": 3, "x": 1.5}}],
    }
