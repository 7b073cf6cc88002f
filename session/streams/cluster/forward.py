"""Interrupts that find their owner: a cancel forwarded to the node generating the stream.

A ``response.cancel`` (or the HTTP cancel) can reach any node; only the node
holding the stream's lease (session/streams/cluster/lease.py) runs its engine request. The
node that got the cancel

1. sets the stream's cancel flag ``<prefix>{<stream_id>}:cancel`` (value: the
   finish reason), and
2. publishes the stream id on the owner's channel ``<prefix>node:{<owner>}:abort``,

in one pipeline. On a Redis Cluster the channel is a *sharded* one
(``SPUBLISH``/``SSUBSCRIBE``): a message goes to the shard serving the
channel's slot only, instead of every node of the cluster over its bus.
The owner's subscriber aborts the request at once (the
engine frees its blocks at its next step) and the stream ends in the log with
``interrupted``; the asking node's client reads that end like any other. The
flag covers what pub/sub cannot: a message lost while the owner's
subscription reconnects is found at the owner's next lease renewal, and a
node taking a dead owner's stream over ends it as interrupted instead of
continuing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import cast

from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from bargein.engine.request import FinishReason
from bargein.session.cancel import cancel_and_wait
from bargein.session.streams.log.redis_client import AnyRedis
from bargein.session.supervise import TaskHealth, supervised

log = logging.getLogger(__name__)

OnAbort = Callable[[str, FinishReason], None]
LISTENER = "abort-listener"  # the listener's task name (the log, /readyz)
FLAG_TTL_MS = 600_000  # longer than any stream lives unfinished without its lease


def cancel_key(prefix: str, stream_id: str) -> str:
    """A stream's cancel flag (same hash slot as its log)."""
    return f"{prefix}{{{stream_id}}}:cancel"


def abort_channel(prefix: str, node_id: str) -> str:
    """The pub/sub channel a node listens on for forwarded aborts."""
    return f"{prefix}node:{{{node_id}}}:abort"


class Forwarder:
    """Sends cancels to the node that owns a stream, and receives this node's.

    Args:
        redis: a redis-py asyncio client (of one server or of a Cluster).
        node_id: this node (its channel is the one listened on).
        on_abort: called on the event loop with (stream_id, reason) for each
            abort forwarded to this node; must not block.
        key_prefix: the token log's key prefix.
        health: marked while the listener crash-loops (it runs supervised:
            a bug that crashes it is logged and it resubscribes).
    """

    def __init__(
        self,
        redis: AnyRedis,
        node_id: str,
        on_abort: OnAbort,
        *,
        key_prefix: str = "bargein:",
        health: TaskHealth | None = None,
    ) -> None:
        self.redis = redis
        self.health = health or TaskHealth()
        self.node_id = node_id
        self._on_abort = on_abort
        self._prefix = key_prefix
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()  # set once the first SUBSCRIBE was answered

    def flag_key(self, stream_id: str) -> str:
        return cancel_key(self._prefix, stream_id)

    async def start(self) -> None:
        """Start listening on this node's channel (returns at once)."""
        self._task = supervised(self._listen, name=LISTENER, health=self.health)

    async def stop(self) -> None:
        """Stop listening (bounded: returns within 5 s)."""
        if self._task is not None:
            # Bounded: a pubsub read can miss its cancellation on 3.11 (gh-86296).
            await cancel_and_wait([self._task], timeout_s=5.0)
            self._task = None

    async def forward(self, stream_id: str, reason: FinishReason, owner: str | None) -> int:
        """Flag the stream as cancelled and tell ``owner`` (if any).

        Returns how many subscribers got the message (0: the owner is gone or
        unknown; the flag still stops any node that takes the stream over).
        Raises redis errors.
        """
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self.flag_key(stream_id), reason.value, px=FLAG_TTL_MS)
            if owner is not None:
                channel, message = abort_channel(self._prefix, owner), _message(stream_id, reason)
                if isinstance(self.redis, RedisCluster):
                    pipe.execute_command("SPUBLISH", channel, message)
                else:
                    pipe.publish(channel, message)
            results = await pipe.execute()
        return int(results[1]) if owner is not None else 0

    async def cancel_reason(self, stream_id: str) -> FinishReason | None:
        """The reason a cancel flagged on the stream, or None."""
        value = cast(bytes | None, await self.redis.get(self.flag_key(stream_id)))  # no decode_responses
        return None if value is None else FinishReason(value.decode())

    async def _listen(self) -> None:
        """Subscribe and hand each message over; resubscribe after a failure."""
        channel = abort_channel(self._prefix, self.node_id)
        while True:
            if isinstance(self.redis, RedisCluster):
                await self._listen_sharded(channel)
                continue
            try:
                async with self.redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(channel)
                    self.subscribed.set()
                    self.health.working(LISTENER)
                    async for message in pubsub.listen():
                        self._handle(message.get("data"))
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("abort channel: %r; resubscribing", exc)
                await asyncio.sleep(0.5)

    async def _listen_sharded(self, channel: str) -> None:
        """``SSUBSCRIBE`` on the shard serving the channel until a failure (a
        failover moves the channel's slot to the promoted replica)."""
        assert isinstance(self.redis, RedisCluster)
        pubsub = None
        try:
            await self.redis.initialize()
            pubsub = self.redis.pubsub()
            await pubsub.ssubscribe(channel)
            self.subscribed.set()
            self.health.working(LISTENER)
            while True:
                message = await pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "smessage":
                    self._handle(message.get("data"))
        except (RedisError, OSError) as exc:
            log.warning("abort channel (sharded): %r; resubscribing", exc)
            with contextlib.suppress(RedisError, OSError):
                await self.redis.nodes_manager.initialize()  # the channel's shard may have moved
            await asyncio.sleep(0.5)
        finally:
            if pubsub is not None:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()

    def _handle(self, data: object) -> None:
        try:
            body = json.loads(data)  # type: ignore[arg-type]
            stream_id, reason = str(body["s"]), FinishReason(body["r"])
        except (TypeError, ValueError, KeyError) as exc:
            log.warning("abort channel: bad message %r (%s)", data, exc)
            return
        try:
            self._on_abort(stream_id, reason)
        except Exception:
            # the subscription stays: leaving the channel to resubscribe would lose
            # the aborts sent meanwhile (a PUBLISH can still count the closing
            # subscriber, so its sender would think them delivered)
            log.exception("abort of stream %s failed (a bug in bargein); still listening", stream_id)


def _message(stream_id: str, reason: FinishReason) -> str:
    return json.dumps({"s": stream_id, "r": reason.value})
