"""Indexing on a local Ray runtime against the single-process pipeline.

The reference is :func:`isotrope.ingest.pipeline.index_documents` on the same corpus and
options: the same fit sample, token counts equal to the single-process counts, moments
equal to float64 moments of the concatenated vectors, fitted transforms, stored vectors
and search results equal to the single-process store's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("lancedb")
pytest.importorskip("faiss")

pytestmark = pytest.mark.slow  # the module starts a local Ray cluster: over a minute on two busy cores

from conftest import make_sentences  # noqa: E402
from isotrope.config import EncoderConfig  # noqa: E402
from isotrope.connectors.ray import index_with_ray  # noqa: E402
from isotrope.encoder import ShapedEncoder  # noqa: E402
from isotrope.ingest.chunking import TokenChunker  # noqa: E402
from isotrope.ingest.loaders import iter_documents  # noqa: E402
from isotrope.ingest.pipeline import index_documents  # noqa: E402
from isotrope.sampling import fair_sample  # noqa: E402
from isotrope.search import Collection  # noqa: E402

#: idf needs token counts; center and abtt are fitted from (diagonal, full) moments, the
#: quantile map from the merged bounded sample; every step sees the previous one's output
SHAPE = "center,abtt(2),quantile(n_quantiles=50),l2"
CHUNKING = {"chunk_tokens": 24, "overlap_tokens": 4}
FIT_SAMPLES = 1500  # fewer than the chunks: sampled chunks reuse their raw vectors, the others are embedded
QUERIES = make_sentences(6, seed=99)


@pytest.fixture(scope="module")
def ray_runtime():
    """A local two-CPU Ray runtime for the module.

    A higher worker soft limit keeps idle task workers alive while the embedding actors run,
    so later passes do not re-import torch in fresh processes (slow on a busy two-core box).
    """
    if ray.is_initialized():
        ray.shutdown()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_num_workers_soft_limit", "8")
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """8 JSON lines files of 50 documents each: about 2,600 chunks of at most 24 tokens."""
    root = tmp_path_factory.mktemp("ray-corpus")
    sentences = make_sentences(6000, seed=1)
    for part in range(8):
        lines = []
        for row in range(50):
            start = (part * 50 + row) * 15
            lines.append(json.dumps({"text": " ".join(sentences[start : start + 15]), "row": row}))
        (root / f"part{part}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def options(tiny_bert_path):
    """BERT+Avg: the context-averaged table is fitted on the driver, everything else on Ray."""
    return EncoderConfig(model=f"{tiny_bert_path}+context:{tiny_bert_path}", shape=SHAPE, weights="idf")


@pytest.fixture(scope="module")
def chunks(corpus, tiny_bert_path):
    """The single-process chunk stream, built independently of both pipelines."""
    from transformers import AutoTokenizer

    chunker = TokenChunker(AutoTokenizer.from_pretrained(tiny_bert_path), **CHUNKING)
    return [chunk for document in iter_documents(corpus) for chunk in chunker.chunk(document)]


def single_process_sample(chunks: list) -> list:
    """The fit sample of the single-process path: fair per file."""
    return fair_sample(((chunk.metadata["source"], chunk) for chunk in chunks), FIT_SAMPLES)


@pytest.fixture(scope="module")
def indexed(ray_runtime, corpus, options, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray-stores")
    common = {"config": options, "fit_samples": FIT_SAMPLES, "show_progress": False, **CHUNKING}
    single = index_documents(corpus, f"lancedb:{folder / 'single'}", **common)
    distributed = index_with_ray(corpus, f"lancedb:{folder / 'ray'}", num_actors=2, **common)
    with Collection.open(f"lancedb:{folder / 'single'}") as reference, Collection.open(f"lancedb:{folder / 'ray'}") as store:
        yield single, distributed, reference, store


def test_corpus_has_enough_unique_chunks(chunks):
    assert len(chunks) >= 2000
    assert len({chunk.text for chunk in chunks}) == len(chunks)  # no exact ties in the search comparison


def test_reports_agree(indexed, chunks):
    single, distributed, _reference, store = indexed
    assert distributed.documents == single.documents == 400
    assert distributed.chunks == single.chunks == len(chunks)
    assert distributed.added == single.added == len(chunks) == len(store.store)
    assert distributed.skipped == single.skipped == []


def test_fit_sample_is_the_single_process_sample(indexed, chunks):
    statistics = indexed[1].statistics
    assert statistics.sample_ids == [chunk.id for chunk in single_process_sample(chunks)]


def test_token_counts_equal_single_process_counts(indexed, chunks):
    _, distributed, reference, store = indexed
    sample = single_process_sample(chunks)
    expected = reference.encoder.count_tokens([chunk.text for chunk in sample])
    counts = distributed.statistics.token_counts
    assert counts.n_texts == expected.n_texts == FIT_SAMPLES
    np.testing.assert_array_equal(counts.counts, expected.counts)
    np.testing.assert_array_equal(counts.doc_freq, expected.doc_freq)
    np.testing.assert_array_equal(store.encoder.weighting.weights_, reference.encoder.weighting.weights_)


def _float64_moments(vectors, full):
    """Independent float64 reference: mean and centred scatter with NumPy."""
    x = np.asarray(vectors, dtype=np.float64)
    mean = x.mean(axis=0)
    centred = x - mean
    return mean, (centred.T @ centred if full else (centred**2).sum(axis=0))


def test_reduced_moments_equal_moments_of_the_concatenated_vectors(indexed, chunks):
    _, distributed, reference, store = indexed
    sample_ids = distributed.statistics.sample_ids
    moments = distributed.statistics.moments
    assert sorted(moments) == [0, 1]  # center (per dimension) and abtt (full)
    # the per-block moments reduce to those of the concatenated raw vectors the actors computed
    ray_raw = store.store._column_vectors(sample_ids, "raw_vector", store.encoder.backbone.dim)
    inputs = [ray_raw, store.encoder.transforms[0].transform(ray_raw)]
    for index, full in ((0, False), (1, True)):
        mean, scatter = _float64_moments(inputs[index], full)
        assert moments[index].count == len(sample_ids)
        assert np.abs(moments[index].mean - mean).max() < 1e-6
        assert np.abs(moments[index].scatter - scatter).max() < 1e-6
    # and agree with the single-process raw vectors of the same sample (covariance: scatter / count)
    single_raw = reference.encoder.embed_raw([chunk.text for chunk in single_process_sample(chunks)])
    inputs = [single_raw, reference.encoder.transforms[0].transform(single_raw)]
    for index, full in ((0, False), (1, True)):
        mean, scatter = _float64_moments(inputs[index], full)
        assert np.abs(moments[index].mean - mean).max() < 1e-6
        assert np.abs(moments[index].scatter / len(sample_ids) - scatter / len(sample_ids)).max() < 1e-6


def test_fitted_state_equals_single_process_state(indexed):
    _, distributed, reference, store = indexed
    assert distributed.statistics.reservoir_rows == {2: FIT_SAMPLES}  # the quantile step saw the whole sample
    assert store.encoder.spec == reference.encoder.spec
    mine, theirs = store.encoder.get_state(), reference.encoder.get_state()
    assert sorted(mine) == sorted(theirs)
    assert "backbone.context_table_" in theirs
    for name, array in theirs.items():
        assert np.abs(mine[name] - array).max() < 1e-6, name


def test_store_records_its_encoder_like_the_single_process_store(indexed):
    _, _, reference, store = indexed
    assert store.store.properties["fingerprint"] == store.encoder.fingerprint
    assert {k: v for k, v in store.store.properties.items() if k != "fingerprint"} == {
        k: v for k, v in reference.store.properties.items() if k != "fingerprint"
    }
    assert store.encoder.metadata["fit"] == reference.encoder.metadata["fit"]


def test_stored_vectors_match_by_id_in_corpus_order(indexed):
    _, _, reference, store = indexed
    ids = reference.store.ids()
    assert store.store.ids() == ids  # written in corpus order
    assert np.abs(store.store.vectors(ids) - reference.store.vectors(ids)).max() < 1e-5
    dim = store.encoder.backbone.dim
    raw = store.store._column_vectors(ids, "raw_vector", dim)
    assert np.abs(raw - reference.store._column_vectors(ids, "raw_vector", dim)).max() < 1e-5
    np.testing.assert_allclose(store.store.vectors(ids), store.encoder.apply_transforms(raw), atol=1e-6)


def test_search_results_are_identical(indexed):
    _, _, reference, store = indexed
    for mine, theirs in zip(store.search(QUERIES, k=10), reference.search(QUERIES, k=10)):
        assert [hit.id for hit in mine] == [hit.id for hit in theirs]
        np.testing.assert_allclose([hit.score for hit in mine], [hit.score for hit in theirs], atol=1e-5)
        assert [hit.metadata for hit in mine] == [hit.metadata for hit in theirs]


def test_updating_a_faiss_store_embeds_new_chunks_and_syncs(ray_runtime, indexed, corpus, tmp_path):
    """An existing store keeps its encoder: stored chunks are skipped, new ones embedded by the actors, and
    with sync the chunks of a file no longer in the source are deleted."""
    _, _, reference, _ = indexed
    older = tmp_path / "older"
    shutil.copytree(corpus, older)
    os.remove(older / "part3.jsonl")
    (older / "gone.jsonl").write_text(json.dumps({"text": " ".join(make_sentences(30, seed=7))}) + "\n", encoding="utf-8")
    uri = f"faiss:{tmp_path / 'faiss'}"
    first = index_documents(older, uri, encoder=reference.encoder, show_progress=False, **CHUNKING)
    report = index_with_ray(corpus, uri, sync=True, num_actors=1, show_progress=False, **CHUNKING)
    ids = reference.store.ids()
    added = [hit.id for hit in reference.store.get(ids) if hit.metadata["source"] == "part3.jsonl"]
    assert report.statistics is None
    assert report.added == len(added) > 0
    assert report.unchanged == len(ids) - len(added)
    assert report.deleted == first.added - report.unchanged > 0
    with Collection.open(uri) as store:
        assert store.encoder.fingerprint == reference.encoder.fingerprint
        assert sorted(store.store.ids()) == sorted(ids)
        assert np.abs(store.store.vectors(ids) - reference.store.vectors(ids)).max() < 1e-5
        # dense: the stores' defaults were chosen on different corpora (an append never recalibrates)
        for mine, theirs in zip(store.search(QUERIES, k=10, mode="dense"), reference.search(QUERIES, k=10, mode="dense")):
            assert [hit.id for hit in mine] == [hit.id for hit in theirs]
            assert [hit.metadata for hit in mine] == [hit.metadata for hit in theirs]


def _documents():
    """Documents given as a function (a fresh pass each call), with an empty one and a repeated one."""
    from isotrope.ingest.loaders import Document

    sentences = make_sentences(400, seed=5)
    documents = [Document(f"doc{i}.txt", " ".join(sentences[i * 10 : i * 10 + 10]), {"part": i % 3}) for i in range(40)]
    return [*documents, Document("blank.txt", "  \n "), Document("doc0.txt", documents[0].text, {"part": 0})]


def _store_rows(uri: str) -> tuple[list[str], list, np.ndarray, ShapedEncoder]:
    with Collection.open(uri) as collection:
        ids = collection.store.ids()
        hits = collection.store.get(ids)
        return ids, [(hit.text, hit.metadata) for hit in hits], collection.store.vectors(ids), collection.encoder


@pytest.mark.parametrize(
    ("kind", "model", "shape"), [("faiss", "{}", "center,l2"), ("lancedb", "{}", "center,l2"), ("faiss", "fast:{}", None)]
)
def test_one_plan_gives_the_same_store_on_both_engines(ray_runtime, tiny_bert_path, tmp_path, kind, model, shape):
    """One IngestPlan executed by the local engine and by Ray: same ids in the same order, same texts and
    metadata, vectors within 1e-6, same report; executing it again adds nothing on either engine.
    ``fast``: the table is distilled on the driver and folded with its chain, as the local engine folds it."""
    from isotrope.connectors.ray import RayOptions, run_on_ray
    from isotrope.ingest.pipeline import run_local
    from isotrope.ingest.plan import IngestPlan

    config = EncoderConfig(model=model.format(tiny_bert_path), shape=shape, distill_samples=None if shape else 40)
    plan = IngestPlan(
        _documents,
        f"{kind}:{tmp_path / 'local'}",
        config=config,
        chunk_tokens=20,
        overlap_tokens=4,
        fit_samples=60,
        batch_size=16,
        commit_every=32,
        show_progress=False,
    )
    on_ray = dataclasses.replace(plan, store=f"{kind}:{tmp_path / 'ray'}")
    local_report = run_local(plan)
    ray_report = run_on_ray(on_ray, RayOptions(num_actors=1))
    for field in ("documents", "chunks", "added", "unchanged", "deleted", "empty"):
        assert getattr(ray_report, field) == getattr(local_report, field), field
    assert local_report.empty == 1 and local_report.documents == 41 and local_report.added > 60
    local_ids, local_rows, local_vectors, local_encoder = _store_rows(plan.store)
    ray_ids, ray_rows, ray_vectors, ray_encoder = _store_rows(on_ray.store)
    assert ray_ids == local_ids and len(local_ids) == local_report.added
    assert ray_rows == local_rows
    assert np.abs(ray_vectors - local_vectors).max() < 1e-6
    assert ray_encoder.spec == local_encoder.spec
    assert ray_encoder.metadata["fit"] == local_encoder.metadata["fit"]
    assert ("distill" in local_encoder.metadata) == (shape is None) == ("distill" in ray_encoder.metadata)
    assert (ray_encoder.spec["backbone"]["type"] == "folded") == (shape is None)  # fast: folded on both engines
    # the vectors are the stored encoder's own, computed independently of both engines
    texts = [text for text, _ in local_rows]
    assert np.abs(local_vectors - local_encoder.encode(texts)).max() < 1e-5
    # resume: the plan executed again skips every stored chunk
    assert run_local(plan).added == run_on_ray(on_ray, RayOptions(num_actors=1)).added == 0
