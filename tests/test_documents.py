"""Rows as documents: each encoding against numpy, in float32, with its error measured."""

import numpy as np
import pytest

from puffergpt.documents import METRICS, Encoding
from puffergpt.stores import Query, open_store

from helpers import assert_close

# Max abs error of y = x @ W + b for a (768 -> 3072) layer with GPT-2-like scales,
# when the distances are computed exactly in float64 from float32 documents. The
# padded encodings subtract M^2 + |q|^2 - distance: nearly equal large numbers.
BOUNDS = {"inner_product": 1e-4, "euclidean_squared": 2e-3, "cosine_distance": 1e-4}
# The same through the embedded store, which computes distances in float32.
STORE_BOUNDS = {"inner_product": 1e-4, "euclidean_squared": 4e-3, "cosine_distance": 1e-4}


def layer(rng, n_in=768, n_out=3072):
    w = (0.14 * rng.standard_normal((n_out, n_in))).astype(np.float32)
    b = (0.1 * rng.standard_normal(n_out)).astype(np.float32)
    x = rng.standard_normal((4, n_in)).astype(np.float32)  # a layer-normed input
    return w, b, x


def distances(metric, d, q):
    d, q = d.astype(np.float64), q.astype(np.float64)
    if metric == "inner_product":
        return q @ d.T
    if metric == "euclidean_squared":
        return ((q[:, None, :] - d[None]) ** 2).sum(-1)
    return 1 - (q @ d.T) / np.linalg.norm(q, axis=1)[:, None] / np.linalg.norm(d, axis=1)[None]


@pytest.mark.parametrize("metric", METRICS)
def test_encoding_is_exact_in_real_arithmetic(metric):
    rng = np.random.default_rng(0)
    w, b, x = layer(rng)
    enc = Encoding(metric)
    docs, M = enc.documents(w, b)
    assert docs.shape == (3072, enc.dim(768))
    if enc.padded:  # every document has the same length M
        np.testing.assert_allclose(np.linalg.norm(docs.astype(np.float64), axis=1), M, rtol=1e-6)
    q = enc.queries(x)
    y = enc.outputs(distances(metric, docs, q), q, M)
    assert_close(f"{metric} encoding", y, x.astype(np.float64) @ w.T.astype(np.float64) + b, BOUNDS[metric])


@pytest.mark.parametrize("metric", METRICS)
def test_encoding_through_the_embedded_store(tmp_path, metric):
    rng = np.random.default_rng(1)
    w, b, x = layer(rng)
    enc = Encoding(metric)
    docs, M = enc.documents(w, b)
    store = open_store("embedded", tmp_path)
    store.create_namespace("m", docs.shape[1], {"matrix": "str", "row": "int"})
    store.upsert("m", [f"w.{i}" for i in range(len(docs))], docs, {"matrix": ["w"] * len(docs), "row": np.arange(len(docs))})
    q = enc.queries(x)
    hits = store.search("m", [Query(v, (("matrix", "=", "w"),)) for v in q], metric, include=("row",))
    dist = np.zeros((len(q), len(docs)))
    dist[hits.query, hits.attrs["row"]] = hits.distance
    err = assert_close(f"{metric} via embedded store", enc.outputs(dist, q, M),
                       x.astype(np.float64) @ w.T.astype(np.float64) + b, STORE_BOUNDS[metric])
    print(f"{metric}: max abs error {err:.3g}")  # shown with pytest -s; the figures are in the README


def test_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric"):
        Encoding("manhattan")
