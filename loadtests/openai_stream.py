"""One streamed OpenAI chat completion, timed at the client, for any server.

The same client for every peer of ``peer_bench.py`` (bargein, llama.cpp's
``llama-server``, the transformers shim): ``POST /v1/chat/completions`` with
``stream: true`` and ``stream_options.include_usage``, read as server-sent
events with httpx. Times are ``time.perf_counter()`` seconds.

Tokens per chunk: bargein's events carry ``id: <stream_id>:<end>`` (the
output offset after the chunk), so a chunk that carries several tokens (a
client that fell behind, or tokens that completed no text until a later one)
counts them all; a server without ids counts one token per chunk with text
(``llama-server`` and the shim send one per token). ``completion_tokens``
comes from the usage chunk when the server sends one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(slots=True, kw_only=True)
class StreamTiming:
    """What one streamed request saw.

    Attributes:
        sent_at: the request was sent.
        chunk_times: arrival of each chunk with text.
        chunk_tokens: tokens each of those chunks carried (1 without ids).
        done_at: the stream ended (``[DONE]`` or the connection closed).
        completion_tokens: ``usage.completion_tokens`` (else the sum of
            ``chunk_tokens``); ``prompt_tokens`` likewise, 0 without usage.
        finish_reason: the last ``finish_reason`` seen.
        error: why it failed (HTTP status, an exception name), else None.
    """

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    done_at: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        """Seconds from sending to the first chunk with text."""
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies, seconds: each later chunk's gap to the one
        before, divided by the tokens it carries, once per token (as
        ``loadgen.py`` does)."""
        out: list[float] = []
        for i in range(1, len(self.chunk_times)):
            n = max(1, self.chunk_tokens[i])
            out += [(self.chunk_times[i] - self.chunk_times[i - 1]) / n] * n
        return out


def chat_body(prompt: str, max_tokens: int, *, ignore_eos: bool) -> dict[str, Any]:
    """A greedy streamed chat request; ``ignore_eos`` (vLLM's and llama.cpp's
    extra parameter) fixes the output length at ``max_tokens``."""
    return {
        "model": "peer",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }


async def stream_chat(http: httpx.AsyncClient, body: dict[str, Any]) -> StreamTiming:
    """Send ``body`` to ``/v1/chat/completions`` and time its stream; never raises
    for a server's failure (``error`` is set instead)."""
    timing = StreamTiming(sent_at=time.perf_counter())
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                timing.error = f"http_{response.status_code}: {(await response.aread())[:200]!r}"
                return timing
            await _read_events(response, timing)
    except httpx.HTTPError as exc:
        timing.error = type(exc).__name__
    timing.done_at = time.perf_counter()
    if not timing.completion_tokens:
        timing.completion_tokens = sum(timing.chunk_tokens)
    return timing


async def _read_events(response: httpx.Response, timing: StreamTiming) -> None:
    """Parse ``id:``/``data:`` events (blank-line separated) into ``timing``."""
    event_id: str | None = None
    data: list[str] = []
    last_end = 0
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            payload = "\n".join(data)
            now = time.perf_counter()
            if payload == "[DONE]":
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                timing.error = str(chunk["error"])[:200]
                return
            end = _end_of(event_id)
            text = "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices") or ())
            if text:
                timing.chunk_times.append(now)
                timing.chunk_tokens.append(1 if end is None else end - last_end)
            if end is not None:
                last_end = end
            for choice in chunk.get("choices") or ():
                timing.finish_reason = choice.get("finish_reason") or timing.finish_reason
            usage = chunk.get("usage")
            if usage:
                timing.completion_tokens = int(usage.get("completion_tokens") or 0)
                timing.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            event_id, data = None, []


def _end_of(event_id: str | None) -> int | None:
    """The output offset of a bargein event id ``<stream_id>:<end>``, else None."""
    if not event_id:
        return None
    _, _, end = event_id.rpartition(":")
    return int(end) if end.isdecimal() else None
