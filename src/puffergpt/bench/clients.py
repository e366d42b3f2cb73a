"""``puffergpt bench --clients N``: N simulated learners against one server, each driving the
playground's API as the page does (open a text, generate it over server-sent events, close
it), first one after another ("solo"), then all N at once ("together"), each learner with a
prompt and a text of its own.

Reported: tokens/s together against one after another, time to first token (median and
worst, solo and together), whether each learner's tokens together are its tokens solo, and
every error (a non-2xx answer, an ``error`` event, a stream cut short), never hidden. Only
the playground's API is assumed of the server: whatever it does with texts that generate
at once (one after another, or their searches merged) is what gets measured. Speed claims
live in benchmarks/RESULTS.md, never in a test.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from puffergpt.model import tokenizer

log = logging.getLogger("puffergpt")

MAX_CLIENTS = 64
WARMUP_TOKENS = 2  # one prefill and one decode before anything is timed
TARGETS = {"speedup": 1.5, "first_token_ratio": 3.0}  # issue 24, item 4: on the demo model, 8 learners

# Short prompts that the demo model continues for at least 24 tokens at temperature 0 (checked
# against the numpy reference: none writes <|endoftext|> in its first 24 tokens). On another
# model a learner may end early: the report says which (``ended_early``).
PROMPTS = (
    "A man", "A woman", "A new", "A small", "A big", "A young", "A child", "A day", "A tree", "A dog", "A game",
    "A horse", "A river", "A mountain", "A farmer", "A writer", "A moon", "A storm", "A fire", "A stone", "A flower",
    "A market", "A bridge", "A forest", "A fox", "My tree", "My writer", "One small", "One big", "One book",
    "One king", "One river", "Your small", "Your painter", "His small", "His letter", "His painter", "Her small",
    "Her child", "Her painter", "Our painter", "Our apple", "This man", "This new", "This tree", "This city",
    "This king", "This bird", "This forest", "That big", "That city", "That student", "That painter", "Every young",
    "Every painter", "Every village", "Some painter", "No writer", "Some small", "Some big", "No big", "Some king",
    "No man", "A young man",
)


class BenchError(ValueError):
    """A bench that can't run as asked: what is wrong, and what to do."""


@dataclass(frozen=True)
class Plan:
    clients: int
    tokens: int = 24  # new tokens a learner asks for
    temperature: float = 0.0
    top_k: int = 40
    seed: int | None = None  # learner i samples with seed + i (temperature > 0)
    timeout_s: float = 600.0  # the longest wait for one read (a text may wait its turn)

    def __post_init__(self):
        if not 1 <= self.clients <= MAX_CLIENTS:
            raise BenchError(f"--clients must be in 1..{MAX_CLIENTS}, got {self.clients}")
        if self.clients > len(PROMPTS):
            raise BenchError(f"only {len(PROMPTS)} prompts: use at most that many clients")
        if self.tokens < 1:
            raise BenchError(f"--tokens must be at least 1, got {self.tokens}")
        if self.temperature < 0:
            raise BenchError(f"--temperature must be >= 0, got {self.temperature}")
        if self.temperature > 0 and self.seed is None:
            raise BenchError("a temperature above 0 needs --seed: without one, solo and together can't be compared")

    def prompt(self, i: int) -> str:
        return PROMPTS[i]

    def body(self, i: int, tokens: int | None = None) -> dict:
        """Learner i's generate request."""
        b = {"max_tokens": tokens or self.tokens, "temperature": self.temperature, "top_k": self.top_k}
        return b | ({"seed": self.seed + i} if self.seed is not None else {})

    def check(self, info: dict) -> None:
        """The plan against the server's bounds (``/api/info``), before anything runs."""
        if self.tokens > info["max_new_tokens"]:
            raise BenchError(f"--tokens {self.tokens} is over this server's limit of {info['max_new_tokens']} "
                             "new tokens a request: ask for fewer")
        if self.clients > info["max_open_texts"]:
            raise BenchError(f"{self.clients} learners together need {self.clients} texts open; this server "
                             f"holds at most {info['max_open_texts']}: use fewer --clients, or start "
                             f"`puffergpt serve --max-texts {self.clients}`")
        n_ctx = info["config"]["n_ctx"]
        longest = max(len(tokenizer.encode(self.prompt(i))) for i in range(self.clients))
        if longest + self.tokens > n_ctx:
            raise BenchError(f"a {longest}-token prompt and {self.tokens} new tokens would not fit the model's "
                             f"context of {n_ctx} tokens: use --tokens {n_ctx - longest} or fewer")


