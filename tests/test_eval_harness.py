"""The evaluation harness: the token-state cache, fitting rules, ``evaluate`` and ``run_sweep``.

References are computed independently: GloVe averages from the fixture file with NumPy,
Spearman with SciPy, and uncached encoders for the cache.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from conftest import make_sentences, read_glove
from isotrope.backbones import make_backbone
from isotrope.backbones.hf import HFBackbone
from isotrope.config import EncoderConfig
from isotrope.encoder import ShapedEncoder
from isotrope.evaluate.cache import CachedBackbone
from isotrope.evaluate.commands import evaluate
from isotrope.evaluate.harness import Evaluator
from isotrope.evaluate.sweep import run_sweep

#: sentences made only of words in the GloVe fixture (so the reference average is exact)
PAIRS = [
    ("the cat sat on the mat .", "the cat sat on a mat", 4.8),
    ("the dog runs fast", "a dog runs", 3.9),
    ("the house on the river", "the river house", 3.1),
    ("the cat runs", "the dog sat", 1.2),
    ("mat , house , river", "the fast dog", 0.4),
    ("the dog sat on the mat", "the cat sat on the mat", 2.7),
]
FIT_TEXTS = [
    "the cat sat",
    "the dog runs fast .",
    "a house on the river",
    "mat , cat , dog",
    "the river runs",
    "the house , the mat",
    "on the mat sat the cat",
    "fast , fast , fast",
]


def _write_pairs(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{a}\t{b}\t{score}\n" for a, b, score in PAIRS), encoding="utf-8")
    return path


def _glove_average(table: dict[str, np.ndarray], text: str) -> np.ndarray:
    """Mean of the fixture vectors of the known (lower-cased) words, in float64."""
    lowered = {word.lower(): vector for word, vector in table.items()}
    words = [word for word in text.lower().replace(",", " , ").replace(".", " . ").split() if word in lowered]
    return np.mean([lowered[word].astype(np.float64) for word in words], axis=0)


def _reference_spearman(glove_path: str, shift: np.ndarray | None = None) -> float:
    table = read_glove(glove_path)
    first = np.array([_glove_average(table, a) for a, _, _ in PAIRS])
    second = np.array([_glove_average(table, b) for _, b, _ in PAIRS])
    if shift is not None:
        first, second = first - shift, second - shift
    cosine = (first * second).sum(1) / np.linalg.norm(first, axis=1) / np.linalg.norm(second, axis=1)
    return 100.0 * stats.spearmanr(cosine, [score for _, _, score in PAIRS]).statistic


def _counting_forward(backbone) -> list[int]:
    """Count the texts the backbone's forward pass really sees."""
    seen = [0]
    forward = backbone.forward

    def counted(input_ids, attention_mask, special_mask):
        seen[0] += input_ids.shape[0]
        return forward(input_ids, attention_mask, special_mask)

    backbone.forward = counted
    return seen


# -- the token-state cache ---------------------------------------------------------
def test_second_encode_never_calls_the_backbone(tiny_bert_path, tmp_path):
    texts = make_sentences(24, seed=3)
    texts.append(texts[0])  # a duplicate is run once
    inner = make_backbone({"type": "hf", "model": tiny_bert_path})
    forwarded = _counting_forward(inner)
    cached = CachedBackbone(inner, tmp_path / "cache")
    encoder = ShapedEncoder.create(tiny_bert_path, backbone=cached)
    plain = ShapedEncoder.create(tiny_bert_path)

    first = encoder.encode(texts)
    assert cached.backbone_texts == forwarded[0] == len(set(texts))
    np.testing.assert_allclose(first, plain.encode(texts), atol=1e-5)

    second = encoder.encode(texts, batch_size=5)
    assert cached.backbone_texts == forwarded[0] == len(set(texts))
    np.testing.assert_allclose(second, first, atol=1e-6)

    # a new run (new wrapper, new backbone) over the same folder reads everything from disk
    again = make_backbone({"type": "hf", "model": tiny_bert_path})
    forwarded_again = _counting_forward(again)
    rerun = CachedBackbone(again, tmp_path / "cache")
    vectors = ShapedEncoder.create(tiny_bert_path, backbone=rerun).encode(texts[::-1])
    assert rerun.backbone_texts == forwarded_again[0] == 0
    np.testing.assert_allclose(vectors, first[::-1], atol=1e-6)


