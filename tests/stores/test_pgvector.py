"""The pgvector backend on a real PostgreSQL (tests/stores/conftest.py): the engine end to
end against numpy, each encoding's error in pgvector's float32, the SQL it sends, and
its faults: no server, a wrong password, no pgvector, a killed load, the server going
away in the middle of a text."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from psycopg import sql

from helpers import compare_with_reference, encoding_error_through
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search import documents, load, manifest, verify
from puffergpt.search.documents import METRICS
from puffergpt.search.manifest import open_engine
from puffergpt.stores import Query, StoreError, open_store
from puffergpt.stores import pgvector as pgvector_store
from puffergpt.stores.pgvector import PgvectorStore, redact
from puffergpt.texts.text import Text

GREEDY = Sampling(0, 40)
PROMPTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "for i in range(10):"]


@pytest.fixture(scope="module")
def tiny_pg(new_database, tiny):
    """The tiny model loaded into a database of its own: (dsn, store, key, manifest)."""
    dsn = new_database()
    store = open_store("pgvector", dsn=dsn)
    key = manifest.model_key(tiny.name)
    m = load.load(store, tiny, key, progress=False)
    yield dsn, store, key, m
    store.close()


def compare(ckpt, store, key, prompt, n, metric="inner_product", text=None):
    """The engine on pgvector and numpy side by side: (worst logit diff, tokens)."""
    return compare_with_reference(ckpt, text or Text(open_engine(store, ckpt.name, key).open()), prompt, n, metric)


# --- the engine on pgvector ---------------------------------------------------------------

def test_engine_on_pgvector_equals_the_reference(tiny_pg, tiny):
    dsn, _, key, _ = tiny_pg
    store = open_store("pgvector", dsn=dsn)
    worst = 0.0
    for prompt in PROMPTS:
        diff, tokens = compare(tiny, store, key, prompt, 16)
        assert tokens == Reference(tiny).greedy(tokenizer.encode(prompt), 16)
        worst = max(worst, diff)
    assert not [ns for ns in store.namespaces("text-")]  # closing a text drops its keys
    print(f"tiny on pgvector, inner_product: worst top-40 logit diff {worst:.3g}")
    store.close()


@pytest.mark.parametrize("metric", ["euclidean_squared", "cosine_distance"])
def test_padded_encodings_on_pgvector(new_database, tiny, metric):
    store = open_store("pgvector", dsn=new_database())
    key = manifest.model_key(tiny.name)
    load.load(store, tiny, key, metric=metric, progress=False)
    text = Text(open_engine(store, tiny.name, key, key_metric=metric).open())
    diff, tokens = compare(tiny, store, key, PROMPTS[1], 8, metric, text=text)
    assert tokens == Reference(tiny).greedy(tokenizer.encode(PROMPTS[1]), 8)
    print(f"tiny on pgvector, {metric}: worst top-40 logit diff {diff:.3g}")
    store.close()


@pytest.mark.parametrize("metric", METRICS)
def test_encoding_error_through_pgvector(pg_dsn, metric):
    """y = x @ W + b of a 768 -> 3072 layer through pgvector's float32, against float64 numpy."""
    store = PgvectorStore(pg_dsn)
    err = encoding_error_through(store, metric)
    print(f"{metric}: max abs error {err:.3g} through pgvector")
    store.close()


# --- what it sends ------------------------------------------------------------------------

def counting(store) -> list:
    """Record each statement the store sends."""
    sent = []
    run = store._run

    def spy(query, params=None, **kw):
        sent.append(query.as_string(store.conn) if hasattr(query, "as_string") else query)
        return run(query, params, **kw)

    store._run = spy
    return sent