# --- the server, over plain HTTP/1.1 (one keep-alive connection a learner) -----------------

class Refused(Exception):
    """A non-2xx answer."""

    def __init__(self, what: str, status: int, body: bytes):
        try:  # every error answers {"error": {"message", ...}}
            detail = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = body.decode(errors="replace")
        super().__init__(f"{what}: {status} {str(detail)[:300]}")


@dataclass(frozen=True)
class Server:
    """Where the server listens: ``Server.of("http://127.0.0.1:8000/")``."""

    scheme: str
    host: str
    port: int
    prefix: str  # the path the API's /api lives under, without the trailing slash

    @classmethod
    def of(cls, url: str) -> Server:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise BenchError(f"--url {url!r} is not a server's address: give one like http://127.0.0.1:8000/")
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise BenchError(f"--url {url!r} has a bad port: give one like http://127.0.0.1:8000/") from None
        return cls(u.scheme, u.hostname, port, u.path.rstrip("/"))

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}/"

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout_s)


def headers(jar: dict | None) -> dict:
    """A request's headers, with the cookies the server set (a load balancer's stickiness)."""
    h = {"Content-Type": "application/json"}
    if jar:
        h["Cookie"] = "; ".join(f"{k}={v}" for k, v in jar.items())
    return h


def keep_cookies(r: http.client.HTTPResponse, jar: dict | None) -> None:
    """The cookies an answer sets, kept in ``jar`` as a browser keeps them (name=value only)."""
    if jar is None:
        return
    for line in r.headers.get_all("Set-Cookie") or []:
        name, _, rest = line.partition("=")
        if name.strip():
            jar[name.strip()] = rest.split(";", 1)[0].strip()


def call(conn: http.client.HTTPConnection, server: Server, method: str, path: str, body: dict | None = None,
         jar: dict | None = None) -> dict:
    """One JSON request: its JSON answer, or Refused. ``jar``: the learner's cookies, sent and kept."""
    payload = json.dumps(body).encode() if body is not None else None
    conn.request(method, server.prefix + path, payload, headers(jar))
    r = conn.getresponse()
    keep_cookies(r, jar)
    data = r.read()
    if not 200 <= r.status < 300:
        raise Refused(f"{method} {path}", r.status, data)
    return json.loads(data)


def events(conn: http.client.HTTPConnection, server: Server, path: str, body: dict,
           jar: dict | None = None) -> Iterator[tuple[str, dict]]:
    """A server-sent event stream, an event at a time as each one completes: (name, data)."""
    conn.request("POST", server.prefix + path, json.dumps(body).encode(), headers(jar))
    r = conn.getresponse()
    keep_cookies(r, jar)
    if not 200 <= r.status < 300:
        raise Refused(f"POST {path}", r.status, r.read())
    name, data = None, None
    while line := r.readline():  # b"" at the end of the response
        line = line.rstrip(b"\r\n")
        if line.startswith(b"event: "):
            name = line[7:].decode()
        elif line.startswith(b"data: "):
            data = json.loads(line[6:])
        elif not line and name is not None:  # a blank line ends an event
            yield name, data
            name, data = None, None


# --- one learner ------------------------------------------------------------------------

@dataclass
class Run:
    """One learner's text: what came and when (``time.perf_counter`` seconds)."""

    learner: int
    prompt: str
    token_ids: list[int] = field(default_factory=list)
    opened: float = 0.0  # the text was asked for
    generate_sent: float | None = None
    first_token: float | None = None
    finished: float = 0.0  # ``done`` came, or the learner gave up on an error
    error: str | None = None
    close_error: str | None = None  # closing the text failed: reported, the tokens still count

    def open_s(self) -> float | None:
        return None if self.generate_sent is None else self.generate_sent - self.opened

    def first_token_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.generate_sent

    def first_token_from_open_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.opened

    def to_json(self) -> dict:
        r = lambda v: None if v is None else round(v, 4)  # noqa: E731
        return {"learner": self.learner, "prompt": self.prompt, "tokens": len(self.token_ids),
                "token_ids": self.token_ids, "text": tokenizer.decode(self.token_ids),
                "open_s": r(self.open_s()),
                "first_token_s": r(self.first_token_s()), "first_token_from_open_s": r(self.first_token_from_open_s()),
                "total_s": r(self.finished - self.opened), "error": self.error, "close_error": self.close_error}


