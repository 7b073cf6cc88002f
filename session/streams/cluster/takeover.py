"""Continuing a stream whose node died, from its logged prefix.

What a node needs to continue another node's generation lives in Redis
beside the stream: the *generation record* ``<prefix>{<stream_id>}:gen``
(written when the stream is created: the prompt token ids and the sampling
parameters, seed included) and the log itself (the token ids already
generated and the text they released). The continuation is a new engine
request whose prompt is ``prompt + logged ids`` and whose ``max_tokens`` is
what is left; its outputs are shifted to the stream's next offset
(:class:`Continuation`). With greedy decoding the joined stream equals an
uninterrupted run; with a seed, the continuation draws from the same seed
(reproducible, though not the draws the dead node would have made).

Text continuity: the log's text ends at a token offset, but the dead node's
detokenizer may have held text back (a character whose bytes were still
incomplete, or text that could begin a stop string). :class:`Continuation`
re-derives everything from token ids: a fresh
:class:`~bargein.engine.detokenizer.IncrementalDetokenizer` on the prompt is fed the
logged ids, and the continuation emits whatever its text holds beyond the
text already in the log. A stop string that straddles the takeover point is
caught there too (the engine's own detokenizer sees only the new text), and
ends the stream with ``stop``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from bargein.engine.detokenizer import IncrementalDetokenizer
from bargein.engine.grammar_spec import GrammarKind, GrammarSpec
from bargein.engine.request import FinishReason, RequestOutput, SamplingParams
from bargein.session.streams.log import LogEntry, StreamEnd, TokenLog


def gen_key(prefix: str, stream_id: str) -> str:
    """The generation record of a stream (same hash slot as its log)."""
    return f"{prefix}{{{stream_id}}}:gen"


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRecord:
    """What a stream was generated from: enough to continue it anywhere."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams

    def encode(self) -> bytes:
        """msgpack: ``p`` prompt ids as little-endian uint32, ``s`` the params
        (a grammar as ``[kind, source]``, absent without one, so records of
        nodes that predate grammars still decode)."""
        ids = struct.pack(f"<{len(self.prompt_token_ids)}I", *self.prompt_token_ids)
        params = {f.name: getattr(self.params, f.name) for f in dataclasses.fields(SamplingParams)}
        params["stop"] = list(params["stop"])
        params["stop_token_ids"] = list(params["stop_token_ids"])
        grammar = params.pop("grammar")
        if grammar is not None:
            params["grammar"] = [grammar.kind.value, grammar.source]
        return msgpack.packb({"p": ids, "s": params})

    @classmethod
    def decode(cls, data: bytes) -> GenerationRecord:
        """Raises ValueError for a record that does not parse."""
        try:
            body = msgpack.unpackb(data)
            raw = body["p"]
            ids = struct.unpack(f"<{len(raw) // 4}I", raw)
            fields = dict(body["s"])
            fields["stop"] = tuple(fields["stop"])
            fields["stop_token_ids"] = tuple(fields["stop_token_ids"])
            if "grammar" in fields:
                kind, source = fields["grammar"]
                fields["grammar"] = GrammarSpec(kind=GrammarKind(kind), source=source)
            return cls(prompt_token_ids=ids, params=SamplingParams(**fields))
        except (KeyError, TypeError, struct.error, msgpack.UnpackException) as exc:
            raise ValueError(f"bad generation record: {exc}") from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggedPrefix:
    """What the log holds of an unfinished stream: ids and text up to ``end``."""

    token_ids: tuple[int, ...]
    text: str

    @property
    def end(self) -> int:
        return len(self.token_ids)


async def read_prefix(log: TokenLog, stream_id: str, end: int) -> LoggedPrefix | StreamEnd:
    """Read tokens ``[0, end)`` of a stream from the log (no following past ``end``).

    Returns the stream's :class:`StreamEnd` instead if it ended meanwhile.
    Raises StreamNotFound, TokenLogUnavailable.
    """
    ids: list[int] = []
    texts: list[str] = []
    if end == 0:
        return LoggedPrefix(token_ids=(), text="")
    async with contextlib.aclosing(log.read(stream_id, 0)) as items:
        async for item in items:
            if isinstance(item, StreamEnd):
                return item
            assert isinstance(item, LogEntry)
            ids.extend(item.token_ids)
            texts.append(item.text)
            if item.end >= end:
                break
    return LoggedPrefix(token_ids=tuple(ids), text="".join(texts))


class Continuation:
    """Maps a continuation request's outputs onto the stream it continues.

    Offsets move by the logged prefix's length, usage counts the original
    prompt, and text comes from a detokenizer that saw the whole output.

    Args:
        tokenizer: the model's tokenizer.
        record: the stream's generation record.
        prefix: what the log holds (its ids are the continuation's extra prompt).
        abort: ``abort(stream_id, reason)`` on the engine loop, to stop the
            request when a stop string straddling the takeover point matched.
    """

    def __init__(
        self,
        tokenizer: Any,
        record: GenerationRecord,
        prefix: LoggedPrefix,
        abort: Callable[[str, FinishReason], None],
    ) -> None:
        self.offset = prefix.end
        self.num_prompt_tokens = len(record.prompt_token_ids)
        self._detok = IncrementalDetokenizer(
            tokenizer, record.prompt_token_ids, record.params.stop, min_tokens=record.params.min_tokens
        )
        self._detok.add(prefix.token_ids)
        self._sent = len(prefix.text)  # characters of the stream's text already logged
        self._abort = abort

    @property
    def stopped(self) -> bool:
        """A stop string already ended the logged text (the stream must end now)."""
        return self._detok.stopped

    def translate(self, out: RequestOutput) -> RequestOutput:
        """The output as the stream sees it (offsets, usage, text, finish)."""
        if out.new_token_ids:
            self._detok.add(out.new_token_ids)
        finished, reason = out.finished, out.finish_reason
        if self._detok.stopped and not finished:
            finished, reason = True, FinishReason.STOP
            self._abort(out.request_id, FinishReason.STOP)
        if finished:
            self._detok.flush()
        return replace(
            out,
            text=self._delta(),
            num_prompt_tokens=self.num_prompt_tokens,
            num_output_tokens=out.num_output_tokens + self.offset,
            finished=finished,
            finish_reason=reason,
        )

    def _delta(self) -> str:
        full = self._detok.text
        delta = full[self._sent :]
        self._sent = max(self._sent, len(full))
        return delta


def continuation_params(params: SamplingParams, logged: int) -> SamplingParams:
    """The params of a continuation after ``logged`` tokens (``logged < max_tokens``):
    the budgets less what the log already holds."""
    return replace(
        params, max_tokens=params.max_tokens - logged, min_tokens=max(0, params.min_tokens - logged)
    )
