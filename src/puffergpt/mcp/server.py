"""The Model Context Protocol server: an assistant (Claude Desktop, Cursor, any MCP client)
generates with the model, looks inside a generated token, runs a lesson on the learner's prompt
(each claim computed from the model, with its verdict), and saves what clicked as an insight in
the notebook, a git commit.

A thin edge, like the CLI and the HTTP server: the tools parse (their bounds are every
edge's, ``app/protocol.py``'s), call the application layer, and render the protocol's JSON
of a step and an inspection, so a tool answers what the matching route answers.

Two ways to reach a model, one interface (``Backend``):

    Local    opens the store itself (``cli.options.open_model``): texts (``registry.Texts``),
             the notebook (``notebook.Notebook``) and replay on the engine
    Remote   talks to a running ``puffergpt serve`` over its HTTP API (httpx), which holds
             the store and the notebook

Every failure a user can act on (a prompt too long, a text closed, a bad insight, the
server unreachable) is a ``ToolError`` with the message; the client shows it as the
tool's error. Nothing is printed to stdout: it carries the protocol.
"""

from __future__ import annotations

import contextlib
import inspect as pyinspect
import json
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Annotated, Any, Protocol
from urllib.parse import quote

from pydantic import ConfigDict, Field, ValidationError

from puffergpt import __version__
from puffergpt import notebook as nb
from puffergpt.app.completion import choice_text
from puffergpt.app.protocol import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, inspect_json, step_json
from puffergpt.lens import inspector, lessons
from puffergpt.lens.inside import MAX_VIEW_K
from puffergpt.mcp.stdio import shown
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import TEXT_ID, TextError, check_generation

log = logging.getLogger("puffergpt.mcp")

MAX_CANDIDATES_SHOWN = 20  # a step's candidates a tool returns (a text keeps 100; a model reads these)
OPEN_TEXTS = 16  # generated texts kept open for ``inspect``: the oldest closes when a new one opens
HTTP_TIMEOUT_S = 300  # a generation of MAX_NEW_TOKENS on a slow store


def check_text_id(text_id) -> str:
    """A text id as generate returns it, or a ValueError naming the bad one. Checked
    before any URL is built: ``../insights?q=x#`` must never reach another route."""
    if isinstance(text_id, str) and TEXT_ID.fullmatch(text_id):
        return text_id
    raise ValueError(f"no open text {shown(text_id)}: a text id is the 12 lowercase hex digits that generate "
                     "returned as text_id")


def segment(v: str | int) -> str:
    """One URL path segment, escaped: a '/', '?', '#' or '..' in it stays inside it."""
    return quote(str(v), safe="")


# --- what the tools return, from the protocol's JSON of a step and an inspection ------------

def generation_json(text_id: str, prompt_ids: list[int], steps: list[dict], k: int) -> dict:
    """A generation as a tool returns it: the text (as /v1 gives it), why it ended, its new
    token ids, and each step's best ``k`` candidates. ``steps`` are the protocol's step JSON
    (``protocol.step_json``: made here, or streamed by a server)."""
    ids = [s["token_id"] for s in steps]
    text, finish = choice_text(ids)  # /v1's rule: a generated <|endoftext|> ends it, in tokens, never in text
    return {"text_id": text_id, "prompt": tokenizer.decode(prompt_ids), "prompt_ids": prompt_ids,
            "text": text, "finish_reason": finish, "tokens": ids,
            "steps": [{"position": s["position"], "token_id": s["token_id"], "text": s["text"],
                       "candidates": [{"token_id": c["token_id"], "text": c["text"], "logit": c["logit"],
                                       "prob": c["prob"]} for c in s["candidates"][:k]]} for s in steps],
            "inspect_positions": [s["position"] for s in steps]}


def inspection_json(d: dict) -> dict:
    """The protocol's inspection (``protocol.inspect_json``) less the raw attention scores
    (the weights are their softmax) and with the request log counted, not listed."""
    out = {k: v for k, v in d.items() if k not in ("scores", "requests")}
    out["searches"] = len(d.get("requests", []))
    return out


