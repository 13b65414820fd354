"""The default search chosen from a store's own chunks: ranks against the shipped fusion, the rule, the
store property, and every entry point (Collection, CLI, ingestion, LlamaIndex) searching with it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import GLOVE_WORDS
from isotrope.autofusion import (
    ALPHAS,
    MIN_DECIDING,
    PROPERTY,
    QUERIES,
    choose,
    fit_default_search,
    ndcg_gain,
    pseudo_query_ranks,
    query_budget,
    stored_default,
    unlearned_chunks,
)
from isotrope.distill import text_key
from isotrope.encoder import ShapedEncoder
from isotrope.fusion import convex_fusion
from isotrope.lexical import K1, B, analyze, bm25_matrix, bm25_scores
from isotrope.pseudo_queries import build_pseudo_queries
from isotrope.search import Collection
from isotrope.stores.base import Hit
from test_cli import run_cli

pytest.importorskip("faiss")


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [w.lower() for w in GLOVE_WORDS if w.isalpha()]
    return [
        " ".join(" ".join(rng.choice(words, size=7)).capitalize() + "." for _ in range(int(rng.integers(3, 6)))) for _ in range(n)
    ]


@pytest.fixture(scope="module")
def encoder(tiny_glove_path) -> ShapedEncoder:
    return ShapedEncoder.create(tiny_glove_path, shape="center").fit(_texts(100, seed=9))


def test_bm25_matrix_matches_the_reference_per_query() -> None:
    documents = [analyze(t) for t in _texts(40)] + [[]]
    queries = [analyze(t) for t in _texts(6, seed=1)] + [["zzz"]]
    expected = np.stack([bm25_scores(documents, q) for q in queries])
    np.testing.assert_allclose(bm25_matrix(documents, queries), expected, rtol=1e-12, atol=1e-12)
    # other documents scored with the statistics of ``documents``: BM25 written out term by term
    scored = [analyze(t) for t in _texts(3, seed=2)]
    n = sum(1 for d in documents if d)
    average = sum(map(len, documents)) / n
    for i, query in enumerate(queries):
        for j, document in enumerate(scored):
            value = 0.0
            for term in set(query):
                df = sum(term in d for d in documents)
                tf = document.count(term)
                if df and tf:
                    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
                    value += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(document) / average))
            assert bm25_matrix(documents, queries, scored)[i, j] == pytest.approx(value, rel=1e-12)


def _reference_rank(dense: np.ndarray, lexical: np.ndarray, target: int, alpha: float, candidates: int, keywords: int) -> float:
    """The target's rank in :func:`isotrope.fusion.convex_fusion` of the two full sorted lists' tops (tied
    with others, the best of their ranks)."""
    dense_top = np.argsort(-dense, kind="stable")[:candidates]
    lexical_top = [i for i in np.argsort(-lexical, kind="stable")[:keywords] if lexical[i] > 0]
    union = list(dict.fromkeys([*dense_top.tolist(), *lexical_top]))
    hits = convex_fusion([Hit(str(i), 0.0, None) for i in union], dense[union], lexical[union], len(union), alpha)
    scores = {hit.id: hit.score for hit in hits}
    if str(target) not in scores:
        return np.inf
    return float(1 + sum(score > scores[str(target)] for score in scores.values()))


def test_pseudo_query_ranks_match_the_shipped_fusion_and_each_side() -> None:
    rng = np.random.default_rng(0)
    dense = rng.standard_normal((12, 80))
    lexical = np.where(rng.random((12, 80)) < 0.4, rng.exponential(2.0, (12, 80)), 0.0)
    targets = rng.integers(0, 80, 12).tolist()
    ranks = pseudo_query_ranks(dense, lexical, targets, candidates=30)  # the keyword side's top 15 (half)
    for row, target in enumerate(targets):
        assert ranks[row, 0] == 1 + np.sum(dense[row] > dense[row, target])
        expected_lexical = 1 + np.sum(lexical[row] > lexical[row, target]) if lexical[row, target] > 0 else np.inf
        assert ranks[row, 1] == expected_lexical
        for column, alpha in enumerate(ALPHAS, start=2):
            assert ranks[row, column] == _reference_rank(dense[row], lexical[row], target, alpha, 30, 15)
    assert np.isinf(ranks).any() and (ranks == 1).any()  # both cases were exercised


def test_ndcg_gain_of_one_relevant_document() -> None:
    np.testing.assert_allclose(ndcg_gain(np.array([1, 2, 10, 11, np.inf])), [1, 1 / np.log2(3), 1 / np.log2(11), 0, 0])


def _gains(dense: np.ndarray, lexical: np.ndarray, hybrid_shift: float, rng: np.random.Generator) -> np.ndarray:
    middle = np.array([a * (1 - a) * 4 for a in ALPHAS])  # 0 at the ends, 1 at alpha 0.5
    hybrid = np.array([a * dense + (1 - a) * lexical for a in ALPHAS]).T + hybrid_shift * middle
    return np.column_stack([dense, lexical, hybrid + 0.5 * rng.standard_normal(hybrid.shape) * middle])


def test_the_rule_takes_hybrid_only_when_it_clears_the_better_side() -> None:
    rng = np.random.default_rng(1)
    dense, lexical = 60 + 20 * rng.standard_normal(400), 50 + 20 * rng.standard_normal(400)
    clear = choose(_gains(dense, lexical, 8.0, rng), "passage")
    assert clear["mode"] == "hybrid" and 0 < clear["alpha"] < 1
    assert clear["hybrid_vs_dense"]["interval"][0] > 0
    none = choose(_gains(dense, lexical, 0.0, rng), "passage")  # hybrid only interpolates: never above dense
    assert (none["mode"], none["alpha"]) == ("dense", None)
    lexical_wins = choose(_gains(lexical - 30, dense, 0.0, rng), "passage")
    assert lexical_wins["mode"] == "lexical" and "hybrid_vs_lexical" in lexical_wins


def test_the_masked_proxy_keeps_dense_whatever_it_rates() -> None:
    rng = np.random.default_rng(2)
    dense = 60 + 20 * rng.standard_normal(400)
    gains = _gains(dense - 10, dense, 8.0, rng)  # lexical and hybrid far ahead on masked pseudo-queries
    assert choose(gains, "passage")["mode"] == "hybrid"
    masked = choose(gains, "masked")
    assert (masked["mode"], masked["alpha"]) == ("dense", None) and "flatters BM25" in masked["rule"]
    assert masked["ndcg@10"]["lexical"] > masked["ndcg@10"]["dense"]  # the evidence is kept beside it


def test_fit_default_search_is_deterministic_and_reports_its_evidence(encoder) -> None:
    texts = _texts(400)
    vectors = encoder.encode(texts)
    first = fit_default_search(texts, vectors, encoder, "cosine", store_size=4000)
    again = fit_default_search(texts, vectors, encoder, "cosine", store_size=4000)
    assert {**again, "seconds": 0, "cpu_seconds": 0} == {**first, "seconds": 0, "cpu_seconds": 0}
    assert first["proxy"] == "passage" and first["pseudo_queries"] >= 30
    assert first["candidates"] == 20  # the fraction of the store the fusion's 200 candidates are
    scores = first["ndcg@10"]
    best_side = max(("dense", "lexical"), key=scores.get)
    assert first["mode"] in ("hybrid", best_side)
    assert (first["alpha"] is None) == (first["mode"] != "hybrid")


def test_pseudo_queries_come_from_the_chunks_a_fast_fit_held_aside(encoder, monkeypatch) -> None:
    texts = _texts(400)
    vectors = encoder.encode(texts)
    held = set(range(0, 400, 4))
    monkeypatch.setitem(
        encoder.metadata, "distill", {"held_aside_chunks": [text_key(texts[i]) for i in sorted(held)] + ["0" * 12]}
    )
    assert unlearned_chunks(texts, encoder) == sorted(held)
    choice = fit_default_search(texts, vectors, encoder, "cosine")
    assert choice["query_chunks"] == "100 held aside from the fast fit" and choice["proxy"] == "passage"
    made = build_pseudo_queries(texts, 600, "passage", sources=sorted(held))
    assert len(made) == choice["pseudo_queries"] and {q.target for q in made} <= held
    monkeypatch.setitem(encoder.metadata, "distill", {"held_aside_chunks": [text_key(texts[i]) for i in range(40)]})
    assert unlearned_chunks(texts, encoder) is None  # too few to cut pseudo-queries from: every chunk
    assert fit_default_search(texts, vectors, encoder, "cosine")["query_chunks"] == "every sampled chunk"


def test_too_little_text_keeps_dense_and_says_why(encoder) -> None:
    texts = ["a cat", "a dog"]
    choice = fit_default_search(texts, encoder.encode(texts), encoder, "cosine")
    assert choice["mode"] == "dense" and "pseudo-queries" in choice["rule"]


def test_collection_searches_its_calibrated_default(tmp_path, encoder, caplog) -> None:
    texts = _texts(300, seed=4)
    ids = [f"t{i}" for i in range(len(texts))]
    with Collection.create(f"faiss:{tmp_path / 's'}", encoder, metric="cosine") as collection:
        collection.add(ids, texts)
        with caplog.at_level("WARNING", logger="isotrope.search"):
            assert collection.default_search() == ("dense", None, None)  # never calibrated
        assert "no calibrated default search" in caplog.text
        assert collection.info()[PROPERTY]["calibrated"] is False
        queries = ["cat river city", texts[5][:40]]
        assert collection.search(queries, k=5) == collection.search(queries, k=5, mode="dense")
        choice = collection.fit_default_search()
        assert collection.info()[PROPERTY] == {k: v for k, v in choice.items() if k not in ("seconds", "cpu_seconds")}
        # a hybrid choice: the default is hybrid at its weight; a weight alone means hybrid
        collection.store.set_properties(**{PROPERTY: json.dumps({**choice, "mode": "hybrid", "alpha": 0.3})})
        assert stored_default(collection.store.properties)[:2] == ("hybrid", 0.3)
        expected = collection.search(queries, k=5, mode="hybrid", alpha=0.3)
        assert collection.search(queries, k=5) == expected
        assert collection.search(queries, k=5, alpha=0.3) == expected
        assert collection.search(queries, k=5, mode="hybrid") == expected  # its calibrated weight
        assert collection.search(queries, k=5, mode="lexical") != expected


def test_index_calibrates_a_new_store_and_calibrate_refits_it(monkeypatch, capsys, tmp_path, tiny_glove_path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(_texts(300, seed=5)):
        (folder / f"{i}.txt").write_text(text)
    uri = f"faiss:{tmp_path / 'store'}"
    code, out, err = run_cli(
        monkeypatch, capsys, "index", folder, "--store", uri, "--model", tiny_glove_path, "--shape", "center"
    )
    assert code == 0, err
    assert "default_search" in out  # its share of the ingestion time
    code, out, err = run_cli(monkeypatch, capsys, "info", uri)
    info = json.loads(out)[PROPERTY]
    assert info["proxy"] == "passage" and info["store_chunks"] == 300 and info["mode"] in ("dense", "lexical", "hybrid")
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", uri, "--default-search")
    assert code == 0, err
    assert json.loads(out)[PROPERTY]["ndcg@10"] == info["ndcg@10"]  # same chunks, same seed
    code, out, err = run_cli(monkeypatch, capsys, "calibrate", uri)
    assert code != 0 and "--default-search" in err


def test_index_chooses_the_default_search_of_a_store_without_one_and_keeps_a_chosen_one(tmp_path, encoder) -> None:
    from isotrope.ingest.loaders import Document
    from isotrope.ingest.pipeline import index_documents

    documents = [Document(source=f"d{i}.txt", text=text) for i, text in enumerate(_texts(300, seed=5))]
    uri = f"faiss:{tmp_path / 'store'}"
    # a store whose first run stopped before the choice: the run that completes it makes the choice
    index_documents(documents[:200], uri, encoder=encoder, default_search=False, show_progress=False)
    with Collection.open(uri) as collection:
        assert stored_default(collection.store.properties)[2] is None
    report = index_documents(documents[:200], uri, encoder=encoder, show_progress=False)
    assert report.added == 0 and "default_search" in report.seconds
    with Collection.open(uri) as collection:
        chosen = collection.store.properties[PROPERTY]
        assert json.loads(chosen)["store_chunks"] == 200
    # a later run adding documents keeps the store's choice (`isotrope calibrate --default-search` refits it)
    report = index_documents(documents, uri, encoder=encoder, show_progress=False)
    assert report.added > 0 and "default_search" not in report.seconds
    with Collection.open(uri) as collection:
        assert collection.store.properties[PROPERTY] == chosen


def test_a_transformer_makes_pseudo_queries_in_proportion_to_the_store(tiny_bert_path, encoder, monkeypatch) -> None:
    bert = ShapedEncoder.create(tiny_bert_path, shape="none")
    # a static table costs nothing: the full count, whatever the store
    assert query_budget(encoder, 1000) == query_budget(encoder, 10**6) == QUERIES
    # a transformer: a tenth of the store's chunks, never below what the passage proxy needs, never above the cap
    assert [query_budget(bert, n) for n in (100, 600, 1526, 5183, 10**6)] == [MIN_DECIDING, MIN_DECIDING, 153, 519, QUERIES]
    texts = _texts(400)
    encoded: list[int] = []
    original = bert.encode

    def counting(batch, *args, **kwargs):
        encoded.append(len(batch))
        return original(batch, *args, **kwargs)

    monkeypatch.setattr(bert, "encode", counting)
    choice = fit_default_search(texts, original(texts), bert, "cosine", store_size=1000)
    assert choice["proxy"] == "passage" and choice["query_budget"] == 100
    assert choice["pseudo_queries"] == len(build_pseudo_queries(texts, 100, "passage")) <= 100
    assert sum(encoded) == 2 * choice["pseudo_queries"]  # each query's sentence and its chunk's rest, nothing else
