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

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from puffergpt.model.checkpoints import GPT2Config

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

# --- the document scheme: where a model's rows live and what they are called -----------
# For a model stored under key K with width C: namespace ``K.C`` holds every matrix whose
# input has C numbers (each layer's attn.c_attn, attn.c_proj and mlp.c_fc, wte, wpe and the
# layer norms); namespace ``K.4C`` holds each layer's mlp.c_proj. A document's attributes are
# ``matrix`` (a filter on it picks one whole matrix), ``row`` and ``norm2`` (|w|^2 of its row).

SCHEMA = {"matrix": "str", "row": "int", "norm2": "float"}
PARTITION = "matrix"  # every search of the weights filters on it: a store may keep each matrix apart


def namespace(key: str, n_in: int) -> str:
    return f"{key}.{n_in}"


def matrices(c: GPT2Config) -> Iterator[tuple[str, int]]:
    """(matrix name, input width) of every matrix stored as documents."""
    for i in range(c.n_layer):
        yield f"h.{i}.attn.c_attn", c.n_embd
        yield f"h.{i}.attn.c_proj", c.n_embd
        yield f"h.{i}.mlp.c_fc", c.n_embd
        yield f"h.{i}.mlp.c_proj", 4 * c.n_embd
    yield "wte", c.n_embd
    yield "wpe", c.n_embd


def norms(c: GPT2Config) -> list[str]:
    return [f"h.{i}.{n}" for i in range(c.n_layer) for n in ("ln_1", "ln_2")] + ["ln_f"]


def doc_id(name: str, row: int) -> str:
    """The id of a matrix's row: ``wte.50256``, ``h.3.ln_1.0``."""
    return f"{name}.{int(row)}"


def ids(name: str, rows: int) -> list[str]:
    return [doc_id(name, r) for r in range(rows)]


def n_in_of(ns: str) -> int:
    return int(ns.rsplit(".", 1)[1])


def whole_matrix(name: str, rows: int, max_top_k: int | None) -> list[tuple]:
    """The filters that, together, match every row of a matrix: one, or row ranges where the
    store returns at most ``max_top_k`` hits a query (turbopuffer's 10,000)."""
    cap = max_top_k or rows
    if cap >= rows:
        return [(("matrix", "=", name),)]
    return [(("matrix", "=", name), ("row", ">=", a), ("row", "<", min(a + cap, rows))) for a in range(0, rows, cap)]
