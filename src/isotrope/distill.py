"""``--model fast``: a static token table distilled from a transformer on the corpus's own texts.

One teacher pass over a seeded sample of the fit texts (chunks; ``windows="sentences"`` spends
the budget a small corpus leaves on its chunks' sentences, measured worse than not) gives, per
token, its mean contextual state (the context-averaged table ``T0``; tokens the sample never saw
get the teacher's input embedding mapped into that space) and, per text, its bag of tokens (``A``,
rows normalised to sum 1: the static encoder's mean pooling) and the teacher's own sentence vector
(``Y``). ``A`` and ``Y`` also get pseudo-query rows: each chunk's sentences mapped to the chunk's
teacher vector, so that short queries land near the chunks that hold them. The table is then
fitted to the teacher:

    min_T ||A T - Y||^2 + lam ||T - T0||^2

by conjugate gradients on the normal equations (one joint solve for every output dimension,
Jacobi-preconditioned, started from ``T0``). On chunks held aside from the fit, ``lam`` and the
shaping (:data:`SHAPES`) are chosen together by agreement with the teacher's nearest neighbours, and a
retrieval proxy can veto a candidate (:mod:`isotrope.distill_proxy`: pseudo-queries cut from them, as
``--shape auto`` makes, with a paired bootstrap interval against ``T0`` in the default shaping). With
``--fast-pairs`` (``pair_lambdas``; the encoder passes none without it) a table that also holds rows for the
sample's frequent token pairs (:mod:`isotrope.token_pairs`) is fitted the same way and replaces the pick where
it agrees with the teacher's neighbours nearly as well (:data:`PAIR_GIVE_BACK`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from isotrope.pooling import pool
from isotrope.resources import return_freed_memory, usable_cores
from isotrope.sentences import split_sentences
from isotrope.sparse_rows import RowRanges, shared_workers
from isotrope.token_pairs import TokenPairs

if TYPE_CHECKING:  # scipy and tqdm are imported only where a table is distilled
    from scipy import sparse

    from isotrope.backbones.base import TokenizedBackbone
    from isotrope.backbones.context import ContextSums
    from isotrope.distill_proxy import ProxyQueries, ProxyTexts

logger = logging.getLogger(__name__)

FAST = "fast"
DEFAULT_TEACHER = "all-MiniLM-L6-v2"
#: texts the teacher runs on by default (docs/results/fast.md: the curve against the sample)
DEFAULT_DISTILL_SAMPLES = 10000
#: candidate regularisation strengths, as multiples of the mean diagonal of A^T A
LAMBDAS = (10.0, 3.0, 1.0)
#: candidates halfway between the unfitted table and the fit at each of these strengths (``MIX`` of each), in the
#: shapings other than the default: centred, on one-sentence paraphrases and newsgroup posts, they agree better with
#: the teacher's neighbours and score higher than either end (sick-para 89.92 against 88.58, 20ng-topic 49.25 against
#: 48.20 nDCG@10); in the default shaping they never gained (STS-B + SICK-R 72.32 against 72.35;
#: docs/results/fast-small-corpora.md)
MIX_LAMBDAS = (3.0, 1.0, 0.3)
MIX = 0.5
#: agreement a shaping other than the default must add over the default's best candidate to be chosen: at
#: 2,000 SciFact abstracts a centred mix agreed 0.004 better and scored 2.4 nDCG@10 points lower
SHAPE_MARGIN = 0.02
CG_ITERATIONS = 30
#: the teacher's batches: at most this many texts, and the padded tokens of the encoder's batches
#: (:func:`isotrope.backbones.base.batch_tokens`)
TEACHER_BATCH = 32
HOLDOUT_FRACTION = 0.1
#: what the budget left over by a small corpus is spent on: "none" (the default), or each chunk's "sentences"
#: with their own teacher vectors. Measured worse on every SciFact size (docs/results/fast-small-corpora.md):
#: 62.15 against 64.04 nDCG@10 on the whole corpus, 81.92 against 83.52 on 500 abstracts
WINDOWS = "none"
#: pseudo-query rows: each chunk's sentences (bags of tokens) mapped to the chunk's teacher vector, together
#: weighing this many times the chunk's own row (no teacher cost). nDCG@10 with / without: SciFact 65.09 / 64.04,
#: 2,000 abstracts 74.93 / 73.47, 1,000 80.04 / 78.27 (docs/results/fast-small-corpora.md)
QUERY_WEIGHT = 1.0
#: chunks of fewer sentences get no pseudo-query rows (as the passage proxy cuts queries only from >= 3)
QUERY_MIN_SENTENCES = 3
#: the shapings a fit is tried with (the first is the fast encoder's default, and the unfitted table's): on
#: one-sentence paraphrases and topical newsgroup posts centring beats partial whitening by 2 to 3 nDCG@10
#: points, and the teacher's neighbours say so (docs/results/fast-small-corpora.md)
SHAPES = ("whiten-partial", "center")
#: token-pair rows (:mod:`isotrope.token_pairs`): the fit strengths tried, in the default shaping. A pair table
#: replaces the token table picked when it gives back at most :data:`PAIR_GIVE_BACK` of the agreement with the
#: teacher's neighbours that the pick gained over the unfitted table (the best such strength). Where it did
#: (SciFact and its 1,000 and 2,000 abstracts: 10-16 %) the pairs gained 1.4-3.2 nDCG@10; where it did not (500
#: abstracts, paraphrases, newsgroup posts, STS-B sentences: 28-169 %) they gained nothing or lost up to 4.8
#: points. The pseudo-query proxy is recorded, not asked: it rated the pairs wholly below the pick at 1,000 and
#: 2,000 abstracts (docs/results/fast-pairs.md)
PAIR_LAMBDAS = (1.0,)
PAIR_GIVE_BACK = 0.2
#: rows of the input table mapped at a time (bounds the float64 temporaries)
_ROW_BLOCK = 4096
NEIGHBOURS = 10


def fast_source(model: str) -> str | None:
    """``fast`` -> ``fast:all-MiniLM-L6-v2``; ``fast:<teacher>`` unchanged; None for other names."""
    if model.lower() == FAST:
        return f"{FAST}:{DEFAULT_TEACHER}"
    if model.lower().startswith(f"{FAST}:"):
        teacher = model.split(":", 1)[1]
        if not teacher:
            raise ValueError(f"{model!r}: name the teacher after 'fast:', e.g. fast:{DEFAULT_TEACHER}")
        return f"{FAST}:{teacher}"
    return None


@dataclass
class TeacherPass:
    """What one pass of the teacher over the sample yields."""

    bags: sparse.csr_matrix  # (n, V): each text's non-special tokens, rows summing to 1
    vectors: np.ndarray  # (n, d) float32: the teacher's mean-pooled sentence vectors
    #: context sums over every sampled text and over the held-aside ones alone (V x d float64 each, resident only
    #: in the rows of the tokens they saw: the held-aside texts' are a fraction; taken by :meth:`take_sums`)
    sums: ContextSums | None
    held_sums: ContextSums | None

    def take_sums(self) -> tuple[ContextSums, ContextSums]:
        """The sums over every text and over the held-aside ones, which this pass then no longer holds (their
        memory goes with the caller's references: the solves run without them)."""
        if self.sums is None or self.held_sums is None:
            raise ValueError("the teacher pass's context sums were already taken")
        taken = self.sums, self.held_sums
        self.sums = self.held_sums = None
        return taken


@dataclass
class Distilled:
    """A distilled table (V, d), or (V + pairs, d) with token-pair rows, and what was sampled, tried and chosen."""

    table: np.ndarray
    report: dict[str, Any]
    pairs: TokenPairs | None = None


@dataclass
class Pick:
    """The token table a fit chose: its candidate's name, pseudo-query reciprocal ranks and neighbour agreement."""

    name: str
    row: np.ndarray
    agreement: float
    gain: float  # its agreement over the unfitted table's


@dataclass
class PairRows:
    """The teacher's texts as bags over tokens and token pairs: the rows of a pair table's fit and checks."""

    pairs: TokenPairs
    bags: sparse.csr_matrix  # (texts + pseudo-query rows, V + pairs): the rows of ``TeacherPass.bags``, with pairs
    proxy: ProxyQueries


def pair_rows(
    teacher: TokenizedBackbone,
    sample: Sequence[str],
    n_chunks: int,
    query_weight: float,
    proxy_texts: ProxyTexts,
) -> PairRows | None:
    """The pairs found in at least :data:`isotrope.token_pairs.MIN_CHUNKS` of the sampled chunks, every teacher
    text and pseudo-query row as a bag over tokens and pairs, and the proxy's texts so bagged; None without
    pairs."""
    from scipy import sparse

    from isotrope.distill_proxy import bag_proxy, token_bags

    special = teacher.special_ids()
    sample_ids = teacher.token_ids(list(sample))
    pairs = TokenPairs.found_in(sample_ids[:n_chunks], teacher.vocab_size, special)
    if not len(pairs):
        return None
    vocab = teacher.vocab_size + len(pairs)
    bags = token_bags(pairs.extend(sample_ids), vocab, special)
    if query_weight > 0:
        bags = sparse.vstack(
            [bags, query_rows(sample[:n_chunks], pairs.extending(teacher.token_ids), vocab, special, query_weight)[0]]
        )
    return PairRows(pairs, bags.tocsr(), bag_proxy(proxy_texts, pairs.extending(teacher.token_ids), vocab, special))


def teacher_pass(
    teacher: TokenizedBackbone, texts: Sequence[str], holdout: np.ndarray, show_progress: bool = False
) -> TeacherPass:
    """Run the teacher once over ``texts``, streaming each batch's token states into the context sums (of every
    text, and of the ``holdout`` ones: indices) and keeping only each text's bag of tokens and pooled vector."""
    from scipy import sparse
    from tqdm.auto import tqdm

    from isotrope.backbones.base import batch_tokens
    from isotrope.backbones.context import ContextSums

    held = np.zeros(len(texts), dtype=bool)
    held[holdout] = True
    sums, held_sums = ContextSums(teacher.vocab_size), ContextSums(teacher.vocab_size)
    vectors = np.zeros((len(texts), teacher.dim), dtype=np.float32)
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    values: list[np.ndarray] = []
    with tqdm(total=len(texts), desc="teacher pass", unit="text", disable=not show_progress) as progress:
        for index, batch in teacher.iter_batches(texts, "document", TEACHER_BATCH, batch_tokens(teacher)):
            sums.add(batch)
            if held[index].any():
                held_sums.add(batch, rows=np.flatnonzero(held[index]))
            vectors[index] = pool(batch.states, batch.attention_mask, "mean")
            keep = batch.attention_mask & ~batch.special_mask
            for row, text_index in enumerate(index):
                ids, counts = np.unique(batch.input_ids[row][keep[row]], return_counts=True)
                rows.append(np.full(len(ids), text_index))
                cols.append(ids)
                values.append(counts / max(counts.sum(), 1))
            progress.update(len(index))
    bags = sparse.csr_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(len(texts), teacher.vocab_size)
    )
    return TeacherPass(bags, vectors, sums, held_sums)


