"""Dynamic micro-batching of concurrent searches for ``isotrope serve``.

Every search runs in the one thread that owns the collection. Searches that arrive while that
thread is busy wait in a queue; as soon as it is free, everything waiting (up to ``max_batch``
query texts) goes to it as one batch, in which the requests with the same options (k, mode,
filter, ...) make one ``Collection.search`` call: one encoder pass and one store search for all
their queries. This is Triton's dynamic batcher with its default ``max_queue_delay`` of 0: a lone
request is sent at once, so batching costs nothing without concurrency; ``max_wait`` (seconds)
holds a batch that long for more requests when the thread is idle.

A request's failure is its own: when a batch call raises, each of its requests is run alone, so
a bad filter in one answers that request with its error and the others with their hits.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from isotrope.stores.base import Hit

logger = logging.getLogger(__name__)

Hits = list[list[Hit]]
#: ``search(queries, **options)``: one list of hits per query
SearchFunction = Callable[..., Hits]


@dataclass
class _Request:
    queries: list[str]
    options: dict[str, Any]
    key: str  # the options as a canonical string: requests with equal keys share a search call
    future: asyncio.Future


def options_key(options: dict[str, Any]) -> str:
    """Equal for equal options, whatever the order of their keys (``where`` may be a nested dict)."""
    return json.dumps(options, sort_keys=True, default=repr)


def run_batch(search: SearchFunction, requests: Sequence[tuple[list[str], dict[str, Any], str]]) -> list[Hits | Exception]:
    """Each request's hits (or its exception), searching requests with equal options together."""
    groups: dict[str, list[int]] = {}
    for index, (_, _, key) in enumerate(requests):
        groups.setdefault(key, []).append(index)
    outcomes: list[Hits | Exception] = [[] for _ in requests]
    for members in groups.values():
        texts = [text for index in members for text in requests[index][0]]
        try:
            hits = search(texts, **requests[members[0]][1])
        except Exception as error:
            if len(members) == 1:
                outcomes[members[0]] = error
                continue
            for index in members:  # find whose request failed; the others get their answers
                outcomes[index] = run_batch(search, [requests[index]])[0]
            continue
        start = 0
        for index in members:
            count = len(requests[index][0])
            outcomes[index] = hits[start : start + count]
            start += count
    return outcomes


class SearchBatcher:
    """Queues searches from the event loop and runs them in batches on ``executor`` (one at a time).

    ``search(queries, **options)`` is called in the executor's thread; ``max_batch`` caps the query
    texts of one batch (a single request larger than that still goes whole); ``max_wait`` is how
    long, in seconds, an idle batcher waits for more requests before sending what it has.
    """

    def __init__(self, search: SearchFunction, executor: Executor, max_batch: int = 64, max_wait: float = 0.0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1; got {max_batch}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0 seconds; got {max_wait}")
        self.search_function = search
        self.executor = executor
        self.max_batch = max_batch
        self.max_wait = max_wait
        self._waiting: deque[_Request] = deque()
        self._waiting_queries = 0
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        self.batches = 0  # batches sent, and the requests in them: for logs and tests
        self.requests = 0

    async def search(self, queries: list[str], **options: Any) -> Hits:
        """The hits of each query, searched together with whatever else is waiting."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(_Request(list(queries), options, options_key(options), future))
        self._waiting_queries += len(queries)
        self._schedule()
        return await future

    def _schedule(self) -> None:
        if self._busy or not self._waiting:
            return
        if self.max_wait == 0 or self._waiting_queries >= self.max_batch:
            self._dispatch()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.max_wait, self._dispatch)

    def _dispatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._busy:
            return
        batch: list[_Request] = []
        size = 0
        while self._waiting and (not batch or size + len(self._waiting[0].queries) <= self.max_batch):
            request = self._waiting.popleft()
            if request.future.cancelled():  # its client went away
                self._waiting_queries -= len(request.queries)
                continue
            batch.append(request)
            size += len(request.queries)
        self._waiting_queries -= size
        if not batch:
            return
        self._busy = True
        self.batches += 1
        self.requests += len(batch)
        work = [(request.queries, request.options, request.key) for request in batch]
        try:
            done = asyncio.get_running_loop().run_in_executor(self.executor, run_batch, self.search_function, work)
        except RuntimeError as error:  # the executor was shut down: these requests fail, later ones too
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(error)
            done = failed
        done.add_done_callback(lambda finished: self._answer(batch, finished))

    def _answer(self, batch: list[_Request], finished: asyncio.Future) -> None:
        self._busy = False
        try:
            outcomes = finished.result()
        except BaseException as error:
            outcomes = [error if isinstance(error, Exception) else RuntimeError(repr(error))] * len(batch)
        for request, outcome in zip(batch, outcomes):
            if request.future.done():
                continue
            if isinstance(outcome, Exception):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)
        if self._waiting:  # what arrived meanwhile has waited a whole batch already: sent at once
            self._dispatch()