def lesson_json(got: dict) -> dict:
    """A lesson's run as a tool returns it: each step's title, the view it opens, the claim and
    whether it holds, and its evidence (what an assistant walks a learner through)."""
    return {"id": got["id"], "title": got["title"], "prompt": got["prompt"],
            "steps": [{k: s[k] for k in ("title", "view", "claim", "holds", "evidence")} for s in got["steps"]]}


# --- the two backends -----------------------------------------------------------------------

class Backend(Protocol):
    def generate(self, prompt: str, max_tokens: int, s: Sampling, k: int) -> dict: ...
    def inspect(self, text_id: str, position: int, lens_k: int) -> dict: ...
    def save_insight(self, title: str, body: str, tags: list[str], evidence: dict | None) -> dict: ...
    def list_insights(self, query: str | None, tag: str | None) -> list[dict]: ...
    def replay_insight(self, insight_id: str) -> dict: ...
    def list_lessons(self) -> list[dict]: ...
    def run_lesson(self, lesson_id: str, prompt: str | None) -> dict: ...
    def close(self) -> None: ...


class Local:
    """The model opened here (``opened``: a ``cli.options.Opened`` on the search engine) and
    a notebook (None: the insight tools say how to give one); ``lessons_dir``: a teacher's own
    lessons beside the shipped ones (``mcp --lessons DIR``)."""

    def __init__(self, opened, notebook: nb.Notebook | None, lessons_dir=None):
        self.opened, self.notebook, self.lessons_dir = opened, notebook, lessons_dir
        self.model = opened.engine.model if opened.engine is not None else None
        self.texts = Texts(opened.open_run, max_open=OPEN_TEXTS + 1)
        self.order: OrderedDict[str, None] = OrderedDict()  # open texts, oldest first

    def generate(self, prompt: str, max_tokens: int, s: Sampling, k: int) -> dict:
        while len(self.order) >= OPEN_TEXTS:  # the oldest text closes: its tokens are in its answer
            with contextlib.suppress(KeyError):
                self.texts.close(self.order.popitem(last=False)[0])
        t = self.texts.create(tokenizer.encode(prompt))
        self.order[t.id] = None
        prompt_ids = list(t.tokens)
        s = check_generation(t.config, s, t.length, max_tokens, MAX_NEW_TOKENS)
        steps = [step_json(step) for step in t.generate(max_tokens, s)]
        return generation_json(t.id, prompt_ids, steps, k)

    def inspect(self, text_id: str, position: int, lens_k: int) -> dict:
        t = self.texts.get(text_id)
        got, requests, recomputed = inspector.inspect(t, position, lens_k)
        with t.lock:
            return inspection_json(inspect_json(got, t, position, requests, recomputed))

    def book(self) -> nb.Notebook:
        if self.notebook is None:
            raise nb.NotebookError("this MCP server has no notebook: start it with `puffergpt mcp --notebook DIR`")
        return self.notebook

    def save_insight(self, title: str, body: str, tags: list[str], evidence: dict | None) -> dict:
        book = self.book()
        ins = book.save(title, body, tags, evidence)
        return {**ins.summary(), "file": str(book.path / ins.path)}

    def list_insights(self, query: str | None, tag: str | None) -> list[dict]:
        return [i.summary() for i in self.book().list(query=query, tag=tag)]

    def replay_insight(self, insight_id: str) -> dict:
        ins = self.book().get(insight_id)
        try:
            r = nb.replay(ins, nb.candidates_from_runs(self.opened.open_run), model=self.model,
                          data_at=nb.data_from_runs(self.opened.open_run))
        except nb.InvalidInsight:
            raise
        except ValueError as e:  # the engine refused the prompt (context, vocabulary)
            raise nb.InvalidInsight(f"the model could not replay this insight: {e}") from None
        return {"id": ins.id, "model": ins.model, "position": ins.evidence["position"] if ins.evidence else None, **r}

    def list_lessons(self) -> list[dict]:
        return [x.brief() for x in lessons.load(self.lessons_dir).values()]

    def run_lesson(self, lesson_id: str, prompt: str | None) -> dict:
        got = lessons.run(lessons.get(lesson_id, self.lessons_dir), self.opened.open_run, self.opened.config, prompt)
        return lesson_json(got)

    def close(self) -> None:
        self.texts.close_all()
        self.opened.close()


