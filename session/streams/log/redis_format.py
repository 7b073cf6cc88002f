"""How the Redis token log lays out its keys and entries, and the commands of one step.

Layout, per stream (the ``{stream_id}`` hash tag keeps one response's keys in
one Redis Cluster hash slot):

- ``<prefix>{<stream_id>}:log``: a Redis stream. Entry ``[start, end)`` has the
  explicit id ``<end>-0`` and one field ``d``: little-endian uint32 start,
  uint32 count, the token ids as uint32, then the text in UTF-8 (one field,
  because per-argument packing and parsing dominate the cost of a step and of
  a replay). The finish has id ``<end>-1`` and fields ``f`` (finish reason),
  ``p``/``c``/``k`` (prompt, completion, cached tokens), and for a finish
  with an error to relay, ``e``/``m``/``r`` (its code, message and
  retry_after_ms). So "entries with
  end > offset" is ``XRANGE (<offset>-0 +``, a reader's position is its last
  id, and a retried ``XADD`` of an entry that already landed fails ("equal or
  smaller id") instead of duplicating it.
- ``<prefix>{<stream_id>}:meta``: a hash of response_id, principal,
  session_id, owner_node, status, ``logged`` (set with the first entry: from
  then on a missing log key means lost entries, not a stream without tokens
  yet), and at the finish end, finish_reason, usage and the error's
  error_code, error_message and retry_after_ms.
- Both keys expire ``live_ttl_s`` after creation (a dead writer never leaves
  keys forever; the first entry restarts both clocks) and ``retention_s``
  after the finish. The length of a stream
  is bounded by admission (max_tokens), never trimmed.
- ``<prefix>session:{<session_id>}``: a session's opaque state (``SET PX``).
- ``<prefix>node:{<node_id>}:wake``: a node's tailer wake-up stream (one Redis).
- ``<prefix>shard:{bell-<k>}:ring``: a Redis Cluster shard's doorbell, rung
  after each write there with the ids of the streams written
  (session/streams/log/redis_shards.py).
- ``<prefix>token-secret``: the resume and session token key the nodes share
  when none is configured (created once with ``SET NX``, no expiry).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from bargein.session.streams.log.contract import EndError, LogEntry, StreamEnd, StreamInfo, StreamWrite
from bargein.session.streams.log.fence import Fence
from bargein.session.streams.log.redis_tail import LOGGED, StreamId, parse_id

_HEAD = struct.Struct("<II")  # start, number of token ids of a packed entry

# Creates the metadata hash only if absent: KEYS[1] meta, ARGV[1] ttl ms, ARGV[2:] field/value pairs.
CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""


# One stream's writes of one step, fenced (session/streams/cluster/lease.py): nothing is written unless the
# stream's epoch is still the writer's and no other node holds its lease, all in one atomic
# step. KEYS[1] lease, KEYS[2] epoch, KEYS[3] log, KEYS[4] meta. ARGV[1] node id, ARGV[2]
# the writer's epoch, ARGV[3] the stream's end before the step, ARGV[4] live ttl ms,
# ARGV[5] retention ms, ARGV[6] the number n of entries, then n pairs (entry id, packed
# entry); then, for a finish: its id, the number m of its field arguments, those m, and
# the metadata's field/value pairs up to the end. Returns WRITTEN, LOST (the stream's keys
# vanished: nothing written), FENCED (another node took the stream: nothing written) or
# GAP (the log ends below the writer's end: a failover lost entries; nothing written, and
# the writer's lease is deleted).
FENCED_STEP_LUA = """
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
local owner = redis.call('GET', KEYS[1])
if owner and owner ~= ARGV[1] then return -1 end
local made = ARGV[3] ~= '0'
if not made and redis.call('EXISTS', KEYS[4]) == 0 then return 0 end
if made then
  -- The log must end where the writer left it (or past it: a retry of this step whose
  -- first attempt landed). Below it, a failover promoted a replica that missed entries:
  -- writing on would leave a hole. The lease goes, so a reader's node continues the
  -- stream at once from what the log still holds.
  local newest = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
  if newest[1] and tonumber(string.match(newest[1][1], '^(%d+)')) < tonumber(ARGV[3]) then
    if owner == ARGV[1] then redis.call('DEL', KEYS[1]) end
    return -2
  end
end
local function xadd(id, ...)
  local reply
  if made then
    reply = redis.pcall('XADD', KEYS[3], 'NOMKSTREAM', id, ...)
  else
    reply = redis.pcall('XADD', KEYS[3], id, ...)
  end
  if type(reply) == 'table' and reply.err then
    -- a retried step whose first attempt landed: the explicit id makes it a no-op
    if string.find(reply.err, 'equal or smaller', 1, true) then return true end
    return reply
  end
  return reply ~= false
end
local i = 7
for _ = 1, tonumber(ARGV[6]) do
  local ok = xadd(ARGV[i], 'd', ARGV[i + 1])
  if ok == false then return 0 elseif ok ~= true then return ok end
  if not made then
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
    -- the mark that tells a reader a missing log was lost (see step_commands)
    redis.call('HSET', KEYS[4], 'LOGGED_FIELD', 1)
    redis.call('PEXPIRE', KEYS[4], ARGV[4])
    made = true
  end
  i = i + 2
