"""Which token log a server runs on, from its URL.

It lives beside both backends so that neither imports the other: the
contract (:mod:`bargein.session.log.contract`) knows no backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bargein.session.log.contract import DEFAULT_RETENTION_S, TokenLog
from bargein.session.log.memory import MemoryTokenLog


def open_token_log(
    url: str | None,
    *,
    retention_s: float = DEFAULT_RETENTION_S,
    node_id: str = "node-0",
    clock: Callable[[], float] = time.monotonic,
) -> TokenLog:
    """The token log a server runs on.

    Args:
        url: ``None`` or ``"memory://"`` for :class:`MemoryTokenLog`;
            ``redis://``, ``rediss://`` or ``unix://`` for
            :class:`bargein.session.log.redis_streams.RedisTokenLog` (no connection is made
            here: the first call connects, and ``ping`` reports health).
        retention_s: seconds an ended stream and a saved session are kept.
        node_id: this server's name, recorded as owner of the streams it writes.
        clock: monotonic seconds for the memory backend (Redis keeps its own time).

    Raises ValueError for another URL scheme.
    """
    if url is None or url == "memory://":
        return MemoryTokenLog(retention_s=retention_s, clock=clock)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from bargein.session.log.redis_streams import RedisLogConfig, RedisTokenLog  # redis only when used

        return RedisTokenLog(url, node_id=node_id, config=RedisLogConfig(retention_s=retention_s))
    raise ValueError(f"token log url {url!r} must be memory://, redis://, rediss:// or unix://")
