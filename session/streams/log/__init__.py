"""The token log: the seam between generation and delivery.

The contract every backend keeps is :mod:`bargein.session.streams.log.contract`;
the backends are :mod:`~bargein.session.streams.log.memory` (in-process) and
:mod:`~bargein.session.streams.log.redis_streams` (Redis Streams, with its key and
entry layout in :mod:`~bargein.session.streams.log.redis_format`, its multiplexed
tail reads in :mod:`~bargein.session.streams.log.redis_tail`, and on a Redis Cluster
:mod:`~bargein.session.streams.log.redis_shards` and
:mod:`~bargein.session.streams.log.redis_cluster_tail`; the deployments a URL names
are in :mod:`~bargein.session.streams.log.redis_url`);
:func:`open_token_log` picks one from a URL.
"""

from bargein.session.streams.log.contract import (
    DEFAULT_LIVE_TTL_S,
    DEFAULT_RETENTION_S,
    TRUNCATED_CODE,
    EndError,
    LogEntry,
    ReadCursor,
    StreamCursor,
    StreamEnd,
    StreamInfo,
    StreamWrite,
    TokenLog,
    check_writes,
)
from bargein.session.streams.log.factory import open_token_log
from bargein.session.streams.log.memory import MemoryTokenLog

__all__ = [
    "DEFAULT_LIVE_TTL_S",
    "DEFAULT_RETENTION_S",
    "EndError",
    "LogEntry",
    "MemoryTokenLog",
    "ReadCursor",
    "StreamCursor",
    "StreamEnd",
    "StreamInfo",
    "StreamWrite",
    "TRUNCATED_CODE",
    "TokenLog",
    "check_writes",
    "open_token_log",
]
