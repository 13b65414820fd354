"""Shared fixtures: tiny models built locally, no download and no data from ../shared.

Fixtures (names are stable; other test files rely on them):

* ``tiny_bert_path`` (session) -> ``str``: a folder with a randomly initialised
  3-layer BERT (hidden 32, 4 heads, ``max_position_embeddings`` 128, seed 0; LayerNorm
  gains and biases randomised too, as in a trained model)
  and its lower-casing WordPiece tokenizer over ``TINY_VOCAB``; load it with
  ``AutoModel``/``AutoTokenizer`` or pass it as ``model`` to ``ShapedEncoder.create``.
* ``tiny_glove_path`` (session) -> ``str``: a GloVe-style text file (``word v1 .. v8``,
  no header) with one seeded random 8-d vector for each word of ``GLOVE_WORDS``
  (two of them upper-case, to test lower-casing).
* ``make_sentences(n, seed=0)`` (plain function): ``n`` deterministic sentences made
  of in-vocabulary words, for fitting encoders.
* ``read_glove(path)`` (plain function): an independent reader of the GloVe fixture,
  word (as written) -> float32 vector. Constants: ``TINY_VOCAB``, ``GLOVE_WORDS``, ``GLOVE_DIM``.

Import the plain functions and constants with ``from conftest import make_sentences``.

Property tests (hypothesis) run under the profile named by ``HYPOTHESIS_PROFILE``: ``ci`` (the
default: each property's own bounded ``max_examples``, no deadline, no example database written
into the checkout) or ``slow`` (10x the examples: ``HYPOTHESIS_PROFILE=slow pytest -m slow
tests/test_properties_*.py`` runs the slow-marked larger variants too).

The session runs with ``HF_HUB_OFFLINE=1`` so that nothing can reach the hub, and with
one intra-op thread per library by default (``OMP_NUM_THREADS=1``): tiny models on a busy
machine run many times faster without thread hand-offs.
"""

from __future__ import annotations

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# ONNX exports (a ``fast`` teacher's among them: isotrope.backbones.static.teacher_backend) go to a
# throw-away cache, never the user's ~/.cache
os.environ.setdefault("ISOTROPE_CACHE_DIR", tempfile.mkdtemp(prefix="isotrope-test-cache-"))

from pathlib import Path

import numpy as np
import pytest

try:
    from hypothesis import settings
except ImportError:  # pragma: no cover - hypothesis comes with the dev extra
    settings = None  # type: ignore[assignment]
if settings is not None:
    settings.register_profile("ci", deadline=None, database=None, print_blob=True)
    settings.register_profile("slow", deadline=None, database=None, print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def examples(n: int) -> int:
    """A property's ``max_examples``: ``n`` under the ci profile, 10x under the slow one."""
    return n * (10 if os.environ.get("HYPOTHESIS_PROFILE") == "slow" else 1)


SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "the",
    "a",
    "an",
    "this",
    "that",
    "is",
    "are",
    "was",
    "were",
    "of",
    "to",
    "in",
    "on",
    "and",
    "or",
    "but",
    "not",
    "it",
    "he",
    "she",
    "they",
    "we",
    "you",
    "i",
    "cat",
    "cats",
    "dog",
    "dogs",
    "bird",
    "car",
    "cars",
    "house",
    "tree",
    "river",
    "city",
    "sun",
    "moon",
    "rain",
    "snow",
    "food",
    "water",
    "music",
    "red",
    "green",
    "blue",
    "big",
    "small",
    "fast",
    "slow",
    "happy",
    "sad",
    "good",
    "bad",
    "new",
    "old",
    "runs",
    "run",
    "walks",
    "eats",
    "sees",
    "likes",
    "loves",
    "reads",
    "plays",
    "sleeps",
    "sentence",
    "means",
    "word",
]
PUNCTUATION = list(".,!?;:'\"()-")
PIECES = ["##s", "##ed", "##ing", "##ly", "##er", "##est", "##y", "##n", "##e", "##a", "##o", "##t", "##r"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
#: vocab.txt of the tiny BERT, index = token id
TINY_VOCAB = list(dict.fromkeys(SPECIAL_TOKENS + WORDS + PUNCTUATION + LETTERS + [f"##{c}" for c in LETTERS] + PIECES))

#: words of the tiny GloVe file (as written in the file)
GLOVE_WORDS = ["the", "cat", "dog", "sat", "on", "mat", ".", ",", "runs", "fast", "House", "River"]
GLOVE_DIM = 8


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A random tiny BERT + WordPiece tokenizer saved in a temporary folder."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
    # first positional parameter: vocab_file (transformers 4) or vocab (transformers 5)
    tokenizer = BertTokenizerFast(str(vocab_file), do_lower_case=True, model_max_length=128)
    config = BertConfig(
        vocab_size=len(TINY_VOCAB),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = BertModel(config).eval()
    with torch.no_grad():  # fresh LayerNorms are (1, 0): every state would sum to exactly 0
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def tiny_glove_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A GloVe-format text file (no header) of seeded random vectors for ``GLOVE_WORDS``."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(GLOVE_WORDS), GLOVE_DIM)).astype(np.float32)
    path = tmp_path_factory.mktemp("glove") / "tiny-glove.txt"
    lines = [word + " " + " ".join(f"{value:.6f}" for value in row) for word, row in zip(GLOVE_WORDS, vectors)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def make_sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic sentences of 3 to 12 in-vocabulary words, some with punctuation."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(3, 13)))
        sentences.append(" ".join(words) + str(rng.choice([".", "!", "?", ""])))
    return sentences


def read_glove(path: str | Path) -> dict[str, np.ndarray]:
    """An independent reader of the fixture file: word -> float32 vector."""
    table = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        word, *values = line.split(" ")
        table[word] = np.array(values, dtype=np.float32)
    return table
