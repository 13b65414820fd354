"""The retrieval proxy that chooses a ``--model fast`` fit: pseudo-queries cut from held-aside chunks.

Agreement with the teacher on held-aside texts rises with every fit, even one that overfits a small
sample and ranks worse than the unfitted table (docs/RESULTS.md, section 12). What the table is for is
retrieval, so each candidate table (the unfitted one and one per ``lam``) is scored on the pseudo-queries
``--shape auto`` makes (:mod:`isotrope.autoshape`: a sentence cut out of a held-aside chunk must find
the rest of it among every chunk of the sample; one-sentence texts fall back to masked passages), encoded
as the fast encoder encodes (mean of the table's rows over the non-special tokens, then
``whiten-partial`` fitted on the fit chunks' vectors, then cosine). Every candidate answers the same
queries, so the comparison with the unfitted table is paired (:func:`isotrope.pseudo_queries.paired_interval`):
the fit with the best mean is kept unless its 95 % interval of the MRR@10 difference lies wholly below
:data:`MARGIN`. Fitting is the default and the proxy a veto, not a gate: on SciFact's 500-abstract subset the
proxy put the fits 0.5-1.7 MRR points below the unfitted table (intervals across zero) while the labelled
nDCG@10 of the fit was 1.95 above it (docs/results/fast-small-corpora.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from isotrope.pseudo_queries import DEFAULT_PROXY, FALLBACK_PROXY, build_pseudo_queries, reciprocal_ranks_at_10

if TYPE_CHECKING:
    from scipy import sparse

#: fewer passage pseudo-queries than this fall back to masked ones (as ``--shape auto`` does)
MIN_QUERIES = 30
#: MRR@10 points (x100) below which the whole interval of the best fit's difference must lie to refuse the fit
MARGIN = 0.0


def token_bags(ids: Sequence[Sequence[int]], vocab_size: int, special: np.ndarray) -> sparse.csr_matrix:
    """(len(ids), vocab_size) rows summing to 1 over each text's non-special tokens (empty texts: zero rows)."""
    from scipy import sparse

    rows, cols, values = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0)]
    for row, text_ids in enumerate(ids):
        kept = np.asarray(text_ids, dtype=np.int64)
        kept = kept[~np.isin(kept, special)]
        if kept.size:
            tokens, counts = np.unique(kept, return_counts=True)
            rows.append(np.full(len(tokens), row))
            cols.append(tokens)
            values.append(counts / counts.sum())
    return sparse.csr_matrix((np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(len(ids), vocab_size))


@dataclass
class ProxyQueries:
    """Pseudo-queries over held-aside chunks, as bags of tokens, and the chunk each must find."""

    queries: sparse.csr_matrix
    documents: sparse.csr_matrix
    targets: np.ndarray
    proxy: str


def make_proxy(
    held_texts: Sequence[str], tokenize: Callable[[list[str]], list[list[int]]], vocab_size: int, special: np.ndarray, seed: int
) -> ProxyQueries | None:
    """One pseudo-query per held-aside chunk where the passage proxy can cut one (else the masked
    proxy); None when even that gives fewer than :data:`MIN_QUERIES`."""
    texts = proxy_texts(held_texts, seed)
    return None if texts is None else bag_proxy(texts, tokenize, vocab_size, special)


ProxyTexts = tuple[str, list[str], list[str], np.ndarray]


def bag_proxy(
    texts: ProxyTexts, tokenize: Callable[[list[str]], list[list[int]]], vocab_size: int, special: np.ndarray
) -> ProxyQueries:
    """The pseudo-queries and documents of :func:`proxy_texts` as bags of the ids ``tokenize`` gives."""
    proxy, queries, documents, targets = texts
    return ProxyQueries(
        token_bags(tokenize(queries), vocab_size, special).astype(np.float32),
        token_bags(tokenize(documents), vocab_size, special).astype(np.float32),
        targets,
        proxy,
    )


def proxy_texts(held_texts: Sequence[str], seed: int) -> ProxyTexts | None:
    """The texts of :func:`make_proxy`: its proxy's name, the pseudo-queries, the held-aside chunks as the queries
    search them (a passage query's chunk without the sentence cut from it) and each query's chunk."""
    for proxy in (DEFAULT_PROXY, FALLBACK_PROXY):
        made = build_pseudo_queries(held_texts, len(held_texts), proxy, seed=seed)
        if len(made) >= MIN_QUERIES:
            documents = list(held_texts)
            for query in made:
                documents[query.target] = query.document if query.document is not None else documents[query.target]
            return proxy, [q.text for q in made], documents, np.array([q.target for q in made])
    return None


def fitted_chain(shape: str, vectors: np.ndarray) -> list[Any]:
    """The transforms of ``shape``, each fitted on ``vectors`` as the steps before it leave them."""
    from isotrope.shapes import build_chain

    chain = build_chain(shape)
    for position, transform in enumerate(chain):
        transform.fit(vectors)
        if position + 1 < len(chain):
            vectors = transform.transform(vectors)
    return chain


def reciprocal_ranks(
    table: np.ndarray, fit_bags: sparse.csr_matrix, proxy: ProxyQueries, shape: str = "whiten-partial"
) -> np.ndarray:
    """Each pseudo-query's reciprocal rank at 10 with ``table``, ``shape`` fitted on ``fit_bags @ table``
    (the fit chunks), among the held-aside chunks and the fit chunks (distractors, as a corpus has)."""
    from scipy import sparse

    from isotrope.transforms.base import apply_chain

    chain = fitted_chain(shape, np.asarray(fit_bags @ table, dtype=np.float32))
    queries = apply_chain(chain, np.asarray(proxy.queries @ table, dtype=np.float32))
    documents = apply_chain(chain, np.asarray(sparse.vstack([proxy.documents, fit_bags]) @ table, dtype=np.float32))
    return reciprocal_ranks_at_10(queries, documents, proxy.targets.tolist())
