"""The pgvector backend: PostgreSQL with the ``vector`` extension, over psycopg 3.

A namespace is a table ``"ns:<name>"`` (id text primary key, vector vector(dim),
one typed column per attribute: int -> bigint, float -> double precision, str -> text) with a B-tree on the
attribute columns, so that a filter on ``matrix`` (or layer, head) reads only the
rows it keeps. There is deliberately no ANN index on a namespace: every search is an exact scan
of the rows that match its filter, ordered by pgvector's operators

- ``<#>`` negative inner product (returned negated: the inner product, larger is closer),
- ``<->`` L2 distance (returned squared: ``euclidean_squared``),
- ``<=>`` cosine distance.

pgvector computes each of them in float32 over float32 vectors, as DuckDB does.

The one approximate search, ``--output-search approximate``'s, is pgvector's HNSW on tables
of their own (``"ann:<digest>"``: one value's vectors padded to one length, and their copies),
made by ``build_index`` beside the namespace, never on it.

Many queries travel in one round trip: their vectors, and the filter values that
differ between them, are arrays unnested into a query relation ``q`` that joins
the namespace's table (``CROSS JOIN LATERAL (... ORDER BY .. LIMIT k)`` for top-k).
A search for every matching row (a matrix product, attention) returns one row a query,
not one a document: its values aggregated into one array (float4, float8 for cosine)
and each included attribute into an array in the same order (``GROUP BY q.qi``).

The vector column is ``STORAGE PLAIN`` where a row fits a page (a 770-wide vector is
3 KB), so it is never TOASTed nor compressed; longer vectors (3,074 wide) are
``EXTERNAL``: out of line, but never run through pglz.
Filter values equal across the batch are plain parameters. Every value is a
parameter and every identifier is quoted with ``psycopg.sql.Identifier``.

Writes overwrite by id (``INSERT .. ON CONFLICT (id) DO UPDATE``): a small batch (the
attention keys of a token) as one statement over unnested arrays, a large one (a
model's load) by binary COPY into a temporary table first; each batch is one transaction.
A broken connection becomes a StoreError that says the server went away (or, for the
local server, that a backend died from a signal, read from its log); the next call reconnects.

``_namespaces`` (name, dim, schema) and ``_meta`` (key, value) hold the catalog
and the manifests; both keep their JSON as written (type ``json``), so a manifest
reads back with its keys in their order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from puffergpt.settings import Setting
from puffergpt.stores import pglocal
from puffergpt.stores.base import Filter, Hits, Layout, NoIndex, Query, Store, StoreError, check_name

try:
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import errors as pgerrors
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.types.json import Json
except ImportError as e:  # pragma: no cover - the package's optional dependencies
    # Said when a store is opened, not here: the CLI reads this module's settings (--dsn) without them.
    MISSING: str | None = (f"the pgvector backend needs psycopg 3 and pgvector ({e}): "
                           f"pip install 'psycopg[binary]' pgvector")
else:
    MISSING = None

PAD_SLACK = 1.5  # M over the longest vector: see zvec.PAD_SLACK
_SQL_TYPES = {"int": "bigint", "float": "double precision", "str": "text"}
# metric -> (pgvector's operator over t.vector and q.v, smaller is closer; the metric's value from it)
_METRICS = {
    "inner_product": ("(t.vector <#> q.v)", "-{}"),  # <#> is the negative inner product
    "euclidean_squared": ("(t.vector <-> q.v)", "{} ^ 2"),  # <-> is the L2 distance
    "cosine_distance": ("(t.vector <=> q.v)", "{}"),
}
# metric -> (its value for every matching row, the type a query's values are aggregated into).
# pgvector sums inner products and squared distances in float32, so float4 holds them
# exactly and is half the bytes (not a `vector`: it stops at 16,000 numbers, and wte has
# 50,257 rows); cosine is divided in float64: keep float8.
_ALL_ROWS = {
    "inner_product": ("(-(t.vector <#> q.v))::float4", "float4[]"),
    "euclidean_squared": ("vector_l2_squared_distance(t.vector, q.v)::float4", "float4[]"),
    "cosine_distance": ("(t.vector <=> q.v)", "float8[]"),
}
# A vector whose row fits a page (8 KB) stays in it, uncompressed (PLAIN: no TOAST, no
# compression tried at load, nothing to detoast at search). A longer one (mlp.c_proj's
# 3,074 numbers, 12 KB) can't: EXTERNAL moves it out of line without trying pglz on it.
PLAIN_MAX_DIM = 1800  # 4 * 1800 + 8 bytes of vector leaves room in a page for the id and attributes
_NP_TYPES = {"int": np.int64, "float": np.float64, "str": object}
CONNECT_TIMEOUT_S = 5
IDLE_CHECK_S = 1.0  # a connection idle this long is checked before use
SMALL_BATCH = 1024  # upserts of up to this many documents are one statement; larger ones go through COPY
FIX_DSN = "check --dsn or PUFFERGPT_DSN"


def _table(ns: str) -> sql.Identifier:
    return sql.Identifier("ns:" + check_name(ns))


def _col(name: str) -> sql.Composed:
    if not name.isidentifier():
        raise StoreError(f"invalid attribute name {name!r}")
    return sql.SQL("t.{}").format(sql.Identifier(name))


def _finite(a: np.ndarray) -> np.ndarray:
    if not np.isfinite(a).all():
        raise StoreError("vectors hold NaN or infinite numbers, which pgvector does not store")
    return a


def redact(dsn: str) -> str:
    """The DSN without its password (for messages and commands a user may copy)."""
    if "://" in dsn:
        u = urlsplit(dsn)
        netloc = u.netloc
        if "@" in netloc:
            cred, host = netloc.rsplit("@", 1)
            netloc = cred.split(":", 1)[0] + "@" + host
        query = urlencode([(k, v) for k, v in parse_qsl(u.query, keep_blank_values=True) if k != "password"], safe="/")
        return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<an invalid DSN>"
    parts.pop("password", None)
    return make_conninfo(**parts)


def _where(dsn_parts: dict) -> str:
    host = (
        dsn_parts.get("host")
        or dsn_parts.get("hostaddr")
        or os.environ.get("PGHOST")
        or "localhost (the default socket)"
    )
    port = dsn_parts.get("port") or os.environ.get("PGPORT") or "5432"
    return f"{host} port {port}"


def _locked(method):
    """One connection serves every thread of the process, one call at a time. A broken
    connection becomes a StoreError that says what happened; the next call reconnects."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.lock:
            self._check_idle()
            if self.conn is None or self.conn.closed:
                if self._closed:
                    raise StoreError("the pgvector store is closed")
                try:
                    self._connect()
                except StoreError as e:
                    raise StoreError(f"the PostgreSQL server went away and can't be reached again: {e}") from None
            try:
                return method(self, *args, **kwargs)
            except psycopg.OperationalError as e:
                self._used = 0.0
                if self.conn is not None and (self.conn.closed or self.conn.broken):
                    self._drop_connection()
                    raise StoreError(self._went_away(e)) from None
                raise StoreError(f"PostgreSQL could not do it: {_msg(e)}") from None
            except pgerrors.UndefinedTable as e:
                self._ns.clear()  # another client dropped a namespace under us
                raise StoreError(f"a namespace's table is gone ({_msg(e)}); run `puffergpt load` again") from None
            except psycopg.Error as e:
                raise StoreError(f"PostgreSQL refused it: {_msg(e)}") from None
    return run


