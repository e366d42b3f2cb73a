"""Probe the HTTP API with bad input and count the answers: 4xx (refused with a message),
5xx (the server's fault), hangs (no answer in 10 s). Loopback only: the app runs in this
process under a real uvicorn server on 127.0.0.1 (a free port), on a tiny random model,
with a notebook in a temporary folder.

    .venv/bin/python scripts/probe_server.py

What it sends:
- each field of each POST route set to each bad value (wrong types, out of range, NaN,
  1e400, a lone surrogate, 70,000 characters), and to JSON Python cannot hold as sent
  (an integer of 5,000 digits, nesting 3,000 and 200 deep);
- every string in each route's good body made to hold a lone surrogate (inside lists too);
- whole bodies that are not JSON: not UTF-8, a byte order mark, 3,000 open brackets, a list;
- GETs of odd paths: unknown texts and steps, static and docs-asset names of 5,000
  characters, a NUL, '..';
- what a page on another site can send (issue 31): each state-changing or costly route
  with an Origin of its own, Sec-Fetch-Site cross-site or same-site, and bodies that are
  not JSON (text/plain, a form, none, application/vnd.evil+json, charset latin-1): each
  must be refused (403, 415) with nothing run (texts and the notebook's commits counted),
  printed as a matrix of route x kind -> status;
- the work budget: 64 prompts of 120 ids echoed with logprobs (15,360 tokens of work) must
  be a 400 naming --max-request-tokens before anything runs;
- slow and odd clients (issue 43), over a raw socket: no Host header (HTTP/1.0: 200), headers
  sent a byte at a time (a 408 at the header deadline, 2 s here), a 1 MB header line (431), a
  body sent a byte at a time (a 408 at the body deadline, 3 s here), one connection past the
  cap (503); each must come within its deadline and a second;
- saves retried (issue 43): a save sent twice with one Idempotency-Key (the same insight), and
  one answered 503 (git's index locked) then retried with its key once git is back (one
  insight, committed, the same id);
- a damaged approximate index (issue 43), after the server: on copies of its data directory,
  a truncated graph file, garbage in built.json, bytes flipped with the mtime kept; `verify`
  and `generate --output-search approximate` must each exit 1 naming
  `load --output-index --repair`, never a traceback;
- notebook attacks: an insight file that is not UTF-8, a YAML alias bomb, a FIFO, a file
  over the size bound, a symbolic link to a file outside, the insights folder a symbolic
  link to a folder outside, and a read-only notebook (a 503 with the reason is its right
  answer; nothing may be written outside the notebook).

Some values in the list are valid for some fields (0, None for an optional field, a list
of token ids as a prompt): those are accepted and listed; every other probe must get a
4xx (or its expected status), none a 5xx or a hang, and the server must still answer
after each.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from puffergpt import notebook as nb
from puffergpt.model import checkpoints, tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search import load, manifest
from puffergpt.search.engine import Engine
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import server
from puffergpt.stores import open_store

BAD_VALUES = [None, True, -1, 0, 1.5, 1e400, float("nan"), float("inf"), "x", "\ud800", [], {}, [1], "a" * 70_000]
# JSON text put in a field's place: values Python's json cannot hold as sent
RAW_VALUES = ["1" * 5000, "-" + "9" * 5000, "[" * 3000 + "]" * 3000, '{"a":' * 3000 + "1" + "}" * 3000,
              "[" * 200 + "]" * 200, "NaN", "-Infinity", "1e400"]
RAW_BODIES = [b'{"prompt": "caf\xe9"}', b"\xef\xbb\xbf{}", b"[" * 3000, b"\xff\xfe{\x00}\x00", b'{"a": 1,}']
FIELDS = {
    "/api/texts": {"prompt": "hi"},
    "/api/texts/{id}/generate": {"max_tokens": 2, "temperature": 0, "top_k": 5, "seed": 1, "lens_k": 5},
    "/api/texts/{id}/append": {"text": "more"},
    "/api/texts/{id}/step_back": {"position": 1},
    "/api/texts/{id}/cut": {"position": 1},
    "/api/texts/{id}/branch": {"position": 1, "rank": 0},
    "/api/compare": {"prompt": "hi", "top_k": 5},
    "/api/analogy": {"a": " man", "b": " woman", "c": " king", "k": 3},
    "/api/neighbours": {"word": " man", "k": 3},
    "/api/map": {"words": [" man", " woman"]},
    "/api/contexts": {"word": " mole", "prompts": ["a mole", "the mole"], "k": 3},
    "/api/insights": None,  # a good insight: made from the model in main()
    "/v1/completions": {"prompt": "hi", "max_tokens": 2, "temperature": 0, "top_k": 5, "n": 1, "logprobs": 1,
                        "stop": ["\n"]},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
LONG = "a" * 5000
GETS = ["/api/texts/nope", "/api/texts/{id}/steps/0/inspect", "/api/texts/{id}/steps/999/inspect",
        "/api/texts/{id}/steps/1/inspect?lens_k=0", "/api/texts/{id}/steps/x/inspect", "/static/%00",
        "/static/../server/app.py", "/v1/models/other-model", f"/static/{LONG}", f"/docs-assets/{LONG}",
        "/static/" + "%C3%A9" * 300, "/docs-assets/" + "x." * 200 + "js", "/static/%ff%fe", "/static/a%0ab",
        "/static/%2e%2e", "/docs-assets/%2e%2e", f"/api/insights/{LONG}", "/api/insights/..%2F.git%2Fconfig"]


# What a page on another site can send without asking first: kind -> (headers, the status it must get)
JSON_TYPE = {"content-type": "application/json"}
CROSS_SITE = {
    "Origin evil": ({**JSON_TYPE, "origin": "https://evil.example"}, 403),
    "Origin null": ({**JSON_TYPE, "origin": "null"}, 403),
    "another port": ({**JSON_TYPE, "origin": "http://127.0.0.1:9", "sec-fetch-site": "same-site"}, 403),
    "Sec-Fetch-Site cross-site": ({**JSON_TYPE, "sec-fetch-site": "cross-site"}, 403),
    "text/plain": ({"content-type": "text/plain;charset=UTF-8"}, 415),
    "form": ({"content-type": "application/x-www-form-urlencoded"}, 415),
    "no type": ({}, 415),
    "vnd.evil+json": ({"content-type": "application/vnd.evil+json"}, 415),
    "charset latin-1": ({"content-type": "application/json; charset=latin-1"}, 415),
}
# Beside FIELDS' routes: those with no body, the notebook's writes, the tokenizer
CROSS_SITE_MORE = {"/api/texts/{id}/stop": {}, "/api/texts/{id}/step_forward": {"position": 1},
                   "/api/insights/push": {}, "/api/insights/{insight}/replay": {}, "/tokenize": {"prompt": "hi"},
                   "/detokenize": {"tokens": [31373]}}
# The costly body, in the tiny model's context: 64 prompts x 120 ids, echoed and scored
BUDGET_BODY = {"prompt": [[5] * 120] * 64, "max_tokens": 0, "echo": True, "logprobs": 5}


CAP = 64  # open connections the probed server takes (serve --max-connections)


def dumps(body) -> bytes:
    return json.dumps(body, allow_nan=True).replace("Infinity", "1e400").encode()  # 1e400 parses as inf: not JSON's


def with_surrogates(good) -> list:
    """The good body once for each string in it (keys too), that string holding a lone surrogate."""
    out = []

    def walk(v, put):
        if isinstance(v, str):
            out.append(put(v + "\ud800"))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, lambda y, k=k: put({**v, k: y}))
            if v:
                k0 = next(iter(v))
                out.append(put({f"{k0}\udfff": v[k0], **{k: x for k, x in v.items() if k != k0}}))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, lambda y, i=i: put([*v[:i], y, *v[i + 1:]]))

    walk(good, lambda b: b)
    return out


class Probe:
    """Sends one input, waits at most 10 s for the answer, counts it, and checks the
    server still answers after it."""

    def __init__(self, client: httpx.Client, tid: str):
        self.c, self.tid = client, tid
        self.counts = {"4xx": 0, "5xx": 0, "2xx": 0, "hang": 0, "expected": 0}
        self.wrong: list[tuple] = []

    def send(self, method: str, path: str, body=None, raw: bytes | None = None, expect: set[int] | None = None,
             headers: dict | None = None):
        path = path.replace("{id}", self.tid)
        content = raw if raw is not None else (None if body is None else dumps(body))
        try:
            r = self.c.request(method, path, content=content,
                               headers={"content-type": "application/json"} if headers is None else headers)
        except httpx.TimeoutException:
            self.counts["hang"] += 1
            self.wrong.append((method, path[:80], str(body)[:80], "hang"))
            return self.alive()
        except httpx.TransportError as e:  # the connection dropped with no answer: the server's fault too
            self.counts["5xx"] += 1
            self.wrong.append((method, path[:80], str(body)[:80], "dropped", repr(e)[:120]))
            return self.alive()
        if expect is not None and r.status_code in expect:
            self.counts["expected"] += 1
        else:
            k = f"{r.status_code // 100}xx"
            self.counts[k] = self.counts.get(k, 0) + 1
            if k != "4xx" or expect is not None:
                self.wrong.append(
                    (method, path[:80], str(body if raw is None else raw)[:80], r.status_code, r.text[:160])
                )
        self.alive()
        return r

    def alive(self) -> None:
        """The server still answers (on a new connection, when a 500 closed the last)."""
        for attempt in range(2):
            try:
                assert self.c.get("/api/info").status_code == 200, "the server stopped answering"
                return
            except httpx.TransportError:
                if attempt:
                    raise


def evidence(engine: Engine, name: str) -> dict:
    """A good insight's evidence: the model's top 5 after "hello there"."""
    ids = tokenizer.encode("hello there")
    top, logits = nb.candidates_from_runs(engine.open)(ids, len(ids), 5)
    return {"kind": "token", "model": name, "prompt_ids": ids, "position": len(ids), "token_id": top[0],
            "sampling": {"temperature": 1.0, "top_k": 5, "seed": None},
            "candidates": [{"token_id": i, "logit": v} for i, v in zip(top, logits, strict=True)]}


@contextlib.contextmanager
def read_only(folder: Path):
    """folder read-only: its mode, and for root (whom modes do not bind) the immutable
    attribute. Yields whether it binds."""
    folder.chmod(0o555)
    immutable, binds = False, True
    try:
        try:
            (folder / ".probe").touch()
            (folder / ".probe").unlink()
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
            binds = immutable
        except PermissionError:
            pass
        yield binds
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def notebook_attacks(p: Probe, book: nb.Notebook, good: dict, outside: Path) -> list[str]:
    """Damage the notebook each way the third probe did; returns notes on cases not run."""
    folder, notes = book.path / "insights", []
    saved = p.send("POST", "/api/insights", good, expect={201})
    iid = saved.json()["id"]
    text = (folder / f"{iid}.md").read_bytes()
    stem = iid[:-6]
    bad_utf8, bomb, big, fifo, link = (f"{stem}{x * 6}" for x in "abcde")
    (folder / f"{bad_utf8}.md").write_bytes(text.replace(b"title: ", b"title: \xff", 1))
    levels = ["&l0 [" + ", ".join(["lol"] * 10) + "]"] + [
        f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)
    ]
    (folder / f"{bomb}.md").write_bytes(
        re.sub(rb"(?m)^title: .*$", f"title: [{', '.join(levels)}]".encode(), text, count=1)
    )
    (folder / f"{big}.md").write_bytes(text + b"x" * nb.MAX_FILE_BYTES)
    os.mkfifo(folder / f"{fifo}.md")
    (outside / "secret.md").write_bytes(text)
    (folder / f"{link}.md").symlink_to(outside / "secret.md")
    for name in (bad_utf8, bomb, big, fifo, link):
        p.send("GET", f"/api/insights/{name}")
        p.send("POST", f"/api/insights/{name}/replay")
    p.send("GET", "/api/insights", expect={200})  # lists the good one, skips the rest (a warning each)
    with read_only(folder) as binds:
        if binds:
            p.send("POST", "/api/insights", good, expect={503})
        else:
            notes.append("read-only notebook: not run (root, and chattr +i failed)")
    folder.rename(outside.parent / "kept")
    folder.symlink_to(outside)
    p.send("POST", "/api/insights", good)
    p.send("GET", "/api/insights")
    p.send("GET", "/api/insights/secret")
    if sorted(x.name for x in outside.iterdir()) != ["secret.md"]:
        p.wrong.append(("POST", "/api/insights", "insights/ a link", "wrote outside the notebook"))
    folder.unlink()
    (outside.parent / "kept").rename(folder)
    return notes


def git_commits(folder: Path) -> int:
    r = subprocess.run(["git", "-C", str(folder), "rev-list", "--all", "--count"], capture_output=True, text=True)
    return int(r.stdout or 0)


def cross_site(p: Probe, app, book: nb.Notebook, fields: dict) -> dict[str, dict[str, int]]:
    """Each route sent each kind of request a page elsewhere can send: route -> kind -> status.
    Each must get its refusal, and nothing may run (texts, their tokens, the notebook's commits)."""
    iid = book.save("kept", "for replay", [], fields["/api/insights"]["evidence"]).id

    def state():
        return (sorted((i, tuple(t.tokens)) for i, t in list(app.state.texts._texts.items()) if t),
                git_commits(book.path))

    matrix, before = {}, state()
    for path, good in {**fields, **CROSS_SITE_MORE, "DELETE /api/texts/{id}": {}}.items():
        method, _, route = path.rpartition(" ")
        for kind, (headers, status) in CROSS_SITE.items():
            r = p.send(method or "POST", route.replace("{insight}", iid), good, headers=headers, expect={status})
            matrix.setdefault(path, {})[kind] = r.status_code if r is not None else "hang"
    if state() != before:
        p.wrong.append(("cross-site", "*", "", "a refused request ran (texts or notebook changed)"))
    return matrix


def budget(p: Probe) -> None:
    """The costly echo body: refused up front naming the limit."""
    r = p.send("POST", "/v1/completions", BUDGET_BODY, expect={400})
    if r is None or r.status_code != 400 or "--max-request-tokens" not in r.text:
        p.wrong.append(("POST", "/v1/completions", "64 x 120 echo logprobs", "not refused naming the limit"))


SLOW_HEAD = b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
SLOW_BODY = (b"POST /api/texts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 300\r\n\r\n" + b'{"prompt": "' + b"a" * 280)
CLIENTS = [  # (what, what is sent, a byte every so many seconds or None: at once, the status, within s)
    ("no Host header", b"GET /ready HTTP/1.0\r\n\r\n", None, 200, 5),
    ("headers a byte at a time", SLOW_HEAD, 0.2, 408, 3),
    ("a 1 MB header line", b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n", None,
     431, 5),
    ("a body a byte at a time", SLOW_BODY, 0.2, 408, 4),
]


def answer_to(port: int, data: bytes, every_s: float | None) -> tuple[int | None, float]:
    """Send ``data`` (a byte every ``every_s``, or at once) on a new connection: the answer's
    status (None: none) and the seconds until the server closed the connection."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        with contextlib.suppress(OSError):  # the server may close while the client still sends
            for piece in ([data] if every_s is None else [data[i:i + 1] for i in range(len(data))]):
                s.sendall(piece)
                if every_s:
                    time.sleep(every_s)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                got += chunk
    status = int(got.split()[1]) if got.startswith(b"HTTP/") else None
    return status, time.monotonic() - t0


def slow_clients(p: Probe, port: int, cap: int) -> None:
    """The CLIENTS, and one connection past the cap of ``cap``: each its status in time."""
    for what, data, every_s, want, within_s in CLIENTS:
        status, took = answer_to(port, data, every_s)
        ok = status == want and took < within_s + 1
        p.counts["expected" if ok else "5xx"] += 1
        if not ok:
            p.wrong.append(("raw", what, f"{status} after {took:.1f} s", f"want {want} within {within_s} s"))
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(cap)]
    try:
        time.sleep(0.3)
        status, took = answer_to(port, b"", None)
    finally:
        for s in held:
            s.close()
    p.counts["expected" if status == 503 else "5xx"] += 1
    if status != 503:
        p.wrong.append(("raw", f"connection {cap + 1} of a cap of {cap}", status, "want 503"))
    p.alive()


def retried_saves(p: Probe, book: nb.Notebook, good: dict) -> None:
    """A save sent twice with its key: one insight; one answered 503 (git's index locked) and
    retried with its key once git is back: one insight, committed, the same id."""
    key = {"content-type": "application/json", "Idempotency-Key": f"probe-{time.time_ns()}"}
    first = p.send("POST", "/api/insights", {**good, "title": "retried once"}, expect={201}, headers=key)
    again = p.send("POST", "/api/insights", {**good, "title": "retried once"}, expect={201}, headers=key)
    if first is None or again is None or first.json().get("id") != again.json().get("id"):
        p.wrong.append(("POST", "/api/insights", "the same Idempotency-Key twice", "two insights"))
    lock = book.path / ".git" / "index.lock"
    lock.write_text("")
    key = {**key, "Idempotency-Key": f"probe-503-{time.time_ns()}"}
    stuck = p.send("POST", "/api/insights", {**good, "title": "answered 503"}, expect={503}, headers=key)
    lock.unlink()
    retry = p.send("POST", "/api/insights", {**good, "title": "answered 503"}, expect={201}, headers=key)
    saved = [i for i in book.list() if i.title == "answered 503"]
    if stuck is None or retry is None or len(saved) != 1 or saved[0].commit is None:
        p.wrong.append(("POST", "/api/insights", "a 503 then its retry", f"{len(saved)} insights, not one committed"))


def truncate_graph(data: Path) -> None:
    (f,) = data.glob("zvec-index/*/*/col/*/ann.index.*.proxima")
    os.truncate(f, f.stat().st_size // 2)


def garbage_built(data: Path) -> None:
    (f,) = data.glob("zvec-index/*/*/built.json")
    f.write_text("{not json")


def flip_graph(data: Path) -> None:
    (f,) = data.glob("zvec-index/*/*/col/*/ann.index.*.proxima")
    st = f.stat()
    with open(f, "r+b") as fh:
        fh.seek(st.st_size // 2)
        b = fh.read(64)
        fh.seek(st.st_size // 2)
        fh.write(bytes(x ^ 0x5A for x in b))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def damaged_index(p: Probe, data: Path, model: str, tmp: Path) -> None:
    """Each damage on a copy of the (closed) data directory: verify and an approximate generate
    exit 1 naming the repair, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    for damage in (truncate_graph, garbage_built, flip_graph):
        copy = Path(shutil.copytree(data, tmp / f"damaged-{damage.__name__}"))
        damage(copy)
        for args in (["verify"], ["generate", "hi", "-n", "1", "--output-search", "approximate"]):
            r = subprocess.run([sys.executable, "-m", "puffergpt.cli", *args, "--model", model, "--data", str(copy)],
                               capture_output=True, text=True, timeout=300, env=env)
            ok = r.returncode == 1 and "--output-index --repair" in r.stderr and "Traceback" not in r.stderr
            p.counts["expected" if ok else "5xx"] += 1
            if not ok:
                p.wrong.append(("cli", " ".join(args[:1]), damage.__name__, r.returncode, r.stderr[-200:]))


def print_matrix(matrix: dict[str, dict[str, int]]) -> None:
    kinds = list(CROSS_SITE)
    print("cross-site matrix (route x kind -> status):")
    print("  " + " | ".join(["route".ljust(32), *kinds]))
    for path, row in matrix.items():
        print("  " + " | ".join([path.ljust(32), *(str(row[k]).ljust(len(k)) for k in kinds)]))


def serve(app):
    """A uvicorn server on a free port of 127.0.0.1, in a thread: (server, thread, port)."""
    s = server(app, "127.0.0.1", 0)
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not s.started:
        assert time.monotonic() < deadline and t.is_alive(), "the server did not start"
        time.sleep(0.02)
    return s, t, s.servers[0].sockets[0].getsockname()[1]


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="puffergpt-probe-"))
    ckpt = checkpoints.load(str(checkpoints.make_model(tmp / "tiny", "tiny", 0)))
    store = open_store("embedded", tmp / "data")
    load.load(store, ckpt, manifest.model_key(ckpt.name), progress=False)
    load.build_output_index(store, manifest.model_key(ckpt.name), ckpt.name, progress=False)  # damaged at the end
    engine = open_engine(store, ckpt.name)
    book = nb.Notebook(tmp / "notebook")
    (tmp / "outside").mkdir()
    config = ServerConfig(max_open_texts=8, header_timeout_s=2.0, body_timeout_s=3.0, max_connections=CAP)
    app = create_app(engine, config, reference=lambda: Run(NumpyWeights(ckpt)), notebook=book)
    fields = {
        **FIELDS,
        "/api/insights": {"title": "t", "body": "b", "tags": ["x"], "evidence": evidence(engine, ckpt.name)},
    }
    srv, thread, port = serve(app)
    notes = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        tid = c.post("/api/texts", json={"prompt": "hello there"}).json()["id"]
        c.post(f"/api/texts/{tid}/generate", json={"max_tokens": 2, "temperature": 0})  # read whole: two tokens
        p = Probe(c, tid)
        for path, good in fields.items():
            for field, value in itertools.product(list(good) + ["unknown_field"], BAD_VALUES):
                if field == "unknown_field" and path.startswith("/v1"):
                    continue  # OpenAI clients send fields we don't use: ignored by design
                p.send("POST", path, {**good, field: value})
            for field, value in itertools.product(good, RAW_VALUES):
                p.send("POST", path, raw=json.dumps({**good, field: "@@"}).replace('"@@"', value).encode())
            for body in with_surrogates(good):
                p.send("POST", path, body)
            for raw in RAW_BODIES:
                p.send("POST", path, raw=raw)
            p.send("POST", path, [good])  # not an object
        for path in GETS:
            p.send("GET", path)
        matrix = cross_site(p, app, book, fields)
        budget(p)
        slow_clients(p, port, CAP)
        retried_saves(p, book, fields["/api/insights"])
        notes += notebook_attacks(p, book, fields["/api/insights"], tmp / "outside")
        before = len(app.state.texts)
    srv.should_exit = True
    thread.join(30)
    store.close()
    damaged_index(p, tmp / "data", ckpt.name, tmp)
    counts = p.counts
    t = time.strftime("%Y-%m-%d %H:%M")
    print(
        f"{t}: {sum(counts.values())} inputs: {counts['4xx']} refused (4xx), {counts['5xx']} 5xx, "
        f"{counts['hang']} hangs, {counts['expected']} answered with their expected status (a saved insight, the "
        f"notebook's list, the read-only notebook's 503, the cross-site refusals, the work budget's 400, "
        f"the slow clients' 200, 408, 431 and 503, the retried saves' 201 and 503, the damaged index's refusals), "
        f"{counts.get('2xx', 0)} accepted (values that are valid for "
        f"their field, e.g. 0 tokens, a seed of 0, token ids as a prompt: listed below); {before} texts open at the end"
    )
    for w in p.wrong:
        print("  accepted:" if w[-2] in (200, 201) else "  WRONG:", w)
    for n in notes:
        print("  note:", n)
    print_matrix(matrix)


if __name__ == "__main__":
    main()