end
if i <= #ARGV then
  local m = tonumber(ARGV[i + 1])
  local ok = xadd(ARGV[i], unpack(ARGV, i + 2, i + 1 + m))
  if ok == false then return 0 elseif ok ~= true then return ok end
  redis.call('HSET', KEYS[4], unpack(ARGV, i + 2 + m))
  redis.call('PEXPIRE', KEYS[3], ARGV[5])
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
return 1
"""
FENCED_STEP_LUA = FENCED_STEP_LUA.replace("LOGGED_FIELD", LOGGED)
FENCED_STEP_SHA = hashlib.sha1(FENCED_STEP_LUA.encode()).hexdigest()
WRITTEN, LOST, FENCED, GAP = 1, 0, -1, -2  # replies of FENCED_STEP_LUA


class Keys:
    """Key names under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def log(self, stream_id: str) -> str:
        return f"{self.prefix}{{{stream_id}}}:log"

    def meta(self, stream_id: str) -> str:
        return f"{self.prefix}{{{stream_id}}}:meta"

    def session(self, session_id: str) -> str:
        return f"{self.prefix}session:{{{session_id}}}"

    def wake(self, node_id: str) -> str:
        return f"{self.prefix}node:{{{node_id}}}:wake"

    def token_secret(self) -> str:
        return f"{self.prefix}token-secret"


def encode_entry(entry: LogEntry) -> bytes:
    """The ``d`` field of an entry. Raises ValueError for ids outside uint32."""
    count = len(entry.token_ids)
    try:
        head = struct.pack(f"<II{count}I", entry.start, count, *entry.token_ids)
    except struct.error as exc:
        raise ValueError(f"token ids must be uint32: {exc}") from exc
    return head + entry.text.encode("utf-8")


def resp(*args: bytes | str | int) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def decode(entry_id: StreamId, fields: Mapping[bytes, bytes]) -> LogEntry | StreamEnd:
    """A log entry as read back (the reader's ReadCursor checks it leaves no gap)."""
    end, seq = entry_id
    if seq == 1:
        error = None
        if b"e" in fields:
            error = EndError(
                code=fields[b"e"].decode(), message=fields[b"m"].decode(), retry_after_ms=int(fields[b"r"])
            )
        return StreamEnd(
            end=end,
            finish_reason=fields[b"f"].decode(),
            prompt_tokens=int(fields[b"p"]),
            completion_tokens=int(fields[b"c"]),
            cached_tokens=int(fields[b"k"]),
            error=error,
        )
    data = fields[b"d"]
    start, count = _HEAD.unpack_from(data)
    ids = struct.unpack_from(f"<{count}I", data, _HEAD.size)
    text = data[_HEAD.size + 4 * count :].decode("utf-8")
    return LogEntry(start=start, end=end, text=text, token_ids=ids)


def already_added(result: object) -> bool:
    """An XADD retried after its first attempt landed (explicit ids make it idempotent)."""
    return isinstance(result, ResponseError) and "equal or smaller" in str(result)


def step_commands(
    writes: Sequence[StreamWrite], ends: Mapping[str, int], keys: Keys, *, retention_ms: int, live_ttl_ms: int
) -> tuple[list[bytes], list[str | None]]:
    """The commands (RESP) of one step, and per command the stream whose loss its reply reveals.

    ``ends`` holds each written stream's end before the step. A stream's
    loss shows as ``EXISTS`` 0 on its metadata at its first write, or as nil
    from ``XADD NOMKSTREAM`` on its log after that.
    """
    commands: list[bytes] = []
    owners: list[str | None] = []
    step_ends: dict[str, int] = {}
    for write in writes:
        sid = write.stream_id
        log_key, meta_key = keys.log(sid), keys.meta(sid)
        end = step_ends.get(sid, ends[sid])
        if end == 0 and sid not in step_ends:  # first write: the metadata must still be there
            commands.append(resp("EXISTS", meta_key))
            owners.append(sid)
        if write.entry is not None:
            commands.append(
                resp(*_xadd(log_key, end), f"{write.entry.end}-0", "d", encode_entry(write.entry))
            )
            owners.append(sid)
            if end == 0:
                # After the log exists: a reader seeing the mark without the log knows it was
                # lost (before the first token there is no log, and nothing to miss).
                commands += [
                    resp("PEXPIRE", log_key, live_ttl_ms),
                    resp("HSET", meta_key, LOGGED, 1),
                    resp("PEXPIRE", meta_key, live_ttl_ms),
                ]
                owners += [None, None, None]
            end = write.entry.end
        if (finish := write.finish) is not None:
            entry_fields, meta_fields = finish_fields(finish)
            commands += [
                resp(*_xadd(log_key, end), f"{end}-1", *entry_fields),
                resp("HSET", meta_key, *meta_fields),
                resp("PEXPIRE", log_key, retention_ms),
                resp("PEXPIRE", meta_key, retention_ms),
            ]
            owners += [sid, None, None, None]  # HSET's count is 0 on a retry: not a check
        step_ends[sid] = end
    return commands, owners


