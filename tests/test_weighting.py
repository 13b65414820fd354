"""Token statistics and weights against hand computations, collections.Counter and scikit-learn."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfTransformer

from isotrope.transforms.base import NotFittedError
from isotrope.weighting import TokenCounts, TokenWeighting, is_punctuation, read_frequency_file

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "dog", "runs", ".", ",", "##s", "##!", "!?", "$", "a"]
SPECIAL = np.array([0, 1, 2, 3])
V = len(VOCAB)


def random_documents(n: int, seed: int = 0) -> list[list[int]]:
    """Token-id lists with a skewed (Zipf-like) distribution over the non-special ids."""
    rng = np.random.default_rng(seed)
    ids = np.arange(4, V)
    probs = 1.0 / np.arange(1, len(ids) + 1)
    probs /= probs.sum()
    return [list(rng.choice(ids, size=int(rng.integers(1, 9)), p=probs)) for _ in range(n)]


DOCS = random_documents(60)


def counts_of(docs: list[list[int]]) -> TokenCounts:
    return TokenCounts.from_token_ids(docs, V)


# -- TokenCounts -------------------------------------------------------------------------------
def test_token_counts_match_counter():
    counts = counts_of(DOCS)
    total = Counter(token for doc in DOCS for token in doc)
    doc_freq = Counter(token for doc in DOCS for token in set(doc))
    np.testing.assert_array_equal(counts.counts, [total[i] for i in range(V)])
    np.testing.assert_array_equal(counts.doc_freq, [doc_freq[i] for i in range(V)])
    assert counts.n_texts == len(DOCS)
    assert counts.n_tokens == sum(len(doc) for doc in DOCS)


def test_merge_equals_counts_of_the_concatenation():
    merged = counts_of(DOCS[:17]).merge(counts_of(DOCS[17:40])).merge(counts_of(DOCS[40:]))
    whole = counts_of(DOCS)
    np.testing.assert_array_equal(merged.counts, whole.counts)
    np.testing.assert_array_equal(merged.doc_freq, whole.doc_freq)
    assert merged.n_texts == whole.n_texts and merged.n_tokens == whole.n_tokens


def test_empty_counts():
    counts = TokenCounts(V)
    assert counts.n_texts == 0 and counts.n_tokens == 0
    with pytest.raises(ValueError, match="needs fit texts"):
        TokenWeighting("idf").fit(VOCAB, SPECIAL, counts)


# -- schemes -------------------------------------------------------------------------------
def test_uniform_needs_no_corpus():
    weighting = TokenWeighting()
    assert not weighting.needs_corpus
    np.testing.assert_array_equal(weighting.fit(VOCAB, SPECIAL).weights_, np.ones(V, dtype=np.float32))


def test_idf_equals_scikit_learn_smoothed_idf():
    matrix = np.zeros((len(DOCS), V))
    for row, doc in enumerate(DOCS):
        for token in doc:
            matrix[row, token] += 1
    expected = TfidfTransformer(smooth_idf=True).fit(matrix).idf_
    weighting = TokenWeighting("idf").fit(VOCAB, SPECIAL, counts_of(DOCS))
    assert weighting.weights_.dtype == np.float32
    np.testing.assert_allclose(weighting.weights_, expected, rtol=1e-6)
    assert weighting.weights_[0] == pytest.approx(math.log(len(DOCS) + 1) + 1)  # unseen token


def test_sif_from_corpus():
    a = 1e-2
    total = Counter(token for doc in DOCS for token in doc)
    n_tokens = sum(total.values())
    weighting = TokenWeighting("sif", sif_a=a).fit(VOCAB, SPECIAL, counts_of(DOCS))
    expected = [a / (a + total[i] / n_tokens) for i in range(V)]
    np.testing.assert_allclose(weighting.weights_, expected, rtol=1e-6)


def usif_reference(probs: list[float], mean_length: float) -> list[float]:
    """Ethayarajh (2018): threshold, alpha, Z = |V|/2, a = (1 - alpha) / (alpha Z), w = a / (a/2 + p)."""
    size = len(probs)
    threshold = 1 - (1 - 1 / size) ** mean_length
    alpha = sum(1 for p in probs if p > threshold) / size
    a = (1 - alpha) / (alpha * size / 2)
    return [a / (0.5 * a + p) for p in probs]


def test_usif_matches_the_formula():
    rng = np.random.default_rng(1)
    size = 300
    zipf = 1.0 / np.arange(1, size + 1)
    docs = [list(rng.choice(size, size=int(rng.integers(2, 30)), p=zipf / zipf.sum())) for _ in range(200)]
    total = Counter(token for doc in docs for token in doc)
    n_tokens = sum(total.values())
    probs = [total[i] / n_tokens for i in range(size)]
    expected = usif_reference(probs, n_tokens / len(docs))
    vocabulary = [f"w{i}" for i in range(size)]
    weighting = TokenWeighting("usif").fit(vocabulary, np.array([], dtype=np.int64), TokenCounts.from_token_ids(docs, size))
    np.testing.assert_allclose(weighting.weights_, expected, rtol=1e-6)
    assert len(set(np.round(expected, 6))) > 10  # the weights really vary with frequency


def test_usif_without_frequent_tokens_falls_back(caplog):
    counts = counts_of(DOCS)  # 15 tokens, 5 a text: no token passes the uSIF threshold
    weighting = TokenWeighting("usif").fit(VOCAB, SPECIAL, counts)
    probs = counts.counts / counts.n_tokens
    np.testing.assert_allclose(weighting.weights_, 1e-3 / (0.5e-3 + probs), rtol=1e-6)
    assert "no token is above the frequency threshold" in caplog.text


def test_drop_top_zeroes_the_most_frequent_tokens():
    counts = counts_of(DOCS)
    order = sorted(range(V), key=lambda i: -counts.counts[i])
    assert counts.counts[order[2]] > counts.counts[order[3]]  # no tie at the cut
    weighting = TokenWeighting("sif", drop_top=3).fit(VOCAB, SPECIAL, counts)
    plain = TokenWeighting("sif").fit(VOCAB, SPECIAL, counts)
    assert set(np.flatnonzero(weighting.weights_ == 0)) == set(order[:3])
    keep = np.ones(V, dtype=bool)
    keep[order[:3]] = False
    np.testing.assert_array_equal(weighting.weights_[keep], plain.weights_[keep])
    assert TokenWeighting(drop_top=2).needs_corpus


def test_exclude_special_and_punctuation():
    weighting = TokenWeighting(exclude_special=True, exclude_punctuation=True).fit(VOCAB, SPECIAL)
    zero = {VOCAB[i] for i in np.flatnonzero(weighting.weights_ == 0)}
    assert zero == {"[PAD]", "[UNK]", "[CLS]", "[SEP]", ".", ",", "##!", "!?", "$"}
    assert np.all(weighting.weights_[weighting.weights_ != 0] == 1)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (".", True),
        ("##,", True),
        ("!?", True),
        ("$", True),
        ("--", True),
        ("a", False),
        ("##s", False),
        ("a.", False),
        ("##", False),
        ("", False),
    ],
)
def test_is_punctuation(token, expected):
    assert is_punctuation(token) is expected


def test_token_weights_gather_by_id():
    weighting = TokenWeighting("idf").fit(VOCAB, SPECIAL, counts_of(DOCS))
    ids = np.array([[2, 4, 5, 3], [2, 6, 3, 0]])
    np.testing.assert_array_equal(weighting.token_weights(ids), weighting.weights_[ids])


def test_state_round_trip_and_not_fitted():
    weighting = TokenWeighting("usif", exclude_special=True)
    with pytest.raises(NotFittedError, match="call fit"):
        weighting.token_weights(np.array([[1, 2]]))
    weighting.fit(VOCAB, SPECIAL, counts_of(DOCS))
    rebuilt = TokenWeighting.from_state(weighting.get_config(), weighting.get_state())
    np.testing.assert_array_equal(rebuilt.weights_, weighting.weights_)
    assert rebuilt.get_config() == weighting.get_config()
    with pytest.raises(ValueError, match="weights_"):
        TokenWeighting.from_state(weighting.get_config(), {})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scheme": "bm25"}, "unknown weighting scheme 'bm25'"),
        ({"scheme": "idf", "frequencies": "wordfreq"}, "idf needs document frequencies"),
        ({"scheme": "sif", "frequencies": "/no/such/file.txt"}, "existing file"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenWeighting(**kwargs)


def test_corpus_schemes_need_counts():
    with pytest.raises(ValueError, match="sif weighting with corpus frequencies needs fit texts"):
        TokenWeighting("sif").fit(VOCAB, SPECIAL)


# -- frequency tables ---------------------------------------------------------------------------
def test_frequency_file_drives_sif(tmp_path):
    path = tmp_path / "freq.txt"
    path.write_text("the 600\n\ncat 100\ns 200\ndog 100\n")
    assert read_frequency_file(path) == {"the": 600.0, "cat": 100.0, "s": 200.0, "dog": 100.0}
    a = 1e-3
    weighting = TokenWeighting("sif", sif_a=a, frequencies=str(path))
    assert not weighting.needs_corpus
    weighting.fit(VOCAB, SPECIAL)
    p = {"the": 0.6, "cat": 0.1, "dog": 0.1, "##s": 0.2}  # '##s' looks up 's'
    expected = [a / (a + p.get(token, 0.0)) for token in VOCAB]
    np.testing.assert_allclose(weighting.weights_, expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("the 10\ncat\n", r"freq\.txt:2: expected 'word count'"),
        ("the 10\n\ncat 1 2\n", r"freq\.txt:3: expected 'word count'"),
        ("the ten\n", r"freq\.txt:1: count 'ten' is not a number"),
    ],
)
def test_frequency_file_errors_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "freq.txt"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_frequency_file(path)
    with pytest.raises(ValueError, match=message):
        TokenWeighting("sif", frequencies=str(path)).fit(VOCAB, SPECIAL)


def test_wordfreq_source():
    from wordfreq import word_frequency

    a = 1e-3
    weighting = TokenWeighting("sif", sif_a=a, frequencies="wordfreq", exclude_special=True).fit(VOCAB, SPECIAL)
    expected = np.array([a / (a + word_frequency(token.removeprefix("##"), "en")) for token in VOCAB])
    expected[SPECIAL] = 0.0
    np.testing.assert_allclose(weighting.weights_, expected, rtol=1e-6)
    assert weighting.weights_[VOCAB.index("the")] < 0.1 < weighting.weights_[VOCAB.index("cat")]
