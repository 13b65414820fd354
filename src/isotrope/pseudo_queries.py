"""Label-free pseudo-queries cut from a corpus (proxies), and the paired statistics that compare two
encoders or searches on them: what ``--shape auto`` (:mod:`isotrope.autoshape`), the store's
default search (:mod:`isotrope.autofusion`) and ``--model fast``'s fit (:mod:`isotrope.distill_proxy`)
decide with."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from isotrope.sentences import split_sentences

#: the confidence of every paired interval
CONFIDENCE = 0.95


@dataclass(frozen=True)
class PseudoQuery:
    """A label-free query, the index of its only relevant text, and that text as the query sees it
    (``document`` is None when the relevant text is the sample text unchanged)."""

    text: str
    target: int
    document: str | None = None


def _sentences(text: str) -> list[str]:
    return [text[start:end] for start, end in split_sentences(text)]


def passage_query(text: str, rng: random.Random) -> tuple[str, str | None] | None:
    """Inverse cloze: a sentence cut out of a text of >= 3 sentences; the rest is its document."""
    sentences = _sentences(text)
    if len(sentences) < 3:
        return None
    cut = rng.randrange(len(sentences))
    if len(sentences[cut].split()) < 4:
        return None
    return sentences[cut], " ".join(sentences[:cut] + sentences[cut + 1 :])


def lead_query(text: str, rng: random.Random) -> tuple[str, str | None] | None:
    """A title or first sentence as the query for the body that follows it (>= 2 more sentences)."""
    sentences = _sentences(text)
    if len(sentences) < 3 or len(sentences[0].split()) < 4:
        return None
    return sentences[0], " ".join(sentences[1:])


def neighbour_query(text: str, rng: random.Random) -> tuple[str, str | None] | None:
    """A chunk against its neighbour: the text is cut at a sentence boundary into two halves of
    >= 2 sentences; one half (either, at random) is the query, the other its document."""
    sentences = _sentences(text)
    if len(sentences) < 4:
        return None
    middle = len(sentences) // 2
    halves = [" ".join(sentences[:middle]), " ".join(sentences[middle:])]
    first = rng.randrange(2)
    return halves[first], halves[1 - first]


def masked_query(text: str, rng: random.Random, keep: float = 0.6, max_words: int = 16) -> tuple[str, str | None] | None:
    """A shortened, masked passage: a window of at most ``max_words`` words (about 70 % of a short
    text) of which 60 % are kept, in order; its document is the whole text, unchanged."""
    words = text.split()
    if len(words) < 6:
        return None
    width = min(max_words, max(5, round(0.7 * len(words))))
    start = rng.randrange(len(words) - width + 1)
    kept = sorted(rng.sample(range(start, start + width), max(3, round(keep * width))))
    return " ".join(words[i] for i in kept), None


#: label-free proxies, each ``(text, rng) -> (query, its document or None for the text itself) or None``
PROXIES: dict[str, Callable[[str, random.Random], tuple[str, str | None] | None]] = {
    "passage": passage_query,
    "lead": lead_query,
    "neighbour": neighbour_query,
    "masked": masked_query,
}
#: the proxy used unless asked otherwise (its ranking of candidates agreed best with labelled
#: queries, docs/results/auto-shaping.md), and the one that works on any text (one-sentence corpora)
DEFAULT_PROXY = "passage"
FALLBACK_PROXY = "masked"


def build_pseudo_queries(
    texts: Sequence[str], n_queries: int, proxy: str = DEFAULT_PROXY, seed: int = 0, sources: Collection[int] | None = None
) -> list[PseudoQuery]:
    """At most ``n_queries`` pseudo-queries, at most one per text, from texts drawn in a seeded order
    (only from the indices ``sources``, when given)."""
    if proxy not in PROXIES:
        raise ValueError(f"unknown proxy {proxy!r}; choose one of {', '.join(PROXIES)}")
    rng = random.Random(seed)
    order = list(range(len(texts))) if sources is None else sorted(set(sources))
    rng.shuffle(order)
    queries: list[PseudoQuery] = []
    for index in order:
        if len(queries) >= n_queries:
            break
        made = PROXIES[proxy](texts[index], rng)
        if made is not None and made[0].strip() and (made[1] is None or made[1].strip()):
            queries.append(PseudoQuery(made[0], index, made[1]))
    return queries


def number_of_queries(n_texts: int, low: int = 200, high: int = 1000) -> int:
    """Pseudo-queries to draw for a sample of ``n_texts``: a tenth of it, within [low, high]."""
    return int(min(high, max(low, n_texts // 10)))


def reciprocal_ranks_at_10(query_vectors: np.ndarray, document_vectors: np.ndarray, relevant: Sequence[int]) -> np.ndarray:
    """Each query's reciprocal rank of its relevant document, 0 beyond the top 10 (cosine)."""

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

    scores = unit(query_vectors) @ unit(document_vectors).T
    target = scores[np.arange(len(relevant)), relevant]
    ranks = (scores > target[:, None]).sum(axis=1) + 1
    return np.where(ranks <= 10, 1.0 / ranks, 0.0)


def mrr_at_10(query_vectors: np.ndarray, document_vectors: np.ndarray, relevant: Sequence[int]) -> float:
    """Mean reciprocal rank of each query's relevant document within the top 10 (cosine)."""
    return float(reciprocal_ranks_at_10(query_vectors, document_vectors, relevant).mean())


def paired_interval(
    differences: np.ndarray, confidence: float = CONFIDENCE, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of the per-query differences and its percentile-bootstrap interval (queries resampled)."""
    from scipy.stats import bootstrap  # 0.46 s of a cold search's imports: only fitting needs it

    differences = np.asarray(differences, dtype=np.float64)
    mean = float(differences.mean())
    if np.ptp(differences) == 0:
        return mean, mean, mean
    result = bootstrap(
        (differences,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)
