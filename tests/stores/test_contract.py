"""The store seam, on every backend: what the engine relies on, checked against numpy.

Every installed backend (``backends()``) runs every test here, ``memory`` below included: a backend
written as docs/backends.md says, in one page, which is how that page's claim is checked;
and the embedded store also in its fallback mode (everything on Qdrant Edge)."""

import json
import operator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from puffergpt.stores import Hits, Layout, Query, Store, StoreError, backends, open_store, register
from puffergpt.stores.base import NoIndex

SCHEMA = {"matrix": "str", "row": "int"}


# --- a new backend, written the documented way: the ten methods, nothing else ---
_OPS = {"=": operator.eq, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_DTYPES = {"int": np.int64, "float": np.float64, "str": object}


@dataclass
class _Table:
    layout: Layout
    row: dict[str, int] = field(default_factory=dict)  # id -> row of the columns
    vectors: np.ndarray = None  # (n, dim) float32
    cols: dict[str, np.ndarray] = field(default_factory=dict)  # "id" and each attribute: (n,)

    def __post_init__(self):
        self.vectors = np.zeros((0, self.layout.dim), np.float32)
        self.cols = {a: np.zeros(0, _DTYPES[t]) for a, t in {"id": "str", **self.layout.schema}.items()}

    def mask(self, f) -> np.ndarray:  # (n,) bool: the rows every condition holds for
        m = np.ones(len(self.row), bool)
        for a, op, v in f:
            m &= np.isin(self.cols[a], v) if op == "in" else _OPS[op](self.cols[a], v)
        return m

    def keep(self, m: np.ndarray) -> None:
        self.vectors, self.cols = self.vectors[m], {a: c[m] for a, c in self.cols.items()}
        self.row = {i: r for r, i in enumerate(self.cols["id"].tolist())}


@register("memory")
class MemoryStore(Store):
    """numpy arrays in a dict: exact by construction, gone with the process."""

    name = "memory"
    metrics = ("inner_product", "euclidean_squared", "cosine_distance")

    def __init__(self):
        self.tables: dict[str, _Table] = {}
        self.meta: dict[str, str] = {}

    def _namespaces(self, prefix):
        return {ns: t.layout for ns, t in self.tables.items() if ns.startswith(prefix)}

    def _create_namespace(self, ns, layout, ephemeral):
        if ns in self.tables:
            return self.tables[ns].layout
        self.tables[ns] = _Table(layout)

    def _drop_namespace(self, ns):
        self.tables.pop(ns, None)

    def _upsert(self, ns, layout, ids, vectors, attrs):
        t = self.tables[ns]
        for i in ids:
            t.row.setdefault(i, len(t.row))
        grow = len(t.row) - len(t.vectors)
        t.vectors = np.concatenate([t.vectors, np.zeros((grow, layout.dim), np.float32)])
        t.cols = {a: np.concatenate([c, np.zeros(grow, c.dtype)]) for a, c in t.cols.items()}
        rows = [t.row[i] for i in ids]
        t.vectors[rows] = vectors
        for a, values in {"id": ids, **attrs}.items():
            t.cols[a][rows] = values

    def _search(self, ns, layout, queries, metric, include):
        t, masks, parts = self.tables[ns], {}, []
        for n, q in enumerate(queries):
            rows = masks.setdefault(repr(q.filter), np.flatnonzero(t.mask(q.filter)))
            w, v = t.vectors[rows].astype(np.float64), q.vector.astype(np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                d = {"inner_product": w @ v, "euclidean_squared": ((w - v) ** 2).sum(1),
                     "cosine_distance": 1 - w @ v / (np.linalg.norm(w, axis=1) * np.linalg.norm(v))}[metric]
            best = np.argsort(-d if metric == "inner_product" else d, kind="stable")[:q.top_k]
            parts.append(Hits(np.full(len(best), n), d[best], {a: t.cols[a][rows[best]] for a in include}))
        return Hits.concat(parts, include, [0] * len(parts))

    def _fetch(self, ns, layout, ids):
        t = self.tables[ns]
        return {i: t.vectors[t.row[i]] for i in ids if i in t.row}

    def _delete(self, ns, layout, filter):
        self.tables[ns].keep(~self.tables[ns].mask(filter))

    def _count(self, ns, layout, filter):
        return int(self.tables[ns].mask(filter).sum())

    def _put_meta(self, key, value):
        self.meta[key] = json.dumps(value)

    def _get_meta(self, key):
        return json.loads(self.meta[key]) if key in self.meta else None


def test_a_new_backend_writes_what_the_guide_lists():
    """Store's abstract methods are the ten that docs/backends.md lists, and ``memory``
    (which passes every test in this file) writes those and nothing else."""
    guide = (Path(__file__).parents[2] / "docs" / "backends.md").read_text()
    assert len(Store.__abstractmethods__) == 10
    assert all(f"`{m}(" in guide for m in Store.__abstractmethods__), "docs/backends.md misses a method"
    written = {k for k, v in vars(MemoryStore).items() if callable(v) and k != "__init__"}
    assert written == set(Store.__abstractmethods__)
    with pytest.raises(TypeError, match="sets `name`"):
        type("Nameless", (MemoryStore,), {"name": None})()
    with pytest.raises(StoreError, match="exists already"):
        register("memory", "somewhere:Else")


def test_the_base_splits_a_batch_at_max_queries(monkeypatch):
    """A search of more queries than a backend takes reaches it in slices of max_queries,
    and comes back numbered as one batch: the same hits as a single request."""
    s = open_store("memory", dsn="postgresql://elsewhere", api_key=None)  # another backend's settings: not its own
    a, _ = fill(s)
    q = np.random.default_rng(8).standard_normal((7, 8)).astype(np.float32)
    queries = [Query(v, (("matrix", "=", "a"), ("row", "<", 10 + i)), top_k=3) for i, v in enumerate(q)]
    whole = s.search("m", queries, "inner_product", include=("row",))
    sizes = []
    real = MemoryStore._search
    monkeypatch.setattr(MemoryStore, "_search", lambda self, *a: sizes.append(len(a[2])) or real(self, *a))
    monkeypatch.setattr(s, "max_queries", 3)
    split = s.search("m", queries, "inner_product", include=("row",))
    assert sizes == [3, 3, 1]
    np.testing.assert_array_equal(split.query, whole.query)
    np.testing.assert_array_equal(split.attrs["row"], whole.attrs["row"])
    for i, v in enumerate(q):  # each query's 3 best rows among those its own filter keeps
        np.testing.assert_array_equal(split.attrs["row"][split.query == i], np.argsort(-(a[:10 + i] @ v))[:3])


@pytest.fixture(params=[*backends(), "embedded-fallback"])
def store(request, tmp_path):
    """Each backend; ``embedded-fallback``: the embedded store with everything on Qdrant Edge, as
    on a CPU without AVX2 (``embedded``: the weights on zvec, a text's keys on Qdrant Edge)."""
    if request.param == "embedded-fallback":
        from puffergpt.stores.embedded import EmbeddedStore

        s = EmbeddedStore(tmp_path, fallback=True)
        yield s
        s.close()
        return
    options = {}
    if request.param == "pgvector":  # a fresh database of the session's PostgreSQL (tests/stores/conftest.py)
        options = {"dsn": request.getfixturevalue("pg_dsn")}
    if request.param == "turbopuffer":  # the emulator, or the real service with its key (tests/stores/conftest.py)
        options = request.getfixturevalue("tpuf_options")
    s = open_store(request.param, tmp_path, **options)
    yield s
    if request.param == "turbopuffer":
        for ns in s.namespaces():
            s.drop_namespace(ns)
        s.forget()
    s.close()


def fill(store, ns="m", n=50, dim=8, seed=0, metric=None, partition=None):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((n, dim)).astype(np.float32), rng.standard_normal((n, dim)).astype(np.float32)
    store.create_namespace(ns, dim, SCHEMA, metric, partition=partition)
    store.upsert(ns, [f"a.{i}" for i in range(n)], a, {"matrix": ["a"] * n, "row": np.arange(n)})
    store.upsert(ns, [f"b.{i}" for i in range(n)], b, {"matrix": ["b"] * n, "row": np.arange(n)})
    return a, b


def test_upsert_overwrites_by_id(store):
    a, _ = fill(store)
    new = np.ones((2, 8), np.float32)
    store.upsert("m", ["a.3", "a.4"], new, {"matrix": ["a", "a"], "row": [3, 4]})
    assert store.count("m") == 100
    np.testing.assert_array_equal(store.fetch("m", ["a.4", "a.2", "a.3"]), np.stack([new[1], a[2], new[0]]))


def test_search_returns_every_matching_row_with_exact_distances(store):
    q = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    for metric in store.metrics:  # a namespace per metric: turbopuffer fixes it per namespace
        a, b = fill(store, ns=f"m-{metric}", metric=metric)
        hits = store.search(
            f"m-{metric}", [Query(v, (("matrix", "=", "a"),)) for v in q], metric, include=("row", "matrix")
        )
        assert len(hits.query) == 3 * 50 and set(hits.attrs["matrix"]) == {"a"}
        got = np.full((3, 50), np.nan)
        got[hits.query, hits.attrs["row"]] = hits.distance
        qq, aa = q.astype(np.float64), a.astype(np.float64)
        want = {
            "inner_product": qq @ aa.T,
            "euclidean_squared": ((qq[:, None] - aa[None]) ** 2).sum(-1),
            "cosine_distance": 1 - (qq @ aa.T) / np.outer(np.linalg.norm(qq, axis=1), np.linalg.norm(aa, axis=1)),
        }[metric]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=metric)


def test_top_k_is_best_first_per_query(store):
    q = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    for metric in store.metrics:  # a namespace per metric, as above
        a, _ = fill(store, ns=f"m-{metric}", metric=metric)
        hits = store.search(
            f"m-{metric}", [Query(v, (("matrix", "=", "a"),), top_k=5) for v in q], metric, include=("row",)
        )
        for i in range(4):
            rows = hits.attrs["row"][hits.query == i]
            closeness = {"inner_product": a @ q[i], "euclidean_squared": -((a - q[i]) ** 2).sum(1),
                         "cosine_distance": (a @ q[i]) / np.linalg.norm(a, axis=1)}[metric]
            np.testing.assert_array_equal(rows, np.argsort(-closeness)[:5], err_msg=metric)


def test_batched_queries_with_their_own_filters(store):
    """Attention's shape: each query has its own head and its own last position."""
    rng = np.random.default_rng(7)
    keys = rng.standard_normal((2, 10, 4)).astype(np.float32)  # (head, pos, hd)
    store.create_namespace("k", 4, {"layer": "int", "head": "int", "pos": "int"})
    hs, ps = np.meshgrid(range(2), range(10), indexing="ij")
    store.upsert("k", [f"{h}.{p}" for h, p in zip(hs.ravel(), ps.ravel(), strict=True)], keys.reshape(20, 4),
                 {"layer": [0] * 20, "head": hs.ravel(), "pos": ps.ravel()})
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    last = [2, 5, 9]
    queries = [
        Query(q[h, t], (("layer", "=", 0), ("head", "=", h), ("pos", "<=", last[t])))
        for h in range(2)
        for t in range(3)
    ]
    hits = store.search(
        "k", queries, "inner_product" if "inner_product" in store.metrics else store.metrics[0], include=("pos",)
    )
    for qi, (h, t) in enumerate((h, t) for h in range(2) for t in range(3)):
        sel = hits.query == qi
        assert sorted(hits.attrs["pos"][sel]) == list(range(last[t] + 1))
        if "inner_product" in store.metrics:
            np.testing.assert_allclose(hits.distance[sel][np.argsort(hits.attrs["pos"][sel])],
                                       keys[h, : last[t] + 1] @ q[h, t], rtol=1e-5, atol=1e-6)


def test_float_attributes(store):
    """Keys scored by a metric other than the inner product carry |k|^2 as a float."""
    store.create_namespace("f", 2, {"pos": "int", "norm2": "float"})
    v = np.array([[1, 2], [3, 4], [0.5, 0.25]], np.float32)
    store.upsert("f", ["x", "y", "z"], v, {"pos": [0, 1, 2], "norm2": (v.astype(np.float64) ** 2).sum(1)})
    # A filter that every key passes: turbopuffer's exact kNN ranks a filtered subset only.
    hits = store.search(
        "f", [Query(np.ones(2, np.float32), (("pos", "<=", 2),))], store.metrics[0], include=("pos", "norm2")
    )
    got = dict(zip(hits.attrs["pos"].tolist(), hits.attrs["norm2"].tolist(), strict=True))
    assert got == {0: 5.0, 1: 25.0, 2: 0.3125}
    assert store.count("f", (("norm2", ">", 1.5),)) == 2


def test_filters_in_and_ranges(store):
    fill(store)
    assert store.count("m", (("matrix", "in", ["a", "b"]), ("row", "<", 10))) == 20
    assert store.count("m", (("matrix", "=", "b"), ("row", ">=", 45))) == 5


def test_delete_drop_and_list(store):
    fill(store)
    fill(store, ns="other")
    store.delete("m", (("matrix", "=", "a"), ("row", ">", 9)))
    assert store.count("m") == 60
    assert store.namespaces() == ["m", "other"]
    store.drop_namespace("other")
    assert store.namespaces() == ["m"]
    with pytest.raises(StoreError, match="does not exist"):
        store.count("other")


def test_a_partitioned_namespace_answers_like_any_other(store):
    """``partition="matrix"`` (how the weights are made): searches with and without the matrix
    in their filter, top-k across matrices merged best first, documents moved from one matrix
    to another, deletes and counts: the same answers as numpy."""
    metric = store.metrics[0]
    a, b = fill(store, ns="p", metric=metric, partition="matrix")
    q = np.random.default_rng(9).standard_normal(8).astype(np.float32)
    everything, names = np.concatenate([a, b]), [("a", r) for r in range(50)] + [("b", r) for r in range(50)]
    close = {"inner_product": everything @ q, "euclidean_squared": -((everything - q) ** 2).sum(1),
             "cosine_distance": everything @ q / np.linalg.norm(everything, axis=1)}[metric]
    f = (("row", "<", 50),)  # turbopuffer's exact kNN ranks a filtered subset only
    hits = store.search("p", [Query(q, f, top_k=7), Query(q, (("matrix", "in", ["b"]), *f))], metric,
                        include=("matrix", "row"))
    top = list(zip(hits.attrs["matrix"][hits.query == 0], hits.attrs["row"][hits.query == 0], strict=True))
    assert top == [names[i] for i in np.argsort(-close)[:7]]
    assert sorted(hits.attrs["row"][hits.query == 1].tolist()) == list(range(50))
    store.upsert("p", ["a.3"], a[3:4], {"matrix": ["b"], "row": [3]})  # a.3 moves to matrix b
    store.delete("p", (("matrix", "=", "b"), ("row", ">=", 40)))
    assert store.count("p", (("matrix", "=", "a"),)) == 49 and store.count("p", (("matrix", "=", "b"),)) == 41
    got = store.search("p", [Query(q, (("matrix", "=", "b"), *f))], metric, include=("id",))
    assert sorted(got.attrs["id"].tolist()) == sorted(["a.3", *(f"b.{i}" for i in range(40))])
    np.testing.assert_array_equal(store.fetch("p", ["a.3", "b.1"]), np.stack([a[3], b[1]]))
    with pytest.raises(StoreError, match="partition 'row' is not a str attribute"):
        store.create_namespace("bad", 8, SCHEMA, metric, partition="row")


def test_meta_round_trip(store):
    assert store.get_meta("x") is None
    store.put_meta("x", {"a": [1, 2], "b": "c"})
    store.put_meta("x", {"a": [3]})
    assert store.get_meta("x") == {"a": [3]}


def test_errors_are_clear(store):
    fill(store)
    with pytest.raises(StoreError, match="no document 'a.999'"):
        store.fetch("m", ["a.1", "a.999"])
    with pytest.raises(StoreError, match="invalid namespace"):
        store.create_namespace('x"; DROP TABLE _meta; --', 4, SCHEMA)
    with pytest.raises(StoreError, match="unknown attribute"):
        store.count("m", (("nope", "=", 1),))
    with pytest.raises(StoreError, match="length 8"):
        store.upsert("m", ["z"], np.zeros((1, 3), np.float32), {"matrix": ["a"], "row": [0]})
    with pytest.raises(StoreError, match="another layout"):
        store.create_namespace("m", 9, SCHEMA)
    with pytest.raises(StoreError, match="no metric"):
        store.search("m", [Query(np.zeros(8, np.float32))], "manhattan")
    assert store.count("m") == 100  # nothing was lost on the way
    assert store.get_meta("x") is None


def test_filter_values_are_parameters_not_sql(store):
    fill(store)
    assert store.count("m", (("matrix", "=", "a' OR '1'='1"),)) == 0
    assert store.count("m") == 100


def test_data_directory_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="can't open the data directory"):
        open_store("embedded", blocker / "data")
    assert blocker.read_text() == "not a directory"


