"""Which ``Host`` headers the server answers: on a loopback address only its own names
(``127.0.0.1``, ``localhost``, ``::1``), so that a page elsewhere can't reach it by DNS
rebinding (a name of the attacker's that resolves to 127.0.0.1), and the names
``serve --allowed-host`` adds: ``host.docker.internal`` for a container on Docker's
default network, a reverse proxy's public name; and ``serve --public-url``'s own host. On
another address, any Host unless ``--allowed-host`` names some (then those and the loopback
names only). Another Host is
a 400 naming the flag that admits it. The probes (``/health``, ``/ready``, ``/metrics``)
answer any Host: a balancer or an orchestrator asks by address, and they tell nothing a
page could use."""

from __future__ import annotations

import contextlib
import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers

from puffergpt.server.errors import refuse

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
FLAG = "puffergpt serve --allowed-host"
PROBES = frozenset({"/health", "/ready", "/metrics"})


def is_loopback(host: str) -> bool:
    """Whether ``--host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def host_name(value: str) -> str | None:
    """The name in a Host header (or an ``--allowed-host``), lower case, without its port or
    an IPv6 address's brackets; None when it is not one."""
    with contextlib.suppress(ValueError):  # a bare address (an IPv6 one has no brackets here)
        return str(ipaddress.ip_address(value.strip()))
    try:
        u = urlsplit("//" + value.strip())
        u.port  # noqa: B018 - a port that is not a number raises here
    except ValueError:
        return None
    if not u.hostname or u.path or u.query or u.fragment or u.username is not None:
        return None
    return u.hostname.lower()


def check_allowed_host(value: str) -> str:
    """An ``--allowed-host`` value: a name or an address, no scheme or path. ValueError if not."""
    name = host_name(value)
    if name is None or "*" in name:
        raise ValueError(f"give a host name or address as clients write it in the URL, e.g. host.docker.internal "
                         f"or puffer.example.org (no scheme, path or wildcard; got {value!r})")
    return name


def trusted_hosts(bind: str, allowed: tuple[str, ...], public_url: str | None = None) -> tuple[str, ...] | None:
    """The Host names answered when listening on ``bind``; None: any. ``public_url`` (serve
    --public-url, the address clients are told to use) adds its own host, as if it were allowed."""
    names = tuple(check_allowed_host(a) for a in allowed)
    if is_loopback(bind) or names:
        own = (host_name(urlsplit(public_url).netloc),) if public_url else ()
        return LOOPBACK_NAMES + tuple(dict.fromkeys(n for n in names + own if n and n not in LOOPBACK_NAMES))
    return None


class TrustedHosts:
    """A request whose Host is not one of ``names`` (normalised by ``host_name``) is a 400
    saying how to admit it, before anything else."""

    def __init__(self, app, names: tuple[str, ...]):
        self.app = app
        self.names = frozenset(host_name(n) for n in names)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in PROBES:
            return await self.app(scope, receive, send)
        sent = Headers(scope=scope).get("host")
        if sent is not None and host_name(sent) in self.names:
            return await self.app(scope, receive, send)
        shown = "no Host header" if sent is None else f"Host {sent[:100]!r}"
        await refuse(scope, send, 400, f"this server does not answer {shown}: it answers "
                                       f"{', '.join(sorted(self.names))}. To reach it by another name (a container: "
                                       f"host.docker.internal, a reverse proxy's name), start it with "
                                       f"`{FLAG} NAME` (docs/deploy.md)", code="invalid_host")
