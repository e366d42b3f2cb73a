"""Rows as documents: each encoding against numpy, in float32, with its error measured."""

import numpy as np
import pytest

from helpers import assert_close, encoding_error_through, layer
from puffergpt.search.documents import METRICS, Encoding
from puffergpt.stores import open_store

# Max abs error of y = x @ W + b for a (768 -> 3072) layer with GPT-2-like scales,
# when the distances are computed exactly in float64 from float32 documents. The
# padded encodings subtract M^2 + |q|^2 - distance: nearly equal large numbers.
BOUNDS = {"inner_product": 1e-4, "euclidean_squared": 2e-3, "cosine_distance": 1e-4}


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
    store = open_store("embedded", tmp_path)
    err = encoding_error_through(store, metric)
    print(f"{metric}: max abs error {err:.3g}")  # shown with pytest -s; the figures are in docs/how-it-works.md
    store.close()


def test_unknown_metric():
    with pytest.raises(ValueError, match="unknown metric"):
        Encoding("manhattan")