def test_cached_token_states_equal_the_backbones(tiny_bert_path, tmp_path):
    texts = make_sentences(9, seed=4)
    inner = make_backbone({"type": "hf", "model": tiny_bert_path, "prompt": 'This sentence : "{text}" means [MASK] .'})
    cached = CachedBackbone(inner, tmp_path / "cache")
    for _ in range(2):  # filled, then served from disk
        batch, reference = cached.embed(texts), inner.embed(texts)
        np.testing.assert_array_equal(batch.input_ids, reference.input_ids)
        np.testing.assert_array_equal(batch.attention_mask, reference.attention_mask)
        np.testing.assert_array_equal(batch.special_mask[batch.attention_mask], reference.special_mask[reference.attention_mask])
        np.testing.assert_array_equal(batch.target_index, reference.target_index)
        mask = reference.attention_mask
        np.testing.assert_allclose(batch.states[mask], reference.states[mask], atol=1e-5)
    assert cached.backbone_texts == len(texts)


def test_kinds_do_not_collide(tiny_bert_path, tmp_path):
    texts = make_sentences(10, seed=5)
    config = {"type": "hf", "model": tiny_bert_path, "query_prefix": "what is "}
    cached = CachedBackbone(make_backbone(config), tmp_path / "cache")
    encoder = ShapedEncoder.create(tiny_bert_path, backbone=cached)
    plain = ShapedEncoder.create(tiny_bert_path, backbone=make_backbone(config))
    documents = encoder.encode(texts, kind="document")
    queries = encoder.encode(texts, kind="query")
    assert cached.backbone_texts == 2 * len(texts)
    np.testing.assert_allclose(queries, plain.encode(texts, kind="query"), atol=1e-5)
    np.testing.assert_allclose(documents, plain.encode(texts, kind="document"), atol=1e-5)
    assert np.abs(queries - documents).max() > 1e-3


def test_configs_do_not_collide(tiny_bert_path, tmp_path):
    texts = make_sentences(10, seed=6)
    vectors, runs = {}, {}
    for layers in ("last", "first_last", "last"):
        cached = CachedBackbone(make_backbone({"type": "hf", "model": tiny_bert_path, "layers": layers}), tmp_path / "c")
        encoder = ShapedEncoder.create(tiny_bert_path, backbone=cached)
        result = encoder.encode(texts)
        plain = ShapedEncoder.create(tiny_bert_path, layers=layers).encode(texts)
        np.testing.assert_allclose(result, plain, atol=1e-5)
        vectors[layers], runs[layers] = result, runs.get(layers, 0) + cached.backbone_texts
    assert runs == {"last": len(texts), "first_last": len(texts)}  # the second "last" ran nothing
    assert np.abs(vectors["last"] - vectors["first_last"]).max() > 1e-3


def test_fitted_backbone_state_is_part_of_the_key(tiny_bert_path, tmp_path):
    """BERT+Avg states depend on the context table: another fit corpus must not reuse them."""
    model = f"{tiny_bert_path}+context:{tiny_bert_path}"
    texts = make_sentences(8, seed=7)
    results = []
    for corpus_seed in (1, 2):
        corpus = make_sentences(30, seed=corpus_seed)
        inner = make_backbone({"type": "hf", "model": tiny_bert_path, "context": True})
        cached = CachedBackbone(inner, tmp_path / "cache")
        encoder = ShapedEncoder.create(model, backbone=cached).fit(corpus)
        plain = ShapedEncoder.create(model).fit(corpus)
        result = encoder.encode(texts)
        np.testing.assert_allclose(result, plain.encode(texts), atol=1e-5)
        assert cached.backbone_texts == len(texts)
        results.append(result)
    assert np.abs(results[0] - results[1]).max() > 1e-4


