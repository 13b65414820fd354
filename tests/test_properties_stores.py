"""The store contract as a state machine (hypothesis): random sequences of add, upsert, delete, search
(with and without a filter), commit, reopen and close-without-commit on a FAISS and a LanceDB store,
each step checked against the memory store as the model (exact search on both sides)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hypothesis")
pytest.importorskip("faiss")
pytest.importorskip("lancedb")
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conftest import examples
from isotrope.connectors.faiss_store import FaissStore
from isotrope.connectors.lancedb_store import LanceDBStore
from isotrope.stores.memory import MemoryStore
from test_stores import assert_same_hits

#: each machine runs for tens of seconds (make test-quick leaves them out)
pytestmark = pytest.mark.slow
DIM = 6
WORDS = ["cat", "dog", "river", "moon", "red", "fast"]


def rows(seed: int, count: int) -> tuple[np.ndarray, list[str], list[dict]]:
    """Vectors, texts and metadata drawn from ``seed`` (hypothesis shrinks the seed, numpy fills the rows)."""
    rng = np.random.default_rng(seed)
    vectors = (rng.standard_normal((count, DIM)) * rng.uniform(0.5, 2, (count, 1))).astype(np.float32)
    texts = [" ".join(rng.choice(WORDS, size=3)) for _ in range(count)]
    metadata = [{"g": int(rng.integers(4)), "s": str(rng.choice(WORDS))} for _ in range(count)]
    return vectors, texts, metadata


class StoreMachine(RuleBasedStateMachine):
    """One store under test beside a memory store holding what it should hold."""

    kind = "faiss"
    #: FAISS: close without commit drops the writes since; LanceDB: every write is already a committed version
    discards_uncommitted = True

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="isotrope-machine-"))
        self.model = MemoryStore(DIM, "ip")
        self.committed = self.folder / "model"  # the model as of the last commit
        self.model.save(self.committed)
        self.store = self.open(DIM)
        self.next_id = 0

    def open(self, dim: int | None = None):
        if self.kind == "faiss":
            return FaissStore(self.folder / "faiss", dim, factory="Flat", metric="ip")
        return LanceDBStore(self.folder / "lance", dim=dim, metric="ip", index_threshold=None)

    def stored(self) -> list[str]:
        return sorted(self.model.ids())

    @initialize(seed=st.integers(0, 2**16), count=st.integers(1, 8))
    def first_rows(self, seed, count):
        self.add_new(seed, count)

    @rule(seed=st.integers(0, 2**16), count=st.integers(1, 8))
    def add_new(self, seed, count):
        ids = [f"id{self.next_id + i}" for i in range(count)]
        self.next_id += count
        self.write(ids, seed)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), seed=st.integers(0, 2**16))
    def upsert(self, data, seed):
        ids = data.draw(st.lists(st.sampled_from(self.stored()), min_size=1, max_size=4, unique=True))
        fresh = data.draw(st.booleans())  # some new ids in the same batch
        if fresh:
            ids.append(f"id{self.next_id}")
            self.next_id += 1
        self.write(ids, seed)

    def write(self, ids, seed):
        vectors, texts, metadata = rows(seed, len(ids))
        self.store.add(ids, vectors, texts, metadata)
        self.model.add(ids, vectors, texts, metadata)

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data())
    def delete(self, data):
        ids = data.draw(st.lists(st.sampled_from(self.stored()), max_size=4, unique=True))
        ids.append("never-stored")
        self.store.delete(ids)
        self.model.delete(ids)

    @rule(seed=st.integers(0, 2**16), k=st.integers(1, 12), group=st.none() | st.integers(0, 3))
    def search(self, seed, k, group):
        queries = np.random.default_rng(seed).standard_normal((2, DIM)).astype(np.float32)
        where = None if group is None else {"g": {"$gte": group}}
        got = self.store.search(queries, k, where=where)
        expected = self.model.search(queries, k, where=where)
        assert_same_hits(expected, got)  # ids in rank order but for ties (rows written from one seed tie exactly)
        for hits in got:
            model_rows = self.model.get([h.id for h in hits])
            assert [(h.text, h.metadata) for h in hits] == [(m.text, m.metadata) for m in model_rows]

    @rule()
    def commit(self):
        self.store.commit()
        shutil.rmtree(self.committed)
        self.model.save(self.committed)

    @rule()
    def reopen(self):
        self.commit()
        self.store.close()
        self.store = self.open()

    @rule()
    def close_without_commit(self):
        """Uncommitted writes are discarded (FAISS) or were never uncommitted (LanceDB)."""
        self.store.close()
        self.store = self.open()
        if self.discards_uncommitted:
            self.model = MemoryStore.load(self.committed)
        else:
            shutil.rmtree(self.committed)
            self.model.save(self.committed)

    @invariant()
    def same_rows(self):
        assert len(self.store) == len(self.model)
        assert sorted(self.store.ids()) == self.stored()
        some = [*self.stored()[:5], "never-stored"]
        assert [(h.text, h.metadata) if h else None for h in self.store.get(some)] == [
            (h.text, h.metadata) if h else None for h in self.model.get(some)
        ]
        if some[:-1]:
            np.testing.assert_array_equal(self.store.vectors(some[:-1]), self.model.vectors(some[:-1]))

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class LanceMachine(StoreMachine):
    kind = "lancedb"
    discards_uncommitted = False


MACHINE_SETTINGS = settings(max_examples=examples(40), stateful_step_count=25, deadline=None)
TestFaissContract = StoreMachine.TestCase
TestFaissContract.settings = MACHINE_SETTINGS
TestLanceDBContract = LanceMachine.TestCase
TestLanceDBContract.settings = MACHINE_SETTINGS
