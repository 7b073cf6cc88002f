"""Redis clients that outlive the connections Redis drops.

Redis closes client connections on ``CLIENT KILL``, a restart on the same
address, a failover, or an idle ``timeout``. A pooled connection does not know
until its next command fails, so without a retry every connection still in
the pool costs one failed call after such an event.

Two policies, by what a client sends:

- :func:`retrying_client` (leases, forwarded cancels, takeover records:
  session/cluster/): redis-py's own machinery retries a command once, after
  a short exponential backoff, on a fresh connection when it failed with a
  connection error or timeout; a connection idle longer than
  ``HEALTH_CHECK_INTERVAL_S`` is PINGed before it is used, so a dead one is
  replaced before a command goes out on it. Only for clients whose commands
  are safe to send twice: reads, ``SET`` of the same value, ``PEXPIRE``,
  ``DEL``, ``PUBLISH`` of an idempotent message, and scripts that check before
  they write. One exception is accepted there: a ``SET NX`` whose first
  attempt landed but whose reply was lost answers "not set" on the retry; the
  lease it takes is then refused (a retryable error, never two owners).
- The token log (session/log/redis_streams.py) keeps redis-py at zero retries and
  retries in its own bounded loop, which knows what each command is: every
  write of a step is idempotent by its explicit entry ids, and a retried
  ``create_stream`` checks whether its own first attempt landed.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

RETRIES = 1  # once: a dropped connection is replaced at the first retry
BACKOFF_BASE_S = 0.025  # first retry after 2 * base
BACKOFF_CAP_S = 0.5
HEALTH_CHECK_INTERVAL_S = 10  # PING a connection idle this long before using it


def retrying_client(url: str) -> Redis:
    """A pooled asyncio client that retries each command once on a fresh connection.

    Args:
        url: ``redis://``, ``rediss://`` or ``unix://`` URL. Nothing connects
            here: the first command does.

    Its commands still raise redis errors (ConnectionError, TimeoutError,
    ResponseError) when the retry fails too, or at once for an error reply.
    """
    retry = Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES)
    return Redis.from_url(
        url,
        retry=retry,
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )
