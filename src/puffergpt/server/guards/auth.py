"""Who may use the server, in one place: ``serve --api-key KEY`` (repeatable, or
``PUFFERGPT_API_KEY``, keys separated by commas, or ``--api-key-file PATH``, one a line: the
two a process's command line never shows), ``--public-read-only`` and ``--no-auth``.
``Auth`` (a middleware, after the cross-site checks and before any route reads a body)
applies the rule to every request:

- with a key, every request under ``/v1`` (reads too, as OpenAI's API) and every request
  that changes state or costs work (POST, PUT, PATCH, DELETE, on every path: a text, a
  generation, the views, the notebook) needs ``Authorization: Bearer KEY``:
  a 401 otherwise, in OpenAI's shape on ``/v1`` (code ``invalid_api_key``). Reads outside
  ``/v1`` need none: the page, its files, ``/api/info``, ``/api/status``, the notebook's
  list, ``/health``, ``/ready``, ``/metrics``; nor does the tokenizer at the root
  (``/tokenize``, ``/detokenize``, ``/tokenizer_info``), as vLLM asks no key outside ``/v1``:
  lm-eval's remote tokenizer sends its own ``auth_token`` there, not ``OPENAI_API_KEY``,
  and it computes nothing of the model's;
- ``--public-read-only``: anyone may generate; the notebook's writes (save, push) need
  the key, and with none set are refused (403) for everyone;
- no key, not read-only: anyone may do anything, which ``check_exposure`` allows only on
  a loopback address, or with ``--no-auth`` said out loud.

Keys are compared in constant time (``hmac.compare_digest``), against every key."""

from __future__ import annotations

import hmac
import logging
import os
from pathlib import Path

from starlette.datastructures import Headers

from puffergpt.server.errors import refuse
from puffergpt.server.guards.hosts import is_loopback

log = logging.getLogger("puffergpt")

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
NOTEBOOK = "/api/insights"
READS_BY_POST = ("/replay",)  # notebook routes that recompute and change nothing: not writes
TOKENIZER = frozenset({"/tokenize", "/detokenize"})  # vLLM's, keyless as vLLM's are: the module's docstring
MIN_KEY_CHARS = 8


def check_key(key: str) -> str:
    """A key as ``--api-key`` takes it: 8 or more visible ASCII characters, no comma (the
    environment's separator). ValueError saying what is wrong, never the key itself."""
    if len(key) < MIN_KEY_CHARS:
        raise ValueError(f"an API key needs at least {MIN_KEY_CHARS} characters (got {len(key)}): "
                         "make one with `python3 -c 'import secrets; print(secrets.token_urlsafe(24))'`")
    if not all("!" <= ch <= "~" for ch in key) or "," in key:
        raise ValueError("an API key is visible ASCII characters without spaces or commas (commas separate "
                         "keys in PUFFERGPT_API_KEY)")
    return key


def read_key_file(path: Path) -> tuple[str, ...]:
    """The keys in a file, one a line (blank lines and ``#`` comments left out), each checked as
    ``--api-key``'s; ValueError naming the file (never a key) if it can't be read or holds none."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"can't read the key file {path}: {e}") from None
    keys = [s for s in (line.strip() for line in lines) if s and not s.startswith("#")]
    if not keys:
        raise ValueError(f"the key file {path} holds no key (one a line; lines starting with # are comments)")
    try:
        return tuple(check_key(k) for k in keys)
    except ValueError as e:
        raise ValueError(f"in the key file {path}: {e}") from None


def check_key_file(path: Path) -> Path:
    """``--api-key-file``: a file that holds keys (``read_key_file``); a warning where others may read it."""
    read_key_file(path)
    if os.stat(path).st_mode & 0o077:
        log.warning("the key file %s can be read by other users: chmod 600 %s", path, path)
    return path


def check_exposure(host: str, keys: tuple[str, ...], public_read_only: bool, no_auth: bool) -> None:
    """Refuse (ValueError) to serve a non-loopback address where anyone could write into the
    notebook, and contradictory flags."""
    if no_auth and (keys or public_read_only):
        raise ValueError("--no-auth lets anyone do anything: it can't go with --api-key (or PUFFERGPT_API_KEY) "
                         "or --public-read-only; choose one")
    if is_loopback(host) or keys or public_read_only or no_auth:
        return
    raise ValueError(f"--host {host} is reachable from other machines, and without a key anyone there could "
                     "generate and write commits into the notebook. Start it with --api-key KEY (or "
                     "PUFFERGPT_API_KEY) to require a key, --public-read-only to let anyone generate but no one "
                     "write the notebook, or --no-auth to let anyone do anything (docs/deploy.md#keys)")


def bearer(headers: Headers) -> bytes | None:
    """The token of ``Authorization: Bearer TOKEN``, as sent; None without one."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip().encode("latin-1") if scheme.lower() == "bearer" and token.strip() else None


def known(token: bytes, keys: tuple[bytes, ...]) -> bool:
    """Whether the token is one of the keys, compared in constant time against every key."""
    return sum(hmac.compare_digest(token, k) for k in keys) > 0


def notebook_write(method: str, path: str) -> bool:
    return method in UNSAFE and path.startswith(NOTEBOOK) and not path.rstrip("/").endswith(READS_BY_POST)


def needs_key(method: str, path: str, public_read_only: bool) -> bool:
    """Whether a request needs a key, when the server has keys."""
    if notebook_write(method, path):
        return True
    if public_read_only or path in TOKENIZER:
        return False
    return path == "/v1" or path.startswith("/v1/") or method in UNSAFE


class Auth:
    """The rule above, before any route. ``keys``: the API keys (none: only ``read_only``
    matters); ``read_only``: ``--public-read-only``."""

    def __init__(self, app, keys: tuple[str, ...] = (), read_only: bool = False):
        self.app = app
        self.keys = tuple(k.encode("utf-8") for k in keys)
        self.read_only = read_only

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] == "OPTIONS":  # a preflight carries no key
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if self.read_only and not self.keys and notebook_write(method, path):
            return await refuse(scope, send, 403, "this server is public and read-only (puffergpt serve "
                                                  "--public-read-only): it generates for anyone, and no one may "
                                                  "write its notebook. Save insights on a server started with "
                                                  "--api-key", code="read_only")
        if not self.keys or not needs_key(method, path, self.read_only):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        token = bearer(headers)
        if token is not None and known(token, self.keys):
            return await self.app(scope, receive, send)
        page = "sec-fetch-mode" in headers and not (path == "/v1" or path.startswith("/v1/"))
        await refuse(scope, send, 401, unauthorized(token is not None, page), code="invalid_api_key",
                     headers={"WWW-Authenticate": 'Bearer realm="puffergpt"'})


def unauthorized(sent: bool, page: bool) -> str:
    """The 401's message, for whoever asked: ``page``, a browser's call outside ``/v1`` (it sends
    ``Sec-Fetch-Mode``, which no script can forge and no SDK sends), whose user types the key in
    the page's field; any other, an API client (an SDK, curl, ``puffergpt mcp``), told the header."""
    why = "the API key sent is not one this server takes" if sent else "this server needs an API key for this request"
    if page:
        return (f"{why}: type a key the server was started with (puffergpt serve --api-key) in the API key field "
                "at the top of the page (it is sent as the header `Authorization: Bearer KEY`)")
    return (f"{why}: send the header `Authorization: Bearer KEY` with a key the server was started with "
            "(puffergpt serve --api-key): the OpenAI SDKs send their api_key so, puffergpt mcp its --api-key")
