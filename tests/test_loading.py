"""Loading a checkpoint as documents: counts, manifest, resume, damage detection."""

import pytest

from puffergpt.model import checkpoints
from puffergpt.model.checkpoints import expected_shapes
from puffergpt.search import load, manifest, verify
from puffergpt.search.documents import ENCODING_VERSION
from puffergpt.search.manifest import open_engine
from puffergpt.stores import open_store
from puffergpt.stores.base import StoreError


def expected_documents(c):
    """One document per output row of each matrix, per embedding row, and 2 per layer norm."""
    shapes = expected_shapes(c)
    n = c.n_vocab + c.n_ctx + 2 * (2 * c.n_layer + 1)
    return n + sum(shapes[k][1] for k in shapes if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")))


@pytest.fixture
def store(tmp_path):
    s = open_store("embedded", tmp_path)
    yield s
    s.close()


def test_load_writes_every_row_once(store, tiny):
    m = load.load(store, tiny, "tiny", progress=False)
    c = tiny.config
    assert m["complete"] and m["version"] == ENCODING_VERSION and m["metric"] == "inner_product"
    assert m["documents"] == expected_documents(c) == sum(store.count(ns) for ns in store.namespaces("tiny."))
    assert set(m["namespaces"]) == {f"tiny.{c.n_embd}", f"tiny.{4 * c.n_embd}"}
    assert m["matrices"]["h.1.mlp.c_fc"]["rows"] == 4 * c.n_embd
    assert m["weights_sha256"] == load.weights_digest(tiny)
    assert verify.verify(store, m) == {}


def test_load_is_idempotent(store, tiny):
    m1 = load.load(store, tiny, "tiny", progress=False)
    m2 = load.load(store, tiny, "tiny", progress=False)
    assert m1 == m2 and sum(store.count(ns) for ns in store.namespaces("tiny.")) == m1["documents"]


def test_interrupted_load_resumes_to_the_same_manifest(tmp_path, tiny):
    clean = open_store("embedded", tmp_path / "clean")
    want = load.load(clean, tiny, "tiny", progress=False)
    store = open_store("embedded", tmp_path / "broken")
    batches = iter(range(100))

    def stop_after_ten():
        if next(batches) == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        load.load(store, tiny, "tiny", progress=False, interrupt=stop_after_ten)
    with pytest.raises(manifest.NotLoaded, match="did not finish.*puffergpt load"):
        open_engine(store, "tiny")
    got = load.load(store, tiny, "tiny", progress=False)
    assert got == want
    assert {ns: store.count(ns) for ns in store.namespaces("tiny.")} == want["namespaces"]  # no duplicates, no gaps


def test_a_removed_document_is_detected_and_named(store, tiny):
    m = load.load(store, tiny, "tiny", progress=False)
    ns = m["matrices"]["h.1.mlp.c_fc"]["namespace"]
    store.delete(ns, (("matrix", "=", "h.1.mlp.c_fc"), ("row", "=", 7)))
    with pytest.raises(manifest.NotLoaded, match=f"namespace {ns} holds .*puffergpt load"):
        open_engine(store, "tiny")
    assert verify.verify(store, m) == {"h.1.mlp.c_fc": "255 documents stored, 256 expected"}
    load.load(store, tiny, "tiny", progress=False)  # load repairs it
    assert verify.verify(store, m) == {}


def test_an_altered_document_is_detected_and_named(store, tiny):
    m = load.load(store, tiny, "tiny", progress=False)
    ns = m["matrices"]["h.0.attn.c_attn"]["namespace"]
    v = store.fetch(ns, ["h.0.attn.c_attn.5"])
    store.upsert(ns, ["h.0.attn.c_attn.5"], v + 1e-3, {"matrix": ["h.0.attn.c_attn"], "row": [5],
                                                        "norm2": verify.row_norm2(v + 1e-3, 64)})
    bad = verify.verify(store, m)
    assert list(bad) == ["h.0.attn.c_attn"] and "altered" in bad["h.0.attn.c_attn"]
    with pytest.raises(
        verify.StoreDamaged, match=r"h\.0\.attn\.c_attn: .*altered.*\n.*puffergpt load --model tiny .*--repair"
    ):
        open_engine(store, "tiny", verify=True)  # as serve and generate open it
    # The counts look right, but the files changed since they were verified: a plain load reads
    # every document back and rewrites what differs.
    assert load.load(store, tiny, "tiny", progress=False) == m
    assert verify.verify(store, m) == {}
    assert open_engine(store, "tiny", verify=True).manifest == m


@pytest.mark.parametrize("attr", ["row", "norm2"])
def test_an_altered_attribute_is_detected_and_repaired(store, tiny, attr):
    """The check covers what a search returns and the engine uses, not only the vectors:
    a document whose row number changed would put its output in another row's place."""
    from puffergpt.model.sampling import Sampling
    from puffergpt.search.manifest import open_engine
    from puffergpt.texts.text import Text

    m = load.load(store, tiny, "tiny", progress=False)
    ns, name = m["matrices"]["h.0.mlp.c_fc"]["namespace"], "h.0.mlp.c_fc"
    v = store.fetch(ns, [f"{name}.5"])
    attrs = {"matrix": [name], "row": [5], "norm2": verify.row_norm2(v, 64)}
    attrs[attr] = [6] if attr == "row" else [123.0]
    store.upsert(ns, [f"{name}.5"], v, attrs)
    bad = verify.verify(store, m)
    assert list(bad) == [name] and "altered attribute" in bad[name], bad
    load.load(store, tiny, "tiny", progress=False, repair=True)
    assert verify.verify(store, m) == {}
    t = Text(open_engine(store, "tiny").open())  # and the engine reads the repaired matrix right
    t.append([1, 2, 3])
    ref = __import__("puffergpt.model.reference", fromlist=["Reference"]).Reference(tiny).greedy([1, 2, 3], 4)
    assert [st.token_id for st in t.generate(4, Sampling(0, 40))] == ref
    t.close()


def test_engine_refuses_missing_or_old_stores(store, tiny):
    with pytest.raises(manifest.NotLoaded, match="not loaded.*puffergpt load --model tiny"):
        open_engine(store, "tiny")
    m = load.load(store, tiny, "tiny", progress=False)
    store.put_meta("manifest:tiny", {**m, "version": ENCODING_VERSION - 1})
    with pytest.raises(manifest.NotLoaded, match="encoding version .*puffergpt load"):
        open_engine(store, "tiny")


def test_two_models_side_by_side(tmp_path, store, tiny):
    other = checkpoints.load(str(checkpoints.make_model(tmp_path / "other", "tiny", seed=1)))
    load.load(store, tiny, "tiny", progress=False)
    load.load(store, other, "other", progress=False)
    tiny_sha, other_sha = (open_engine(store, k).manifest["weights_sha256"] for k in ("tiny", "other"))
    assert tiny_sha != other_sha
    assert verify.verify(store, open_engine(store, "tiny").manifest) == {}


def test_a_changed_checkpoint_is_reloaded(tmp_path, store, tiny):
    load.load(store, tiny, "tiny", progress=False)
    other = checkpoints.load(str(checkpoints.make_model(tmp_path / "other", "tiny", seed=1)))
    m = load.load(store, other, "tiny", progress=False)
    assert m["weights_sha256"] == load.weights_digest(other)
    assert verify.verify(store, m) == {}


def test_a_metric_the_store_lacks(store, tiny):
    store.metrics = ("inner_product",)  # a store with fewer metrics
    with pytest.raises(StoreError, match="no exact 'cosine_distance' search"):
        load.load(store, tiny, "tiny", metric="cosine_distance", progress=False)
    assert store.namespaces() == []


def test_a_document_of_no_matrix_is_counted(store, tiny):
    """A namespace holding more than its matrices' rows (a document of no matrix, which no
    matrix's check sees) fails verify, named by namespace."""
    m = load.load(store, tiny, "tiny", progress=False)
    ns = m["matrices"]["wte"]["namespace"]
    store.upsert(ns, ["stray.0"], store.fetch(ns, ["wte.0"]), {"matrix": ["stray"], "row": [0], "norm2": [0.0]})
    assert verify.verify(store, m) == {f"namespace {ns}": f"it holds {m['namespaces'][ns] + 1:,} documents, "
                                                          f"the manifest says {m['namespaces'][ns]:,}"}


def test_a_verified_store_is_not_read_again_until_its_files_change(tmp_path, tiny, monkeypatch):
    """The stamp: the size and digest of every file of the weights, read in full at every start.
    zvec rewrites update times in its files at every close, which the digest leaves out (so an
    unchanged store is not read back); the probe's bit rot (exponent bytes flipped, the file's
    mtime restored) is read back and refused."""
    import os

    from helpers import flip_exponents, vector_file

    store = open_store("embedded", tmp_path)
    m = load.load(store, tiny, "tiny", progress=False)  # which reads every document back: stamped
    ns = m["matrices"]["h.0.attn.c_attn"]["namespace"]
    path, at = vector_file(tmp_path, ns, store.fetch(ns, ["h.0.attn.c_attn.0"])[0])
    store.close()
    reads = []
    real = verify.check
    monkeypatch.setattr(verify, "check", lambda *a, **k: reads.append(1) or real(*a, **k))

    def opened() -> int:
        reads.clear()
        s = open_store("embedded", tmp_path)
        try:
            open_engine(s, "tiny", verify=True).open().session.close()
        finally:
            s.close()
        return len(reads)

    assert opened() == 0 and opened() == 0  # opened and closed: zvec rewrote its update times, no read
    os.utime(path, ns=(1, 1))
    assert opened() == 0  # a new mtime alone: its bytes are those verified
    before = path.read_bytes()
    flip_exponents(path, at)  # h.0.attn.c_attn's first 64 numbers doubled or halved, the mtime as it was
    with pytest.raises(verify.StoreDamaged, match=r"h\.0\.attn\.c_attn: .*altered.*\n.*puffergpt load .*--repair"):
        opened()
    assert reads == [1]
    path.write_bytes(before)  # put back: byte for byte what was verified, so not read
    assert opened() == 0
    s = open_store("embedded", tmp_path)
    s.put_meta("manifest:tiny", {**m, "checkpoint": {"path": "moved"}})  # another manifest: read again
    s.close()
    assert opened() == 1 and opened() == 0