def initial_table(sums: ContextSums, input_table: np.ndarray) -> np.ndarray:
    """The context-averaged table, float32 (V, d); tokens never seen get their input embedding mapped
    by the ridge-regression map from input embeddings to context rows fitted on the seen tokens
    (computed in float64)."""
    table = sums.table()
    seen = sums.counts > 0
    if seen.all() or not seen.any():
        return table
    seen_inputs = input_table[seen].astype(np.float64)  # never the whole table in float64: its peak memory
    gram = seen_inputs.T @ seen_inputs
    ridge = 1e-3 * np.trace(gram) / len(gram)
    mapping = np.linalg.solve(gram + ridge * np.eye(len(gram)), seen_inputs.T @ table[seen].astype(np.float64))
    del seen_inputs
    unseen = np.flatnonzero(~seen)
    for begin in range(0, len(unseen), _ROW_BLOCK):
        rows = unseen[begin : begin + _ROW_BLOCK]
        table[rows] = input_table[rows].astype(np.float64) @ mapping
    return table


def lambda_scale(bags: sparse.spmatrix) -> float:
    """Mean diagonal of A^T A over the tokens the texts hold: the unit of ``lam``."""
    diagonal = np.asarray(bags.multiply(bags).sum(axis=0)).ravel()
    return float(diagonal[diagonal > 0].mean())


