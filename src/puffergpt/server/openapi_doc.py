"""The OpenAPI document, ``/openapi.json``, as a generated client or a Custom GPT's action
imports it:

- ``servers`` is absolute: ``serve --public-url`` where given (the address clients reach,
  behind a proxy or a tunnel), else the URL the request came to (``request.base_url``,
  which holds any ``root_path``). A relative ``/`` can't be imported as an action.
- ``?tags=notebook`` (any tags, comma-separated) serves only the operations of those tags
  and the schemas they reference: an action imports at most 30 operations, and one that
  saves insights needs the notebook's four, not the playground's.
- FastAPI adds a 422 in its own shape (``HTTPValidationError``) to every route with a
  parameter; this server never answers in that shape (``errors.py``: every error is an
  ``ErrorBody``), so those are dropped, and each route declares the 422 it really sends.
"""

from __future__ import annotations

import copy
import json
import re
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from puffergpt.server.guards.auth import needs_key
from puffergpt.server.playground.responses import WHY

OPENAPI_URL = "/openapi.json"
TAG_LIKE = re.compile(r"[a-z][a-z0-9-]{0,31}")  # what an unknown ?tags= value may be shown as: a word, never more
TAGS = [  # the groups of operations, in the document's order
    {"name": "notebook", "description": "The learner's notebook of insights: save, list, read and replay. "
                                        "An action imports these alone: /openapi.json?tags=notebook"},
    {"name": "notebook-git", "description": "The notebook pushed to its git remote"},
    {"name": "openai", "description": "OpenAI-compatible completions and models"},
    {"name": "tokenizer", "description": "GPT-2's tokenizer, as vLLM's server has it"},
    {"name": "model", "description": "The model served, and Compare"},
    {"name": "texts", "description": "The playground's texts: open, edit, generate, look inside"},
    {"name": "views", "description": "The embedding views and a word in several contexts"},
]
FASTAPI_422 = "#/components/schemas/HTTPValidationError"


def check_public_url(url: str) -> str:
    """``serve --public-url``: an absolute http(s) URL with no query, fragment or password,
    without its trailing slash; a ValueError naming what is wrong."""
    try:
        u = urlsplit(url)
        u.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as e:
        raise ValueError(f"--public-url {url!r} is not a URL ({e})") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"--public-url must be an absolute http:// or https:// URL such as "
                         f"https://puffer.example.org, got {url!r}")
    if u.query or u.fragment or url.endswith(("?", "#")):
        raise ValueError(f"--public-url must have no query or fragment (clients add the paths to it), got {url!r}")
    if u.username is not None or u.password is not None:
        raise ValueError("--public-url must not hold a user name or password: the document is public")
    return url.rstrip("/")


def full(app: FastAPI) -> dict:
    """FastAPI's document of the app (made once), less FastAPI's 422s."""
    doc = copy.deepcopy(app.openapi())
    for item in doc["paths"].values():
        for op in item.values():
            if FASTAPI_422 in json.dumps(op.get("responses", {}).get("422", {})):
                del op["responses"]["422"]
    schemas = doc.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):  # only those 422s named them
        schemas.pop(name, None)
    return doc


def keyed(doc: dict, keys: bool) -> dict:
    """Every operation ``auth.needs_key`` guards declares the 401 it sends with ``serve
    --api-key``; with keys set, the document also says how to send one (a bearer scheme), as an
    action's importer asks for it."""
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if needs_key(method.upper(), path, False):
                op.setdefault("responses", {}).setdefault("401", {
                    "description": WHY[401], "content": {"application/json": {"schema": {
                        "$ref": "#/components/schemas/ErrorBody"}}}})
                if keys:
                    op["security"] = [{"apiKey": []}]
    if keys:
        doc.setdefault("components", {})["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
    return doc


def refs(x) -> set[str]:
    """The component schemas that ``x`` names (``#/components/schemas/NAME``)."""
    return set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(x)))


def tagged(doc: dict, tags: set[str]) -> dict:
    """The document with only the operations of ``tags``, and the schemas they reference
    (and those reference, and so on)."""
    paths = {}
    for path, item in doc["paths"].items():
        ops = {m: op for m, op in item.items() if tags & set(op.get("tags", ()))}
        if ops:
            paths[path] = ops
    schemas = doc.get("components", {}).get("schemas", {})
    kept, todo = set(), refs(paths)
    while todo:
        name = todo.pop()
        if name not in kept and name in schemas:
            kept.add(name)
            todo |= refs(schemas[name])
    out = {**doc, "paths": paths, "tags": [t for t in doc.get("tags", []) if t["name"] in tags]}
    out["components"] = {**doc.get("components", {}), "schemas": {k: v for k, v in schemas.items() if k in kept}}
    return out


def unknown(tags: set[str]) -> str:
    """Tags no operation has, as an error may show them: a short tag-like word as it is, anything
    else (a long or odd value) counted, never echoed back."""
    if not tags:
        return "(none given)"
    shown = sorted(t for t in tags if TAG_LIKE.fullmatch(t))[:5]
    hidden = len(tags) - len(shown)
    return ", ".join(shown + ([f"{hidden} other value{'s' if hidden > 1 else ''} (not shown)"] if hidden else []))


def document(app: FastAPI, server: str, tags: str | None, keys: bool = False) -> dict:
    """The document served at ``server`` (an absolute URL); ``tags`` (comma-separated) keep
    only their operations; ``keys``: the server wants an API key. ValueError for a tag no
    operation has."""
    doc = keyed(full(app), keys)
    if tags is not None:
        wanted = {t.strip() for t in tags.split(",") if t.strip()}
        known = {t for item in doc["paths"].values() for op in item.values() for t in op.get("tags", ())}
        if not wanted or wanted - known:
            raise ValueError(f"tags: no operations are tagged {unknown(wanted - known)}; "
                             f"the tags are {', '.join(sorted(known))}")
        doc = tagged(doc, wanted)
    doc["servers"] = [{"url": server, "description": "this server"}]
    return doc


def add_document(app: FastAPI, public_url: str | None, keys: bool = False) -> None:
    """``/openapi.json`` on the app (made with ``openapi_url=None``: FastAPI's own would give
    a relative server), which the docs pages read."""
    app.openapi_url = OPENAPI_URL

    @app.get(OPENAPI_URL, include_in_schema=False)
    def openapi(request: Request, tags: str | None = None) -> JSONResponse:
        from puffergpt.server.openai.protocol import OpenAIError

        server = public_url or str(request.base_url).rstrip("/")
        try:
            return JSONResponse(document(request.app, server, tags, keys))
        except ValueError as e:
            raise OpenAIError(400, str(e), "tags") from None