def test_unknown_backend(tmp_path):
    with pytest.raises(StoreError, match="unknown backend 'faiss': the installed backends are embedded, pgvector, "
                                         "turbopuffer"):
        open_store("faiss", tmp_path)


def test_the_engine_on_every_backend(store, tiny):
    """The engine on this store: greedy tokens and top-40 logits equal the numpy reference."""
    from helpers import assert_close
    from puffergpt.model import tokenizer
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.sampling import Sampling
    from puffergpt.model.session import Run
    from puffergpt.search import load
    from puffergpt.search.manifest import open_engine
    from puffergpt.texts.text import Text

    load.load(store, tiny, "tiny", progress=False)  # the store's most precise metric
    ids = tokenizer.encode("The quick brown fox")
    got, want = Text(open_engine(store, tiny.name, "tiny").open()), Text(Run(NumpyWeights(tiny)))
    for t in (got, want):
        t.append(ids)
    for a, b in zip(got.generate(8, Sampling(0, 40)), want.generate(8, Sampling(0, 40)), strict=True):
        assert a.token_id == b.token_id and list(a.ids) == list(b.ids)
        assert_close(f"{store.name} top-40 logits", a.logits, b.logits, 1e-3)
    got.close()


def test_the_learning_views_on_every_backend(store, tiny):
    """Attention per layer and head, the lens and an analogy, as this store's searches,
    equal numpy's (which tests/test_inside.py holds to transformers)."""
    from helpers import assert_close
    from puffergpt.app import completion
    from puffergpt.lens import views
    from puffergpt.model import tokenizer
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.sampling import Sampling
    from puffergpt.model.session import Run
    from puffergpt.search import load
    from puffergpt.search.manifest import open_engine

    load.load(store, tiny, "tiny", progress=False)
    engine = open_engine(store, tiny.name, "tiny")
    ids = tokenizer.encode("one two three one two")
    got = list(completion.complete(engine.open, ids, 2, Sampling(0, 40), inspect=10))
    want = list(completion.complete(lambda: Run(NumpyWeights(tiny)), ids, 2, Sampling(0, 40), inspect=10))
    for a, b in zip(got, want, strict=True):
        assert_close(f"{store.name} attention at {a.position}", a.inspect["weights"], b.inspect["weights"], 1e-4)
        for la, lb in zip(a.inspect["lens"], b.inspect["lens"], strict=True):
            assert list(la["ids"]) == list(lb["ids"]), f"{store.name} lens layer {la['layer']}"
            assert_close(f"{store.name} lens layer {la['layer']}", la["logits"], lb["logits"], 1e-3)
    run = engine.open()
    try:
        g = views.analogy(run.weights, " man", " woman", " king", 5)["results"]
    finally:
        run.session.close()
    w = tiny.params["wte.weight"].astype(np.float64)
    a, b, c = (tokenizer.encode(x)[0] for x in (" man", " woman", " king"))
    v = w[b] - w[a] + w[c]
    sims = w @ v / (np.linalg.norm(w, axis=1) * np.linalg.norm(v))
    top = [int(i) for i in np.argsort(-sims, kind="stable") if int(i) not in (a, b, c)][:5]
    assert [r["token_id"] for r in g] == top
    assert_close(f"{store.name} analogy", [r["score"] for r in g], sims[top], 1e-4)


