"""Redis clients that outlive the connections Redis drops.

Redis closes client connections on ``CLIENT KILL``, a restart on the same
address, a failover, or an idle ``timeout``. A pooled connection does not know
until its next command fails, so without a retry every connection still in
the pool costs one failed call after such an event.

Two policies, by what a client sends:

- :func:`retrying_client` (leases, forwarded cancels, takeover records:
  session/streams/cluster/): redis-py's own machinery retries a command once, after
  a short exponential backoff, on a fresh connection when it failed with a
  connection error or timeout; a connection idle longer than
  ``HEALTH_CHECK_INTERVAL_S`` is PINGed before it is used, so a dead one is
  replaced before a command goes out on it. Only for clients whose commands
  are safe to send twice: reads, ``SET`` of the same value, ``PEXPIRE``,
  ``DEL``, ``PUBLISH`` of an idempotent message, and scripts that check before
  they write. One exception is accepted there: a ``SET NX`` whose first
  attempt landed but whose reply was lost answers "not set" on the retry; the
  lease it takes is then refused (a retryable error, never two owners).
- The token log (session/streams/log/redis_streams.py) keeps redis-py at zero retries and
  retries in its own bounded loop, which knows what each command is: every
  write of a step is idempotent by its explicit entry ids, and a retried
  ``create_stream`` checks whether its own first attempt landed.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bargein.session.streams.log.redis_url import RedisTarget, parse_redis_url

RETRIES = 1  # once: a dropped connection is replaced at the first retry
BACKOFF_BASE_S = 0.025  # first retry after 2 * base
BACKOFF_CAP_S = 0.5
HEALTH_CHECK_INTERVAL_S = 10  # PING a connection idle this long before using it


AnyRedis = Redis | RedisCluster  # the client of one server (or Sentinel's primary), or of a Cluster


def open_client(url: str | RedisTarget, **kwargs: Any) -> AnyRedis:
    """A pooled asyncio client of the deployment ``url`` names (session/streams/log/redis_url.py).

    ``kwargs`` are redis-py connection options (``retry``, ``socket_timeout``,
    ...). One server: ``Redis.from_url``; a Cluster: ``RedisCluster`` on the
    seed addresses (it follows ``MOVED`` redirections and refreshes its slot
    map itself); Sentinel: the ``Redis`` client of ``Sentinel.master_for``,
    whose pool asks the Sentinels for the primary at every new connection, so
    after a failover the next connection goes to the promoted replica.
    Nothing connects here. Raises ValueError for a URL of another scheme.
    """
    target = parse_redis_url(url) if isinstance(url, str) else url
    if target.kind == "single":
        return Redis.from_url(target.url, **kwargs)
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.tls:
        auth["ssl"] = True
    if target.kind == "cluster":
        kwargs.pop("single_connection_client", None)  # a cluster client pools per node
        nodes = [ClusterNode(host, port) for host, port in target.addresses]
        return RedisCluster(startup_nodes=nodes, **auth, **kwargs)
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_") and v is not None}
    sentinel = Sentinel(list(target.addresses), sentinel_kwargs=sentinel_kwargs)
    assert target.master is not None  # parse_redis_url requires it
    single = kwargs.pop("single_connection_client", False)
    pooled: Redis = sentinel.master_for(target.master, db=target.db, **auth, **kwargs)
    client = _SentinelRedis(connection_pool=pooled.connection_pool, single_connection_client=single)
    client.auto_close_connection_pool = True
    client.sentinel_manager = sentinel
    return client


class _SentinelRedis(Redis):
    """The client of Sentinel's primary; closing it closes its Sentinel connections too."""

    sentinel_manager: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel_manager is not None:
            for client in self.sentinel_manager.sentinels:
                await client.aclose()


def retrying_client(url: str) -> AnyRedis:
    """A pooled asyncio client that retries each command once on a fresh connection.

    Args:
        url: any URL :func:`open_client` takes. Nothing connects here: the
            first command does.

    Its commands still raise redis errors (ConnectionError, TimeoutError,
    ResponseError) when the retry fails too, or at once for an error reply.
    """
    retry = Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES)
    return open_client(
        url,
        retry=retry,
        retry_on_error=[RedisConnectionError, RedisTimeoutError],
        health_check_interval=HEALTH_CHECK_INTERVAL_S,
    )