def _msg(e: Exception) -> str:
    return " ".join(str(e).split())


class PgvectorStore(Store):
    name = "pgvector"
    metrics = ("inner_product", "euclidean_squared", "cosine_distance")
    max_queries = 4096
    thread_safe = True  # it holds its own locks

    def __init__(self, dsn: str, connect_timeout: int = CONNECT_TIMEOUT_S, local: pglocal.LocalServer | None = None):
        if MISSING:
            raise StoreError(MISSING)
        if not dsn or not isinstance(dsn, str):
            raise StoreError("the pgvector backend needs a PostgreSQL DSN: give --dsn or set PUFFERGPT_DSN")
        try:
            self.parts = conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as e:
            raise StoreError(f"invalid DSN {redact(dsn)!r}: {_msg(e)}; {FIX_DSN}") from None
        self.dsn = dsn
        self.local = local  # the local server this store started or joined (pglocal), released at close
        self.connect_timeout = connect_timeout
        self.lock = threading.RLock()
        self.conn: psycopg.Connection | None = None
        self._closed = False
        self._ns: dict[str, Layout] = {}
        self._ef: int | None = None  # hnsw.ef_search as this session has it set (None: the server's default)
        self._ann_M: dict[str, float] = {}  # an index's vectors' length, by its _meta key
        self._used = time.monotonic()  # when a call last used the connection (_check_idle)
        with self.lock:
            self._connect()

    # --- the connection ---
    def _connect(self) -> None:
        where = _where(self.parts)
        options = {} if "connect_timeout" in self.parts else {"connect_timeout": self.connect_timeout}
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, **options)
        except psycopg.OperationalError as e:
            m = _msg(e)
            low = m.lower()
            user = self.parts.get("user") or os.environ.get("PGUSER") or "the default user"
            if (
                "password authentication failed" in low
                or "no password supplied" in low
                or "authentication failed" in low
            ):
                raise StoreError(
                    f"PostgreSQL at {where} refused user {user}: authentication failed ({m}); "
                    f"{FIX_DSN} (or PGPASSWORD, ~/.pgpass)"
                ) from None
            if "database" in low and "does not exist" in low:
                raise StoreError(
                    f"PostgreSQL at {where} has no such database ({m}): create it (createdb) or {FIX_DSN}"
                ) from None
            if "role" in low and "does not exist" in low:
                raise StoreError(f"PostgreSQL at {where} has no such role ({m}); {FIX_DSN}") from None
            raise StoreError(
                f"can't reach PostgreSQL at {where} ({m}); {FIX_DSN}, and that the server is running"
            ) from None
        try:
            self._prepare(conn, where)
        except BaseException:
            conn.close()
            raise
        self.conn = conn

    def _prepare(self, conn, where: str) -> None:
        try:
            if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
                    raise StoreError(f"the PostgreSQL server at {where} does not have pgvector: the 'vector' extension "
                                     "must be installed in that server (https://github.com/pgvector/pgvector), "
                                     f"or {FIX_DSN} to use another server")
                try:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except pgerrors.InsufficientPrivilege:
                    db = conn.info.dbname
                    raise StoreError(
                        f"pgvector is installed in the server at {where}, but not enabled in database {db!r}, "
                        f"and user {conn.info.user!r} may not enable it: ask its owner or a superuser to run "
                        f"`CREATE EXTENSION vector;` in {db!r}, or {FIX_DSN}"
                    ) from None
                except pgerrors.UniqueViolation:
                    pass  # another client enabled it at the same moment
                except pgerrors.FeatureNotSupported as e:  # "extension is not available"
                    raise StoreError(
                        f"the PostgreSQL server at {where} does not have pgvector ({_msg(e)}): the 'vector' "
                        f"extension must be installed in that server, or {FIX_DSN}"
                    ) from None
            register_vector(conn)
            for stmt in (
                "CREATE TABLE IF NOT EXISTS _namespaces "
                "(name text PRIMARY KEY, dim integer NOT NULL, schema json NOT NULL)",
                "CREATE TABLE IF NOT EXISTS _meta (key text PRIMARY KEY, value json NOT NULL)",
            ):
                try:
                    conn.execute(stmt)
                except pgerrors.UniqueViolation:
                    pass  # created by another client at the same moment
        except pgerrors.InsufficientPrivilege as e:
            raise StoreError(
                f"user {conn.info.user!r} may not create tables in database {conn.info.dbname!r} at {where} "
                f"({_msg(e)}): grant it CREATE on the schema, or {FIX_DSN}"
            ) from None
        except psycopg.OperationalError as e:
            raise StoreError(f"the PostgreSQL server at {where} went away while connecting: {_msg(e)}; "
                             "run the command again once it is back") from None
        except psycopg.Error as e:
            raise StoreError(f"PostgreSQL at {where} refused to set up the store: {_msg(e)}") from None

    def _went_away(self, e: Exception) -> str:
        """What a broken connection says: a backend of the local server that died from a
        signal (its log says so: signal 4 is pgvector using instructions this CPU lacks, and
        a rerun fails alike) is named; otherwise the server went away and may come back."""
        crash = self.local.crash() if self.local is not None else None
        if crash:
            return crash
        return (f"the PostgreSQL server went away: {_msg(e)}; run the command again once it is back "
                "(if it goes away at the same step again, see the server's log: a backend \"terminated by signal 4\" "
                "means its pgvector uses instructions that server's CPU lacks)")

    def _check_idle(self) -> None:
        """A connection that lay idle may have died with a server restart, unnoticed until
        its next statement fails: check one idle over IDLE_CHECK_S with an empty statement
        (one round trip), and drop it if dead, so the call reconnects instead of failing once."""
        now = time.monotonic()
        idle, self._used = now - self._used, now
        if self.conn is None or self.conn.closed or idle < IDLE_CHECK_S:
            return
        try:
            self.conn.execute("SELECT 1")
        except psycopg.Error:
            self._drop_connection()

    def _drop_connection(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        self.conn = None
        self._ns.clear()
        self._ef = None

    def _run(self, query, params: Sequence | dict | None = None, binary: bool = True) -> list:
        cur = self.conn.execute(query, params, binary=binary)
        return cur.fetchall() if cur.description is not None else []

    def _one(self, query, params=None):
        rows = self._run(query, params)
        return rows[0] if rows else None

    # --- namespaces ---
    @_locked
    def _layout(self, ns):
        if ns not in self._ns:
            row = self._one("SELECT dim, schema FROM _namespaces WHERE name = %s", [ns])
            if row is None:
                return None
            self._ns[ns] = Layout(row[0], row[1], self.metrics)  # any metric on any table
        return self._ns[ns]

    @_locked
    def _create_namespace(self, ns, layout, ephemeral):
        if (old := self._layout(ns)) is not None:
            return old
        dim, schema = layout.dim, layout.schema
        cols = sql.SQL("").join(
            sql.SQL(", {} {}").format(sql.Identifier(k), sql.SQL(_SQL_TYPES[t])) for k, t in schema.items()
        )
        try:
            with self.conn.transaction():
                # A text's keys need no crash safety: an UNLOGGED table skips the WAL.
                create = "CREATE UNLOGGED TABLE" if ephemeral else "CREATE TABLE"
                self._run(sql.SQL(create + " {} (id text PRIMARY KEY, vector vector({}) NOT NULL{})").format(
                    _table(ns), sql.Literal(int(dim)), cols))
                self._run(sql.SQL("ALTER TABLE {} ALTER COLUMN vector SET STORAGE {}").format(
                    _table(ns), sql.SQL(storage(dim))))
                if schema:  # a B-tree on the attributes (not an ANN index): filters read only their rows
                    self._run(sql.SQL("CREATE INDEX ON {} ({})").format(
                        _table(ns), sql.SQL(", ").join(map(sql.Identifier, schema))))
                self._run("INSERT INTO _namespaces VALUES (%s, %s, %s)", [ns, int(dim), Json(schema)])
        except (pgerrors.DuplicateTable, pgerrors.UniqueViolation):  # another client made it meanwhile
            self._ns.pop(ns, None)
            return self._layout(ns)
        return None

    @_locked
    def _drop_namespace(self, ns):
        with self.conn.transaction():
            self._run(sql.SQL("DROP TABLE IF EXISTS {}").format(_table(ns)))
            self._run("DELETE FROM _namespaces WHERE name = %s", [ns])
            for (key,) in self._run("DELETE FROM _meta WHERE starts_with(key, %s) RETURNING key", [f"index:{ns}:"]):
                self._run(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(  # its approximate indexes' tables
                    _ann_table(key), _ann_table(key, "copies")))
                self._ann_M.pop(key, None)
        self._ns.pop(ns, None)

    @_locked
    def _namespaces(self, prefix):
        rows = self._run("SELECT name, dim, schema FROM _namespaces WHERE starts_with(name, %s)", [prefix])
        return {name: Layout(dim, schema, self.metrics) for name, dim, schema in rows}

    # --- documents ---
    @_locked
    def _upsert(self, ns, layout, ids, vectors, attrs):
        schema = layout.schema
        names = list(schema)
        columns = [ids, list(_finite(vectors)), *(attrs[k] for k in names)]
        cols = sql.SQL(", ").join(map(sql.Identifier, ["id", "vector", *names]))
        sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in ["vector", *names])
        conflict = sql.SQL("ON CONFLICT (id) DO UPDATE SET {}").format(sets)
        if len(ids) <= SMALL_BATCH:  # one statement, one round trip: the arrays unnested
            types = sql.SQL(", ").join(
                sql.SQL("%b::{}[]").format(sql.SQL(t))
                for t in ["text", "vector", *(_SQL_TYPES[schema[k]] for k in names)]
            )
            self._run(
                sql.SQL("INSERT INTO {} ({}) SELECT * FROM unnest({}) {}").format(_table(ns), cols, types, conflict),
                columns,
            )
            return
        with self.conn.transaction():  # bulk: COPY into a temporary table, then one INSERT
            self._run(sql.SQL("CREATE TEMP TABLE _batch (LIKE {}) ON COMMIT DROP").format(_table(ns)))
            with self.conn.cursor().copy(sql.SQL("COPY _batch ({}) FROM STDIN (FORMAT BINARY)").format(cols)) as cp:
                cp.set_types(["text", "vector", *(_SQL_TYPES[schema[k]] for k in names)])
                for row in zip(*columns, strict=True):
                    cp.write_row(row)
            self._run(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM _batch {}").format(_table(ns), cols, cols, conflict))

    @_locked
    def _fetch(self, ns, layout, ids):
        rows = self._run(sql.SQL("SELECT id, vector FROM {} WHERE id = ANY(%b::text[])").format(_table(ns)), [ids])
        return {r[0]: r[1].to_numpy() for r in rows}

    def _where(self, f: Filter, schema: dict, params: list, q_cols: dict | None = None) -> sql.Composable:
        """SQL for a filter. Conditions named in q_cols compare against that query column."""
        types = {"id": "str", **schema}
        conds = []
        for i, (attr, op, value) in enumerate(f):
            typ = sql.SQL(_SQL_TYPES[types[attr]])
            if q_cols and i in q_cols:
                rhs = sql.SQL(q_cols[i])
                if op == "in":  # a json array per query: does it hold this row's value?
                    conds.append(sql.SQL("{} @> to_jsonb({})").format(rhs, _col(attr)))
                else:
                    conds.append(sql.SQL("{} {} {}").format(_col(attr), sql.SQL(op), rhs))
            elif op == "in":
                params.append(list(value))
                conds.append(sql.SQL("{} = ANY(%b::{}[])").format(_col(attr), typ))
            else:
                params.append(value)
                conds.append(sql.SQL("{} {} %b::{}").format(_col(attr), sql.SQL(op), typ))
        return sql.SQL(" AND ").join(conds) if conds else sql.SQL("TRUE")

    @_locked
    def _delete(self, ns, layout, filter):
        params: list = []
        self._run(
            sql.SQL("DELETE FROM {} t WHERE {}").format(_table(ns), self._where(filter, layout.schema, params)), params
        )

    @_locked
    def _count(self, ns, layout, filter):
        params: list = []
        return self._one(
            sql.SQL("SELECT count(*) FROM {} t WHERE {}").format(
                _table(ns), self._where(filter, layout.schema, params)
            ),
            params,
        )[0]

    @_locked
    def _search(self, ns, layout, queries, metric, include):
        schema = layout.schema
        _finite(np.stack([q.vector for q in queries]))
        # Queries with filters of one shape and one top_k share a single statement.
        groups: dict[tuple, list[int]] = {}
        for i, q in enumerate(queries):
            shape = (tuple((a, op) for a, op, _ in q.filter), q.top_k)
            groups.setdefault(shape, []).append(i)
        return Hits.concat([self._search_group(ns, schema, [queries[i] for i in idx], np.asarray(idx), metric, include)
                       for idx in groups.values()], include)

    def _search_group(self, ns, schema, qs: list[Query], index: np.ndarray, metric, include) -> Hits:
        order, value = _METRICS[metric]
        types = {"id": "str", **schema}
        f0 = qs[0].filter
        # Conditions equal across the batch become parameters (so the B-tree picks the rows);
        # the others become columns of the query relation, one value per query.
        varying = [i for i in range(len(f0)) if any(not _same(q.filter[i][2], f0[i][2]) for q in qs)]
        arrays = [list(range(len(qs))), [np.asarray(q.vector, np.float32) for q in qs]]
        q_types = [sql.SQL("int4[]"), sql.SQL("vector[]")]
        for i in varying:
            if f0[i][1] == "in":
                arrays.append([Json(q.filter[i][2]) for q in qs])
                q_types.append(sql.SQL("jsonb[]"))
            else:
                arrays.append([q.filter[i][2] for q in qs])
                q_types.append(sql.SQL(_SQL_TYPES[types[f0[i][0]]] + "[]"))
        q_cols = {i: f"q.f{i}" for i in varying}
        params: list = list(arrays)
        where = self._where(f0, schema, params, q_cols)
        names = sql.SQL(", ").join(sql.SQL("%b::{}").format(t) for t in q_types)
        alias = sql.SQL(", ").join(sql.Identifier(c) for c in ["qi", "v", *(f"f{i}" for i in varying)])
        rel = sql.SQL("unnest({}) AS q({})").format(names, alias)
        k = qs[0].top_k
        if k is None:  # one row a query: its values, and the attributes in the same order
            expr, agg = _ALL_ROWS[metric]
            sel = sql.SQL("").join(sql.SQL(", array_agg({})").format(_col(a)) for a in include)
            query = sql.SQL("SELECT q.qi, array_agg({})::{} AS d{} FROM {} JOIN {} t ON {} GROUP BY q.qi").format(
                sql.SQL(expr), sql.SQL(agg), sel, rel, _table(ns), where)
            return _unnest_hits(self._run(query, params), index, include, types)
        inner = sql.SQL("").join(
            sql.SQL(", {} AS {}").format(_col(a), sql.Identifier("a_" + a)) for a in include if a != "id"
        )
        sel = sql.SQL("").join(
            sql.SQL(", h.{}").format(sql.Identifier("id" if a == "id" else "a_" + a)) for a in include
        )
        # each query's k best (one distance a row: the outer select turns it into the metric's value)
        query = sql.SQL(
            "SELECT q.qi, {} AS d{} FROM {} CROSS JOIN LATERAL "
            "(SELECT {} AS o, t.id{} FROM {} t WHERE {} ORDER BY o, t.id LIMIT {}) h "
            "ORDER BY q.qi, h.o, h.id"
        ).format(
            sql.SQL(value.format("h.o")),
            sel,
            rel,
            sql.SQL(order),
            inner,
            _table(ns),
            where,
            sql.Literal(max(int(k), 0)),
        )
        rows = self._run(query, params)
        n = len(rows)
        cols = list(zip(*rows, strict=True)) if rows else [()] * (2 + len(include))
        attrs = {}
        for j, a in enumerate(include):
            attrs[a] = (
                np.fromiter(cols[2 + j], _NP_TYPES[types[a]], n)
                if types[a] != "str"
                else np.array(cols[2 + j], dtype=object)
            )
        return Hits(index[np.fromiter(cols[0], np.int64, n)], np.fromiter(cols[1], np.float64, n), attrs)

    # --- an approximate index: pgvector's HNSW over the padded vectors, in a table of their own ---
    @staticmethod
    def _ann(ns: str, on: tuple[str, str], metric: str) -> tuple[sql.Identifier, str]:
        """The index's table (a digest: PostgreSQL cuts names at 63 bytes) and its _meta key."""
        key = f"index:{ns}:{on[0]}={on[1]}:{metric}"
        return _ann_table(key), key

    @_locked
    def _has_index(self, ns, on, metric):
        table, key = self._ann(ns, on, metric)
        return self._get_meta(key) is not None and self._one("SELECT to_regclass(%s)", [table.as_string(
            self.conn)])[0] is not None

    @_locked
    def _build_index(self, ns, layout, on, metric, params, progress):
        """``CREATE INDEX ... USING hnsw (vector vector_cosine_ops)`` on a table of the documents'
        vectors padded to one length M (zvec.py says why: the nearest by cosine is then the largest
        inner product). Identical vectors go into the graph once: the others are in a second table
        (id, its first copy's id), and a hit brings its copies. The namespace's table is not touched."""
        if metric != "inner_product":
            raise StoreError(f"the pgvector store's approximate index ranks by inner product (puffergpt's default "
                             f"encoding), not {metric}: load the model without --metric")
        m, efc = int(params.get("m", 16)), int(params.get("ef_construction", 100))
        rows = self._run(sql.SQL("SELECT id, vector FROM {} WHERE {} = %s ORDER BY id").format(
            _table(ns), sql.Identifier(on[0])), [on[1]])
        if not rows:
            raise StoreError(f"namespace {ns!r} holds no documents with {on[0]}={on[1]!r} to index")
        ids = np.array([r[0] for r in rows], object)
        d = np.stack([r[1].to_numpy() for r in rows])  # (rows, dim)
        _, first, inverse = np.unique(d, axis=0, return_index=True, return_inverse=True)
        first_of = ids[first][inverse.ravel()]
        sq = (d.astype(np.float64) ** 2).sum(axis=1)
        M = float(np.sqrt(sq.max())) * PAD_SLACK + 1e-6
        padded = np.concatenate([d, np.sqrt(np.maximum(M * M - sq, 0)).astype(np.float32)[:, None]], axis=1)
        table, key = self._ann(ns, on, metric)
        self._ann_M.pop(key, None)
        copies = _ann_table(key, "copies")
        with self.conn.transaction():
            self._run(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(table, copies))
            self._run(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, vector vector({}) NOT NULL)").format(
                table, sql.Literal(d.shape[1] + 1)))
            self._run(sql.SQL("CREATE TABLE {} (id text PRIMARY KEY, first text NOT NULL)").format(copies))
            with self.conn.cursor().copy(sql.SQL("COPY {} (id, vector) FROM STDIN (FORMAT BINARY)").format(
                    table)) as cp:
                cp.set_types(["text", "vector"])
                for i in range(len(ids)):
                    if first_of[i] == ids[i]:
                        cp.write_row((ids[i], padded[i]))
                    if progress and (i + 1) % 2048 == 0:
                        progress(i + 1, len(ids))
            with self.conn.cursor().copy(sql.SQL("COPY {} (id, first) FROM STDIN").format(copies)) as cp:
                for i in np.flatnonzero(first_of != ids):
                    cp.write_row((ids[i], first_of[i]))
            if progress:
                progress(len(ids), len(ids))
            self._run(sql.SQL("CREATE INDEX ON {} (first)").format(copies))
            self._run("SET LOCAL maintenance_work_mem = '512MB'")  # the graph built in memory, not on disk
            self._run(sql.SQL("CREATE INDEX ON {} USING hnsw (vector vector_cosine_ops) WITH (m = {}, "
                              "ef_construction = {})").format(table, sql.Literal(m), sql.Literal(efc)))
            self._run(sql.SQL("ANALYZE {}").format(table))
            built = {"kind": "hnsw", "database": "pgvector", "metric": metric, "m": m, "ef_construction": efc,
                     "rows": len(ids), "distinct": len(first), "reduction": "padded to one length, searched by cosine"}
            self._put_meta(key, {**built, "M": M})
        return built

    @_locked
    def _search_approximate(self, ns, layout, on, queries, metric, include, ef):
        """One statement a query: the graph's k nearest by cosine, each with its copies, and the
        attributes from the namespace's table. hnsw.ef_search is set for the session when it
        changes (a statement of its own, once)."""
        table, key = self._ann(ns, on, metric)
        if key not in self._ann_M:  # read once: a search is one statement
            if (info := self._get_meta(key)) is None:
                raise NoIndex(f"the pgvector store has no approximate index over {ns} {on[0]}={on[1]}")
            self._ann_M[key] = float(info["M"])
        M = self._ann_M[key]
        if self._ef != ef:
            self._run(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(int(ef))))
            self._ef = ef
        sel = sql.SQL("").join(sql.SQL(", t.{}").format(sql.Identifier(a)) for a in include)
        parts = []
        for i, q in enumerate(queries):
            v = np.append(q.vector, np.float32(0)).astype(np.float32)
            rows = self._run(sql.SQL(
                "WITH h AS (SELECT id, vector <=> %b::vector AS d FROM {a} ORDER BY vector <=> %b::vector LIMIT {k}), "
                "c AS (SELECT h.id AS first, h.id, h.d FROM h UNION ALL "
                "SELECT c.first, c.id, h.d FROM h JOIN {c} c ON c.first = h.id) "
                "SELECT c.d{sel} FROM c JOIN {t} t ON t.id = c.id "
                "ORDER BY c.d, c.first, c.id LIMIT {k}").format(a=table, c=_ann_table(key, "copies"), t=_table(ns),
                                                                sel=sel, k=sql.Literal(int(q.top_k))), [v, v])
            qn = float(np.sqrt((q.vector.astype(np.float64) ** 2).sum()))
            parts.append(Hits(np.full(len(rows), i, np.int64),
                              np.array([(1 - r[0]) * M * qn for r in rows], np.float64),  # cosine -> d.q
                              {a: np.array([r[1 + j] for r in rows], _NP_TYPES[({"id": "str"} | layout.schema)[a]])
                               for j, a in enumerate(include)}))
        return Hits.concat(parts, include)

    # --- metadata ---
    @_locked
    def _put_meta(self, key, value):
        self._run("INSERT INTO _meta VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                  [str(key), Json(value, dumps=json.dumps)])

    @_locked
    def _get_meta(self, key):
        row = self._one("SELECT value::text FROM _meta WHERE key = %s", [str(key)])
        return json.loads(row[0]) if row else None

    def worker_options(self):
        """A local server (no --dsn) is this process's: a worker reaches it at its address."""
        return {"dsn": self.dsn} if self.local is not None else {}

    def cli_args(self):
        if self.local is not None:
            return f"--backend pgvector --data {shlex.quote(str(self.local.data_dir))}"
        return f"--backend pgvector --dsn {shlex.quote(redact(self.dsn))}"

    def close(self):
        with self.lock:
            self._closed = True
            if self.conn is not None:
                try:
                    self.conn.close()
                except Exception:
                    pass
                self.conn = None
            if self.local is not None:
                self.local.release()


def _ann_table(key: str, part: str = "") -> sql.Identifier:
    """An approximate index's table (``part`` "copies": its copies' table), named by a digest of
    its _meta key: PostgreSQL cuts names at 63 bytes."""
    return sql.Identifier("ann:" + hashlib.sha1(key.encode()).hexdigest()[:24] + (f":{part}" if part else ""))


def storage(dim: int) -> str:
    """The vector column's STORAGE for vectors of length dim (see PLAIN_MAX_DIM)."""
    return "PLAIN" if int(dim) <= PLAIN_MAX_DIM else "EXTERNAL"


def _unnest_hits(rows: list, index: np.ndarray, include: Sequence[str], types: dict) -> Hits:
    """Rows of (query, its values, one array per attribute) -> one hit per value.
    Within a row every array_agg saw the documents in one order, so they line up."""
    values = [np.asarray(r[1], np.float64) for r in rows]
    sizes = np.fromiter((len(v) for v in values), np.int64, len(rows))
    query = np.repeat(index[np.fromiter((r[0] for r in rows), np.int64, len(rows))], sizes)
    distance = np.concatenate(values) if rows else np.zeros(0)
    attrs = {}
    for j, a in enumerate(include):
        flat = [x for r in rows for x in r[2 + j]]
        attrs[a] = (
            np.array(flat, dtype=object) if types[a] == "str" else np.asarray(flat, _NP_TYPES[types[a]]).reshape(-1)
        )
    return Hits(query, distance, attrs)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple, np.ndarray)) or isinstance(b, (list, tuple, np.ndarray)):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return a == b


def open_pgvector(
    data_dir: Path | None = None, dsn: str | None = None, connect_timeout: int = CONNECT_TIMEOUT_S
) -> PgvectorStore:
    """The pgvector backend's factory: the server at ``dsn``, or without one a local server
    under the data directory (pglocal), released when the store is closed."""
    if MISSING:
        raise StoreError(MISSING)
    if dsn:
        return PgvectorStore(dsn, connect_timeout)
    if data_dir is None:
        raise StoreError("the pgvector backend needs a PostgreSQL DSN (give --dsn or set PUFFERGPT_DSN), "
                         "or a data directory (--data) for a local server")
    local = pglocal.start(Path(data_dir))
    try:
        return PgvectorStore(local.dsn, connect_timeout, local=local)
    except BaseException:
        local.release()
        raise


open_pgvector.settings = (  # what the CLI reads for it (Store.settings): --dsn, else PUFFERGPT_DSN
    Setting("dsn", "PostgreSQL connection string for --backend pgvector; without one, a local server under --data "
                   "[env PUFFERGPT_DSN]", flag="--dsn", env="PUFFERGPT_DSN", secret=True),
)