def learn(server: Server, plan: Plan, i: int, on_token: Callable[[], None] = lambda: None,
          tokens: int | None = None) -> Run:
    """Learner i: open a text on its prompt, generate it to the end, close it. Never raises:
    what went wrong is the run's ``error``. It keeps the cookies the server sets, as a browser
    does: behind a load balancer with stickiness, its requests stay on one server."""
    run, conn, text_id, jar = Run(i, plan.prompt(i)), server.connect(plan.timeout_s), None, {}
    try:
        run.opened = time.perf_counter()
        text_id = call(conn, server, "POST", "/api/texts", {"prompt": run.prompt}, jar)["id"]
        run.error = generate(conn, server, f"/api/texts/{text_id}/generate", plan.body(i, tokens), run, on_token, jar)
    except Exception as e:  # refused, unreachable, timed out, not JSON: the run says so
        run.error = f"{type(e).__name__}: {e}" if not isinstance(e, Refused) else str(e)
    finally:
        run.finished = run.finished or time.perf_counter()
        if text_id is not None:  # the text's namespace goes now, not when the server sweeps it
            try:
                call(conn, server, "DELETE", f"/api/texts/{text_id}", jar=jar)
            except Exception as e:
                run.close_error = f"closing the text: {e}" if isinstance(e, Refused) else f"closing the text: {e!r}"
        conn.close()
    return run


def generate(conn, server: Server, path: str, body: dict, run: Run, on_token: Callable[[], None],
             jar: dict | None = None) -> str | None:
    """The generate stream into ``run``: None, or what went wrong."""
    run.generate_sent, error, done = time.perf_counter(), None, None
    for name, data in events(conn, server, path, body, jar):
        if name == "token":
            run.first_token = run.first_token or time.perf_counter()
            run.token_ids.append(int(data["token_id"]))
            on_token()
        elif name == "done":
            run.finished, done = time.perf_counter(), data
        elif name == "error":
            error = f"error event: {data.get('detail') if isinstance(data, dict) else data}"
    if error is None and done is None:
        return "the stream ended without a done event"
    if error is None and done["tokens"] != len(run.token_ids):
        return f"done says {done['tokens']} tokens, {len(run.token_ids)} token events came"
    return error


# --- the two ways of running N learners ---------------------------------------------------

def solo(server: Server, plan: Plan, on_token: Callable[[], None]) -> list[Run]:
    return [learn(server, plan, i, on_token) for i in range(plan.clients)]