class RemoteError(Exception):
    """The server answered an error, or could not be reached; the message says which."""


class Remote:
    """A running ``puffergpt serve`` at ``url``: its texts, and its notebook; ``api_key``: the
    key it was started with (``serve --api-key``), sent with every request."""

    def __init__(self, url: str, timeout: float = HTTP_TIMEOUT_S, api_key: str | None = None):
        import httpx

        self.url = url.rstrip("/")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def call(self, method: str, path: str, **kw) -> Any:
        import httpx

        try:
            r = self.http.request(method, path, **kw)
        except httpx.InvalidURL as e:  # not an HTTPError; the ids in it are checked, so this is a bug to report
            raise RemoteError(f"could not build the request to {self.url}: {e}") from None
        except httpx.HTTPError as e:
            raise RemoteError(f"could not reach puffergpt serve at {self.url} ({e}): is it running? "
                              "Start it with `puffergpt serve`, or give this server --data/--model instead") from None
        if r.status_code >= 400:
            raise RemoteError(f"the server answered {r.status_code}: {detail(r)}")
        return r.json()

    def generate(self, prompt: str, max_tokens: int, s: Sampling, k: int) -> dict:
        text = self.call("POST", "/api/texts", json={"prompt": prompt})
        body = {"max_tokens": max_tokens, "temperature": s.temperature, "top_k": s.top_k, "seed": s.seed}
        steps = list(self.events(f"/api/texts/{segment(text['id'])}/generate", body))
        return generation_json(text["id"], [t["token_id"] for t in text["tokens"]], steps, k)

    def events(self, path: str, body: dict) -> Iterator[dict]:
        """The ``token`` events of a generation's server-sent events; ``error`` raises."""
        import httpx

        try:
            with self.http.stream("POST", path, json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    raise RemoteError(f"the server answered {r.status_code}: {detail(r)}")
                event = None
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "token":
                        yield json.loads(line[6:])
                    elif line.startswith("data: ") and event == "error":
                        raise RemoteError(f"the generation failed: {json.loads(line[6:])['detail']}")
        except httpx.HTTPError as e:
            raise RemoteError(f"the connection to {self.url} failed during the generation ({e})") from None

    def inspect(self, text_id: str, position: int, lens_k: int) -> dict:
        path = f"/api/texts/{segment(check_text_id(text_id))}/steps/{segment(int(position))}/inspect"
        return inspection_json(self.call("GET", path, params={"lens_k": lens_k}))

    def save_insight(self, title: str, body: str, tags: list[str], evidence: dict | None) -> dict:
        sent = {"title": title, "body": body, "tags": tags} | ({} if evidence is None else {"evidence": evidence})
        return self.call("POST", "/api/insights", json=sent)

    def list_insights(self, query: str | None, tag: str | None) -> list[dict]:
        params = {k: v for k, v in (("q", query), ("tag", tag)) if v is not None}
        return self.call("GET", "/api/insights", params=params)["insights"]

    def replay_insight(self, insight_id: str) -> dict:
        return self.call("POST", f"/api/insights/{segment(nb.check_id(insight_id))}/replay")

    def list_lessons(self) -> list[dict]:
        return self.call("GET", "/api/lessons")

    def run_lesson(self, lesson_id: str, prompt: str | None) -> dict:
        body = {} if prompt is None else {"prompt": prompt}
        return lesson_json(self.call("POST", f"/api/lessons/{segment(lesson_id)}/run", json=body))

    def close(self) -> None:
        self.http.close()


def detail(r) -> str:
    try:
        d = r.json()
    except ValueError:
        return r.text[:500] or r.reason_phrase
    if isinstance(d, dict) and isinstance(d.get("error"), dict):  # every error of serve's: {"error": {"message"}}
        return str(d["error"].get("message"))
    return json.dumps(d)[:1000]


# --- the tools ------------------------------------------------------------------------------

@contextlib.contextmanager
def tool_errors() -> Iterator[None]:
    """What a user can act on becomes the tool's error message, nothing else."""
    from mcp.server.mcpserver.exceptions import ToolError

    from puffergpt.stores.base import StoreError

    try:
        yield
    except (nb.NotebookError, TextError, RemoteError, lessons.LessonError, ValueError) as e:
        raise ToolError(str(e)) from None
    except KeyError as e:  # a text closed or never opened
        raise ToolError(str(e.args[0]) if e.args else "not found") from None
    except StoreError as e:
        raise ToolError(f"the store failed: {e}") from None


Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="the text to continue")]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS, description="how many tokens to generate")]
Temperature = Annotated[float, Field(ge=0, le=100, description="0: always the best candidate (greedy)")]
TopK = Annotated[int, Field(ge=1, le=tokenizer.VOCAB_SIZE, description="sample among this many best candidates")]
Seed = Annotated[int | None, Field(ge=0, le=2**63 - 1, description="the same seed draws the same tokens")]
Shown = Annotated[int, Field(ge=1, le=MAX_CANDIDATES_SHOWN, description="candidates returned for each step")]
Title = Annotated[str, Field(min_length=1, max_length=nb.MAX_TITLE_CHARS)]
Body = Annotated[str, Field(max_length=nb.MAX_BODY_CHARS, description="the insight in the learner's words")]
Tags = Annotated[list[Annotated[str, Field(min_length=1, max_length=nb.MAX_TAG_CHARS)]], Field(max_length=nb.MAX_TAGS)]
Query = Annotated[str | None, Field(max_length=nb.MAX_QUERY_CHARS)]
OneTag = Annotated[str | None, Field(max_length=nb.MAX_TAG_CHARS)]


