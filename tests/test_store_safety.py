"""Faults around a store: failed creation, a missing encoder, a tampered encoder, concurrent writers and readers."""

from __future__ import annotations

import pytest

from isotrope.encoder import ShapedEncoder
from isotrope.search import Collection

from conftest import make_sentences


@pytest.fixture
def glove_encoder(tiny_glove_path):
    return ShapedEncoder.create(tiny_glove_path, shape="center").fit(["the cat sat on the mat", "the dog runs fast"])


@pytest.mark.parametrize("kind", ["faiss", "lancedb"])
def test_a_store_that_fails_to_build_leaves_no_half_made_folder(kind, glove_encoder, tmp_path, monkeypatch):
    from isotrope import search

    store_class = search._store_class(kind)

    def fail(self, **properties):
        raise ImportError("The lance library is required to use this function. Please install with `pip install pylance`.")

    monkeypatch.setattr(store_class, "set_properties", fail)
    with pytest.raises(ImportError, match="lance library"):
        Collection.create(f"{kind}:{tmp_path / 'store'}", glove_encoder)
    assert not (tmp_path / "store").exists()
    # an existing (empty) folder the user made is kept, but holds no store
    (tmp_path / "mine").mkdir()
    with pytest.raises(ImportError):
        Collection.create(f"{kind}:{tmp_path / 'mine'}", glove_encoder)
    assert (tmp_path / "mine").is_dir() and not Collection.exists(f"{kind}:{tmp_path / 'mine'}")