def together(server: Server, plan: Plan, on_token: Callable[[], None]) -> list[Run]:
    """All learners at once: each in a thread of its own, released together by a barrier."""
    runs: list[Run | None] = [None] * plan.clients
    start = threading.Barrier(plan.clients)

    def learner(i: int) -> None:
        start.wait()
        runs[i] = learn(server, plan, i, on_token)

    threads = [threading.Thread(target=learner, args=(i,), name=f"learner-{i}", daemon=True)
               for i in range(plan.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r if r is not None else Run(i, plan.prompt(i), error="the learner's thread died")
            for i, r in enumerate(runs)]


def summary(runs: list[Run], one_after_another: bool) -> dict:
    """A phase's figures. Wall time: one after another, the sum of the learners' times
    (opening to done, the closes between them left out); together, first open to last done."""
    wall = (sum(r.finished - r.opened for r in runs) if one_after_another
            else max(r.finished for r in runs) - min(r.opened for r in runs))
    tokens = sum(len(r.token_ids) for r in runs)
    return {"wall_s": round(wall, 3), "tokens": tokens, "tokens_per_s": round(tokens / wall, 3) if wall > 0 else None,
            "first_token_s": spread([r.first_token_s() for r in runs]),
            "first_token_from_open_s": spread([r.first_token_from_open_s() for r in runs]),
            "open_s": spread([r.open_s() for r in runs]),
            "runs": [r.to_json() for r in runs]}


def spread(values: list[float | None]) -> dict:
    got = [v for v in values if v is not None]
    if not got:
        return {"median": None, "worst": None, "of": 0}
    return {"median": round(statistics.median(got), 4), "worst": round(max(got), 4), "of": len(got)}


def compared(solo_runs: list[Run], together_runs: list[Run]) -> dict:
    """Whether each learner's tokens together are its tokens solo; the first that differs."""
    equal = [s.error is None and t.error is None and s.token_ids == t.token_ids
             for s, t in zip(solo_runs, together_runs, strict=True)]
    first = next((i for i, e in enumerate(equal) if not e), None)
    return {"equal": sum(equal), "of": len(equal),
            "first_difference": None if first is None else difference(solo_runs[first], together_runs[first])}


def difference(s: Run, t: Run) -> dict:
    a, b = s.token_ids, t.token_ids
    at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    tok = lambda ids: None if at >= len(ids) else {"token_id": ids[at], "text": tokenizer.token_text(ids[at])}  # noqa: E731
    return {"learner": s.learner, "prompt": s.prompt, "position": at, "solo": tok(a), "together": tok(b),
            "solo_tokens": len(a), "together_tokens": len(b), "solo_error": s.error, "together_error": t.error}


# --- the bench ----------------------------------------------------------------------------

def run(url: str, plan: Plan, progress: bool = False, where: str = "at --url") -> dict:
    """The bench against the server at ``url``: a warm-up learner (not timed), the learners one
    after another, then together. ``where`` says whose server it is, for the report."""
    server = Server.of(url)
    info = server_info(server, plan.timeout_s)
    plan.check(info)
    warm = learn(server, plan, 0, tokens=min(WARMUP_TOKENS, plan.tokens))
    if warm.error or warm.close_error:
        raise BenchError(f"the warm-up learner failed, so nothing was timed: {warm.error or warm.close_error}")
    load0 = loadavg()
    phases, status = {}, {"before": server_status(server, plan.timeout_s)}
    for name, go in (("solo", solo), ("together", together)):
        with bar(name, plan, progress) as on_token:
            phases[name] = go(server, plan, on_token)
        status[f"after_{name}"] = server_status(server, plan.timeout_s)
    return report_of(server, where, info, plan, phases, status, load0)


def report_of(server: Server, where: str, info: dict, plan: Plan, phases: dict[str, list[Run]], status: dict,
              load0: list[float]) -> dict:
    from puffergpt.bench.engines import machine

    s, t = summary(phases["solo"], True), summary(phases["together"], False)
    report = {"url": server.url(), "server": where, "model": info["model"], "backend": info["backend"],
              "clients": plan.clients, "tokens": plan.tokens, "temperature": plan.temperature, "top_k": plan.top_k,
              "seed": plan.seed, "machine": machine() | {"loadavg_before": load0, "loadavg_after": loadavg()},
              "solo": s, "together": t, "outputs": compared(phases["solo"], phases["together"]),
              "errors": [{"phase": name, "learner": r.learner, "error": e}
                         for name, runs in phases.items() for r in runs for e in (r.error, r.close_error) if e],
              "ended_early": sorted({r.learner for runs in phases.values() for r in runs
                                     if r.error is None and len(r.token_ids) < plan.tokens}),
              "server_status": status}  # the server's own account (/api/status), where it has one
    return report | verdict(s, t)


def loadavg() -> list[float]:
    """The machine's load average (1, 5, 15 minutes): whoever else was running shows here."""
    return [round(x, 2) for x in os.getloadavg()]


def verdict(s: dict, t: dict) -> dict:
    """The figures the issue's targets are about, and whether each is met."""
    speedup = t["tokens_per_s"] / s["tokens_per_s"] if s["tokens_per_s"] and t["tokens_per_s"] else None
    ratio = worst_vs_median(s["first_token_s"], t["first_token_s"])
    return {"speedup": None if speedup is None else round(speedup, 3),
            "first_token_worst_together_vs_median_solo": ratio,
            "first_token_from_open_worst_together_vs_median_solo": worst_vs_median(s["first_token_from_open_s"],
                                                                                    t["first_token_from_open_s"]),
            "targets": {"speedup_at_least": TARGETS["speedup"],
                        "first_token_ratio_at_most": TARGETS["first_token_ratio"],
                        "met": speedup is not None and ratio is not None and speedup >= TARGETS["speedup"]
                        and ratio <= TARGETS["first_token_ratio"]}}


def worst_vs_median(solo_spread: dict, together_spread: dict) -> float | None:
    med, worst = solo_spread["median"], together_spread["worst"]
    return round(worst / med, 3) if med and worst is not None else None


def server_info(server: Server, timeout_s: float) -> dict:
    conn = server.connect(min(timeout_s, 30.0))
    try:
        return call(conn, server, "GET", "/api/info")
    except Refused as e:
        raise BenchError(f"{server.url()} is not a puffergpt server ({e}): give the address `puffergpt serve` "
                         "prints") from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise BenchError(f"could not reach a puffergpt server at {server.url()} ({type(e).__name__}: {e}): "
                         "is `puffergpt serve` running there?") from None
    finally:
        conn.close()


def server_status(server: Server, timeout_s: float) -> dict | None:
    """The server's own account of its load (``/api/status``), where it has one; None if not."""
    conn = server.connect(min(timeout_s, 30.0))
    try:
        return call(conn, server, "GET", "/api/status")
    except (Refused, OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


@contextlib.contextmanager
def bar(phase: str, plan: Plan, progress: bool) -> Iterator[Callable[[], None]]:
    """A progress bar of the phase's tokens (on stderr), ticked from the learners' threads."""
    from tqdm import tqdm

    lock = threading.Lock()
    with tqdm(total=plan.clients * plan.tokens, unit="tok", desc=phase, disable=not progress, leave=False) as b:
        def tick() -> None:
            with lock:
                b.update()
        yield tick


# --- the table ----------------------------------------------------------------------------

def table(report: dict) -> str:
    """The report as the command prints it."""
    s, t, m = report["solo"], report["together"], report["machine"]
    f = lambda v, fmt=".2f": "-" if v is None else format(v, fmt)  # noqa: E731
    rows = [("", "one after another", "together"),
            ("wall s", f(s["wall_s"]), f(t["wall_s"])),
            ("tokens", str(s["tokens"]), str(t["tokens"])),
            ("tokens/s", f(s["tokens_per_s"]), f(t["tokens_per_s"])),
            ("first token s, median", f(s["first_token_s"]["median"], ".3f"), f(t["first_token_s"]["median"], ".3f")),
            ("first token s, worst", f(s["first_token_s"]["worst"], ".3f"), f(t["first_token_s"]["worst"], ".3f")),
            ("  from opening the text, median", f(s["first_token_from_open_s"]["median"], ".3f"),
             f(t["first_token_from_open_s"]["median"], ".3f")),
            ("  from opening the text, worst", f(s["first_token_from_open_s"]["worst"], ".3f"),
             f(t["first_token_from_open_s"]["worst"], ".3f")),
            ("opening a text s, median", f(s["open_s"]["median"], ".3f"), f(t["open_s"]["median"], ".3f"))]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    sampling = f"temperature {report['temperature']:g}, top_k {report['top_k']}" + (
        f", seed {report['seed']}+learner" if report["seed"] is not None else "")
    head = (f"{report['model']} on {report['backend']}, server {report['server']} ({report['url']}): "
            f"{report['clients']} learners x {report['tokens']} tokens, {sampling}\n"
            f"{m['cores']} cores ({m['cpu']}), load average {m['loadavg_before'][0]:.1f} before, "
            f"{m['loadavg_after'][0]:.1f} after")
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([head, *lines, *verdict_lines(report)])


def verdict_lines(report: dict) -> list[str]:
    tg, o = report["targets"], report["outputs"]
    mark = lambda ok: "met" if ok else "NOT met"  # noqa: E731
    f = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    sp, ratio = report["speedup"], report["first_token_worst_together_vs_median_solo"]
    lines = [f"together vs one after another: {'-' if sp is None else f'{sp:.2f}x'} tokens/s "
             f"(target >= {tg['speedup_at_least']:g}x: {mark(sp is not None and sp >= tg['speedup_at_least'])})",
             f"worst first token together / median solo: {'-' if ratio is None else f'{ratio:.2f}x'} "
             f"(target <= {tg['first_token_ratio_at_most']:g}x: "
             f"{mark(ratio is not None and ratio <= tg['first_token_ratio_at_most'])}); "
             f"from opening the text: {f(report['first_token_from_open_worst_together_vs_median_solo'])}",
             *searches_lines(report["server_status"]),
             f"outputs equal to solo: {o['equal']}/{o['of']}"]
    if (d := o["first_difference"]) is not None:
        lines.append(f"  first difference: learner {d['learner']} ({d['prompt']!r}) at new token {d['position']}: "
                     f"solo {d['solo']}, together {d['together']}")
    if report["ended_early"]:
        lines.append(f"ended at <|endoftext|> before {report['tokens']} tokens: learners {report['ended_early']}")
    errors = report["errors"]
    lines.append(f"errors: {len(errors) or 'none'}")
    lines += [f"  {e['phase']} learner {e['learner']}: {e['error']}" for e in errors[:10]]
    if len(errors) > 10:
        lines.append(f"  ... and {len(errors) - 10} more (all in --json)")
    return lines


def searches_lines(status: dict) -> list[str]:
    """What the server says of its searches in each phase (``/api/status``: asks, and those
    merged with another text's), where it says so."""
    lines = []
    for phase, a, b in (("one after another", "before", "after_solo"), ("together", "after_solo", "after_together")):
        try:
            x, y = status[a]["searches"], status[b]["searches"]
            asks, merged = y["asks"] - x["asks"], y["merged"] - x["merged"]
        except (KeyError, TypeError):  # a server without /api/status, or another shape of it
            return []
        lines.append(f"the server's searches {phase}: {asks:,} asked, {merged:,} merged with another text's")
    return lines
