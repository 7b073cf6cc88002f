"""The ``Host`` and browser ``Origin`` allow-lists and API keys, checked before any route runs.

:class:`AuthMiddleware` wraps the whole ASGI app. The protected paths are
everything under ``/v1``, ``/debug`` and ``/metrics``, judged on the path's
canonical form (:func:`canonical_path`: case folded, repeated slashes
collapsed, dot segments resolved; uvicorn has already decoded percent
escapes), whatever the method (``HEAD`` and ``OPTIONS`` included), so that
no spelling of a route reaches it without a key. Open: ``/healthz`` and
``/readyz`` (probes send no key), the static browser page (it asks for the
key itself), and ``/metrics`` only when ``--public-metrics`` says so
(:attr:`AuthConfig.open_paths`; else Prometheus sends a key, with
``authorization: {credentials_file: ...}`` in its scrape config). On the
protected paths:

- a request whose ``Host`` header names a host outside ``--allowed-hosts``
  is refused with HTTP 400 (as starlette's ``TrustedHostMiddleware`` and
  Django do), on every path but the probes: a DNS-rebinding page (its own
  name, resolved to this server's address) sends its own name as ``Host``.
  The default (:func:`default_allowed_hosts`): bound to a loopback address,
  the loopback names and addresses (``localhost``, ``127.0.0.1``,
  ``[::1]``, any port); bound elsewhere, any host (the server logs a
  warning: list the names clients use). Entries are host names, addresses,
  ``*.suffix`` or ``*`` (:func:`normalize_host`); ports are not compared;
- a request whose ``Origin`` header is not allowed is refused with HTTP 403;
  clients that send no ``Origin`` (not browsers) are not concerned. Without
  ``--allowed-origins``, an origin is allowed when its host is an allowed
  host (with any host allowed: when it is the request's own origin, so
  another site's page is refused, but not a DNS-rebinding one). With it,
  origins compare in the form browsers send them (:func:`normalize_origin`:
  lower case, no default port, no trailing slash). The entry ``self``
  allows the origin the request was addressed to (:func:`request_origin`):
  the ``Host`` header, already checked against the allowed hosts (so a
  rebinding page's name never passes it unless any host is allowed), with
  the request's scheme, which behind a TLS-terminating proxy is the one its
  ``X-Forwarded-Proto`` says, when uvicorn trusts that proxy
  (``--forwarded-allow-ips``; the browser's ``Origin`` is ``https://...``
  while the proxy talks plain HTTP to bargein). The proxy must pass the
  client's ``Host`` on (nginx: ``proxy_set_header Host $http_host``), and
  that name must be an allowed host;
- when API keys are configured, every request must carry one: the
  ``Authorization: Bearer <key>`` header, or, on a WebSocket, the offered
  subprotocol ``bearer.<key>`` (browsers cannot set headers; the server never
  echoes it), or ``openai-insecure-api-key.<key>``, the one OpenAI's browser
  clients offer. Missing or wrong: HTTP 401 with ``WWW-Authenticate: Bearer``.
  A key in the query string (``?api_key=``) is not one: query strings end
  up in access logs and browser histories (the 401 says so).

A refused request never reaches the app: no session, no admission slot, no
rate-limit token is spent on it.

A WebSocket is refused *before the upgrade*, with a real HTTP response, via
the ASGI ``websocket.http.response`` extension (uvicorn supports it); a
server without it gets ``websocket.close`` before accept, which uvicorn
answers with 403.

The caller's *principal* is put in ``scope["state"]["principal"]``:
``"key:<first 32 hex of sha256(key)>"`` (the same as
:func:`bargein.app.openai.routes.principal_of`), or ``"anonymous"`` without a key. It
owns what the caller creates (streams, sessions, resume tokens). Keys are
kept only as their SHA-256 digests, and never logged.

The *limit key* (``scope["state"]["limit_key"]``) is who the rate limits and
caps of :mod:`bargein.session.runtime.admission` count against: the principal when API keys
are configured (every request carries a valid one), else the client's
address (:func:`address_key`). Without keys any bearer string is accepted,
so a string is no identity: a client rotating it would get fresh limits with
each one. The address is the peer's, or, from a proxy in
``--forwarded-allow-ips`` (uvicorn's proxy headers, default: loopback only),
the one its ``X-Forwarded-For`` names; from any other peer the header is
ignored (any client can write it).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bargein.protocol.codec import BEARER_PREFIX

logger = logging.getLogger("bargein.auth")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

ANONYMOUS = "anonymous"
OPENAI_KEY_PREFIX = "openai-insecure-api-key."  # the subprotocol OpenAI's browser clients send a key in
# Canonical forms (see canonical_path); "/v1" also covers "/v1foo": over-protecting
# a static file name is harmless, letting a spelling of a route through is not.
PROTECTED_PREFIXES = ("/v1", "/debug", "/metrics")
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
# Query parameters that look like a credential: refused with a hint, never used.
_QUERY_KEY_NAMES = frozenset(
    {"api_key", "api-key", "apikey", "key", "access_token", "token", "authorization"}
)
# The allowed-origins entry meaning "the origin the request was addressed to".
SELF_ORIGIN = "self"
_DEFAULT_PORTS = {"http": 80, "https": 443}
ANY_HOST = "*"
# What a server bound to a loopback address answers to by default (any port).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
# A Host header: a name or IPv4 address, or an IPv6 address in brackets, then an optional port.
_HOST_HEADER = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::[0-9]{1,5})?")
# A WebSocket's scope scheme is ws/wss; its page's origin is http/https.
_HTTP_SCHEMES = {"ws": "http", "wss": "https"}
# uvicorn (0.54, websockets-sansio) logs this at ERROR after a handshake answered
# with an HTTP response, as a refusal here is: one line per refused client.
_UVICORN_DENIAL_LINE = "ASGI callable returned without completing handshake."


class _DenialLineFilter(logging.Filter):
    """Drops uvicorn's error line about a WebSocket answered with an HTTP response."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _UVICORN_DENIAL_LINE