def test_a_batch_of_queries_is_one_statement(pg_dsn):
    store = PgvectorStore(pg_dsn)
    rng = np.random.default_rng(3)
    keys = rng.standard_normal((40, 4)).astype(np.float32)
    store.create_namespace("k", 4, {"layer": "int", "head": "int", "pos": "int", "tag": "str"})
    store.upsert(
        "k",
        [f"k{i}" for i in range(40)],
        keys,
        {
            "layer": [0] * 40,
            "head": np.arange(40) % 2,
            "pos": np.arange(40) // 2,
            "tag": [f"t{i % 3}" for i in range(40)],
        },
    )
    q = rng.standard_normal((6, 4)).astype(np.float32)
    sent = counting(store)
    # attention's shape: head and last position vary per query, the layer does not
    queries = [Query(q[i], (("layer", "=", 0), ("head", "=", i % 2), ("pos", "<=", 3 * i))) for i in range(6)]
    hits = store.search("k", queries, "inner_product", include=("pos", "head", "id"))
    assert len(sent) == 1 and "unnest(" in sent[0] and "LATERAL" not in sent[0] and "GROUP BY q.qi" in sent[0]
    for i in range(6):
        sel = hits.query == i
        want = [j for j in range(40) if j % 2 == i % 2 and j // 2 <= 3 * i]
        assert sorted(hits.attrs["id"][sel]) == sorted(f"k{j}" for j in want)
        np.testing.assert_allclose(
            hits.distance[sel], keys[[int(s[1:]) for s in hits.attrs["id"][sel]]] @ q[i], rtol=1e-5, atol=1e-6
        )
    # top-k, each query with its own `in` list and its own tag: one LATERAL join
    sent.clear()
    tags = [["t0"], ["t1", "t2"], ["t0", "t2"]]
    queries = [Query(q[i], (("tag", "in", tags[i]), ("pos", ">", i)), top_k=3) for i in range(3)]
    for metric in store.metrics:
        hits = store.search("k", queries, metric, include=("id",))
        for i in range(3):
            rows = [j for j in range(40) if f"t{j % 3}" in tags[i] and j // 2 > i]
            d = {
                "inner_product": -(keys[rows] @ q[i]),
                "euclidean_squared": ((keys[rows] - q[i]) ** 2).sum(1),
                "cosine_distance": 1 - keys[rows] @ q[i] / np.linalg.norm(keys[rows], axis=1) / np.linalg.norm(q[i]),
            }[metric]
            assert list(hits.attrs["id"][hits.query == i]) == [
                f"k{rows[j]}" for j in np.argsort(d, kind="stable")[:3]
            ], metric
    assert len(sent) == 3 and all("CROSS JOIN LATERAL" in s and "ORDER BY" in s and "LIMIT 3" in s for s in sent)
    assert all(op in sent[0] for op in ("<#>",)) and "<->" in sent[1] and "<=>" in sent[2]
    # filter values travel as parameters, never in the SQL text
    assert not any("t1" in s or "t2" in s for s in sent)
    store.close()


def test_bulk_and_small_upserts_both_overwrite_by_id(pg_dsn):
    store = PgvectorStore(pg_dsn)
    store.create_namespace("m", 3, {"matrix": "str", "row": "int", "w": "float"})
    n = 3000  # above SMALL_BATCH: COPY into a temporary table, then INSERT .. ON CONFLICT
    v = np.arange(3 * n, dtype=np.float32).reshape(n, 3)
    ids = [f"a.{i}" for i in range(n)]
    store.upsert("m", ids, v, {"matrix": ["a"] * n, "row": np.arange(n), "w": np.linspace(0, 1, n)})
    sent = counting(store)
    store.upsert("m", ids[:2000], -v[:2000], {"matrix": ["b"] * 2000, "row": np.arange(2000), "w": np.zeros(2000)})
    assert any(s.startswith("CREATE TEMP TABLE") for s in sent)
    sent.clear()
    store.upsert(
        "m", ["a.5", "z"], np.ones((2, 3), np.float32), {"matrix": ["c", "c"], "row": [5, -1], "w": [0.25, 0.5]}
    )
    assert len(sent) == 1 and "unnest(" in sent[0]
    assert store.count("m") == n + 1
    assert store.count("m", (("matrix", "=", "b"),)) == 1999 and store.count("m", (("w", ">=", 0.25),)) == 1000 + 2
    np.testing.assert_array_equal(
        store.fetch("m", ["a.4", "a.5", "a.2999", "z"]), np.stack([-v[4], np.ones(3), v[2999], np.ones(3)])
    )
    hits = store.search(
        "m", [Query(np.ones(3, np.float32), (("matrix", "=", "c"),))], "inner_product", include=("w", "row")
    )
    assert sorted(hits.attrs["w"].tolist()) == [0.25, 0.5] and hits.attrs["w"].dtype == np.float64
    with pytest.raises(StoreError, match="twice"):
        store.upsert("m", ["q", "q"], np.ones((2, 3), np.float32), {"matrix": ["c", "c"], "row": [0, 0], "w": [0, 0]})
    store.close()


def test_threads_share_one_store(pg_dsn):
    store = PgvectorStore(pg_dsn)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((64, 8)).astype(np.float32)
    store.create_namespace("m", 8, {"matrix": "str", "row": "int"})
    store.upsert("m", [f"a.{i}" for i in range(64)], a, {"matrix": ["a"] * 64, "row": np.arange(64)})
    errors = []

    def work(seed):
        try:
            q = np.random.default_rng(seed).standard_normal((5, 8)).astype(np.float32)
            for _ in range(20):
                h = store.search("m", [Query(v) for v in q], "inner_product", include=("row",))
                got = np.zeros((5, 64))
                got[h.query, h.attrs["row"]] = h.distance
                np.testing.assert_allclose(got, q @ a.T, rtol=1e-5, atol=1e-5)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store.close()


def test_dsn_without_password_in_commands():
    assert redact("postgresql://bob:s3cret@db.example:5433/pg?sslmode=require&password=x") == "postgresql://bob@db.example:5433/pg?sslmode=require"
    assert "s3cret" not in redact("host=db.example user=bob password=s3cret dbname=pg")
    assert "host=db.example" in redact("host=db.example user=bob password=s3cret dbname=pg")


# --- faults -------------------------------------------------------------------------------

def test_no_dsn_and_no_data_directory():
    with pytest.raises(StoreError, match=r"give --dsn or set PUFFERGPT_DSN.*or a data directory"):
        open_store("pgvector", None)


def test_the_cli_on_pgvector_gives_the_reference_tokens(pg_dsn):
    """`puffergpt load --backend pgvector`, then `generate --temperature 0`: the reference's
    greedy tokens on the demo model; the DSN comes from PUFFERGPT_DSN, as a user sets it."""
    import json

    from click.testing import CliRunner

    from puffergpt.cli import main
    from puffergpt.model import checkpoints, tokenizer
    from puffergpt.model.reference import Reference

    run = CliRunner().invoke
    env = {"PUFFERGPT_DSN": pg_dsn}
    r = run(main, ["load", "--model", "demo", "--backend", "pgvector"], env=env)
    assert r.exit_code == 0, r.output
    r = run(main, ["generate", "--model", "demo", "--backend", "pgvector", "--temperature", "0", "-n", "12", "--json",
                   "The list"], env=env)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.output.strip().splitlines()]
    got = [x["token_id"] for x in lines[:-1]]
    want = Reference(checkpoints.load("demo")).greedy(tokenizer.encode("The list"), 12)
    if tokenizer.EOT in want:  # generate ends a text at <|endoftext|>, which it writes
        want = want[: want.index(tokenizer.EOT) + 1]
    assert got == want
    assert lines[-1]["summary"]["backend"] == "pgvector"


def test_no_dsn_starts_a_local_server_loads_searches_and_stops(tmp_path, tiny, tiny_dir, capfd):
    """open_store("pgvector", data_dir) with no DSN: a PostgreSQL of its own under the data
    directory, on a unix socket, with shared_buffers set; a second process reuses it, the
    CLI reaches it with --data, and the last one to close stops it."""
    import json
    import subprocess
    import sys

    from click.testing import CliRunner

    from puffergpt.cli import main
    from puffergpt.stores import pglocal

    data = tmp_path / "data"
    store = open_store("pgvector", data)
    local = store.local
    assert "starting a local PostgreSQL with pgvector" in capfd.readouterr().err
    assert local.running and local.pgdata == data.resolve() / "postgres" and "host=" in local.dsn
    assert store.cli_args() == f"--backend pgvector --data {data.resolve()}"
    settings = dict(
        store._run(
            "SELECT name, setting FROM pg_settings WHERE name IN ('listen_addresses', 'shared_buffers', 'block_size')"
        )
    )
    assert settings["listen_addresses"] == ""  # a unix socket only
    assert int(settings["shared_buffers"]) * int(settings["block_size"]) == pglocal.shared_buffers_mb() * 2**20
    key = manifest.model_key(tiny.name)
    m = load.load(store, tiny, key, progress=False)
    _, tokens = compare(tiny, store, key, PROMPTS[0], 6)
    assert tokens == Reference(tiny).greedy(tokenizer.encode(PROMPTS[0]), 6)
    # another process on the same data directory joins the running server
    code = ("import sys; from pathlib import Path; from puffergpt.stores import open_store; "
            "s = open_store('pgvector', Path(sys.argv[1])); print(len(s.namespaces())); s.close()")
    r = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "using the PostgreSQL already running" in r.stderr and int(r.stdout) == len(store.namespaces()) > 0
    assert local.running  # it left the server to us
    # the CLI, in this process, with --data and no --dsn: the same server and the same model
    r = CliRunner().invoke(main, ["generate", "--model", str(tiny_dir), "--backend", "pgvector", "--data", str(data),
                                  "--temperature", "0", "-n", "4", "--json", PROMPTS[0]], env={"PUFFERGPT_DSN": None})
    assert r.exit_code == 0, r.output
    got = [json.loads(x)["token_id"] for x in r.output.strip().splitlines()[:-1]]
    assert got == tokens[:4] and local.running
    store.close()
    assert not local.running  # the last holder stopped it
    # started again, everything loaded is still there
    again = open_store("pgvector", data)
    assert manifest.manifest(again, key, tiny.name) == m and verify.verify(again, m) == {}
    again.close()
    assert not again.local.running


def test_shared_buffers_is_a_quarter_of_memory_at_most():
    from puffergpt.stores.pglocal import SHARED_BUFFERS_MB, shared_buffers_mb

    assert shared_buffers_mb(64 * 2**30) == SHARED_BUFFERS_MB == 1024
    assert shared_buffers_mb(2 * 2**30) == 512 and shared_buffers_mb(256 * 2**20) == 128


def test_vectors_that_fit_a_page_are_stored_plain(pg_dsn):
    """770 numbers (3 KB) stay in the row, uncompressed; 3,074 (12 KB) can't (PLAIN refuses
    such a row), so they go out of line without compression (EXTERNAL)."""
    from puffergpt.stores.pgvector import PLAIN_MAX_DIM

    store = PgvectorStore(pg_dsn)
    rng = np.random.default_rng(5)
    for dim, want in [(770, "p"), (PLAIN_MAX_DIM, "p"), (3074, "e")]:
        ns = f"w{dim}"
        store.create_namespace(ns, dim, {"matrix": "str", "row": "int"})
        v = rng.standard_normal((3, dim)).astype(np.float32)
        store.upsert(ns, ["a.0", "a.1", "a.2"], v, {"matrix": ["a"] * 3, "row": [0, 1, 2]})
        ((storage,),) = store._run(
            "SELECT attstorage FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'vector'", [f'"ns:{ns}"']
        )
        assert storage == want, dim
        # never compressed; and the row is in the heap (PLAIN) or its vector in the TOAST table (EXTERNAL)
        assert store._run(f'SELECT DISTINCT pg_column_compression(vector) FROM "ns:{ns}"') == [(None,)]
        np.testing.assert_array_equal(store.fetch(ns, ["a.2"])[0], v[2])
    toast = store._one("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = '\"ns:w3074\"'::regclass")[0]
    assert (
        toast > 0
        and store._one("SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = '\"ns:w770\"'::regclass")[0]
        == 0
    )
    store._run('ALTER TABLE "ns:w3074" ALTER COLUMN vector SET STORAGE PLAIN')  # what PLAIN would do with 3,074
    with pytest.raises(StoreError, match="row is too big"):
        store.upsert("w3074", ["b"], np.ones((1, 3074), np.float32), {"matrix": ["b"], "row": [0]})
    store.close()


def test_one_aggregated_row_a_query_equals_numpy(pg_dsn):
    """A product (every row of a 3,072 x 770 matrix) comes back as one row a query; its values
    equal pgvector's own per-document operators exactly, and numpy's within float32 rounding."""
    store = PgvectorStore(pg_dsn)
    rng = np.random.default_rng(6)
    w = rng.standard_normal((3072, 770)).astype(np.float32)
    store.create_namespace("m", 770, {"matrix": "str", "row": "int"})
    store.upsert("m", [f"fc.{i}" for i in range(3072)], w, {"matrix": ["fc"] * 3072, "row": np.arange(3072)})
    store.upsert("m", ["other.0"], w[:1], {"matrix": ["other"], "row": [0]})
    q = rng.standard_normal((4, 770)).astype(np.float32)
    sent, rows = [], []
    run = store._run

    def spy(query, params=None, **kw):
        sent.append(query.as_string(store.conn))
        rows.append(run(query, params, **kw))
        return rows[-1]

    store._run = spy
    w64, q64 = w.astype(np.float64), q.astype(np.float64)
    want = {"inner_product": q64 @ w64.T, "euclidean_squared": ((q64[:, None] - w64[None]) ** 2).sum(-1),
            "cosine_distance": 1 - (q64 @ w64.T) / np.linalg.norm(q64, axis=1)[:, None] / np.linalg.norm(w64, axis=1)}
    op = {
        "inner_product": "-(vector <#> %s)",
        "euclidean_squared": "(vector <-> %s) ^ 2",
        "cosine_distance": "vector <=> %s",
    }
    for metric in store.metrics:
        sent.clear(), rows.clear()
        hits = store.search("m", [Query(v, (("matrix", "=", "fc"),)) for v in q], metric, include=("row", "id"))
        assert len(sent) == 1 and "GROUP BY q.qi" in sent[0] and "array_agg" in sent[0] and len(rows[0]) == 4
        assert (hits.attrs["id"] == np.array([f"fc.{r}" for r in hits.attrs["row"]], dtype=object)).all()
        got = np.full((4, 3072), np.nan)
        got[hits.query, hits.attrs["row"]] = hits.distance
        assert not np.isnan(got).any() and len(hits.query) == 4 * 3072
        diff = np.abs(got - want[metric]).max()
        print(f"{metric}: one aggregated row a query, max abs diff {diff:.3g} against float64 numpy")
        assert diff <= {"inner_product": 1e-3, "euclidean_squared": 2e-3, "cosine_distance": 1e-6}[metric]
        # the per-document operator, row by row: the same numbers (float32 sums for these two)
        one = dict(run(f"SELECT row, {op[metric] % '%b::vector'} FROM \"ns:m\" WHERE matrix = 'fc'", [q[1]]))
        per_doc = np.array([one[r] for r in range(3072)])
        tol = 0 if metric == "inner_product" else 1e-9 * np.abs(per_doc).max()  # squaring pgvector's sqrt
        assert np.abs(got[1] - per_doc).max() <= tol, metric
    store.close()


def test_an_unreachable_server():
    with pytest.raises(StoreError, match=r"can't reach PostgreSQL at 127\.0\.0\.1 port 1 .*--dsn or PUFFERGPT_DSN"):
        PgvectorStore("postgresql://postgres@127.0.0.1:1/postgres")


def test_a_server_that_never_answers_times_out():
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts, never speaks
    port = silent.getsockname()[1]
    t = time.monotonic()
    try:
        with pytest.raises(StoreError, match=f"can't reach PostgreSQL at 127.0.0.1 port {port}.*timeout"):
            PgvectorStore(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2)
    finally:
        silent.close()
    assert time.monotonic() - t < 10


def test_a_wrong_password(pg):
    """pgserver trusts local connections; conftest makes one role log in with a password only."""
    PASSWORD_ROLE, PASSWORD = pg.password_role, pg.password
    db = pg.new_database(owner=PASSWORD_ROLE)
    good = pg.dsn(db, user=PASSWORD_ROLE, password=PASSWORD)
    bad = pg.dsn(db, user=PASSWORD_ROLE, password="not-it")
    with pytest.raises(StoreError, match=f"refused user {PASSWORD_ROLE}: authentication failed") as e:
        PgvectorStore(bad)
    assert "not-it" not in str(e.value) and "--dsn or PUFFERGPT_DSN" in str(e.value)
    with pytest.raises(StoreError, match="authentication failed"):  # no password at all
        PgvectorStore(pg.dsn(db, user=PASSWORD_ROLE))
    store = PgvectorStore(good)  # the right one works, and commands never show it
    store.create_namespace("m", 2, {"row": "int"})
    assert store.namespaces() == ["m"] and PASSWORD not in store.cli_args() and PASSWORD_ROLE in store.cli_args()
    store.close()


def test_a_database_where_pgvector_is_not_enabled_and_may_not_be(pg):
    pg.admin("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'puffergpt_plain') THEN "
             "CREATE ROLE puffergpt_plain LOGIN; END IF; END $$")
    db = pg.new_database(owner="puffergpt_plain", template="template1")  # no vector extension in it
    with pytest.raises(StoreError, match=r"not enabled in database .* may not enable it: .*CREATE EXTENSION vector"):
        PgvectorStore(pg.dsn(db, user="puffergpt_plain"))
    pg.admin("CREATE EXTENSION vector", db=db)  # what the message asks a superuser to do
    store = PgvectorStore(pg.dsn(db, user="puffergpt_plain"))
    store.create_namespace("m", 2, {})
    store.close()


def test_a_server_without_pgvector(bare_server):
    with pytest.raises(
        StoreError, match="does not have pgvector: the 'vector' extension must be installed in that server"
    ):
        PgvectorStore(bare_server())


class Killed(BaseException):
    """What a kill -9 looks like from inside: nothing after it runs."""


def test_a_killed_load_is_refused_then_resumed(new_database, tiny_pg, tiny):
    _, _, key, clean = tiny_pg
    dsn = new_database()
    store = open_store("pgvector", dsn=dsn)
    batches = iter(range(12))

    def kill():
        if next(batches) == 11:
            raise Killed

    with pytest.raises(Killed):
        load.load(store, tiny, key, progress=False, interrupt=kill)
    store.close()  # the process is gone
    store = open_store("pgvector", dsn=dsn)
    stored = sum(store.count(ns) for ns in store.namespaces(f"{key}."))
    assert 0 < stored < clean["documents"]  # half-loaded
    with pytest.raises(manifest.NotLoaded, match="did not finish.*--backend pgvector --dsn"):
        open_engine(store, tiny.name, key)
    resumed = load.load(store, tiny, key, progress=False)
    assert resumed == clean
    assert verify.verify(store, resumed) == {}
    _, tokens = compare(tiny, store, key, PROMPTS[0], 4)
    assert tokens == Reference(tiny).greedy(tokenizer.encode(PROMPTS[0]), 4)
    store.close()


def test_the_server_going_away_mid_generation(pg, tiny_pg, tiny, monkeypatch):
    """A backend killed under a text (pg_terminate_backend): the next call says so clearly,
    the one after reconnects, the text carries on where it was, and nothing is lost."""
    monkeypatch.setattr(
        pgvector_store, "IDLE_CHECK_S", 3600.0
    )  # the call itself meets the dead connection, however slow the machine
    dsn, _, key, m = tiny_pg
    store = open_store("pgvector", dsn=dsn)
    ids = tokenizer.encode(PROMPTS[1])
    want = Reference(tiny).greedy(ids, 8)
    text = Text(open_engine(store, tiny.name, key).open())
    text.append(ids)
    steps = text.generate(8, GREEDY)
    got = [next(steps).token_id for _ in range(3)]
    pid = store.conn.info.backend_pid
    pg.admin("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(StoreError, match=r"the PostgreSQL server went away: .*; run the command again once it is back"):
        next(steps)
    # the text is as it was after 3 tokens; the store reconnects on the next call
    steps = text.generate(5, GREEDY)
    got += [s.token_id for s in steps]
    assert got == want and store.conn.info.backend_pid != pid
    assert manifest.manifest(store, key, tiny.name) == m and verify.verify(store, m) == {}
    text.close()
    store.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_server_stopping_mid_generation(pg, tiny_pg, tiny, mode, monkeypatch):
    """The whole server stops between two tokens: clear errors while it is down, and once it
    is back the store carries on with every document there. After a clean stop (fast) the
    same text carries on; after a crash (immediate) PostgreSQL empties the UNLOGGED table of
    the text's keys, so the text says so and a text opened again gives the same tokens."""
    # The call itself meets the dead connection: on a slow machine the idle check (a second
    # after the last call) would find it first and reconnect, failing with "can't be reached".
    monkeypatch.setattr(pgvector_store, "IDLE_CHECK_S", 3600.0)
    dsn, _, key, m = tiny_pg
    store = open_store("pgvector", dsn=dsn)
    ids = tokenizer.encode(PROMPTS[2])
    want = Reference(tiny).greedy(ids, 6)
    text = Text(open_engine(store, tiny.name, key).open())
    text.append(ids)
    steps = text.generate(6, GREEDY)
    got = [next(steps).token_id for _ in range(2)]
    pg.stop(mode)
    try:
        with pytest.raises(
            StoreError, match=r"the PostgreSQL server went away: .*run the command again once it is back"
        ):
            next(steps)
        with pytest.raises(
            StoreError,
            match=r"went away and can't be reached again: can't reach PostgreSQL at .*--dsn or PUFFERGPT_DSN",
        ):
            store.count(documents.namespace(key, tiny.config.n_embd))
        with pytest.raises(StoreError, match="can't reach PostgreSQL"):
            open_store("pgvector", dsn=dsn)
    finally:
        pg.start()
    if mode == "immediate":
        with pytest.raises(StoreError, match=r"keys in text-\S+ are missing .*close the text and open it again"):
            next(iter(text.generate(4, GREEDY)))
        text.close()
        text = Text(open_engine(store, tiny.name, key).open())
        text.append(ids)
        got = []
    got += [s.token_id for s in text.generate(6 - len(got), GREEDY)]
    assert got == want
    again = open_store("pgvector", dsn=dsn)
    assert manifest.manifest(again, key, tiny.name) == m and verify.verify(again, m) == {}
    text.close()
    store.close()
    again.close()


def test_ready_is_503_while_postgresql_is_stopped(pg, tiny_pg, tiny):
    """/ready (server/probes.py) on pgvector: 200 while PostgreSQL answers, 503 with the
    store's reason while it is stopped, 200 again once it is back; /health answers throughout."""
    from fastapi.testclient import TestClient

    from puffergpt.server import create_app

    dsn, _, key, _ = tiny_pg
    store = open_store("pgvector", dsn=dsn)
    try:
        with TestClient(create_app(open_engine(store, tiny.name, key))) as c:
            assert c.get("/ready").json() == {"status": "ready"}
            pg.stop("fast")
            try:
                r = c.get("/ready")
                assert r.status_code == 503 and "PostgreSQL" in r.json()["reason"], r.text
                assert c.get("/health").status_code == 200
            finally:
                pg.start()
            assert c.get("/ready").status_code == 200, c.get("/ready").text  # it reconnects
    finally:
        store.close()


# --- the approximate index over the token vectors (issue 35) --------------------------------

def test_the_approximate_index_on_pgvector_gives_true_logits_through_hnsw(tiny_pg, tiny):
    """pgvector's HNSW over wte (a table of the padded vectors, searched by cosine): each candidate
    a token with its logit as numpy has it, recall computed against numpy's exact top 40, the
    plan an HNSW index scan (so the search is the index's, not an exact sort)."""
    from puffergpt.lens import output_search

    _, store, key, _ = tiny_pg
    m = load.build_output_index(store, key, tiny.name, {"m": 8, "ef_construction": 32, "ef": 100}, progress=False)
    info = m["indexes"]["wte"]
    assert info["database"] == "pgvector" and info["rows"] == tiny.config.n_vocab and 0 < info["recall_at_build"] <= 1
    run = open_engine(store, tiny.name, key, output_search="approximate").open()
    p = run.weights
    W = tiny.params["wte.weight"].astype(np.float64)
    recalls, worst = [], 0.0
    try:
        for x in output_search.hidden_states(tiny, tokenizer.encode(PROMPTS[1])):
            with run.session.recording() as reqs:
                ids, logits = p.top_k(x, 40)
            assert [r.kind for r in reqs] == ["wte.ann"]
            assert len(set(ids.tolist())) == 40 and 0 <= ids.min() and ids.max() < tiny.config.n_vocab
            worst = max(worst, float(np.abs(logits - (W @ x)[ids]).max()))
            recalls.append(output_search.recall(ids, np.argsort(-(W @ x))[:40]))
        sent = counting(store)  # a token's output search is one statement, as the exact one is
        p.top_k(x, 40)
        assert len(sent) == 1 and "ORDER BY vector <=>" in sent[0], sent
    finally:
        store.__dict__.pop("_run", None)  # the spy off: the store is the module's
        run.session.close()
    assert worst < 1e-4, worst
    table, _ = store._ann(m["matrices"]["wte"]["namespace"], ("matrix", "wte"), "inner_product")
    with store.lock:
        plan = "\n".join(r[0] for r in store.conn.execute(sql.SQL(
            "EXPLAIN SELECT id FROM {} ORDER BY vector <=> %s::vector LIMIT 40").format(table),
            [np.ones(tiny.config.n_embd + 2, np.float32)]).fetchall())
    assert "Index Scan using" in plan and "vector_idx" in plan, plan
    print(f"\ntiny (random weights) on pgvector: recall@40 {np.mean(recalls):.3f}, logits within {worst:.1e}")
