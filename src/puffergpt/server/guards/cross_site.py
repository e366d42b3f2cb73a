"""Only this server's own page and the clients it allows drive it: no request forgery
from another site. Every request that changes state or costs work (POST, PUT, PATCH,
DELETE, on every path) passes ``CrossSite`` before any route reads its body:

- an ``Origin`` that is neither this server's own (the scheme and the ``Host`` the
  request was sent to) nor one allowed with ``serve --cors-origin`` is a 403 naming it and
  the flag; so is ``Sec-Fetch-Site: cross-site`` or ``same-site`` (another port of the
  same host) from an origin not allowed. The notebook's routes (``/api/insights``: save,
  push, replay) take their own page only, whatever ``--cors-origin`` allows;
- a body must be JSON, ``Content-Type: application/json`` (charset utf-8 or none): any
  other type, or a body without one, is a 415 naming the type expected. That is what a
  page elsewhere can send without asking first (a form, ``text/plain``, a ``no-cors``
  fetch); anything else a browser asks about first (a preflight), which only the
  ``--cors-origin`` origins are answered (Starlette's ``CORSMiddleware``, added by the app).

Clients that send no ``Origin`` and no ``Sec-Fetch-Site`` (curl, the openai SDK, lm-eval)
are not browsers driven by a page: they pass."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers

from puffergpt.server.errors import refuse

UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})
OWN_PAGE_ONLY = ("/api/insights",)  # the notebook (push: the learner's git remote): never another origin
JSON = "application/json"
FLAG = "puffergpt serve --cors-origin"


def check_origin(value: str) -> str:
    """An origin as ``--cors-origin`` takes it, normalised as browsers send it (lower
    case, no default port): ``scheme://host[:port]``. ValueError saying what is wrong."""
    how = f"give an origin as scheme://host[:port], e.g. http://localhost:3000 (got {value!r})"
    try:
        u = urlsplit(value.strip())
        port = u.port
    except ValueError:
        raise ValueError(f"not an origin: {how}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"not an origin: it needs http:// or https:// and a host: {how}")
    if u.path or u.query or u.fragment or "#" in value or "?" in value:
        raise ValueError(f"an origin has no path, query or fragment, not even a final '/': {how}")
    if u.username is not None or u.password is not None:
        raise ValueError(f"an origin has no user or password: {how}")
    host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
    default = {"http": 80, "https": 443}[u.scheme]
    return f"{u.scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def own_origin(scope) -> str | None:
    """This server's origin as the request names it: its scheme and Host header."""
    host = Headers(scope=scope).get("host")
    return f"{scope.get('scheme', 'http')}://{host.lower()}" if host else None


def json_type(value: str) -> bool:
    """Whether a Content-Type is JSON in UTF-8: application/json, charset utf-8 or none."""
    media, *params = (p.strip().lower() for p in value.split(";"))
    return media == JSON and all(p.replace(" ", "").replace('"', "") == "charset=utf-8" for p in params if p)


def cross_site(headers: Headers, own: str | None, allowed: frozenset[str]) -> str | None:
    """Why a request is a forgery from another site, or None."""
    origin, site = headers.get("origin"), headers.get("sec-fetch-site")
    if origin is not None and origin.lower() in allowed:
        return None
    if origin is not None and origin.lower() != own:
        return f"a request from the origin {origin!r} is refused"
    if site in ("cross-site", "same-site"):
        return f"a request a page on another site sent (Sec-Fetch-Site: {site}) is refused"
    return None


def not_json(headers: Headers) -> str | None:
    """Why a request's body is not one a route reads (a 415), or None."""
    kind = headers.get("content-type")
    if kind is None:
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        return "the request has a body but no Content-Type" if has_body else None
    return None if json_type(kind) else f"Content-Type {kind[:100]!r} is not accepted"


class CrossSite:
    """Refuse a forged request (403) or a body that is not JSON (415), before any route
    and before its body is read. ``allowed``: the ``--cors-origin`` origins, normalised."""

    def __init__(self, app, allowed: tuple[str, ...] = ()):
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in UNSAFE:
            return await self.app(scope, receive, send)
        headers, own = Headers(scope=scope), own_origin(scope)
        own_only = scope["path"].startswith(OWN_PAGE_ONLY)
        why = cross_site(headers, own, frozenset() if own_only else self.allowed)
        if why is not None:
            where = "its notebook only from its own page" if own_only else \
                f"only its own page and the origins allowed with `{FLAG} ORIGIN`"
            return await refuse(scope, send, 403, f"{why}: this server ({own or 'no Host given'}) takes requests "
                                                  f"that change state or cost work from {where}, and from clients "
                                                  "that send no Origin (curl, SDKs)", code="cross_site_request")
        why = not_json(headers)
        if why is not None:
            return await refuse(scope, send, 415, f"{why}: send the body as JSON with Content-Type: {JSON} "
                                                  "(charset utf-8 or none)", code="unsupported_media_type")
        await self.app(scope, receive, send)
