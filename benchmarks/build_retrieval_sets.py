"""Build small labelled retrieval sets (BEIR folders) from the labelled data in shared/data, to measure
``--shape auto`` on more than SciFact.

* ``20ng-topic``: retrieval by topic. A query is the first lines of a 20 Newsgroups test post's body
  (headers, quoted replies and signatures dropped, at most 40 words); the corpus is the bodies of other
  test posts (first 1,000 characters), and every post of the query's newsgroup is relevant (grade 1). Query posts are never
  in the corpus.
* ``stsb-para`` / ``sick-para``: retrieval by paraphrase. For each pair whose gold score is high
  (STS-B >= 4.0 of 5, SICK >= 4.5 of 5) and whose sentences differ, sentence 1 is the query and
  sentence 2 its relevant document; every other sentence of the data set is a distractor. A
  sentence used as a query is never a document.
* ``scifact-N`` (with ``--scifact-sizes``): small corpora for ``--model fast``. N SciFact abstracts: every
  abstract a test query judges relevant, then a seeded random sample of the others; the test queries
  and their judgements unchanged.
* ``scifact-lower``: SciFact's test queries and qrels over its corpus written as some public collections
  are, in lower case with ``" . "`` between sentences (issue 31: text where a sentence splitter that needs
  capitals finds one sentence per document).
* ``scifact-questions``: SciFact's corpus with questions written here as a user would ask them
  (``benchmarks/questions/scifact_questions.tsv``: each written from one abstract, which is its one
  relevant document; other abstracts may answer it too, so the scores are a lower bound).

    .venv/bin/python benchmarks/build_retrieval_sets.py --data-dir ../shared/data --out .cache/isotrope/sets \
        --scifact-sizes 500 1000 2000
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from isotrope.evaluate.data import STSPairs, load_beir, load_clustering, load_sick, load_stsb

_HEADER = re.compile(r"^[A-Za-z-]+: ")


def post_body(text: str, max_chars: int = 1000) -> str:
    """A newsgroup post without its header block, quoted lines, or signature separator and after."""
    _, _, body = text.partition("\n\n")
    lines = []
    for line in body.splitlines():
        stripped = line.strip()
        if stripped in ("--", "-- "):
            break
        if stripped.startswith((">", "|", ":")) or (_HEADER.match(stripped) and "writes" not in stripped):
            continue
        if re.search(r"(writes|wrote):$", stripped) or stripped.startswith("In article") or not stripped:
            continue
        lines.append(re.sub(r"\S+@\S+", "", stripped))
    return " ".join(" ".join(lines).split())[:max_chars]


def newsgroups_topic(data_dir: Path, n_docs: int, n_queries: int, seed: int) -> tuple[dict, dict, dict]:
    data = load_clustering(data_dir / "clustering/20newsgroups/20news_bydate.jsonl.gz", split="test")
    rng = random.Random(seed)
    posts = [
        (body, label) for body, label in ((post_body(t), y) for t, y in zip(data.texts, data.labels)) if len(body.split()) >= 20
    ]
    rng.shuffle(posts)
    query_posts, doc_posts = posts[:n_queries], posts[n_queries : n_queries + n_docs]
    corpus = {f"d{i}": {"title": "", "text": body} for i, (body, _) in enumerate(doc_posts)}
    queries = {f"q{i}": " ".join(body.split()[:40]) for i, (body, _) in enumerate(query_posts)}
    qrels = {
        f"q{i}": {f"d{j}": 1 for j, (_, doc_label) in enumerate(doc_posts) if doc_label == label}
        for i, (_, label) in enumerate(query_posts)
    }
    return corpus, queries, qrels


def paraphrase(sets: list[STSPairs], threshold: float, n_docs: int, n_queries: int, seed: int) -> tuple[dict, dict, dict]:
    rng = random.Random(seed)
    pairs = [
        (a, b)
        for s in sets
        for a, b, score in zip(s.sentences1, s.sentences2, s.scores)
        if score >= threshold and a.lower().strip(" .") != b.lower().strip(" .")
    ]
    pairs = list(dict.fromkeys(pairs))
    rng.shuffle(pairs)
    pairs = pairs[:n_queries]
    query_texts = {a for a, _ in pairs}
    relevant = list(dict.fromkeys(b for _, b in pairs if b not in query_texts))
    others = sorted({t for s in sets for t in (*s.sentences1, *s.sentences2)} - query_texts - set(relevant))
    rng.shuffle(others)
    documents = relevant + others[: max(0, n_docs - len(relevant))]
    ids = {text: f"d{i}" for i, text in enumerate(documents)}
    corpus = {ids[text]: {"title": "", "text": text} for text in documents}
    kept = [(a, b) for a, b in pairs if b in ids]
    queries = {f"q{i}": a for i, (a, _) in enumerate(kept)}
    qrels = {f"q{i}": {ids[b]: 1} for i, (_, b) in enumerate(kept)}
    return corpus, queries, qrels


def scifact_subset(folder: Path, size: int, seed: int) -> tuple[dict, dict, dict]:
    """``size`` abstracts of the BEIR folder: all that its test qrels judge, then seeded random others."""
    data = load_beir(folder, "test")
    judged = sorted({doc_id for docs in data.qrels.values() for doc_id in docs})
    if size < len(judged):
        raise ValueError(f"a SciFact subset needs at least the {len(judged)} judged abstracts, not {size}")
    others = sorted(set(data.corpus) - set(judged))
    random.Random(seed).shuffle(others)
    kept = set(judged) | set(others[: size - len(judged)])
    corpus = {doc_id: doc for doc_id, doc in data.corpus.items() if doc_id in kept}  # corpus order
    return corpus, data.queries, data.qrels


def write_beir(folder: Path, corpus: dict, queries: dict, qrels: dict) -> None:
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w") as out:
        for doc_id, doc in corpus.items():
            out.write(json.dumps({"_id": doc_id, **doc}) + "\n")
    with open(folder / "queries.jsonl", "w") as out:
        for query_id, text in queries.items():
            out.write(json.dumps({"_id": query_id, "text": text}) + "\n")
    with open(folder / "qrels" / "test.tsv", "w") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        for query_id, docs in qrels.items():
            for doc_id, grade in docs.items():
                out.write(f"{query_id}\t{doc_id}\t{grade}\n")
    print(
        f"{folder}: {len(corpus)} documents, {len(queries)} queries, {sum(len(d) for d in qrels.values())} relevance judgements"
    )


def lower_cased(folder: Path) -> tuple[dict, dict, dict]:
    """A BEIR set's corpus in lower case with each sentence end detached (``"grew. The"`` -> ``"grew . the"``)."""
    dataset = load_beir(folder, "test")
    corpus = {
        doc_id: {"title": doc.get("title", "").lower(), "text": re.sub(r"([.!?])\s+", r" \1 ", doc["text"]).lower()}
        for doc_id, doc in dataset.corpus.items()
    }
    return corpus, dataset.queries, dataset.qrels


