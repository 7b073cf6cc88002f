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
- ``<prefix>node:{<node_id>}:wake``: a node's tailer wake-up stream.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from session.redis_tail import LOGGED, StreamId, parse_id
from session.token_log import EndError, LogEntry, StreamEnd, StreamInfo, StreamWrite

_HEAD = struct.Struct("<II")  # start, number of token ids of a packed entry

# Creates the metadata hash only if absent: KEYS[1] meta, ARGV[1] ttl ms, ARGV[2:] field/value pairs.
CREATE_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""


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
            error = EndError(code=fields[b"e"].decode(), message=fields[b"m"].decode(),
                             retry_after_ms=int(fields[b"r"]))
        return StreamEnd(end=end, finish_reason=fields[b"f"].decode(), prompt_tokens=int(fields[b"p"]),
                         completion_tokens=int(fields[b"c"]), cached_tokens=int(fields[b"k"]), error=error)
    data = fields[b"d"]
    start, count = _HEAD.unpack_from(data)
    ids = struct.unpack_from(f"<{count}I", data, _HEAD.size)
    text = data[_HEAD.size + 4 * count:].decode("utf-8")
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
            commands.append(resp(*_xadd(log_key, end), f"{write.entry.end}-0", "d", encode_entry(write.entry)))
            owners.append(sid)
            if end == 0:
                # After the log exists: a reader seeing the mark without the log knows it was
                # lost (before the first token there is no log, and nothing to miss).
                commands += [resp("PEXPIRE", log_key, live_ttl_ms),
                             resp("HSET", meta_key, LOGGED, 1), resp("PEXPIRE", meta_key, live_ttl_ms)]
                owners += [None, None, None]
            end = write.entry.end
        if (finish := write.finish) is not None:
            entry_error: tuple[str | int, ...] = ()
            meta_error: tuple[str | int, ...] = ()
            if (error := finish.error) is not None:
                entry_error = ("e", error.code, "m", error.message, "r", error.retry_after_ms)
                meta_error = ("error_code", error.code, "error_message", error.message,
                              "retry_after_ms", error.retry_after_ms)
            commands += [
                resp(*_xadd(log_key, end), f"{end}-1", "f", finish.finish_reason, "p", finish.prompt_tokens,
                     "c", finish.completion_tokens, "k", finish.cached_tokens, *entry_error),
                resp("HSET", meta_key, "status", "complete", "end", end,
                     "finish_reason", finish.finish_reason, "prompt_tokens", finish.prompt_tokens,
                     "completion_tokens", finish.completion_tokens, "cached_tokens", finish.cached_tokens,
                     *meta_error),
                resp("PEXPIRE", log_key, retention_ms), resp("PEXPIRE", meta_key, retention_ms)]
            owners += [sid, None, None, None]  # HSET's count is 0 on a retry: not a check
        step_ends[sid] = end
    return commands, owners


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
            error = EndError(code=text["error_code"], message=text["error_message"],
                             retry_after_ms=int(text["retry_after_ms"]))
        finish = StreamEnd(end=end, finish_reason=text["finish_reason"],
                           prompt_tokens=int(text["prompt_tokens"]),
                           completion_tokens=int(text["completion_tokens"]),
                           cached_tokens=int(text["cached_tokens"]), error=error)
    else:
        end = parse_id(newest[0][0])[0] if newest else 0
    return StreamInfo(stream_id=stream_id, response_id=text["response_id"], principal=text["principal"],
                      session_id=text["session_id"], owner_node=text["owner_node"],
                      status="complete" if finish else "live", end=end, finish=finish)