# -- Evaluator.fit -----------------------------------------------------------------
def test_fit_needs_a_corpus_unless_transductive(tiny_glove_path):
    evaluator = Evaluator()
    eval_texts = [text for a, b, _ in PAIRS for text in (a, b)]
    with pytest.raises(ValueError, match="needs a fit corpus"):
        evaluator.fit(EncoderConfig(model=tiny_glove_path, shape="center"), None, eval_texts)
    with pytest.raises(ValueError, match="needs a fit corpus"):
        evaluator.fit(EncoderConfig(model=tiny_glove_path, weights="idf"), None, eval_texts)

    encoder, fitted_on = evaluator.fit(EncoderConfig(model=tiny_glove_path, shape="center"), None, eval_texts, transductive=True)
    assert fitted_on.startswith("TRANSDUCTIVE") and f"({len(set(eval_texts))} texts)" in fitted_on
    table = read_glove(tiny_glove_path)
    expected = np.mean([_glove_average(table, text) for text in dict.fromkeys(eval_texts)], axis=0)
    np.testing.assert_allclose(encoder.transforms[0].mean_, expected, atol=1e-5)

    _, fitted_on = evaluator.fit(EncoderConfig(model=tiny_glove_path, shape="none"), None, eval_texts)
    assert fitted_on == "nothing (no fitted statistics)"


def test_fit_on_a_corpus_file_samples_it(tiny_glove_path, tmp_path):
    corpus = tmp_path / "fit.txt"
    corpus.write_text("\n".join(FIT_TEXTS) + "\n")
    encoder, fitted_on = Evaluator().fit(EncoderConfig(model=tiny_glove_path, shape="center"), str(corpus), ["ignored text"])
    assert fitted_on == f"{corpus} ({len(FIT_TEXTS)} texts)"
    table = read_glove(tiny_glove_path)
    expected = np.mean([_glove_average(table, text) for text in FIT_TEXTS], axis=0)
    np.testing.assert_allclose(encoder.transforms[0].mean_, expected, atol=1e-5)

    encoder, fitted_on = Evaluator(fit_samples=3).fit(EncoderConfig(model=tiny_glove_path, shape="center"), str(corpus))
    assert fitted_on.endswith("(3 texts)") and encoder.metadata["fit"]["n_texts"] == 3


def test_context_tables_are_shared_only_between_equal_fit_samples(tiny_bert_path, tmp_path, monkeypatch):
    corpora = []
    for seed in (1, 2):
        corpora.append(tmp_path / f"corpus{seed}.txt")
        corpora[-1].write_text("\n".join(make_sentences(30, seed=seed)) + "\n")
    evaluator = Evaluator(cache_dir=tmp_path / "cache")
    recipe = EncoderConfig(model=f"static:{tiny_bert_path}+context:{tiny_bert_path}")
    first, fitted_on = evaluator.fit(recipe, str(corpora[0]))
    assert fitted_on == f"{corpora[0]} (30 texts)"  # the table is fitted even when nothing else is
    other, _ = evaluator.fit(recipe, str(corpora[1]))
    again, fitted_on = evaluator.fit(EncoderConfig(model=recipe.model, shape="center"), str(corpora[0]))
    assert fitted_on == f"{corpora[0]} (30 texts)"
    assert again.backbone is first.backbone and other.backbone is not first.backbone
    tables = [encoder.backbone.get_state()["context.1.table_"] for encoder in (first, other)]
    assert np.abs(tables[0] - tables[1]).max() > 1e-4
    fresh = ShapedEncoder.create(recipe.model).fit(corpora[0].read_text().split("\n")[:-1])
    np.testing.assert_allclose(tables[0], fresh.backbone.get_state()["context.1.table_"], atol=1e-5)

    # the tables were averaged through the token-state cache: a new run never calls the transformer
    calls = []
    forward = HFBackbone.forward
    monkeypatch.setattr(HFBackbone, "forward", lambda self, *args: calls.append(1) or forward(self, *args))
    rerun, _ = Evaluator(cache_dir=tmp_path / "cache").fit(recipe, str(corpora[1]))
    assert not calls
    np.testing.assert_array_equal(rerun.backbone.get_state()["context.1.table_"], tables[1])


