"""The "isotrope" embedding function in LanceDB's registry, driven through LanceDB's public API only
(after the one ``create`` call). Reference: ``ShapedEncoder.encode`` (documents and queries apart)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lancedb")

import lancedb
from lancedb.embeddings import get_registry
from lancedb.pydantic import LanceModel, Vector

import isotrope.connectors.lancedb_registry  # noqa: F401  registers "isotrope"
from conftest import make_sentences
from isotrope.backbones import make_backbone
from isotrope.encoder import ShapedEncoder
from isotrope.errors import EncoderMismatchError, NotFittedError
from isotrope.transforms import TRANSFORMS

TEXTS = make_sentences(20, seed=7)


@pytest.fixture(scope="module")
def encoder(tiny_bert_path: str) -> ShapedEncoder:
    """A fitted tiny encoder whose queries differ from its documents (a query prefix)."""
    backbone = make_backbone({"type": "hf", "model": tiny_bert_path, "query_prefix": "query: ", "device": "cpu"})
    return ShapedEncoder(backbone, "mean", transforms=[TRANSFORMS["center"](), TRANSFORMS["l2"]()]).fit(
        make_sentences(64, seed=5)
    )


def make_table(db_path: Path, encoder_dir: Path):
    func = get_registry().get("isotrope").create(encoder=str(encoder_dir), device="cpu")

    class Doc(LanceModel):
        text: str = func.SourceField()
        vector: Vector(func.ndims()) = func.VectorField()  # type: ignore[valid-type]
        source: str = ""

    return lancedb.connect(db_path).create_table("docs", schema=Doc)


def test_a_plain_table_embeds_documents_on_add_and_queries_on_search(encoder: ShapedEncoder, tmp_path: Path) -> None:
    encoder.save(tmp_path / "encoder")
    table = make_table(tmp_path / "db", tmp_path / "encoder")
    table.add([{"text": text, "source": f"s{i % 3}"} for i, text in enumerate(TEXTS)])
    stored = table.to_pandas().sort_values("text")
    expected = encoder.encode(list(stored["text"]), kind="document")
    assert np.allclose(np.stack(stored["vector"].to_list()), expected, atol=1e-6)

    query = "the happy dog runs in the rain"
    hits = table.search(query).metric("cosine").limit(5).to_list()
    vectors = encoder.encode(TEXTS, kind="document").astype(np.float64)
    scores = vectors @ encoder.encode([query], kind="query")[0].astype(np.float64)
    assert [hit["text"] for hit in hits] == [TEXTS[i] for i in np.argsort(-scores)[:5]]
    assert not np.allclose(encoder.encode([query], kind="query"), encoder.encode([query], kind="document"), atol=1e-3)

    reopened = lancedb.connect(tmp_path / "db").open_table("docs")  # the function is re-created from the table
    again = reopened.search(query).metric("cosine").limit(5).to_list()
    assert [hit["text"] for hit in again] == [hit["text"] for hit in hits]


def test_the_table_records_the_fingerprint_and_refuses_another_encoder(
    encoder: ShapedEncoder, tiny_bert_path: str, tmp_path: Path
) -> None:
    encoder.save(tmp_path / "encoder")
    table = make_table(tmp_path / "db", tmp_path / "encoder")
    table.add([{"text": text, "source": "a"} for text in TEXTS[:4]])
    assert encoder.fingerprint in table.schema.metadata[b"embedding_functions"].decode()

    other = ShapedEncoder.create(tiny_bert_path, shape="l2", device="cpu")  # same dimension, another shaping
    other.save(tmp_path / "encoder")
    reopened = lancedb.connect(tmp_path / "db").open_table("docs")
    with pytest.raises(EncoderMismatchError, match=encoder.fingerprint):
        reopened.search("the cat").limit(3).to_list()
    with pytest.raises(EncoderMismatchError):
        reopened.add([{"text": "a new text", "source": "b"}])
    assert reopened.count_rows() == 4


def test_a_recipe_needing_no_corpus_is_accepted_and_one_needing_fit_refused(tiny_bert_path: str) -> None:
    registry = get_registry().get("isotrope")
    func = registry.create(model=tiny_bert_path, shape="l2", device="cpu")
    reference = ShapedEncoder.create(tiny_bert_path, shape="l2", device="cpu")
    assert np.allclose(func.compute_source_embeddings(TEXTS[:3]), reference.encode(TEXTS[:3]), atol=1e-6)
    with_null = func.compute_source_embeddings([TEXTS[0], None])
    assert with_null[1] is None and np.allclose(with_null[0], reference.encode(TEXTS[:1])[0], atol=1e-6)
    with pytest.raises(NotFittedError, match="needs fitting"):
        registry.create(model=tiny_bert_path, shape="center", device="cpu")