def key_digest(key: str) -> str:
    """The SHA-256 hex digest of a key (what is kept in memory instead of the key)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def principal_for(key: str | None) -> str:
    """The principal of a caller presenting ``key`` (``"anonymous"`` for none)."""
    return ANONYMOUS if not key else "key:" + key_digest(key)[:32]


# IPv6 hosts get a whole /64 (SLAAC, privacy addresses): one limit key for it,
# or a host could rotate through 2**64 addresses of its own.
IPV6_LIMIT_PREFIX = 64


def address_key(scope: Scope) -> str:
    """The limit key of a caller known only by its address: ``addr:<IPv4>``,
    ``addr:<IPv6 /64 network>``, or ``addr:unknown`` (a Unix socket, a test
    client without a peer address)."""
    client = scope.get("client")
    if not client:
        return "addr:unknown"
    try:
        ip = ipaddress.ip_address(client[0])
    except ValueError:
        return "addr:unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"addr:{ip.ipv4_mapped}"
        return f"addr:{ipaddress.ip_network(f'{ip}/{IPV6_LIMIT_PREFIX}', strict=False)}"
    return f"addr:{ip}"


def load_api_keys(spec: str | None) -> frozenset[str]:
    """The key digests named by ``spec``: a file (one key a line, ``#`` comments)
    or a comma-separated list. ``None`` or empty: no keys (auth off).

    Raises:
        ValueError: ``spec`` names a file that holds no key.
    """
    if not spec:
        return frozenset()
    path = Path(spec).expanduser()
    if path.is_file():
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        keys = [line for line in lines if line]
        if not keys:
            raise ValueError(f"the API key file {str(path)!r} holds no key")
    else:
        keys = [k.strip() for k in spec.split(",") if k.strip()]
    return frozenset(key_digest(k) for k in keys)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthConfig:
    """What :class:`AuthMiddleware` enforces.

    Attributes:
        key_digests: SHA-256 digests of the accepted keys; empty: no key needed.
        allowed_hosts: ``Host`` names allowed, in :func:`normalize_host`'s form
            (a name, an address, ``*.suffix``, or :data:`ANY_HOST`).
        allowed_origins: browser origins allowed, in :func:`normalize_origin`'s
            form (``scheme://host[:port]``, or :data:`SELF_ORIGIN`); empty:
            those whose host is an allowed host (see the module doc).
        open_paths: canonical paths served without any check.
    """

    key_digests: frozenset[str] = field(default_factory=frozenset, repr=False)
    allowed_hosts: frozenset[str] = frozenset({ANY_HOST})
    allowed_origins: frozenset[str] = frozenset()
    open_paths: frozenset[str] = OPEN_PATHS

    def __post_init__(self) -> None:
        if not self.allowed_hosts:
            raise ValueError(f"{self.allowed_hosts=} must name at least one host (or {ANY_HOST})")

    def is_protected(self, path: str) -> bool:
        """Whether a request for ``path`` (decoded) goes through the checks."""
        canonical = canonical_path(path)
        return canonical not in self.open_paths and canonical.startswith(PROTECTED_PREFIXES)


def normalize_origin(origin: str) -> str:
    """``origin`` as browsers serialize it (RFC 6454 section 6.2): ``scheme://host[:port]``
    with scheme and host in lower case and no default port (80, 443) or
    trailing slash; :data:`SELF_ORIGIN` stays as it is.

    Raises:
        ValueError: ``origin`` is not an http or https origin (a path, a query,
            user info, a bad port), naming it.
    """
    if origin == SELF_ORIGIN:
        return origin
    bad = ValueError(f"origin {origin!r} must be scheme://host[:port] (http or https), or {SELF_ORIGIN}")
    parts = urllib.parse.urlsplit(origin.strip())
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        raise bad
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise bad
    try:
        port = parts.port
    except ValueError:
        raise bad from None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname  # IPv6 keeps its brackets
    return f"{scheme}://{host}" if port in (None, _DEFAULT_PORTS[scheme]) else f"{scheme}://{host}:{port}"


def normalize_host(entry: str) -> str:
    """An ``--allowed-hosts`` entry in the form :func:`host_of` gives: lower
    case, no trailing dot, an IPv6 address in brackets; ``*`` and
    ``*.suffix`` stay wildcards.

    Raises:
        ValueError: ``entry`` is not a host name, an address or a wildcard
            (a port, a scheme, a path), naming it.
    """
    text = entry.strip().lower()
    if text == ANY_HOST:
        return text
    wildcard = text.startswith("*.")
    name = text[2:] if wildcard else text
    if not wildcard and ":" in name and not name.startswith("["):
        name = f"[{name}]"  # a bare IPv6 address
    host = host_of(name)
    if host is None or host != name.rstrip(".") or (wildcard and host.startswith("[")):
        raise ValueError(
            f"allowed host {entry!r} must be a host name, an address, *.domain or * (no scheme, port or path)"
        )
    return f"*.{host}" if wildcard else host


def host_of(authority: str) -> str | None:
    """The host of a ``Host`` header or an origin's ``host[:port]``: lower
    case, without its port and trailing dot, an IPv6 address in brackets;
    None when malformed (user info, a bad port, odd characters)."""
    match = _HOST_HEADER.fullmatch(authority.strip().lower())
    if match is None:
        return None
    host = match.group(1)
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        return host
    return host.rstrip(".") or None


def host_allowed(host: str, allowed: frozenset[str]) -> bool:
    """Whether ``host`` (:func:`host_of`'s form) matches an entry of ``allowed``:
    equal, under a ``*.suffix`` (not the suffix itself), or any with ``*``."""
    if ANY_HOST in allowed or host in allowed:
        return True
    return any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in allowed)


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` (``--host``) listens on loopback only."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_allowed_hosts(bind_host: str) -> frozenset[str]:
    """The ``Host`` names a server bound to ``bind_host`` answers to without
    ``--allowed-hosts``: the loopback names and addresses (and the bound
    address itself) on loopback, else any (:data:`ANY_HOST`)."""
    if not is_loopback(bind_host):
        return frozenset({ANY_HOST})
    return frozenset({*LOOPBACK_HOSTS, normalize_host(bind_host)})


def request_origin(scope: Scope) -> str | None:
    """The origin a request was addressed to: its ``Host`` header and scheme
    (``https`` for ``wss``; behind a trusted proxy the forwarded one), in
    :func:`normalize_origin`'s form; None without a usable ``Host``."""
    host = _headers(scope).get("host")
    if not host:
        return None
    scheme = scope.get("scheme", "http")
    try:
        return normalize_origin(f"{_HTTP_SCHEMES.get(scheme, scheme)}://{host}")
    except ValueError:
        return None


def canonical_path(path: str) -> str:
    """``path`` case folded, with repeated slashes collapsed, ``.`` and ``..``
    segments resolved and no trailing slash: every spelling of one route
    (``//V1/./models/``) has the same canonical form (``/v1/models``)."""
    segments: list[str] = []
    for segment in path.lower().split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def presented_key(scope: Scope) -> str | None:
    """The key a request carries: bearer header first, then a ``bearer.`` (or
    OpenAI's ``openai-insecure-api-key.``) subprotocol."""
    scheme, _, key = _headers(scope).get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return key.strip()
    offered: Iterable[str] = scope.get("subprotocols", []) if scope["type"] == "websocket" else ()
    return next(
        (
            p[len(prefix) :]
            for p in offered
            for prefix in (BEARER_PREFIX, OPENAI_KEY_PREFIX)
            if p.startswith(prefix) and len(p) > len(prefix)
        ),
        None,
    )


class AuthMiddleware:
    """ASGI middleware: origin check, API key check, principal in the scope.

    Args:
        app: the wrapped ASGI app.
        config: hosts, keys and origins.
        on_refused: told the reason of each refusal (``host_not_allowed``,
            ``origin_not_allowed``, ``missing_api_key``, ``invalid_api_key``),
            for the metrics.
    """

    def __init__(
        self, app: ASGIApp, config: AuthConfig, on_refused: Callable[[str], None] = lambda reason: None
    ) -> None:
        self.app = app
        self.config = config
        self.on_refused = on_refused
        uvicorn_error = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _DenialLineFilter) for f in uvicorn_error.filters):
            uvicorn_error.addFilter(_DenialLineFilter())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        key = presented_key(scope)
        state = scope.setdefault("state", {})
        state["principal"] = principal_for(key)
        # With keys, a valid key is an identity; without, any string passes,
        # so limits count against the address instead (see the module doc).
        state["limit_key"] = state["principal"] if self.config.key_digests else address_key(scope)
        refusal = self._host_refusal(scope)
        if refusal is None and self.config.is_protected(scope["path"]):
            refusal = self._refusal(scope, key)
        if refusal is not None:
            self.on_refused(refusal[1])
            await _deny(scope, receive, send, *refusal)
            return
        await self.app(scope, receive, send)

    def _host_refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """The refusal of a ``Host`` outside the allowed hosts, or None. The
        probes stay open: a balancer's health check names the node's address,
        and what they answer is no secret."""
        if ANY_HOST in self.config.allowed_hosts or canonical_path(scope["path"]) in OPEN_PATHS:
            return None
        header = _headers(scope).get("host", "")
        host = host_of(header)
        if host is not None and host_allowed(host, self.config.allowed_hosts):
            return None
        logger.info("request refused", extra={"reason": "host", "host": header[:200]})
        return 400, "host_not_allowed", "this Host is not served here (see --allowed-hosts)"

    def _refusal(self, scope: Scope, key: str | None) -> tuple[int, str, str] | None:
        """``(status, code, message)`` of a request to a protected path to refuse, or None."""
        origin = _headers(scope).get("origin")
        if origin is not None and not self._origin_allowed(scope, origin):
            logger.info("request refused", extra={"reason": "origin", "origin": origin[:200]})
            return 403, "origin_not_allowed", "this Origin is not allowed"
        digests = self.config.key_digests
        if digests and (key is None or key_digest(key) not in digests):
            reason = "missing_api_key" if key is None else "invalid_api_key"
            logger.info("request refused", extra={"reason": reason})  # never the key itself
            message = "a valid API key is required (Authorization: Bearer <key>)"
            if key is None and _key_in_query(scope):
                message += "; a key in the query string is not accepted (it would be logged)"
            return 401, reason, message
        return None

    def _origin_allowed(self, scope: Scope, origin: str) -> bool:
        """Whether a browser page of ``origin`` may call: listed, or ``self`` and
        the request's own; without a list, one on an allowed host (see the module doc)."""
        try:
            origin = normalize_origin(origin)
        except ValueError:  # "null" (a sandboxed frame, a file:// page) or garbage
            return False
        allowed = self.config.allowed_origins
        if not allowed:
            hosts = self.config.allowed_hosts
            if ANY_HOST in hosts:  # no names to judge by: only the page's own server
                return origin == request_origin(scope)
            host = host_of(origin.partition("://")[2])
            return host is not None and host_allowed(host, hosts)
        # The Host behind request_origin passed the allowed hosts already.
        return origin in allowed or (SELF_ORIGIN in allowed and origin == request_origin(scope))


def _key_in_query(scope: Scope) -> bool:
    """Whether the query string has a parameter named like a credential."""
    query = scope.get("query_string", b"").decode("latin-1")
    names = {pair.partition("=")[0].lower() for pair in query.split("&")}
    return not names.isdisjoint(_QUERY_KEY_NAMES)


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
    """Answer with an HTTP error (before the upgrade, for a WebSocket)."""
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})
