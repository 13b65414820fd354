"""Batched chunking (``chunk_many``, ``chunk_stream``) gives the chunks of one document at a time."""

from __future__ import annotations

import random

import pytest

from isotrope.ingest import chunking, plan
from isotrope.ingest.chunking import TokenChunker
from isotrope.ingest.loaders import Document
from isotrope.ingest.plan import IngestReport, chunk_stream
from test_chunking import WORDS, byte_level_tokenizer, make_text, tokenizer  # noqa: F401  (the tiny WordPiece fixture)


def varied_documents(seed: int) -> list[Document]:
    """Long and short documents, one-sentence ones, lists, run-on sentences, long words, empty ones."""
    rng = random.Random(seed)
    documents = []
    for i in range(60):
        kind = i % 6
        if kind == 0:
            text, _ = make_text(seed=seed + i, sentences=rng.randint(20, 80))
        elif kind == 1:
            text = rng.choice(WORDS).capitalize() + " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 8))) + "."
        elif kind == 2:
            text = "\n".join(f"- {' '.join(rng.choices(WORDS, k=rng.randint(2, 9)))}" for _ in range(rng.randint(2, 30)))
        elif kind == 3:
            text = " ".join(rng.choices(WORDS, k=rng.randint(30, 200))) + " end."  # a run-on sentence
        elif kind == 4:
            text = "Tiny. " + "q" * rng.randint(5, 60) + " tail.  " + make_text(seed=i, sentences=3)[0]
        else:
            text = rng.choice(["", "  \n ", "\n\n"])
        documents.append(Document(f"docs/{i}.txt", text, {"n": i}))
    return documents


def bpe_documents() -> list[Document]:
    rng = random.Random(4)
    sentences = ["Cat dog.", "Dog cat dog.", "Cat.", "Dog dog cat.", "Cat dog dog dog dog dog dog cat."]
    texts = [" ".join(rng.choices(sentences, k=rng.randint(1, 40))) for _ in range(30)]
    texts += ["Cat " * 40 + "dog.", "", "Dog.\nCat dog dog.\n" * 8]
    return [Document(f"bpe/{i}.txt", text) for i, text in enumerate(texts)]


@pytest.mark.parametrize(("chunk_tokens", "overlap_tokens"), [(12, 4), (30, 8), (64, 0)])
def test_chunk_many_equals_one_document_at_a_time(tokenizer, chunk_tokens: int, overlap_tokens: int) -> None:  # noqa: F811
    documents = varied_documents(chunk_tokens)
    chunker = TokenChunker(tokenizer, chunk_tokens, overlap_tokens)
    one_by_one = [chunker.chunk(document) for document in documents]
    assert chunker.chunk_many(documents) == one_by_one
    assert sum(map(len, one_by_one)) > len(documents)  # documents were cut into several chunks
    assert [] in one_by_one  # the empty ones give none
    # the tokenizers object itself (how a folded encoder chunks) gives the same chunks
    core = TokenChunker(tokenizer.backend_tokenizer, chunk_tokens, overlap_tokens, max_length=512)
    assert core.chunk_many(documents) == one_by_one


def test_chunk_many_equals_one_at_a_time_for_byte_level_bpe() -> None:
    tok = byte_level_tokenizer()
    documents = bpe_documents()
    chunker = TokenChunker(tok, 12, 4)
    assert not chunker._words.enabled  # counted by the tokenizer, not the word cache
    one_by_one = [chunker.chunk(document) for document in documents]
    assert chunker.chunk_many(documents) == one_by_one
    assert all(len(tok.encode(c.text, add_special_tokens=False)) <= 12 for chunks in one_by_one for c in chunks)


def test_counts_match_the_transformers_tokenizer(tokenizer) -> None:  # noqa: F811
    texts = [document.text for document in varied_documents(1)] + ["zyxt qwerty\tBlorp\n", "a\u00a0b", "x" * 150]
    expected = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    chunker = TokenChunker(tokenizer, 30, 8)
    assert chunker._words.enabled
    assert chunker.count_tokens(texts) == expected


def test_chunk_stream_batches_keep_order_and_count_empty_documents(tokenizer, monkeypatch) -> None:  # noqa: F811
    documents = varied_documents(7)
    chunker = TokenChunker(tokenizer, 30, 8)
    expected = [(d, chunker.chunk(d)) for d in documents if d.text.strip()]
    for batch_documents, batch_characters in ((3, 10**9), (10**6, 500)):
        monkeypatch.setattr(plan, "CHUNK_BATCH_DOCUMENTS", batch_documents)
        monkeypatch.setattr(plan, "CHUNK_BATCH_CHARACTERS", batch_characters)
        report = IngestReport()
        assert list(chunk_stream(iter(documents), chunker, report)) == expected
        assert report.empty == len(documents) - len(expected)


def test_tokenizer_batches_do_not_change_chunks(tokenizer, monkeypatch) -> None:  # noqa: F811
    documents = bpe_documents()
    chunker = TokenChunker(byte_level_tokenizer(), 12, 4)
    expected = chunker.chunk_many(documents)
    monkeypatch.setattr(chunking, "_TOKENIZE_BATCH", 5)
    assert chunker.chunk_many(documents) == expected


def test_a_slow_tokenizer_is_refused() -> None:
    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match="needs a fast tokenizer"):
        TokenChunker(Slow())


def test_a_folded_encoder_chunks_with_its_tokenizers_object(tiny_bert_path) -> None:
    from conftest import make_sentences
    from isotrope.encoder import ShapedEncoder
    from isotrope.fold import fold_encoder
    from isotrope.ingest.plan import IngestPlan

    encoder = fold_encoder(ShapedEncoder.create(f"static:{tiny_bert_path}", shape="center").fit(make_sentences(200)))
    chunker = IngestPlan(source=[], store="faiss:unused", chunk_tokens=24, overlap_tokens=6).chunker(encoder)
    assert chunker.tokenizer is encoder.backbone.core_tokenizer  # no transformers wrapper built for chunking
    assert encoder.backbone._hf_tokenizer is None
    documents = [Document(f"d{i}.txt", "\n\n".join(make_sentences(12, seed=i))) for i in range(5)]
    expected = [TokenChunker(encoder.tokenizer, 24, 6).chunk(document) for document in documents]  # transformers
    assert chunker.chunk_many(documents) == expected
    assert sum(map(len, expected)) > len(documents)
