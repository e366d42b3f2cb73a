"""Rows as documents: a matrix product as one exact vector search.

A linear layer y = x @ W + b has one output per row w of W.T (Hugging Face's
Conv1D stores W as (in, out)). Each row, with its bias, becomes one document;
the layer's input becomes the query; every output comes back from the distance
between the query and that row's document. Three encodings, each exact in real
arithmetic, one per metric a vector database may offer:

- ``inner_product``:     d = (w, b),        q = (x, 1),    y = d . q
- ``euclidean_squared``: d = (w, b, pad),   q = (x, 1, 0), y = (M^2 + |q|^2 - |d - q|^2) / 2
- ``cosine_distance``:   d = (w, b, pad),   q = (x, 1, 0), y = (1 - dist) * M * |q|

where pad = sqrt(M^2 - |w|^2 - b^2) gives every document of the matrix the
same length M. In float32 the inner product is the most precise: the other two
subtract large, nearly equal numbers (tests/test_documents.py measures by how much).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ENCODING_VERSION = 2  # 2: every document carries norm2, |w|^2 of its row
METRICS = ("inner_product", "euclidean_squared", "cosine_distance")


@dataclass(frozen=True)
class Encoding:
    metric: str

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}: use one of {', '.join(METRICS)}")

    @property
    def padded(self) -> bool:
        return self.metric != "inner_product"

    def dim(self, n_in: int) -> int:
        """Document length for a matrix with n_in inputs: the inputs, the bias, the pad."""
        return n_in + 2 if self.padded else n_in + 1

    def documents(self, w: np.ndarray, b: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """Rows (out, in) and biases (out,) -> documents (out, dim) and their length M."""
        w = np.asarray(w, np.float32)
        b = np.zeros(w.shape[0], np.float32) if b is None else np.asarray(b, np.float32)
        d = np.concatenate([w, b[:, None]], axis=1)  # (out, in + 1)
        if not self.padded:
            return d, 0.0
        sq = (d.astype(np.float64) ** 2).sum(axis=1)  # |w|^2 + b^2
        M = float(np.sqrt(sq.max())) * (1 + 1e-3) + 1e-6  # a little slack keeps every pad real
        pad = np.sqrt(M * M - sq).astype(np.float32)
        return np.concatenate([d, pad[:, None]], axis=1), M

    def queries(self, x: np.ndarray) -> np.ndarray:
        """Inputs (T, in) -> queries (T, dim): append the bias's 1 (and the pad's 0)."""
        x = np.asarray(x, np.float32)
        cols = [x, np.ones((x.shape[0], 1), np.float32)]
        if self.padded:
            cols.append(np.zeros((x.shape[0], 1), np.float32))
        return np.concatenate(cols, axis=1)

    def outputs(self, dist: np.ndarray, q: np.ndarray, M: float) -> np.ndarray:
        """Distances (T, out) of queries (T, dim) -> layer outputs y (T, out)."""
        dist = np.asarray(dist, np.float64)
        if self.metric == "inner_product":
            return dist.astype(np.float32)
        qq = (q.astype(np.float64) ** 2).sum(axis=1, keepdims=True)  # |q|^2, (T, 1)
        if self.metric == "euclidean_squared":
            return ((M * M + qq - dist) / 2).astype(np.float32)
        return ((1 - dist) * M * np.sqrt(qq)).astype(np.float32)

    def rows(self, docs: np.ndarray, n_in: int) -> np.ndarray:
        """Documents -> the weight rows they carry (for embeddings fetched by id)."""
        return docs[:, :n_in]
