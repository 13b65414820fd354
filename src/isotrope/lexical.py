"""The one text analyzer behind every store's lexical (BM25) index, and the BM25 both stores rank by.

Both stores index the *output* of :func:`analyze` (space-joined terms) with a tokenizer that only
splits on spaces, so the FAISS store's keyword index and LanceDB see the same terms for the same text
and the same query:

* Unicode NFKD, combining marks dropped (``café`` -> ``cafe``), lower case;
* tokens are runs of letters and digits (as LanceDB's ``simple`` tokenizer); tokens longer
  than 40 characters are dropped (LanceDB's default ``max_token_length``);
* English stop words removed: the 33-word Lucene/tantivy list LanceDB's English index uses;
* the Snowball English stemmer (PyStemmer; the stemmer of LanceDB's English index and bm25s).

A query is analyzed the same way; its *distinct* terms are OR-ed (a repeated query term counts once:
the stores are given the distinct terms, so no engine's handling of repeats matters). Nothing a user
types is query syntax: quotes, ``-``, ``*``, ``AND``, ``NEAR`` are punctuation or words.

The one BM25 (Lucene's, LanceDB's native FTS), over the live rows that have terms (a deleted row, or
one without terms, counts in no statistic): N rows, ``n_t`` of them holding term t, ``dl`` a row's
analyzed-token count, ``avgdl`` their mean; ``idf_t = ln(1 + (N - n_t + 0.5) / (n_t + 0.5))``, k1 = 1.2,
b = 0.75; score = sum over the query's distinct terms of ``idf_t * tf * (k1 + 1) / (tf + k1 * (1 - b +
b * dl / avgdl))``. :func:`bm25_scores` computes it in float64 as the test reference.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np

#: Lucene's (and tantivy's) default English stop words
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "if",
        "in",
        "into",
        "is",
        "it",
        "no",
        "not",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "will",
        "with",
    ]
)
MAX_TOKEN_LENGTH = 40
K1 = 1.2
B = 0.75
_TOKEN = re.compile(r"[^\W_]+")


@functools.lru_cache(maxsize=1)
def _stemmer():
    try:
        import Stemmer
    except ImportError as error:  # pragma: no cover - a dependency of the package
        raise ImportError("lexical search needs PyStemmer: pip install PyStemmer") from error
    return Stemmer.Stemmer("english")


def _fold(text: str) -> str:
    if text.isascii():
        return text.lower()
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).lower()


def analyze(text: str | None) -> list[str]:
    """The index terms of ``text``, in order (repeats kept)."""
    if not text:
        return []
    words = [w for w in _TOKEN.findall(_fold(text)) if len(w) <= MAX_TOKEN_LENGTH and w not in STOP_WORDS]
    return _stemmer().stemWords(words)


def index_text(text: str | None) -> str:
    """What the engines index: the analyzed terms joined by spaces."""
    return " ".join(analyze(text))


def query_terms(query: str) -> list[str]:
    """The distinct terms of a query, in first-seen order (empty: nothing to match)."""
    return list(dict.fromkeys(analyze(query)))


def bm25_scores(documents: Sequence[Sequence[str]], terms: Sequence[str]) -> np.ndarray:
    """BM25 of each analyzed (live) document for the distinct query ``terms`` (float64; 0 where none matches).
    Documents without terms count in neither N nor the average length."""
    scores = np.zeros(len(documents))
    lengths = np.array([len(d) for d in documents], dtype=np.float64)
    n_docs = int((lengths > 0).sum())
    if n_docs == 0:
        return scores
    average = lengths.sum() / n_docs
    counts = [Counter(d) for d in documents]
    for term in dict.fromkeys(terms):
        tf = np.array([c.get(term, 0) for c in counts], dtype=np.float64)
        df = float((tf > 0).sum())
        if df == 0:
            continue
        weight = np.log1p((n_docs - df + 0.5) / (df + 0.5))
        scores += weight * tf * (K1 + 1) / (tf + K1 * (1 - B + B * lengths / average))
    return scores


def bm25_matrix(
    documents: Sequence[Sequence[str]], queries: Sequence[Sequence[str]], scored: Sequence[Sequence[str]] | None = None
) -> np.ndarray:
    """BM25 (Lucene IDF) of each query's distinct terms against each of the ``scored`` documents (default:
    ``documents``), with the statistics (N, document frequencies, average length) of ``documents``:
    :func:`bm25_scores` for many queries at once, as a sparse product (queries x scored, float64)."""
    from scipy.sparse import csr_matrix

    vocabulary: dict[str, int] = {}
    for document in documents:
        for term in document:
            vocabulary.setdefault(term, len(vocabulary))

    def counts(texts: Sequence[Sequence[str]], distinct: bool) -> csr_matrix:
        rows, columns = [], []
        for row, terms in enumerate(texts):
            known = [vocabulary[t] for t in (dict.fromkeys(terms) if distinct else terms) if t in vocabulary]
            rows.extend([row] * len(known))
            columns.extend(known)
        shape = (len(texts), len(vocabulary))
        matrix = csr_matrix((np.ones(len(rows)), (rows, columns)), shape=shape)
        matrix.sum_duplicates()
        return matrix

    corpus = counts(documents, distinct=False)
    lengths = np.array([len(d) for d in documents], dtype=np.float64)
    n_docs = int((lengths > 0).sum())
    if n_docs == 0 or not vocabulary:
        return np.zeros((len(queries), len(documents if scored is None else scored)))
    df = np.bincount(corpus.indices, minlength=len(vocabulary)).astype(np.float64)
    idf = np.log1p((n_docs - df + 0.5) / (df + 0.5))
    target = corpus if scored is None else counts(scored, distinct=False)
    target_lengths = lengths if scored is None else np.array([len(d) for d in scored], dtype=np.float64)
    norm = K1 * (1 - B + B * target_lengths / (lengths.sum() / n_docs))
    tf = target.tocoo()
    weights = idf[tf.col] * tf.data * (K1 + 1) / (tf.data + norm[tf.row])
    weighted = csr_matrix((weights, (tf.row, tf.col)), shape=target.shape)
    return np.asarray((counts(queries, distinct=True) @ weighted.T).todense())