def test_context_corpus_fits_the_table_apart_from_the_shaping(tiny_bert_path, tmp_path):
    table_corpus = tmp_path / "general.txt"
    table_corpus.write_text("\n".join(make_sentences(30, seed=1)) + "\n")
    documents = make_sentences(12, seed=9)
    evaluator = Evaluator()
    recipe = EncoderConfig(model=f"static:{tiny_bert_path}+context:{tiny_bert_path}", shape="center")
    encoder, fitted_on = evaluator.fit(recipe, documents, context_corpus=str(table_corpus))
    assert fitted_on == f"the retrieval corpus (12 texts); context table: {table_corpus} (30 texts)"
    table_only, _ = evaluator.fit(EncoderConfig(model=recipe.model), str(table_corpus))
    assert table_only.backbone is encoder.backbone  # the table came from the context corpus
    np.testing.assert_allclose(encoder.transforms[0].mean_, encoder.embed_raw(documents).astype(np.float64).mean(0), atol=1e-5)
    _, fitted_on = evaluator.fit(EncoderConfig(model=recipe.model), None, context_corpus=str(table_corpus))
    assert fitted_on == f"context table: {table_corpus} (30 texts)"
    with pytest.raises(ValueError, match="has none"):
        evaluator.fit(
            EncoderConfig(model=f"static:{tiny_bert_path}", shape="center"), documents, context_corpus=str(table_corpus)
        )


# -- evaluate ----------------------------------------------------------------------
def test_evaluate_sts_on_a_pairs_file(tiny_glove_path, tmp_path):
    pairs = _write_pairs(tmp_path / "tiny_pairs.tsv")
    result = evaluate("sts", EncoderConfig(model=tiny_glove_path, shape="none"), Evaluator(), pairs=[pairs])
    expected = _reference_spearman(tiny_glove_path)
    assert result["scores"]["tiny_pairs"] == pytest.approx(expected, abs=0.006)
    assert result["average"] == result["scores"]["tiny_pairs"]
    assert result["fitted_on"] == "nothing (no fitted statistics)" and result["transductive"] is False

    corpus = tmp_path / "fit.txt"
    corpus.write_text("\n".join(FIT_TEXTS) + "\n")
    centred = evaluate(
        "sts", EncoderConfig(model=tiny_glove_path, shape="center"), Evaluator(), pairs=[pairs], fit_corpus=str(corpus)
    )
    table = read_glove(tiny_glove_path)
    mean = np.mean([_glove_average(table, text) for text in FIT_TEXTS], axis=0)
    assert centred["scores"]["tiny_pairs"] == pytest.approx(_reference_spearman(tiny_glove_path, mean), abs=0.006)
    assert centred["transductive"] is False

    labelled = evaluate(
        "sts", EncoderConfig(model=tiny_glove_path, shape="center"), Evaluator(), pairs=[pairs], transductive=True
    )
    assert labelled["transductive"] is True and labelled["fitted_on"].startswith("TRANSDUCTIVE")
    with pytest.raises(ValueError, match="needs a fit corpus"):
        evaluate("sts", EncoderConfig(model=tiny_glove_path, shape="center"), Evaluator(), pairs=[pairs])
    with pytest.raises(ValueError, match="unknown task"):
        evaluate("sentiment", EncoderConfig(model=tiny_glove_path), Evaluator())


def test_cli_eval_sts_prints_and_writes_json(tiny_glove_path, tmp_path, monkeypatch, capsys):
    from isotrope.cli import main

    pairs = _write_pairs(tmp_path / "tiny_pairs.tsv")
    out = tmp_path / "result.json"
    monkeypatch.setattr(
        sys, "argv", ["isotrope", "eval", "sts", "--model", tiny_glove_path, "--pairs", str(pairs), "--json", str(out)]
    )
    main()
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["scores"]["tiny_pairs"] == pytest.approx(_reference_spearman(tiny_glove_path), abs=0.006)