def strict_tool(fn, read_only: bool):
    """The SDK's tool of ``fn``, strict: an argument it does not take is refused
    (``additionalProperties: false`` in its input schema, and checked), its description the
    docstring without its indentation, its annotations saying whether it writes anything."""
    from mcp.server.mcpserver.tools import Tool
    from mcp_types import ToolAnnotations

    hints = ToolAnnotations(read_only_hint=True, open_world_hint=False) if read_only else \
        ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
    tool = Tool.from_function(fn, description=pyinspect.cleandoc(fn.__doc__ or ""), annotations=hints)
    loose = tool.fn_metadata.arg_model
    args = type(loose.__name__, (loose,), {"model_config": ConfigDict(extra="forbid"), "__module__": __name__})
    return tool.model_copy(update={"fn_metadata": tool.fn_metadata.model_copy(update={"arg_model": args}),
                                   "parameters": args.model_json_schema(by_alias=True)})


def refused(tool: str, e: ValidationError, takes: list[str]) -> str:
    """A tool's refused arguments in words, each with where and why, without pydantic's
    links: an unknown one says which arguments the tool takes."""
    said = []
    for err in e.errors(include_url=False, include_input=False):
        where = ".".join(map(str, err["loc"])) or "the arguments"
        if err["type"] == "extra_forbidden":
            said.append(f"{where}: {tool} takes no such argument (it takes {', '.join(takes)})")
        else:
            said.append(f"{where}: {err['msg']}")
    return f"{tool}: " + "; ".join(said)


