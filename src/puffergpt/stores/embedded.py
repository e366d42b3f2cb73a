"""The embedded backend: DuckDB, in-process, one file under the data directory.

Chosen by measurement (benchmarks/embedded_dbs.py): of the embedded engines that
search exactly, DuckDB's ``array_inner_product`` over a FLOAT[n] column returned
a whole 3,072-row matrix fastest, and it batches many queries into one join.
A namespace is a table; documents of one matrix are written together, so DuckDB's
zone maps skip the other matrices' row groups under a filter.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from puffergpt.stores.base import Filter, Hits, Query, Store, StoreError, check_filter, check_name, check_schema, check_upsert

_SQL_TYPES = {"int": "BIGINT", "float": "DOUBLE", "str": "VARCHAR"}
# metric -> (SQL expression over t.vector and q.v, whether larger is closer)
_METRICS = {
    "inner_product": ("array_inner_product(t.vector, q.v)", True),
    "euclidean_squared": ("pow(array_distance(t.vector, q.v)::DOUBLE, 2)", False),
    "cosine_distance": ("array_cosine_distance(t.vector, q.v)", False),
}
DB_FILE = "puffergpt.duckdb"


def _table(ns: str, catalog: str = "main") -> str:
    return f'{catalog}."ns:' + check_name(ns) + '"'  # names are checked, so quoting is safe


def _col(name: str) -> str:
    if not name.isidentifier():
        raise StoreError(f"invalid attribute name {name!r}")
    return '"' + name + '"'


def _vectors(a: np.ndarray, dim: int) -> pa.FixedSizeListArray:
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim != 2 or a.shape[1] != dim:
        raise StoreError(f"vectors have shape {a.shape}, the namespace holds vectors of length {dim}")
    return pa.FixedSizeListArray.from_arrays(pa.array(a.ravel()), dim)


def _locked(method):
    """One DuckDB connection serves every thread of the process, one call at a time;
    DuckDB's own errors become StoreErrors."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self.lock:
            try:
                return method(self, *args, **kwargs)
            except duckdb.Error as e:
                raise StoreError(f"the embedded store failed: {e}") from None
    return run