def finish_fields(finish: StreamEnd) -> tuple[tuple[str | int, ...], tuple[str | int, ...]]:
    """The field/value arguments of a finish: its log entry's, then the metadata's."""
    entry: tuple[str | int, ...] = (
        "f",
        finish.finish_reason,
        "p",
        finish.prompt_tokens,
        "c",
        finish.completion_tokens,
        "k",
        finish.cached_tokens,
    )
    meta: tuple[str | int, ...] = (
        "status",
        "complete",
        "end",
        finish.end,
        "finish_reason",
        finish.finish_reason,
        "prompt_tokens",
        finish.prompt_tokens,
        "completion_tokens",
        finish.completion_tokens,
        "cached_tokens",
        finish.cached_tokens,
    )
    if (error := finish.error) is not None:
        entry += ("e", error.code, "m", error.message, "r", error.retry_after_ms)
        meta += (
            "error_code",
            error.code,
            "error_message",
            error.message,
            "retry_after_ms",
            error.retry_after_ms,
        )
    return entry, meta


def fenced_step_calls(
    writes: Sequence[StreamWrite],
    ends: Mapping[str, int],
    keys: Keys,
    fence_of: Callable[[str], Fence | None],
    *,
    retention_ms: int,
    live_ttl_ms: int,
) -> tuple[list[tuple[str, list[bytes | str | int]]], list[str]]:
    """One ``FENCED_STEP_LUA`` call per stream of a step, in first-write order.

    Returns the calls as ``(stream id, keys + args)`` and the streams that
    have no fence (this node does not hold their lease: nothing may be
    written). ``ends`` holds each stream's end before the step; the writes
    were validated (a finish comes last in its stream).
    """
    by_stream: dict[str, list[StreamWrite]] = {}
    for write in writes:
        by_stream.setdefault(write.stream_id, []).append(write)
    calls: list[tuple[str, list[bytes | str | int]]] = []
    unfenced: list[str] = []
    for sid, stream_writes in by_stream.items():
        fence = fence_of(sid)
        if fence is None:
            unfenced.append(sid)
            continue
        args: list[bytes | str | int] = [
            fence.lease_key,
            fence.epoch_key,
            keys.log(sid),
            keys.meta(sid),
            fence.node_id,
            fence.epoch,
            ends[sid],
            live_ttl_ms,
            retention_ms,
        ]
        entries = [w.entry for w in stream_writes if w.entry is not None]
        args.append(len(entries))
        for entry in entries:
            args += [f"{entry.end}-0", encode_entry(entry)]
        finish = stream_writes[-1].finish
        if finish is not None:
            entry_fields, meta_fields = finish_fields(finish)
            args += [f"{finish.end}-1", len(entry_fields), *entry_fields, *meta_fields]
        calls.append((sid, args))
    return calls, unfenced


def ring_command(bell_key: str, stream_ids: Sequence[str], maxlen: int) -> bytes:
    """The doorbell ring of a shard after a step wrote ``stream_ids`` there
    (session/streams/log/redis_shards.py): one entry, field ``s``, the ids space-separated."""
    return resp("XADD", bell_key, "MAXLEN", "~", maxlen, "*", "s", " ".join(stream_ids))


def _xadd(log_key: str, end: int) -> tuple[str, ...]:
    # Past the first token the log must exist: NOMKSTREAM turns a lost stream into nil.
    return ("XADD", log_key, "NOMKSTREAM") if end > 0 else ("XADD", log_key)


def info_from_meta(stream_id: str, meta: Mapping[bytes, bytes], newest: Sequence[Any]) -> StreamInfo | None:
    """StreamInfo from the metadata hash and the log's newest raw entry (for a live end)."""
    if b"principal" not in meta:
        return None
    text = {k.decode(): v.decode() for k, v in meta.items()}
    finish = None
    if text.get("status") == "complete":
        end = int(text["end"])
        error = None
        if "error_code" in text:
            error = EndError(
                code=text["error_code"],
                message=text["error_message"],
                retry_after_ms=int(text["retry_after_ms"]),
            )
        finish = StreamEnd(
            end=end,
            finish_reason=text["finish_reason"],
            prompt_tokens=int(text["prompt_tokens"]),
            completion_tokens=int(text["completion_tokens"]),
            cached_tokens=int(text["cached_tokens"]),
            error=error,
        )
    else:
        end = parse_id(newest[0][0])[0] if newest else 0
    return StreamInfo(
        stream_id=stream_id,
        response_id=text["response_id"],
        principal=text["principal"],
        session_id=text["session_id"],
        owner_node=text["owner_node"],
        status="complete" if finish else "live",
        end=end,
        finish=finish,
        tool_mode=text.get("tool_mode"),  # absent: no tools, or a node from before them
    )