def test_cli_eval_shows_progress_and_the_library_does_not(tiny_glove_path, tmp_path, monkeypatch, capsys):
    """`isotrope eval` shows the fit and the encoding as they run (a transformer over a BEIR corpus takes
    minutes); the Evaluator as a library stays quiet unless asked."""
    from isotrope.cli import main

    pairs = _write_pairs(tmp_path / "tiny_pairs.tsv")
    fit = tmp_path / "fit.txt"
    fit.write_text("\n".join(make_sentences(30, seed=3)) + "\n")
    args = ["isotrope", "eval", "sts", "--model", tiny_glove_path, "--shape", "center", "--fit-corpus", str(fit)]
    monkeypatch.setattr(sys, "argv", [*args, "--pairs", str(pairs)])
    main()
    err = capsys.readouterr().err
    assert err.count("encoding: 100%") == 2, err  # the fit's texts, then the pairs' sentences
    evaluate("sts", EncoderConfig(model=tiny_glove_path, shape="center"), Evaluator(), pairs=[pairs], fit_corpus=str(fit))
    assert "encoding" not in capsys.readouterr().err


def test_retrieval_through_a_store_shows_the_documents_encoding(tiny_glove_path, tmp_path, capsys):
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    texts = make_sentences(12, seed=5)
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    (beir / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(texts[:3])))
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(3)))
    config = EncoderConfig(model=tiny_glove_path, shape="center")
    evaluate("retrieval", config, Evaluator(show_progress=True), beir=beir, fit_corpus="corpus", modes=["dense"])
    err = capsys.readouterr().err
    assert err.count("encoding: 100%") == 2, err  # the fit's texts, then the documents written to the store


def test_cli_eval_takes_a_context_corpus(tiny_bert_path, tmp_path, monkeypatch, capsys):
    from isotrope.cli import main

    pairs = _write_pairs(tmp_path / "tiny_pairs.tsv")
    table_corpus = tmp_path / "general.txt"
    table_corpus.write_text("\n".join(make_sentences(20, seed=1)) + "\n")
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "isotrope",
            "eval",
            "sts",
            "--model",
            f"static:{tiny_bert_path}+context:{tiny_bert_path}",
            "--pairs",
            str(pairs),
            "--context-corpus",
            str(table_corpus),
        ],
    )
    main()
    assert json.loads(capsys.readouterr().out)["fitted_on"] == f"context table: {table_corpus} (20 texts)"


def test_isotropy_leaves_out_texts_without_a_known_token(tiny_glove_path, tmp_path):
    from isotrope.isotropy import isotropy_report

    texts = ["the cat sat on the mat", "zzqx qqzx", "the dog runs fast", "a house on the river"]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(texts) + "\n")
    result = evaluate("isotropy", EncoderConfig(model=tiny_glove_path), Evaluator(), texts_file=path)
    known = [texts[i] for i in (0, 2, 3)]
    expected = isotropy_report(ShapedEncoder.create(tiny_glove_path).encode(known))
    assert result["scores"]["zero_vectors"] == 1
    for name, value in expected.items():
        assert result["scores"][name] == pytest.approx(round(value, 4), abs=1e-4)


def test_evaluate_retrieval_fits_on_the_documents_never_the_queries(tiny_glove_path, tmp_path):
    documents = ["the cat sat on the mat", "the dog runs fast", "a house on the river", "mat , river , fast"]
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n" for i, text in enumerate(documents))
    )
    (beir / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": text}) + "\n" for i, text in enumerate(documents))
    )
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(4)))
    recipe = EncoderConfig(model=tiny_glove_path, shape="center")
    result = evaluate("retrieval", recipe, Evaluator(), beir=beir, fit_corpus="corpus", split=None)
    assert result["fitted_on"] == "the retrieval corpus (4 texts)" and result["queries"] == 4
    assert result["scores"]["ndcg@10"] == 100.0 and result["scores"]["mrr@10"] == 100.0
    with pytest.raises(ValueError, match="never fits on the queries"):
        evaluate("retrieval", recipe, Evaluator(), beir=beir, transductive=True)