class EmbeddedStore(Store):
    name = "embedded"
    metrics = ("inner_product", "euclidean_squared", "cosine_distance")
    max_queries = 16384  # 12 heads x 1,024 positions: a whole prefill's attention in one request

    def __init__(self, data_dir: Path, read_only: bool = False):
        self.lock = threading.RLock()
        self.path = Path(data_dir) / DB_FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except (OSError, duckdb.IOException) as e:
            raise StoreError(f"can't open the data directory {data_dir}: {e}. Choose another with --data DIR.") from None
        if not read_only:
            self._run("CREATE TABLE IF NOT EXISTS _namespaces (name VARCHAR PRIMARY KEY, dim INTEGER, schema VARCHAR)")
            # Ephemeral namespaces (a text's keys) live in memory: they end with the process anyway,
            # since a text's values do, and writes to them skip the file and its WAL.
            self._run("ATTACH ':memory:' AS mem")
            self._run("CREATE TABLE mem._namespaces (name VARCHAR PRIMARY KEY, dim INTEGER, schema VARCHAR)")
            self._run("CREATE TABLE IF NOT EXISTS _meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
        self._ns: dict[str, tuple[int, dict]] = {}
        self._catalog: dict[str, str] = {}

    def _run(self, sql: str, params: list | None = None) -> list:
        # DuckDB 2 wants every result consumed before the next statement.
        return self.con.execute(sql, params).fetchall()

    def _transaction(self, *statements) -> None:
        """All or nothing: a failed statement rolls the others back."""
        self._run("BEGIN")
        try:
            for st in statements:
                self._run(*st) if isinstance(st, tuple) else self._run(st)
            self._run("COMMIT")
        except BaseException:
            self._run("ROLLBACK")
            raise

    def _one(self, sql: str, params: list | None = None):
        rows = self._run(sql, params)
        return rows[0] if rows else None

    # --- namespaces ---
    def _info(self, ns: str) -> tuple[int, dict]:
        if ns not in self._ns:
            for catalog in ("main", "mem"):
                row = self._one(f"SELECT dim, schema FROM {catalog}._namespaces WHERE name = ?", [check_name(ns)])
                if row is not None:
                    self._ns[ns], self._catalog[ns] = (row[0], json.loads(row[1])), catalog
                    break
            else:
                raise StoreError(f"namespace {ns!r} does not exist")
        return self._ns[ns]

    def _t(self, ns: str) -> str:
        self._info(ns)
        return _table(ns, self._catalog[ns])

    @_locked
    def create_namespace(self, ns, dim, schema, metric=None, ephemeral=False):  # DuckDB searches any metric
        check_name(ns)
        if ns in self.namespaces(ns):
            if self._info(ns) != (dim, schema):
                raise StoreError(f"namespace {ns!r} exists with another layout {self._info(ns)}; drop it first")
            return
        check_schema(schema, _SQL_TYPES)
        cols = "".join(f", {_col(k)} {_SQL_TYPES[t]}" for k, t in schema.items())
        catalog = "mem" if ephemeral else "main"
        self._transaction(f"CREATE TABLE {_table(ns, catalog)} (id VARCHAR PRIMARY KEY, vector FLOAT[{int(dim)}]{cols})",
                          (f"INSERT INTO {catalog}._namespaces VALUES (?, ?, ?)", [ns, int(dim), json.dumps(schema)]))

    @_locked
    def drop_namespace(self, ns):
        for catalog in ("main", "mem"):
            self._transaction(f"DROP TABLE IF EXISTS {_table(ns, catalog)}", (f"DELETE FROM {catalog}._namespaces WHERE name = ?", [ns]))
        self._ns.pop(ns, None)
        self._catalog.pop(ns, None)

    @_locked
    def namespaces(self, prefix=""):
        rows = self._run("SELECT name FROM (SELECT name FROM main._namespaces UNION ALL SELECT name FROM mem._namespaces) "
                         "WHERE starts_with(name, ?) ORDER BY name", [prefix])
        return [r[0] for r in rows]

    # --- documents ---
    @_locked
    def upsert(self, ns, ids, vectors, attrs):
        dim, schema = self._info(ns)
        check_upsert(ns, ids, vectors, attrs, schema)
        batch = pa.table({"id": pa.array(list(ids), pa.string()), "vector": _vectors(vectors, dim),
                          **{k: pa.array(np.asarray(attrs[k]).tolist()) for k in schema}})
        names = ", ".join(["id", "vector", *map(_col, schema)])
        self.con.register("_batch", batch)
        try:
            self._run(f"INSERT OR REPLACE INTO {self._t(ns)} ({names}) SELECT {names} FROM _batch")
        finally:
            self.con.unregister("_batch")

    @_locked
    def fetch(self, ns, ids):
        dim, _ = self._info(ns)
        tbl = self.con.sql(f"SELECT id, vector FROM {self._t(ns)} WHERE id IN (SELECT unnest(?::VARCHAR[]))", params=[list(ids)]).to_arrow_table()
        got = dict(zip(tbl.column("id").to_pylist(), range(tbl.num_rows)))
        missing = [i for i in ids if i not in got]
        if missing:
            raise StoreError(f"namespace {ns!r} has no document {missing[0]!r} ({len(missing)} missing); the store is incomplete: run `puffergpt load` again")
        vecs = tbl.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, dim)
        return vecs[[got[i] for i in ids]]

    def _where(self, f: Filter, schema: dict, params: list, q_cols: dict | None = None) -> str:
        """SQL for a filter. Conditions named in q_cols compare against that query column."""
        check_filter(f, schema)
        conds = []
        for i, (attr, op, value) in enumerate(f):
            rhs = q_cols[i] if q_cols and i in q_cols else "?"
            if rhs == "?":
                params.append(list(value) if op == "in" else value)
            conds.append(f"list_contains({rhs}, t.{_col(attr)})" if op == "in" else f"t.{_col(attr)} {op} {rhs}")
        return " AND ".join(conds) or "TRUE"

    @_locked
    def delete(self, ns, filter):
        _, schema = self._info(ns)
        params: list = []
        self._run(f"DELETE FROM {self._t(ns)} t WHERE {self._where(filter, schema, params)}", params)

    @_locked
    def count(self, ns, filter=()):
        _, schema = self._info(ns)
        params: list = []
        return self._one(f"SELECT count(*) FROM {self._t(ns)} t WHERE {self._where(filter, schema, params)}", params)[0]

    @_locked
    def search(self, ns, queries, metric, include=()):
        dim, schema = self._info(ns)
        self.check_search(queries, metric, include, schema)
        # Queries with filters of one shape and one top_k share a single SQL join.
        groups: dict[tuple, list[int]] = {}
        for i, q in enumerate(queries):
            shape = (tuple((a, op) for a, op, _ in q.filter), q.top_k)
            groups.setdefault(shape, []).append(i)
        return Hits.concat([self._search_group(ns, dim, schema, [queries[i] for i in idx], np.asarray(idx), metric, include)
                       for idx in groups.values()], include)

    def _search_group(self, ns, dim, schema, qs: list[Query], index: np.ndarray, metric, include) -> Hits:
        expr, larger_closer = _METRICS[metric]
        f0 = qs[0].filter
        # Conditions equal across the batch become constants (so zone maps skip row groups);
        # the others become columns of the query table, joined per query.
        varying = [i for i in range(len(f0)) if any(q.filter[i][2] != f0[i][2] for q in qs)]
        cols = {"qi": pa.array(np.arange(len(qs), dtype=np.int32)), "v": _vectors(np.stack([q.vector for q in qs]), dim)}
        for i in varying:
            cols[f"f{i}"] = pa.array([list(q.filter[i][2]) if f0[i][1] == "in" else q.filter[i][2] for q in qs])
        params: list = []
        where = self._where(f0, schema, params, {i: f"q.f{i}" for i in varying})
        sel = "".join(f", t.{_col(a)}" for a in include)
        sql = f"SELECT q.qi, {expr} AS d{sel} FROM {self._t(ns)} t, _queries q WHERE {where}"
        k = qs[0].top_k
        if k is None:
            return self._run_group(sql, params, cols, index, include)
        # Top-k: ORDER BY .. LIMIT per query; DuckDB runs it as a heap, far cheaper than a window.
        order = "DESC" if larger_closer else "ASC"
        sql += f" AND q.qi = ? ORDER BY d {order}, t.id LIMIT {int(k)}"
        return Hits.concat([self._run_group(sql, params + [i], cols, index, include) for i in range(len(qs))], include)

    def _run_group(self, sql, params, cols, index, include) -> Hits:
        self.con.register("_queries", pa.table(cols))
        try:
            r = self.con.execute(sql, params).fetchnumpy()
        finally:
            self.con.unregister("_queries")
        return Hits(index[np.asarray(r["qi"], dtype=np.int64)], np.asarray(r["d"], dtype=np.float64),
                    {a: np.asarray(r[a]) for a in include})

    # --- metadata ---
    @_locked
    def put_meta(self, key, value):
        self._run("INSERT OR REPLACE INTO _meta VALUES (?, ?)", [key, json.dumps(value)])

    @_locked
    def get_meta(self, key):
        row = self._one("SELECT value FROM _meta WHERE key = ?", [key])
        return json.loads(row[0]) if row else None

    def cli_args(self):
        return f"--backend embedded --data {self.path.parent}"

    @_locked
    def close(self):
        self.con.close()
