"""Which token log a server runs on, from its URL.

It lives beside both backends so that neither imports the other: the
contract (:mod:`bargein.session.streams.log.contract`) knows no backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bargein.session.streams.log.contract import DEFAULT_RETENTION_S, TokenLog
from bargein.session.streams.log.durability import parse_durability
from bargein.session.streams.log.memory import MemoryTokenLog
from bargein.session.streams.log.redis_url import is_redis_url, redact_url


def open_token_log(
    url: str | None,
    *,
    retention_s: float = DEFAULT_RETENTION_S,
    node_id: str = "node-0",
    clock: Callable[[], float] = time.monotonic,
    durability: str = "none",
) -> TokenLog:
    """The token log a server runs on.

    Args:
        url: ``None`` or ``"memory://"`` for :class:`MemoryTokenLog`;
            ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` or
            ``redis+sentinel://`` (session/streams/log/redis_url.py) for
            :class:`bargein.session.streams.log.redis_streams.RedisTokenLog` (no connection is made
            here: the first call connects, and ``ping`` reports health).
        retention_s: seconds an ended stream and a saved session are kept.
        node_id: this server's name, recorded as owner of the streams it writes.
        clock: monotonic seconds for the memory backend (Redis keeps its own time).
        durability: when Redis writes wait for a replica (session/streams/log/durability.py).

    Raises ValueError for another URL scheme or a bad durability (the URL
    shown without its password).
    """
    if url is None or url == "memory://":
        return MemoryTokenLog(retention_s=retention_s, clock=clock)
    if is_redis_url(url):
        from bargein.session.streams.log.redis_streams import (  # redis only when used
            RedisLogConfig,
            RedisTokenLog,
        )

        config = RedisLogConfig(retention_s=retention_s, durability=parse_durability(durability))
        return RedisTokenLog(url, node_id=node_id, config=config)
    raise ValueError(
        f"token log url {redact_url(url)!r} must be memory://, redis://, rediss://, unix://, "
        "redis+cluster:// or redis+sentinel://"
    )
