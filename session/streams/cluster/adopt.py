"""Taking over a stream whose node died: its lease, then its end or its continuation here.

A node that watches a stream (a client here resumes it, or a cancel found no
owner) and sees its lease gone runs :meth:`Adopter.take_over`: it takes the
lease (of several racing nodes exactly one gets it, session/streams/cluster/lease.py),
adopts the stream in its log at the logged end, and then either ends it there
(a forwarded cancel's flag, no generation record, nothing left to generate, or
entries lost) or continues it with a new engine request on this node
(session/streams/cluster/takeover.py says how the continuation joins the stream).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from redis.exceptions import RedisError

from bargein.engine.errors import EngineError
from bargein.engine.request import EngineRequest, FinishReason
from bargein.session.errors import StreamTruncated
from bargein.session.streams.cluster.lease import Leases
from bargein.session.streams.cluster.takeover import (
    Continuation,
    GenerationRecord,
    LoggedPrefix,
    continuation_params,
    gen_key,
    read_prefix,
)
from bargein.session.streams.log import TRUNCATED_CODE, EndError, StreamEnd, StreamInfo, StreamWrite
from bargein.session.streams.log.redis_client import AnyRedis
from bargein.session.streams.log.redis_format import Keys
from bargein.session.streams.log.redis_streams import RedisTokenLog
from bargein.session.streams.log.redis_tail import LOGGED
from bargein.session.streams.peers import LocalNode

log = logging.getLogger(__name__)

_REDIS_ERRORS = (RedisError, OSError)

# done: complete or unknown; owned: another node holds the lease; ended: ended
# here without generating; continued: generated here from now on.
Outcome = Literal["done", "owned", "ended", "continued"]


class Adopter:
    """Takes over the streams of dead nodes (see the module doc).

    Args:
        redis: the cluster's Redis client.
        leases: this node's leases.
        token_log: the node's token log on that Redis.
        flag_key: a stream's cancel flag key (session/streams/cluster/forward.py).
        node_id: this node (recorded as the stream's new owner).
        key_prefix: the token log's key prefix.
    """

    def __init__(
        self,
        redis: AnyRedis,
        leases: Leases,
        token_log: RedisTokenLog,
        flag_key: Callable[[str], str],
        node_id: str,
        key_prefix: str,
    ) -> None:
        self._redis = redis
        self._leases = leases
        self._token_log = token_log
        self._flag_key = flag_key
        self._node_id = node_id
        self._prefix = key_prefix
        self._keys = Keys(key_prefix)
        self.num_takeovers = 0  # streams this node continued after their node died

    async def take_over(self, stream_id: str, node: LocalNode) -> Outcome:
        """Continue ``stream_id`` on ``node`` if it is unfinished and nobody holds its lease.

        Returns ``"done"`` (complete or unknown), ``"owned"`` (another node
        holds the lease), ``"ended"`` (ended here without generating:
        cancelled, length, or nothing to continue from) or ``"continued"``.
        Raises TokenLogError and Redis errors (the lease, if taken, is released).
        """
        info = await self._token_log.info(stream_id)
        if info is None or info.status == "complete":
            return "done"
        if not await self._leases.acquire(stream_id):
            return "owned"
        try:
            return await self._continue(stream_id, node)
        except BaseException:
            await self._release_now(stream_id)
            raise

    async def _continue(self, stream_id: str, node: LocalNode) -> Outcome:
        """With the lease held: end or continue the stream from its logged prefix."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(gen_key(self._prefix, stream_id))
            pipe.get(self._flag_key(stream_id))
            raw_record, flag = await pipe.execute()
        info = await self._token_log.info(stream_id)  # the final end: the old owner is gone
        if info is None or info.status == "complete":
            await self._release_now(stream_id)
            return "done"
        await self._redis.hset(self._keys.meta(stream_id), "owner_node", self._node_id)
        try:
            prefix = await self._logged_prefix(stream_id, info)
        except StreamTruncated as exc:
            # Without its whole prefix the stream cannot be continued: end it so, or its
            # readers (past the loss) would wait for tokens nobody writes.
            log.warning("cannot continue %s: %s; ending it as truncated", stream_id, exc)
            self._token_log.adopt_stream(info)
            await self._finish(
                stream_id, info, raw_record, LoggedPrefix(token_ids=(), text=""), FinishReason.ERROR, exc
            )
            return "ended"
        if isinstance(prefix, StreamEnd):
            await self._release_now(stream_id)
            return "done"
        self._token_log.adopt_stream(info)
        reason = _end_reason(raw_record, flag, prefix, node.max_model_len)
        if reason is not None:
            await self._finish(stream_id, info, raw_record, prefix, reason)
            return "ended"
        record = GenerationRecord.decode(raw_record)
        continuation = Continuation(node.runner.tokenizer, record, prefix, node.runner.abort)
        request = EngineRequest(
            request_id=stream_id,
            prompt_token_ids=record.prompt_token_ids + prefix.token_ids,
            params=continuation_params(record.params, prefix.end),
            arrival_time=node.clock(),
            cache_salt=node.cache_salt(info.principal),
            num_replayed_tokens=prefix.end,  # a grammar consumes the logged tokens first
        )
        try:
            node.continue_stream(request, response_id=info.response_id, continuation=continuation)
        except EngineError as exc:
            log.error("continuing %s failed: %r", stream_id, exc)
            await self._finish(stream_id, info, raw_record, prefix, FinishReason.ERROR)
            return "ended"
        self.num_takeovers += 1
        log.info("took over %s at offset %d", stream_id, prefix.end)
        return "continued"

    async def _logged_prefix(self, stream_id: str, info: StreamInfo) -> LoggedPrefix | StreamEnd:
        """What the log holds of a live stream, ``[0, info.end)``, or its end.

        Raises StreamTruncated when entries are missing, also when the log
        lost all of them (an end of 0 then only means nothing is left, which
        the metadata's ``logged`` mark tells); StreamNotFound, TokenLogUnavailable.
        """
        if info.end == 0 and await self._redis.hexists(self._keys.meta(stream_id), LOGGED):
            raise StreamTruncated(stream_id, 0)
        return await read_prefix(self._token_log, stream_id, info.end)

    async def _finish(
        self,
        stream_id: str,
        info: StreamInfo,
        raw_record: bytes | None,
        prefix: LoggedPrefix,
        reason: FinishReason,
        lost: StreamTruncated | None = None,
    ) -> None:
        """End an adopted stream at its logged end, then release its lease.

        ``lost``: the log lost entries, so the end is ``info.end`` and carries
        the error that makes every reader raise StreamTruncated.
        """
        num_prompt = 0 if raw_record is None else len(GenerationRecord.decode(raw_record).prompt_token_ids)
        end_at = prefix.end if lost is None else info.end
        end = StreamEnd(
            end=end_at,
            finish_reason=reason.value,
            prompt_tokens=num_prompt,
            completion_tokens=end_at,
            cached_tokens=0,
            error=None
            if lost is None
            else EndError(code=TRUNCATED_CODE, message=str(lost), retry_after_ms=0),
        )
        await self._token_log.write_step([StreamWrite(stream_id=stream_id, entry=None, finish=end)])
        await self._release_now(stream_id)

    async def _release_now(self, stream_id: str) -> None:
        try:
            await self._leases.release([stream_id])
        except _REDIS_ERRORS as exc:
            log.warning("releasing the lease of %s failed: %r", stream_id, exc)


def _end_reason(
    raw_record: bytes | None, flag: bytes | None, prefix: LoggedPrefix, max_model_len: int
) -> FinishReason | None:
    """Why the stream ends here without generating, or None to continue it."""
    if flag is not None:
        return FinishReason(flag.decode())
    if raw_record is None:
        return FinishReason.ERROR  # created by a node outside the cluster, or expired
    record = GenerationRecord.decode(raw_record)
    room = max_model_len - len(record.prompt_token_ids)
    if prefix.end >= min(record.params.max_tokens, room):
        return FinishReason.LENGTH
    return None