def test_a_failed_create_leaves_the_store_working(store):
    fill(store)
    with pytest.raises(StoreError):
        store.create_namespace("bad", 4, {"vector": "int"})
    with pytest.raises(StoreError):
        store.create_namespace("bad2", 4, {"x": "complex"})
    assert store.count("m") == 100 and "bad" not in store.namespaces()
    store.create_namespace("good", 4, {"row": "int"})
    assert "good" in store.namespaces()


def test_ephemeral_namespaces_work_like_the_others(store):
    store.create_namespace("text-x", 4, {"pos": "int"}, ephemeral=True)
    store.upsert("text-x", ["a", "b"], np.eye(2, 4, dtype=np.float32), {"pos": [0, 1]})
    store.upsert("text-x", ["a"], np.full((1, 4), 2, np.float32), {"pos": [0]})
    assert store.count("text-x") == 2 and "text-x" in store.namespaces("text-")
    np.testing.assert_array_equal(store.fetch("text-x", ["a"]), np.full((1, 4), 2, np.float32))
    store.drop_namespace("text-x")
    assert "text-x" not in store.namespaces()


def test_embedded_ephemeral_namespaces_end_with_the_process(tmp_path):
    s = open_store("embedded", tmp_path)
    s.create_namespace("kept", 4, {"pos": "int"})
    s.create_namespace("text-y", 4, {"pos": "int"}, ephemeral=True)
    s.close()
    s = open_store("embedded", tmp_path)
    assert s.namespaces() == ["kept"]
    s.close()


