"""Which Redis deployment a ``--redis-url`` names: one server, a Cluster, or Sentinel.

Pure parsing, no connection (the clients are built in session/streams/log/redis_client.py):

- ``redis://``, ``rediss://``, ``unix://``: one server (or an address that
  follows the primary, such as a managed endpoint), as redis-py parses it.
- ``redis+cluster://[user:password@]host:port[,host:port...]`` (or
  ``rediss+cluster://`` for TLS): a Redis Cluster, reached through any of
  the seed addresses (the client learns the rest from ``CLUSTER SLOTS``).
  Cluster mode has only database 0, so a path other than ``/`` or ``/0``
  is refused.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]``
  (or ``rediss+sentinel://``): the primary that the Sentinels at these
  addresses name for ``master``; the credentials are the data nodes'
  (Sentinels are reached without them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379
SINGLE_SCHEMES = ("redis://", "rediss://", "unix://")

Kind = Literal["single", "cluster", "sentinel"]
REDACTED = "[redacted]"
# The password of ``scheme://user:password@``: everything after the first colon
# of the userinfo, up to the last "@" before the path (a password may hold "@").
_USERINFO_PASSWORD = re.compile(r"(?i)^([a-z][a-z0-9+.-]*://[^:/@?#]*:)[^/?#]*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:password|passwd|pwd)=)[^&#]*")


def redact_url(url: str) -> str:
    """``url`` fit for a message or a log line: the password of its user info
    (``redis://user:[redacted]@host``) and a ``?password=`` parameter (which
    redis-py also reads) replaced by ``[redacted]``; the rest as given, so the
    operator still sees which part is wrong."""
    url = _USERINFO_PASSWORD.sub(lambda m: m.group(1) + REDACTED + "@", url)
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + REDACTED, url)


@dataclass(frozen=True, slots=True, kw_only=True)
class RedisTarget:
    """A parsed Redis URL.

    Attributes:
        kind: ``single``, ``cluster`` or ``sentinel``.
        url: the URL as given (for ``single``, what redis-py parses); it
            may hold a password, so it is not in the repr (:func:`redact_url`).
        addresses: ``(host, port)`` seeds of a cluster, or the Sentinels;
            empty for ``single``.
        master: the Sentinel service name (``sentinel`` only).
        db: database number (always 0 on a cluster).
        username, password: credentials of the data nodes, percent-decoded.
        tls: connect with TLS (the ``rediss`` schemes).
    """

    kind: Kind
    url: str = field(repr=False)
    addresses: tuple[tuple[str, int], ...] = ()
    master: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False


def is_redis_url(url: str) -> bool:
    """Whether ``url`` has one of the schemes :func:`parse_redis_url` takes."""
    return url.startswith(SINGLE_SCHEMES) or url.split("://", 1)[0] in _MULTI_SCHEMES


_MULTI_SCHEMES: dict[str, tuple[Kind, bool]] = {
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}


def parse_redis_url(url: str) -> RedisTarget:
    """The deployment ``url`` names (see the module doc).

    Raises ValueError for another scheme, a missing or malformed address,
    a Sentinel URL without a master name, or a cluster URL with a database;
    its message shows the URL without its password (:func:`redact_url`).
    """
    if url.startswith(SINGLE_SCHEMES):
        return RedisTarget(kind="single", url=url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in _MULTI_SCHEMES:
        raise ValueError(
            f"redis url {redact_url(url)!r} must start with redis://, rediss://, unix://, "
            "redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
        )
    kind, tls = _MULTI_SCHEMES[scheme]
    rest = rest.split("?", 1)[0]
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        creds, _, netloc = netloc.rpartition("@")
        user, has_pw, pw = creds.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if has_pw else None
    default_port = DEFAULT_SENTINEL_PORT if kind == "sentinel" else DEFAULT_PORT
    addresses = tuple(_address(part, default_port, redact_url(url)) for part in netloc.split(","))
    parts = [p for p in path.split("/") if p]
    master = None
    if kind == "sentinel":
        if not parts:
            raise ValueError(
                f"redis url {redact_url(url)!r} needs the Sentinel master name: .../<master>[/<db>]"
            )
        master, parts = unquote(parts[0]), parts[1:]
    if len(parts) > 1 or (parts and not parts[0].isdigit()):
        raise ValueError(f"redis url {redact_url(url)!r}: bad database {'/'.join(parts)!r}")
    db = int(parts[0]) if parts else 0
    if kind == "cluster" and db != 0:
        raise ValueError(f"redis url {redact_url(url)!r}: a Redis Cluster has only database 0")
    return RedisTarget(
        kind=kind,
        url=url,
        addresses=addresses,
        master=master,
        db=db,
        username=username,
        password=password,
        tls=tls,
    )


def _address(part: str, default_port: int, shown_url: str) -> tuple[str, int]:
    """``host:port``, ``[v6addr]:port`` or ``host`` (the default port); a bad
    one's error names ``shown_url`` (the URL, redacted)."""
    if part.startswith("["):
        host, _, tail = part[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else (str(default_port) if not tail else "")
    elif ":" in part:
        host, _, port = part.rpartition(":")
    else:
        host, port = part, str(default_port)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"redis url {shown_url!r}: bad address {part!r} (want host:port)")
    return host, int(port)