@dataclass
class RowFit:
    """A solve's table as the rows it moved: ``values`` in place of the rows ``rows`` (sorted token ids) of the
    table it started from, every other row unchanged. Held so, a fit costs its texts' tokens' rows, not a
    V x d copy."""

    rows: np.ndarray
    values: np.ndarray

    def write(self, table: np.ndarray, mix: float = 0.0) -> np.ndarray:
        """Write these rows into ``table`` (the prior they were solved from), in place, and return it;
        with ``mix``, each row becomes ``mix`` of the prior's row and the rest of the fit's."""
        table[self.rows] = mix * table[self.rows] + (1 - mix) * self.values if mix else self.values
        return table

    @contextlib.contextmanager
    def applied(self, table: np.ndarray, mix: float = 0.0) -> Iterator[np.ndarray]:
        """``table`` with these rows written (:meth:`write`) while the block runs, restored after: a candidate
        table to score without copying the prior."""
        kept = table[self.rows]
        try:
            yield self.write(table, mix)
        finally:
            table[self.rows] = kept


def solve_rows(
    bags: sparse.spmatrix,
    targets: np.ndarray,
    table: np.ndarray,
    lam: float,
    iterations: int = CG_ITERATIONS,
    start: np.ndarray | RowFit | None = None,
    tol: float = 1e-6,
    dtype: type = np.float32,
) -> RowFit:
    """min_T ||A T - Y||^2 + lam ||T - T0||^2 by preconditioned conjugate gradients, as the rows that move.

    Only the rows of tokens that occur in ``bags`` move; the others stay at ``T0`` (``table``), so only
    the moved rows are returned. The normal equations (A^T A + lam I) T = A^T Y + lam T0 share one matrix
    across the output dimensions, so all columns are solved as one block system. ``start`` warm-starts
    the solve: a whole table, or the fit of an earlier solve on the same ``bags`` (default ``T0``). The
    products run in ``dtype`` (float32 halves the time of float64), and the rows are returned in it.
    """
    from scipy import sparse
    from scipy.sparse.linalg import LinearOperator, cg

    if lam <= 0:
        raise ValueError(f"lam must be positive, got {lam}")
    bags = sparse.csr_matrix(bags, dtype=dtype)
    used = np.flatnonzero(bags.getnnz(axis=0))
    if isinstance(start, RowFit) and not np.array_equal(start.rows, used):
        raise ValueError("a fit warm-starts only a solve on the same texts' tokens")
    a = bags[:, used].tocsr()
    a_t = a.T.tocsr()
    size, dim = len(used), table.shape[1]
    prior: np.ndarray = table[used].astype(dtype)
    rhs = a_t @ np.asarray(targets, dtype=dtype) + dtype(lam) * prior
    diagonal: np.ndarray = (np.asarray(a.multiply(a).sum(axis=0)).ravel() + lam).astype(dtype)
    threads = usable_cores()

    workers = shared_workers()
    forward, backward = RowRanges(a, threads, workers), RowRanges(a_t, threads, workers)

    def normal_matvec(flat: np.ndarray) -> np.ndarray:
        block = flat.reshape(size, dim)
        return (backward @ (forward @ block) + dtype(lam) * block).ravel()

    operator = LinearOperator((size * dim, size * dim), matvec=normal_matvec, dtype=dtype)
    jacobi = LinearOperator(
        (size * dim, size * dim), dtype=dtype, matvec=lambda flat: (flat.reshape(size, dim) / diagonal[:, None]).ravel()
    )
    x0 = start.values if isinstance(start, RowFit) else prior if start is None else start[used]
    solution, _ = cg(operator, rhs.ravel(), x0=np.asarray(x0, dtype=dtype).ravel(), rtol=tol, maxiter=iterations, M=jacobi)
    return RowFit(used, solution.reshape(size, dim))


def solve_table(
    bags: sparse.spmatrix,
    targets: np.ndarray,
    table: np.ndarray,
    lam: float,
    iterations: int = CG_ITERATIONS,
    start: np.ndarray | None = None,
    tol: float = 1e-6,
    dtype: type = np.float32,
) -> np.ndarray:
    """The whole table :func:`solve_rows` solves for (a copy of ``table`` with the moved rows), in ``dtype``."""
    fit = solve_rows(bags, targets, table, lam, iterations, start, tol, dtype)
    return fit.write(np.array(table, dtype=dtype, copy=True))


def neighbour_agreement(
    train_vectors: np.ndarray, test_vectors: np.ndarray, teacher_vectors: np.ndarray, k: int = NEIGHBOURS, shape: str = SHAPES[0]
) -> float:
    """How often the static vectors of held-aside texts (``shape`` fitted on ``train_vectors``)
    find the same ``k`` nearest held-aside neighbours as the teacher's vectors, in [0, 1]."""
    from isotrope.shapes import build_chain

    vectors = np.asarray(test_vectors, dtype=np.float32)
    fit = np.asarray(train_vectors, dtype=np.float32)
    for transform in build_chain(shape):
        transform.fit(fit)
        fit, vectors = transform.transform(fit), transform.transform(vectors)
    teacher = teacher_vectors / np.maximum(np.linalg.norm(teacher_vectors, axis=1, keepdims=True), 1e-12)
    k = min(k, len(vectors) - 1)
    static_sims, teacher_sims = vectors @ vectors.T, teacher @ teacher.T
    np.fill_diagonal(static_sims, -np.inf)
    np.fill_diagonal(teacher_sims, -np.inf)
    static_top = np.argpartition(-static_sims, k, axis=1)[:, :k]
    teacher_top = np.argpartition(-teacher_sims, k, axis=1)[:, :k]
    overlaps = [len(np.intersect1d(mine, theirs)) for mine, theirs in zip(static_top, teacher_top)]
    return float(np.mean(overlaps)) / k


def _windows(text: str, kind: str) -> list[str]:
    """Sub-chunk windows of ``text``: its sentences (of >= 4 words, when it has >= 2) for ``kind``
    "sentences"; none for "none"."""
    if kind == "sentences":
        sentences = [text[start:end] for start, end in split_sentences(text)]
        return [s for s in sentences if len(s.split()) >= 4] if len(sentences) >= 2 else []
    if kind == "none":
        return []
    raise ValueError(f"unknown window kind {kind!r}: sentences or none")


def teacher_texts(
    texts: Sequence[str], samples: int, rng: np.random.Generator, windows: str = WINDOWS
) -> tuple[list[str], np.ndarray, int]:
    """What the teacher runs on: a seeded sample of at most ``samples`` distinct ``texts`` (chunks),
    then, while the budget has room, a seeded sample of their sub-chunk windows. Returns the texts,
    each one's chunk (its index among the sampled chunks) and the number of chunks (they come first)."""
    unique = list(dict.fromkeys(texts))
    chosen = np.sort(rng.choice(len(unique), size=min(samples, len(unique)), replace=False))
    sample = [unique[i] for i in chosen]
    parents = list(range(len(sample)))
    room = samples - len(sample)
    if room > 0:
        found: dict[str, int] = {}
        for parent, text in enumerate(sample):
            for window in _windows(text, windows):
                found.setdefault(window, parent)
        for text in sample:
            found.pop(text, None)
        pool_ = list(found.items())
        picked = np.sort(rng.choice(len(pool_), size=min(room, len(pool_)), replace=False)) if pool_ else np.zeros(0, np.int64)
        sample += [pool_[i][0] for i in picked]
        parents += [pool_[i][1] for i in picked]
    return sample, np.asarray(parents, dtype=np.int64), len(chosen)


