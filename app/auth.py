"""API keys and the browser ``Origin`` allow-list, checked before any route runs.

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

- a request whose ``Origin`` header is not in ``--allowed-origins`` (when an
  allow-list is set) is refused with HTTP 403; clients that send no
  ``Origin`` (not browsers) are not concerned. Origins compare in the form
  browsers send them (:func:`normalize_origin`: lower case, no default port,
  no trailing slash). The entry ``self`` allows the origin the request was
  addressed to (:func:`request_origin`): the ``Host`` header with the
  request's scheme, which behind a TLS-terminating proxy is the one its
  ``X-Forwarded-Proto`` says, when uvicorn trusts that proxy
  (``--forwarded-allow-ips``; the browser's ``Origin`` is ``https://...``
  while the proxy talks plain HTTP to bargein). The proxy must pass the
  client's ``Host`` on (nginx: ``proxy_set_header Host $http_host``);
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
caps of :mod:`bargein.session.admission` count against: the principal when API keys
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
        allowed_origins: browser origins allowed, in :func:`normalize_origin`'s
            form (``scheme://host[:port]``, or :data:`SELF_ORIGIN`); empty: any.
    """

    key_digests: frozenset[str] = field(default_factory=frozenset, repr=False)
    allowed_origins: frozenset[str] = frozenset()
    open_paths: frozenset[str] = OPEN_PATHS

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
        config: keys and origins.
        on_refused: told the reason of each refusal (``origin_not_allowed``,
            ``missing_api_key``, ``invalid_api_key``), for the metrics.
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
        if self.config.is_protected(scope["path"]):
            refusal = self._refusal(scope, key)
            if refusal is not None:
                self.on_refused(refusal[1])
                await _deny(scope, receive, send, *refusal)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, key: str | None) -> tuple[int, str, str] | None:
        """``(status, code, message)`` of a request to refuse, or None."""
        origin = _headers(scope).get("origin")
        if self.config.allowed_origins and origin is not None and not self._origin_allowed(scope, origin):
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
        """Whether a browser page of ``origin`` may call: listed, or ``self`` and the request's own."""
        try:
            origin = normalize_origin(origin)
        except ValueError:  # "null" (a sandboxed frame, a file:// page) or garbage
            return False
        allowed = self.config.allowed_origins
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