def make_server(backend: Backend, name: str = "puffergpt"):
    """An ``MCPServer`` with the seven tools over ``backend``."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError

    class Server(MCPServer):
        async def call_tool(self, name: str, arguments: dict[str, Any], context=None):
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as e:  # the SDK's message of bad arguments is pydantic's, with its links
                if isinstance(e, UnexpectedToolError) or not isinstance(e.__cause__, ValidationError):
                    raise
                takes = list(self._tool_manager.get_tool(name).parameters.get("properties", {}))
                raise ToolError(refused(name, e.__cause__, takes)) from e.__cause__

    def generate(prompt: Prompt, max_tokens: MaxTokens = 16, temperature: Temperature = 0.0, top_k: TopK = 40,
                 seed: Seed = None, candidates: Shown = 5) -> dict[str, Any]:
        """Continue a prompt with the model. Returns the new text, its token ids, each step's best
        candidates (token, logit, prob: the softmax of the logits at this temperature over the
        step's 100 best; at temperature 0 the chosen one has 1) and the text_id to inspect its
        positions with. A generated <|endoftext|> ends the text (finish_reason "stop"): it is the
        last of the tokens, never in the text, as on /v1."""
        with tool_errors():
            return backend.generate(prompt, max_tokens, Sampling(temperature, top_k, seed), candidates)

    def inspect(text_id: Annotated[str, Field(description="the text_id generate returned")],
                position: Annotated[int, Field(ge=1)],
                lens_k: Annotated[int, Field(ge=1, le=MAX_VIEW_K)] = 5) -> dict[str, Any]:
        """Look inside the model at a generated text's position p (one of generate's
        inspect_positions): the attention of every layer and head over the tokens 0..p-1, the
        logit lens (each layer's best guesses for token p) and the attribution of the final logit."""
        with tool_errors():
            return backend.inspect(check_text_id(text_id), position, lens_k)

    def save_insight(title: Title, body: Body = "", tags: Tags | None = None,
                     evidence: dict[str, Any] | None = None) -> dict[str, Any]:
        """Save what the learner understood as an insight in their notebook: one Markdown file,
        one git commit. evidence is optional (an insight from this conversation has none; the
        playground's "Save as insight" attaches a token's candidates, and the sampling's controls
        they are after, checked as /v1 bounds them). Returns the file and commit."""
        with tool_errors():
            return backend.save_insight(title, body, list(tags or []), evidence)

    def list_insights(query: Query = None, tag: OneTag = None) -> dict[str, Any]:
        """The notebook's insights, newest first; query searches titles, bodies and tags."""
        with tool_errors():
            return {"insights": backend.list_insights(query, tag)}

    def replay_insight(insight_id: Annotated[str, Field(min_length=1, max_length=100)]) -> dict[str, Any]:
        """Recompute an insight's stored candidates with the model and say whether they still
        match; an insight without evidence says there is nothing to replay."""
        with tool_errors():
            return backend.replay_insight(insight_id)

    def list_lessons() -> dict[str, Any]:
        """The lessons: guided experiments, each step a claim tested on the model (id, title, steps)."""
        with tool_errors():
            return {"lessons": backend.list_lessons()}

    def run_lesson(lesson_id: Annotated[str, Field(min_length=1, max_length=60, description="a lesson's id")],
                   prompt: Annotated[str | None, Field(min_length=1, max_length=lessons.MAX_LESSON_PROMPT,
                                                       description="the learner's prompt; default the starter")]
                   = None) -> dict[str, Any]:
        """Run a lesson on the learner's prompt: each step's claim, computed from the model, whether it
        holds (and why not, when it does not), and its evidence. Walk the learner through the steps."""
        with tool_errors():
            return backend.run_lesson(lesson_id, prompt)

    tools = [strict_tool(generate, True), strict_tool(inspect, True), strict_tool(save_insight, False),
             strict_tool(list_insights, True), strict_tool(replay_insight, True), strict_tool(list_lessons, True),
             strict_tool(run_lesson, True)]
    return Server(name, version=__version__, tools=tools, instructions=(
        "puffergpt runs GPT-2 with every weight row stored in a vector database; every matrix multiply is "
        "one vector search. generate continues a prompt and shows each step's candidates; inspect shows "
        "attention per head, the logit lens and the attribution at a generated token; run_lesson tests a "
        "lesson's claims on the learner's prompt; save_insight writes what the learner understood to their "
        "notebook (a git repository), one commit each."))
