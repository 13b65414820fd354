"""The LanceDB store on an S3-compatible object store: moto's server (``pip install "moto[server]"``) on
localhost; skipped when moto is not installed."""

from __future__ import annotations

import socket

import numpy as np
import pytest

pytest.importorskip("lancedb")
moto_server = pytest.importorskip("moto.server")
boto3 = pytest.importorskip("boto3")
from isotrope.connectors.lancedb_store import LanceDBStore  # noqa: E402

DIM = 8


@pytest.fixture(scope="module")
def s3():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "aws_endpoint": endpoint,
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }
    boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    ).create_bucket(Bucket="isotrope")
    yield options
    server.stop()


def test_a_store_on_s3_writes_reopens_searches_and_deletes(s3):
    uri = "s3://isotrope/stores/docs"
    vectors = np.random.default_rng(0).standard_normal((40, DIM)).astype(np.float32)
    store = LanceDBStore(uri, dim=DIM, metric="ip", index="flat", storage_options=s3)
    assert store.path == uri
    store.add([f"r{i}" for i in range(40)], vectors, [f"text {i}" for i in range(40)], [{"half": i % 2} for i in range(40)])
    store.commit()
    store.close()
    store = LanceDBStore(uri, storage_options=s3)
    assert len(store) == 40 and store.metadata_fields() == {"half"}
    scores = vectors @ vectors[3]
    hits = store.search(vectors[3], 5)[0]
    assert [h.id for h in hits] == [f"r{i}" for i in np.argsort(-scores, kind="stable")[:5]]
    np.testing.assert_allclose([h.score for h in hits], np.sort(scores)[::-1][:5], rtol=1e-5)
    assert {h.id for h in store.search(vectors[3], 40, where={"half": 1})[0]} == {f"r{i}" for i in range(1, 40, 2)}
    store.delete(["r3"])
    store.commit()
    assert len(LanceDBStore(uri, storage_options=s3)) == 39
    assert [h.id for h in store.lexical_search(["text 7"], 1)[0]] == ["r7"]