def test_an_approximate_index_is_built_where_the_store_can_and_refused_by_name_elsewhere(store):
    """The optional index (issue 35): the embedded store on zvec and pgvector build one over a
    matrix's rows; the fallback (Qdrant Edge, a CPU without AVX2) and turbopuffer say they can't,
    by name, and a search through an index that was never built is refused too."""
    metric = "inner_product" if "inner_product" in store.metrics else sorted(store.metrics)[0]
    fill(store, partition="matrix", metric=metric)
    can = store.name == "pgvector" or (store.name == "embedded" and not store.fallback)
    if can:
        built = store.build_index("m", ("matrix", "a"), metric, {"m": 8, "ef_construction": 32})
        assert built["rows"] == 50 and store.has_index("m", ("matrix", "a"), metric)
        return
    with pytest.raises(NoIndex) as e:
        store.build_index("m", ("matrix", "a"), metric, {"m": 8, "ef_construction": 32})
    assert "approximate index" in str(e.value), e.value
    assert store.name in str(e.value) or "Qdrant Edge" in str(e.value), e.value  # which store, or what it holds
    assert not store.has_index("m", ("matrix", "a"), metric)
    with pytest.raises(NoIndex):
        store.search_approximate("m", ("matrix", "a"), [Query(np.ones(8, np.float32), top_k=3)], metric,
                                 ("row",), 10)