QUESTIONS = Path(__file__).parent / "questions" / "scifact_questions.tsv"


def questions(folder: Path, path: Path = QUESTIONS) -> tuple[dict, dict, dict]:
    """SciFact's corpus with our own questions (``path``: id, the abstract each was written from, question)."""
    dataset = load_beir(folder, "test")
    queries, qrels = {}, {}
    with open(path) as rows:
        next(rows)
        for line in rows:
            query_id, doc_id, text = line.rstrip("\n").split("\t")
            if doc_id not in dataset.corpus:
                raise ValueError(f"{path}: {query_id} is judged to {doc_id}, which is not in {folder}")
            queries[query_id], qrels[query_id] = text, {doc_id: 1}
    return dataset.corpus, queries, qrels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path(".cache/isotrope/sets"))
    parser.add_argument("--docs", type=int, default=3000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--news-docs", type=int, default=1500, help="20 Newsgroups posts are long: fewer of them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scifact-sizes", type=int, nargs="*", default=[], help="SciFact subsets of these many abstracts")
    args = parser.parse_args()
    for size in args.scifact_sizes:
        write_beir(args.out / f"scifact-{size}", *scifact_subset(args.data_dir / "retrieval/scifact", size, args.seed))
    write_beir(args.out / "20ng-topic", *newsgroups_topic(args.data_dir, args.news_docs, args.queries, args.seed))
    stsb = [load_stsb(args.data_dir, split) for split in ("train", "dev", "test")]
    write_beir(args.out / "stsb-para", *paraphrase(stsb, 4.0, args.docs, args.queries, args.seed))
    sick = [load_sick(args.data_dir, split) for split in ("train", "trial", "test")]
    write_beir(args.out / "sick-para", *paraphrase(sick, 4.5, args.docs, args.queries, args.seed))
    write_beir(args.out / "scifact-lower", *lower_cased(args.data_dir / "retrieval/scifact"))
    write_beir(args.out / "scifact-questions", *questions(args.data_dir / "retrieval/scifact"))


if __name__ == "__main__":
    main()