def test_clustering_limit_samples_across_a_label_sorted_file(tiny_glove_path, tmp_path):
    import gzip

    words = ["cat", "dog", "house", "river"]
    path = tmp_path / "clusters.jsonl.gz"
    with gzip.open(path, "wt") as handle:  # sorted by label, as 20 Newsgroups is
        for label, word in enumerate(words):
            for _ in range(10):
                handle.write(json.dumps({"text": f"{word} {word} the", "label": label, "split": "test"}) + "\n")
    result = evaluate("clustering", EncoderConfig(model=tiny_glove_path), Evaluator(), jsonl=path, split="test", limit=12)
    assert result["texts"] == 12 and result["labels"] == 4


def test_clustering_fits_on_another_split_of_the_file(tiny_glove_path, tmp_path):
    path = tmp_path / "clusters.jsonl"
    rows = [
        {"text": f"{word} {word} the", "label": label, "split": "test"}
        for label, word in enumerate(["cat", "dog", "house"])
        for _ in range(4)
    ]
    rows += [{"text": f"the {word} river", "label": 0, "split": "train"} for word in ["cat", "dog", "green", "red", "old"]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recipe = EncoderConfig(model=tiny_glove_path, shape="center")
    result = evaluate("clustering", recipe, Evaluator(), jsonl=path, split="test", fit_corpus="split:train")
    assert result["fitted_on"] == "clusters.jsonl split train (5 texts)" and result["texts"] == 12
    encoder, _ = Evaluator().fit(recipe, [row["text"] for row in rows if row["split"] == "train"])
    center = encoder.transforms[0].mean_
    raw = ShapedEncoder.create(tiny_glove_path).embed_raw([f"the {w} river" for w in ["cat", "dog", "green", "red", "old"]])
    np.testing.assert_allclose(center, raw.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="is the evaluated split"):
        evaluate("clustering", recipe, Evaluator(), jsonl=path, split="test", fit_corpus="split:test")


# -- sweeps ------------------------------------------------------------------------
def test_run_sweep_writes_json_and_markdown(tiny_glove_path, tiny_bert_path, tmp_path):
    data = tmp_path / "data"
    _write_pairs(data / "tiny_pairs.tsv")
    (data / "fit.txt").write_text("\n".join(FIT_TEXTS) + "\n")
    config = {
        "data_dir": "data",  # relative to the config's folder
        "cache_dir": str(tmp_path / "cache"),
        "tasks": {"sts": {"pairs": ["tiny_pairs.tsv"]}},
        "grid": [{"model": [tiny_glove_path], "shape": ["none", "center"], "fit_corpus": ["fit.txt"]}],
        "recipes": [{"model": tiny_bert_path, "shape": "none"}],
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(config))
    rows = run_sweep(path, tmp_path / "out" / "tiny")

    assert [row["recipe"] for row in rows] == [
        f"{tiny_glove_path} pool=mean shape=none",
        f"{tiny_glove_path} pool=mean shape=center",
        f"{tiny_bert_path} pool=mean shape=none",
    ]
    assert json.loads((tmp_path / "out" / "tiny.json").read_text()) == rows
    assert rows[0]["scores"]["tiny_pairs"] == pytest.approx(_reference_spearman(tiny_glove_path), abs=0.006)
    assert rows[1]["fitted_on"] == f"fit.txt ({len(FIT_TEXTS)} texts)"  # paths relative to data_dir, as in the files
    assert rows[2]["fitted_on"] == "nothing (no fitted statistics)"
    assert (tmp_path / "cache" / "token_states.sqlite").is_file()

    markdown = (tmp_path / "out" / "tiny.md").read_text().splitlines()
    assert markdown[0] == "### sts"
    header = markdown.index("| recipe | fitted on | tiny_pairs | avg |")
    body = markdown[header + 2 : header + 5]
    for line, row in zip(body, rows):
        assert line == f"| {row['recipe']} | {row['fitted_on']} | {row['scores']['tiny_pairs']} | {row['average']} |"
    assert "| fit.txt (8 texts) |" in body[1]


def test_run_sweep_task_fit_corpus_is_a_default(tiny_glove_path, tmp_path):
    data = tmp_path / "data"
    _write_pairs(data / "tiny_pairs.tsv")
    (data / "fit.txt").write_text("\n".join(FIT_TEXTS) + "\n")
    (data / "other.txt").write_text("\n".join(FIT_TEXTS[:5]) + "\n")
    config = {
        "data_dir": str(data),
        "tasks": {"sts": {"pairs": ["tiny_pairs.tsv"], "fit_corpus": "fit.txt"}},
        "recipes": [
            {"model": tiny_glove_path, "shape": "center"},
            {"model": tiny_glove_path, "shape": "center", "fit_corpus": "other.txt"},
        ],
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(config))
    rows = run_sweep(path, tmp_path / "out")
    assert [row["fitted_on"] for row in rows] == ["fit.txt (8 texts)", "other.txt (5 texts)"]


def test_an_interrupted_sweep_resumes_with_the_rows_it_wrote(tiny_glove_path, tmp_path, monkeypatch):
    from isotrope.evaluate import sweep

    data = tmp_path / "data"
    _write_pairs(data / "tiny_pairs.tsv")
    (data / "fit.txt").write_text("\n".join(FIT_TEXTS) + "\n")
    config = {
        "data_dir": str(data),
        "tasks": {"sts": {"pairs": ["tiny_pairs.tsv"], "fit_corpus": "fit.txt"}},
        "grid": {"model": [tiny_glove_path], "shape": ["none", "center"]},
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(config))
    first = run_sweep(path, tmp_path / "out")
    evaluated = []
    real_evaluate = sweep.evaluate
    monkeypatch.setattr(
        sweep, "evaluate", lambda task, recipe, *a, **k: evaluated.append(recipe.shape) or real_evaluate(task, recipe, *a, **k)
    )
    config["grid"]["shape"].insert(0, "whiten")  # a new point before the finished ones
    path.write_text(json.dumps(config))
    second = run_sweep(path, tmp_path / "out")
    assert evaluated == ["whiten"] and second[1:] == first
    assert json.loads((tmp_path / "out.json").read_text()) == second  # the reused rows are written back too
    config["tasks"]["sts"]["fit_corpus"] = "tiny_pairs.tsv"  # other task options: nothing is reused
    path.write_text(json.dumps(config))
    evaluated.clear()
    run_sweep(path, tmp_path / "out")
    assert evaluated == ["whiten", "none", "center"]


def test_run_sweep_keeps_frequency_keywords_beside_a_folder_of_that_name(tiny_glove_path, tmp_path):
    data = tmp_path / "data"
    _write_pairs(data / "tiny_pairs.tsv")
    (data / "wordfreq").mkdir()  # as in a data root that ships a wordfreq/ folder
    (data / "counts.txt").write_text("the 100\ncat 5\n")
    config = {
        "data_dir": str(data),
        "tasks": {"sts": {"pairs": ["tiny_pairs.tsv"]}},
        "grid": {"model": [tiny_glove_path], "weights": ["sif"], "frequencies": ["wordfreq", "counts.txt"]},
    }
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(config))
    rows = run_sweep(path, tmp_path / "out")
    assert [row["recipe"] for row in rows] == [
        f"{tiny_glove_path} pool=mean w=sif[wordfreq] shape=none",
        f"{tiny_glove_path} pool=mean w=sif[counts.txt] shape=none",
    ]


def test_run_sweep_rejects_bad_configs(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"grid": {"model": ["glove-6b-50d"],}')
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        run_sweep(path, tmp_path / "out")
    path.write_text(json.dumps({"grid": {"model": ["glove-6b-50d"], "shaping": ["none"]}}))
    with pytest.raises(ValueError, match=r"unknown recipe keys \['shaping'\]"):
        run_sweep(path, tmp_path / "out")