def query_rows(
    chunks: Sequence[str],
    token_ids: Callable[[list[str]], list[list[int]]],
    vocab_size: int,
    special: np.ndarray,
    weight: float,
) -> tuple[sparse.csr_matrix, np.ndarray, np.ndarray]:
    """Pseudo-query rows: each chunk's sentences as bags of the ids ``token_ids`` gives, to be mapped to the
    chunk's own teacher vector (short queries should land near the chunks that hold them). Each row is scaled by
    ``sqrt(weight / k)`` (``k``: its chunk's sentences; chunks of fewer than :data:`QUERY_MIN_SENTENCES`
    get none), so a chunk's rows weigh ``weight`` times its own
    row in the least squares. Returns the scaled bags, each row's chunk and its scale."""
    from isotrope.distill_proxy import token_bags

    sentences, parents = query_sentences(chunks)
    bags = token_bags(token_ids(sentences) if sentences else [], vocab_size, special)
    scale = np.sqrt(weight / np.bincount(parents)[parents]) if len(parents) else np.zeros(0)
    return bags.multiply(scale[:, None]).tocsr(), parents, scale


def query_sentences(chunks: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """The sentences of each chunk of at least :data:`QUERY_MIN_SENTENCES` (a one-sentence chunk's own row is its
    query), and each one's chunk: the texts of :func:`query_rows`."""
    sentences: list[str] = []
    parents: list[int] = []
    for parent, chunk in enumerate(chunks):
        found = [window for window in _windows(chunk, "sentences") if window != chunk]
        if len(found) >= QUERY_MIN_SENTENCES:
            sentences += found
            parents += [parent] * len(found)
    return sentences, np.asarray(parents, dtype=np.int64)


def text_key(text: str) -> str:
    """A short stable key of a chunk's text (the held-aside chunks are named by it in the report)."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=6).hexdigest()


def held_aside_count(n_chunks: int) -> int:
    """Chunks held aside to choose the fit: a tenth, at least 200 (at most 30 %) and at most 1,000;
    none below 100 chunks."""
    if n_chunks < 100:
        return 0
    return int(min(1000, max(round(HOLDOUT_FRACTION * n_chunks), min(200, round(0.3 * n_chunks)))))


def distill_table(
    teacher: TokenizedBackbone,
    texts: Sequence[str],
    input_table: np.ndarray | Callable[[], np.ndarray],
    *,
    samples: int = DEFAULT_DISTILL_SAMPLES,
    seed: int = 0,
    lambdas: Sequence[float] = LAMBDAS,
    mixes: Sequence[float] = MIX_LAMBDAS,
    pair_lambdas: Sequence[float] = PAIR_LAMBDAS,
    iterations: int = CG_ITERATIONS,
    windows: str = WINDOWS,
    query_weight: float = QUERY_WEIGHT,
    margin: float | None = None,
    shapes: Sequence[str] = SHAPES,
    show_progress: bool = False,
) -> Distilled:
    """The distilled table, float32, and a report of what was sampled, tried and chosen.

    ``input_table``: the teacher's input embeddings (V, d), or a function that loads them (called after the
    teacher's pass). Memory: ``teacher`` is dropped after its pass (the caller should hold no other reference, as
    :meth:`StaticBackbone.fit` does not), the context sums as soon as their tables are built and a loaded input
    table once the tables that need it are built, so the solves run without the transformer, its accumulators
    and its inputs; every table and target here is float32 (the solves run in float32 anyway), and each fit is
    kept as the rows it moved (:class:`RowFit`). The tables tried are the fit at each of ``lambdas``, in each
    of ``shapes``, and, for each of ``mixes``, :data:`MIX` of the unfitted table and the rest of the fit at that
    strength, in each of ``shapes`` but the first. A table in a shaping is a candidate when its shaped static
    vectors of the held-aside chunks find the teacher's nearest neighbours better than the unfitted table's do in
    the first shaping (:func:`neighbour_agreement`) and its pseudo-query MRR@10 interval against that unfitted
    table does not lie wholly below ``margin`` (default :data:`isotrope.distill_proxy.MARGIN`: the proxy's veto).
    The candidate of best agreement in the first shaping is kept, unless one in another shaping agrees better by
    more than :data:`SHAPE_MARGIN`; the unfitted table when none is a candidate. Then a table with token-pair rows
    (:mod:`isotrope.token_pairs`), fitted at each of ``pair_lambdas`` in the first shaping, replaces the pick
    when it gives back at most :data:`PAIR_GIVE_BACK` of the agreement the pick gained over the unfitted table. The report's ``shape`` names the shaping to fit with the table
    (:meth:`isotrope.encoder.ShapedEncoder.adopt_distilled_shape`).
    """
    from isotrope.distill_proxy import MARGIN, bag_proxy, proxy_texts, reciprocal_ranks
    from isotrope.pseudo_queries import paired_interval

    rng = np.random.default_rng(seed)
    sample, parents, n_chunks = teacher_texts(texts, samples, rng, windows)
    n_held = held_aside_count(n_chunks)
    held_chunks = np.sort(rng.choice(n_chunks, size=n_held, replace=False)) if n_held else np.zeros(0, dtype=np.int64)
    held = np.isin(parents, held_chunks)  # held-aside chunks and their windows: out of every validation fit
    made = proxy_texts([sample[i] for i in held_chunks], seed)  # cut once, bagged by tokens (and by pairs)
    proxy = None if made is None else bag_proxy(made, teacher.token_ids, teacher.vocab_size, teacher.special_ids())
    logger.info(
        "fast: teacher pass over %d texts (%d of %d chunks, %d %s windows; %d chunks held aside to choose the fit)",
        len(sample),
        n_chunks,
        len(dict.fromkeys(texts)),
        len(sample) - n_chunks,
        windows,
        n_held,
    )
    extra = (
        query_rows(sample[:n_chunks], teacher.token_ids, teacher.vocab_size, teacher.special_ids(), query_weight)
        if query_weight > 0
        else None
    )
    paired = (
        pair_rows(teacher, sample, n_chunks, query_weight, made)
        if made is not None and pair_lambdas and (lambdas or mixes)
        else None
    )
    passed = teacher_pass(teacher, sample, np.flatnonzero(held), show_progress)
    texts_sampled = sample[:n_chunks]
    del teacher, sample
    return_freed_memory()  # the transformer's weights and activations go before the tables are built and solved
    report: dict[str, Any] = {
        "teacher_texts": len(passed.vectors),
        "chunks": n_chunks,
        "windows": len(passed.vectors) - n_chunks,
        "held_aside": n_held,
    }
    sums, held_sums = passed.take_sums()
    inputs = input_table() if callable(input_table) else input_table
    del input_table  # only ``inputs`` holds a loaded table now: it goes once the priors are built
    final_prior = initial_table(sums, inputs)
    if extra is not None:  # pseudo-query rows: a chunk's sentences -> the chunk's teacher vector
        from scipy import sparse

        extra_bags, extra_parents, extra_scale = extra
        passed.bags = sparse.vstack([passed.bags, extra_bags]).tocsr()
        passed.vectors = np.vstack([passed.vectors, extra_scale.astype(np.float32)[:, None] * passed.vectors[extra_parents]])
        held = np.concatenate([held, np.isin(extra_parents, held_chunks)])
        report["query_rows"] = len(extra_parents)
    if proxy is None or not (lambdas or mixes):
        reason = "no fit strength to try" if proxy else f"{n_chunks} chunks give too few pseudo-queries to check a fit"
        report.update(fitted=False, shape=SHAPES[0], reason=f"{reason}: unfitted context table")
        return Distilled(final_prior, report)
    train = np.flatnonzero(~held)
    train_bags = passed.bags[train]
    train_targets = passed.vectors[train]
    fit_chunks = np.setdiff1d(np.arange(n_chunks), held_chunks)
    chunk_bags = passed.bags[fit_chunks].astype(np.float32)  # whiten-partial's fit
    sums.subtract(held_sums)  # the sums over the fitting texts: the held-aside ones' tokens stay out of the prior
    prior = initial_table(sums, inputs)
    del sums, held_sums, inputs
    scale = lambda_scale(train_bags)
    held_bags, held_targets = passed.bags[held_chunks].astype(np.float32), passed.vectors[held_chunks].astype(np.float64)

    def agreement(
        table: np.ndarray, shape: str, bags: sparse.csr_matrix = chunk_bags, held: sparse.csr_matrix = held_bags
    ) -> float:
        return neighbour_agreement(bags @ table, held @ table, held_targets, shape=shape)

    # candidates: the unfitted table in the default shaping, then each table in each shaping ("3", "3 center",
    # "mix 1": MIX of the unfitted table and the rest of the fit at lam 1); each fit is kept as the rows it moved
    # and scored written into the prior (restored after), so no candidate costs a copy of the table
    names, rows, agreements = ["unfitted"], [reciprocal_ranks(prior, chunk_bags, proxy)], [agreement(prior, SHAPES[0])]
    candidates: list[tuple[float, bool, str]] = [(0.0, False, SHAPES[0])]  # (lam, mixed, shaping)
    fits: dict[float, RowFit] = {}
    fit: RowFit | None = None
    for relative in sorted(set(lambdas) | set(mixes), reverse=True):  # strongest first: each solve warm-starts the next
        fit = fits[relative] = solve_rows(train_bags, train_targets, prior, relative * scale, iterations, start=fit)
        tried = ([False] if relative in lambdas else []) + ([True] if relative in mixes else [])
        for mixed in tried:
            with fit.applied(prior, MIX if mixed else 0.0) as tried_table:
                for shape in shapes[1:] if mixed else shapes:
                    name = f"mix {relative:g}" if mixed else f"{relative:g}"
                    names.append(name if shape == SHAPES[0] else f"{name} {shape}")
                    rows.append(reciprocal_ranks(tried_table, chunk_bags, proxy, shape))
                    agreements.append(agreement(tried_table, shape))
                    candidates.append((relative, mixed, shape))
                    _log_candidate(names[-1], scale, agreements, rows)
    margin = MARGIN if margin is None else margin
    comparisons = [paired_interval(100 * (row - rows[0]), seed=seed) for row in rows[1:]]
    report["validation"] = {
        "agreement": {name: round(value, 4) for name, value in zip(names, agreements)},
        "proxy": proxy.proxy,
        "pseudo_queries": len(proxy.targets),
        "mrr@10": {name: round(100 * float(row.mean()), 2) for name, row in zip(names, rows)},
        "vs_unfitted": {name: [round(m, 2), round(lo, 2), round(hi, 2)] for name, (m, lo, hi) in zip(names[1:], comparisons)},
    }
    better = [i for i in range(1, len(names)) if agreements[i] > agreements[0]]
    kept = [i for i in better if comparisons[i - 1][2] >= margin]  # the proxy vetoes a fit wholly below the margin
    vetoed = ", ".join(
        f"lam {names[i]} {comparisons[i - 1][0]:+.2f} [{comparisons[i - 1][1]:.2f}, {comparisons[i - 1][2]:.2f}]"
        for i in better
        if i not in kept
    )
    where = f"on {len(proxy.targets)} {proxy.proxy} pseudo-queries, MRR@10 against the unfitted table, 95% paired bootstrap"
    chosen = _choose(kept, agreements, [candidates[i][2] == SHAPES[0] for i in range(len(candidates))]) if kept else 0
    pick = Pick(names[chosen], rows[chosen], agreements[chosen], agreements[chosen] - agreements[0])
    pair_fit = (
        _pair_candidate(
            paired,
            prior,
            (train, fit_chunks, held_chunks),
            train_targets,
            pair_lambdas,
            iterations,
            pick,
            agreement,
            report,
            seed,
        )
        if paired is not None
        else None
    )
    if pair_fit is None and not kept:
        reason = (
            f"every fit that beat the unfitted table's agreement with the teacher's neighbours ({agreements[0]:.4f}) lies wholly "
            f"below {margin:+g} {where}: {vetoed}"
            if better
            else f"no fit beat the unfitted table's agreement with the teacher's neighbours ({agreements[0]:.4f})"
        )
        report.update(fitted=False, shape=SHAPES[0], reason=f"{reason}: unfitted context table")
        logger.info("fast: %s", report["reason"])
        return Distilled(final_prior, report)
    if pair_fit is None:
        mean, low, high = comparisons[chosen - 1]
        relative, mixed, shape = candidates[chosen]
        report.update(
            fitted=True,
            lam=relative,
            mix=MIX if mixed else 0.0,
            lam_scale=scale,
            shape=shape,
            reason=f"lam {names[chosen]}: neighbour agreement {agreements[0]:.4f} -> {agreements[chosen]:.4f}, the best of the "
            f"candidates not vetoed; {mean:+.2f} [{low:.2f}, {high:.2f}] {where}" + (f" (vetoed: {vetoed})" if vetoed else ""),
        )
        logger.info("fast: %s", report["reason"])
        # the chosen fit warm-starts the final one, on every text and the token table's prior over them
        all_bags, final_table, start, mix = passed.bags, final_prior, fits[relative].write(prior), report["mix"]
        kept_pairs = None
    else:
        relative, start, chosen_pairs = pair_fit
        kept_pairs = chosen_pairs.pairs
        # the held-aside chunks' own rows stay in as bags of tokens alone: with their pairs they taught the pair rows
        # their phrases, and the default-search calibration's pseudo-queries, cut from them, then rated dense 11 points
        # higher on SciFact and chose it over hybrid (docs/results/hybrid-default.md)
        all_bags = _tokens_only(chosen_pairs.bags, passed.bags, held_chunks)
        final_table, mix = chosen_pairs.pairs.prior(final_prior), 0.0
    del prior, fit, fits, train_bags, train_targets
    final_rows = _final_rows(held, len(parents))
    report["held_aside_chunks"] = [text_key(texts_sampled[i]) for i in held_chunks]
    final_bags = all_bags[final_rows]
    final = solve_rows(
        final_bags, passed.vectors[final_rows], final_table, relative * lambda_scale(final_bags), iterations, start=start
    )
    del start
    return Distilled(final.write(final_table, mix), report, kept_pairs)


def _tokens_only(pair_bags: sparse.csr_matrix, token_bags: sparse.csr_matrix, rows: np.ndarray) -> sparse.csr_matrix:
    """``pair_bags`` with its ``rows`` replaced by those of ``token_bags`` (no pair column)."""
    from scipy import sparse

    padded = sparse.hstack([token_bags[rows], sparse.csr_matrix((len(rows), pair_bags.shape[1] - token_bags.shape[1]))])
    order = np.arange(pair_bags.shape[0])
    order[rows] = pair_bags.shape[0] + np.arange(len(rows))
    return sparse.vstack([pair_bags, padded]).tocsr()[order]


def _final_rows(held: np.ndarray, n_texts: int) -> np.ndarray:
    """The rows of the final fit: every teacher text, and the pseudo-query rows of the chunks not held aside (the
    held-aside chunks' sentences are then queries the table never learned, for the store's default-search
    calibration, :mod:`isotrope.autofusion`)."""
    return np.flatnonzero(~held | (np.arange(len(held)) < n_texts))


def _log_candidate(name: str, scale: float, agreements: list[float], rows: list[np.ndarray]) -> None:
    logger.info(
        "fast: %s (lam x %.3g): neighbour agreement %.4f (unfitted %.4f), pseudo-query MRR@10 %.4f (unfitted %.4f)",
        name,
        scale,
        agreements[-1],
        agreements[0],
        rows[-1].mean(),
        rows[0].mean(),
    )


def _pair_candidate(
    paired: PairRows,
    prior: np.ndarray,
    split: tuple[np.ndarray, np.ndarray, np.ndarray],
    targets: np.ndarray,
    lambdas: Sequence[float],
    iterations: int,
    pick: Pick,
    agreement: Callable[..., float],
    report: dict[str, Any],
    seed: int,
) -> tuple[float, np.ndarray, PairRows] | None:
    """Fit the pair table at each of ``lambdas`` (from ``prior``, the token prior, with the pairs' rows) and score it
    against the token table picked; the pair table kept (the best agreement of those that give back at most
    :data:`PAIR_GIVE_BACK` of the pick's gain) as its strength, its table and ``paired``, or None. Records every
    figure in ``report``, the pseudo-query proxy's comparison with the pick included."""
    from isotrope.distill_proxy import reciprocal_ranks
    from isotrope.pseudo_queries import paired_interval

    train, fit_chunks, held_chunks = split  # the fit's rows, the chunks whitening is fitted on, the held-aside ones
    prior = paired.pairs.prior(prior)
    bags = paired.bags[train]
    chunk_bags = paired.bags[fit_chunks].astype(np.float32)
    held_bags = paired.bags[held_chunks].astype(np.float32)
    scale = lambda_scale(bags)
    validation = report["validation"]
    fit: RowFit | None = None
    kept: list[tuple[float, float, RowFit]] = []  # (agreement, lam, fit)
    compared = {}
    for relative in sorted(lambdas, reverse=True):
        fit = solve_rows(bags, targets, prior, relative * scale, iterations, start=fit)
        name = f"pairs {relative:g}"
        with fit.applied(prior) as table:
            row = reciprocal_ranks(table, chunk_bags, paired.proxy)
            agreed = agreement(table, SHAPES[0], chunk_bags, held_bags)
        mean, low, high = paired_interval(100 * (row - pick.row), seed=seed)
        validation["agreement"][name] = round(agreed, 4)
        validation["mrr@10"][name] = round(100 * float(row.mean()), 2)
        compared[name] = [round(mean, 2), round(low, 2), round(high, 2)]
        logger.info(
            "fast: %s (lam x %.3g, %d pairs): neighbour agreement %.4f (%s %.4f), pseudo-query MRR@10 %+.2f [%.2f, %.2f] against it",
            name, scale, len(paired.pairs), agreed, pick.name, pick.agreement, mean, low, high,
        )  # fmt: skip
        if _given_back(agreed, pick) <= PAIR_GIVE_BACK:
            kept.append((agreed, relative, fit))
    validation["pairs_vs_pick"] = {"pick": pick.name, **compared}
    report["pairs"] = {"rows": len(paired.pairs), "chosen": bool(kept)}
    if not kept:
        return None
    agreed, relative, fit = max(kept, key=lambda entry: (entry[0], entry[1]))
    mean, low, high = compared[f"pairs {relative:g}"]
    report.update(
        fitted=True,
        lam=relative,
        mix=0.0,
        lam_scale=scale,
        shape=SHAPES[0],
        reason=f"pairs {relative:g}: {len(paired.pairs)} token-pair rows, neighbour agreement {agreed:.4f} against the token "
        f"table's pick ({pick.name}) {pick.agreement:.4f}, giving back {_given_back(agreed, pick):.0%} of its gain over the "
        f"unfitted table (at most {PAIR_GIVE_BACK:.0%}); pseudo-query MRR@10 {mean:+.2f} [{low:.2f}, {high:.2f}] against "
        "it (95% paired bootstrap, not asked)",
    )
    logger.info("fast: %s", report["reason"])
    return relative, fit.write(prior), paired


def _given_back(agreement: float, pick: Pick) -> float:
    """The share of ``pick``'s agreement gain over the unfitted table that a table of ``agreement`` gives back (0 when
    it agrees at least as well; infinite when it agrees less with a pick that gained nothing)."""
    lost = pick.agreement - agreement
    if lost <= 0:
        return 0.0
    return lost / pick.gain if pick.gain > 0 else float("inf")


def _choose(kept: list[int], agreements: list[float], default_shape: list[bool]) -> int:
    """Of the candidates ``kept`` (not empty), the one of best agreement in the default shaping (the strongest
    of equals), unless one in another shaping agrees better by more than :data:`SHAPE_MARGIN` or none is in the
    default shaping (then the best of the others)."""

    def key(i: int) -> tuple[float, int]:
        return agreements[i], -i

    defaults = [i for i in kept if default_shape[i]]
    others = [i for i in kept if not default_shape[i]]
    if not defaults:
        return max(others, key=key)
    default = max(defaults, key=key)
    if others and agreements[max(others, key=key)] > agreements[default] + SHAPE_MARGIN:
        return max(others, key=key)
    return default
