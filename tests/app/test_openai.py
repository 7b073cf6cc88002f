"""The OpenAI-compatible API end to end: the official ``openai`` client and plain
httpx SSE readers against the real server (bundled model, loopback)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.app.conftest import LiveServer
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

KEY = "sk-test-alice"
AUTH = {"Authorization": f"Bearer {KEY}"}
SKY = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


@pytest.fixture
async def client(live_server: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=live_server.http_url + "/v1", api_key=KEY, max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def http(live_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server.http_url, headers=AUTH, timeout=60) as http:
        yield http


@dataclass(frozen=True, slots=True)
class Event:
    """One SSE event as a client sees it."""

    id: str | None
    data: str

    @property
    def content(self) -> str:
        """The text of a content chunk ("" for any other event)."""
        if self.data == "[DONE]":
            return ""
        choices = json.loads(self.data).get("choices") or [{}]
        return str(choices[0].get("delta", {}).get("content") or "")


async def sse(response: httpx.Response) -> AsyncIterator[Event]:
    """Parse a text/event-stream body (id and data fields, blank-line separated)."""
    assert response.headers["content-type"].startswith("text/event-stream")
    event_id, data = None, []
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield Event(event_id, "\n".join(data))
            event_id, data = None, []
        elif line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


def stream_body(messages: list[dict[str, str]], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "bargein",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }


async def read_until(events_in: AsyncIterator[Event], num_contents: int) -> list[Event]:
    """Events of a stream up to its ``num_contents``-th content chunk (the
    iterator stays open: reading may go on)."""
    events: list[Event] = []
    async for event in events_in:
        events.append(event)
        if sum(1 for e in events if e.content) == num_contents:
            return events
    raise AssertionError(f"the stream ended early: {events}")


def stream_id_of(events: list[Event]) -> str:
    assert events[0].id is not None
    return events[0].id.rpartition(":")[0]


def finish_of(events: list[Event]) -> str:
    reasons = [
        c["finish_reason"]
        for e in events
        if e.data != "[DONE]"
        for c in json.loads(e.data)["choices"]
        if c["finish_reason"]
    ]
    assert len(reasons) == 1, events
    return str(reasons[0])


def finished(stats: Any) -> int:
    return sum(stats.num_finished_by_reason.values())


# ---- the openai SDK ----------------------------------------------------------


async def test_models_lists_the_served_model(client: openai.AsyncOpenAI, live_server: LiveServer) -> None:
    models = [m async for m in client.models.list()]
    assert [m.id for m in models] == [live_server.state.runner.model_name]
    assert models[0].object == "model"


async def test_streamed_greedy_answer_equals_the_non_streamed_one(
    client: openai.AsyncOpenAI, live_server: LiveServer
) -> None:
    prompt_ids = live_server.tokenizer.apply_chat_template(SKY, add_generation_prompt=True, tokenize=True)[
        "input_ids"
    ]
    before = await live_server.wait_idle()
    whole = await client.chat.completions.create(
        model="bargein",
        messages=SKY,  # type: ignore[arg-type]
        max_tokens=24,
        temperature=0,
    )
    after = await live_server.wait_idle()
    choice = whole.choices[0]
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(prompt_ids)  # the tokenizer's count
    assert whole.usage.completion_tokens == 24
    assert after.num_generated_tokens - before.num_generated_tokens == 24
    assert whole.usage.total_tokens == len(prompt_ids) + 24
    text = choice.message.content or ""
    assert len(live_server.tokenizer.encode(text, add_special_tokens=False)) == 24

    chunks = [
        c
        async for c in await client.chat.completions.create(  # type: ignore[call-overload]
            model="bargein",
            messages=SKY,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    ]
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["length"]
    # Exactly one usage chunk, the last one, with no choices; null usage before it.
    assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert same_usage(chunks[-1].usage, whole.usage)


async def test_without_include_usage_no_chunk_carries_usage(client: openai.AsyncOpenAI) -> None:
    chunks = [
        c
        async for c in await client.chat.completions.create(  # type: ignore[call-overload]
            model="bargein", messages=SKY, max_tokens=6, temperature=0, stream=True
        )
    ]
    assert all(c.usage is None and c.choices for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_stop_seed_user_and_unknown_fields(client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    full = await client.chat.completions.create(
        model="bargein",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=16,
        temperature=0,
    )
    text = full.choices[0].message.content or ""
    assert "4" in text, text
    cut = await client.chat.completions.create(  # type: ignore[call-overload]
        model="bargein",
        messages=messages,
        max_tokens=16,
        temperature=0,
        stop=["4"],
        user="u-7",
        n=1,
        extra_body={"frobnicate": True, "top_k": "ignored"},
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == text[: text.index("4")]
    sampled = [
        await client.chat.completions.create(  # type: ignore[call-overload]
            model="bargein", messages=messages, max_tokens=8, temperature=1.0, top_p=0.9, seed=1234
        )
        for _ in range(2)
    ]
    assert sampled[0].choices[0].message.content == sampled[1].choices[0].message.content


YES_NO = [{"role": "user", "content": "Reply with one word: yes or no?"}]  # "Yes." then EOS


async def test_ignore_eos_and_min_tokens_fix_the_output_length(client: openai.AsyncOpenAI) -> None:
    async def chat(stream: bool, **extra: Any) -> tuple[str, int, str | None]:
        """(text, completion_tokens, finish_reason) of one greedy answer of at most 24 tokens."""
        kwargs: dict[str, Any] = {"model": "bargein", "messages": YES_NO, "max_tokens": 24, "temperature": 0}
        if not stream:
            done = await client.chat.completions.create(**kwargs, extra_body=extra)
            assert done.usage is not None
            return (
                done.choices[0].message.content or "",
                done.usage.completion_tokens,
                done.choices[0].finish_reason,
            )
        chunks = [
            c
            async for c in await client.chat.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True}, extra_body=extra
            )
        ]
        usage = chunks[-1].usage
        assert usage is not None
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return (
            text,
            usage.completion_tokens,
            next(c.choices[0].finish_reason for c in chunks[::-1] if c.choices),
        )

    async def complete(stream: bool, **extra: Any) -> tuple[int, str | None]:
        """(completion_tokens, finish_reason) of a legacy completion of at most 24 tokens."""
        kwargs: dict[str, Any] = {
            "model": "bargein",
            "prompt": "Yes or no?",
            "max_tokens": 24,
            "temperature": 0,
        }
        if not stream:
            done = await client.completions.create(**kwargs, extra_body=extra)
            assert done.usage is not None
            return done.usage.completion_tokens, done.choices[0].finish_reason
        chunks = [
            c
            async for c in await client.completions.create(
                **kwargs, stream=True, stream_options={"include_usage": True}, extra_body=extra
            )
        ]
        assert chunks[-1].usage is not None
        return chunks[-1].usage.completion_tokens, next(
            c.choices[0].finish_reason for c in chunks[::-1] if c.choices
        )

    for stream in (False, True):
        text, used, reason = await chat(stream)
        assert (text, used, reason) == ("Yes.", 3, "stop"), stream  # EOS counts as a token
        text, used, reason = await chat(stream, min_tokens=8)
        assert text.startswith("Yes.") and used >= 8, (stream, text, used)
        text, used, reason = await chat(stream, ignore_eos=True)
        assert text.startswith("Yes.") and (used, reason) == (24, "length"), (stream, text)
        _, used, reason = await chat(stream, ignore_eos=True, min_tokens=8)
        assert (used, reason) == (24, "length"), stream
        assert await complete(stream, ignore_eos=True) == (24, "length"), stream
        used, _ = await complete(stream, min_tokens=20)
        assert used >= 20, stream


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"extra_body": {"min_tokens": 5}}, "min_tokens"),  # above max_tokens (4)
        ({"extra_body": {"min_tokens": -1}}, "min_tokens"),
        ({"extra_body": {"ignore_eos": "yes"}}, "ignore_eos"),
        ({"n": 2}, "n"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 65}, "max_tokens"),  # the server's limit is 64
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"seed": -1}, "seed"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "word " * 600}]}, "messages"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_bad_parameters_are_400s_naming_the_parameter(
    client: openai.AsyncOpenAI, live_server: LiveServer, fields: dict[str, Any], param: str
) -> None:
    start = await live_server.wait_idle()
    request = {"model": "bargein", "messages": SKY, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(**request)
    assert caught.value.status_code == 400
    assert caught.value.param == param
    assert caught.value.type == "invalid_request_error"
    if param == "messages":
        assert caught.value.code == "context_length_exceeded"
    # Nothing was scheduled.
    assert finished(await live_server.wait_idle()) == finished(start)


async def test_malformed_json_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/chat/completions", content=b"{nope", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


# ---- resumable SSE -------------------------------------------------------------


async def test_a_dropped_stream_resumes_from_last_event_id(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, live_server: LiveServer
) -> None:
    reference = await client.chat.completions.create(
        model="bargein",
        messages=SKY,  # type: ignore[arg-type]
        max_tokens=32,
        temperature=0,
    )
    before = await live_server.wait_idle()
    async with http.stream("POST", "/v1/chat/completions", json=stream_body(SKY, 32)) as response:
        assert response.status_code == 200
        stream_id = response.headers["x-bargein-stream-id"]
        first = await read_until(sse(response), 3)
    # Leaving the block dropped the connection mid-answer.
    assert stream_id_of(first) == stream_id and first[0].id == f"{stream_id}:0"
    last_id = first[-1].id
    assert last_id is not None
    resumed = await resume(http, stream_id, last_id)
    events = first + resumed
    assert "".join(e.content for e in events) == reference.choices[0].message.content
    ids = [e.id for e in events if e.id is not None]
    assert len(ids) == len(set(ids)), "an event was delivered twice"
    ends = [int(i.rpartition(":")[2]) for i in ids]
    assert ends == sorted(ends)
    assert finish_of(resumed) == "length" and resumed[-1].data == "[DONE]"
    # The closing events add no token: they carry no new id.
    assert [e.id for e in resumed[-2:]] == [None, None]
    # The answer was generated once: no token again for the resume.
    after = await live_server.wait_idle()
    assert after.num_generated_tokens - before.num_generated_tokens == 32

    # The same id again gives the same answer (now from the log only): the same
    # text, the same last id and the same closing events. The chunks may group
    # tokens differently: a replay hands over what queued as bigger batches.
    assert replayed(await resume(http, stream_id, last_id)) == replayed(resumed)
    # ?from= works as Last-Event-ID does; from 0 replays everything with the role chunk.
    assert replayed(await resume(http, stream_id, query=f"from={last_id.rpartition(':')[2]}")) == replayed(
        resumed
    )
    everything = await resume(http, stream_id, query="from=0")
    assert everything[0] == first[0]
    assert "".join(e.content for e in everything) == reference.choices[0].message.content


def replayed(events: list[Event]) -> tuple[str, str | None, list[Event]]:
    """What a resume from one position must give every time: its text, the id
    of its last content chunk and its closing events (finish, [DONE])."""
    ids = [e.id for e in events if e.id is not None]
    return "".join(e.content for e in events), ids[-1] if ids else None, events[-2:]


async def resume(
    http: httpx.AsyncClient,
    stream_id: str,
    last_id: str | None = None,
    query: str = "",
    headers: dict[str, str] | None = None,
) -> list[Event]:
    """Every event of ``GET /v1/streams/{stream_id}/events`` from a position."""
    sent = dict(headers or {})
    if last_id is not None:
        sent["Last-Event-ID"] = last_id
    url = f"/v1/streams/{stream_id}/events" + (f"?{query}" if query else "")
    async with http.stream("GET", url, headers=sent) as response:
        assert response.status_code == 200, await response.aread()
        return [e async for e in sse(response)]


async def test_resume_errors_are_clear(http: httpx.AsyncClient, live_server: LiveServer) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=stream_body(SKY, 4)) as response:
        events = [e async for e in sse(response)]
    stream_id = stream_id_of(events)
    url = f"/v1/streams/{stream_id}/events"
    cases = [
        ({"Last-Event-ID": f"{stream_id}:99"}, 400, "offset_out_of_range"),
        ({"Last-Event-ID": "garbage"}, 400, "invalid_value"),
        ({"Last-Event-ID": "otherstream:1"}, 400, "invalid_value"),
        ({"Authorization": "Bearer sk-mallory"}, 404, "stream_not_found"),
        ({"Authorization": ""}, 404, "stream_not_found"),
    ]
    for headers, status, code in cases:
        response = await http.get(url, headers=headers)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code)
    response = await http.get("/v1/streams/nosuchstream/events")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_a_stream_past_its_retention_is_404_not_a_gap(
    http: httpx.AsyncClient, live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=stream_body(SKY, 8)) as response:
        events = [e async for e in sse(response)]
    stream_id = stream_id_of(events)
    assert len(await resume(http, stream_id, events[1].id)) > 0
    log = live_server.state.log
    real_clock = log._clock
    monkeypatch.setattr(log, "_clock", lambda: real_clock() + log._retention_s + 1)
    response = await http.get(f"/v1/streams/{stream_id}/events", headers={"Last-Event-ID": events[1].id})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "stream_not_found" and "expired" in error["message"]


# ---- cancel and disconnect -----------------------------------------------------------


async def test_cancel_mid_stream_interrupts_and_frees_the_blocks(
    http: httpx.AsyncClient, live_server: LiveServer
) -> None:
    start = await live_server.wait_idle()
    async with http.stream("POST", "/v1/chat/completions", json=stream_body(STORY, 64)) as response:
        reading = sse(response)
        events = await read_until(reading, 3)
        stream_id = stream_id_of(events)
        cancelled = await http.post(f"/v1/streams/{stream_id}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["finish_reason"] == "interrupted"
        events += [e async for e in reading]
    assert finish_of(events) == "interrupted" and events[-1].data == "[DONE]"
    assert cancelled.json()["end"] < 64
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks
    assert (
        stats.num_finished_by_reason.get("interrupted", 0)
        == start.num_finished_by_reason.get("interrupted", 0) + 1
    )
    # Cancelling again is harmless and tells how it ended; others cannot cancel it.
    again = await http.post(f"/v1/streams/{stream_id}/cancel")
    assert again.json()["finish_reason"] == "interrupted"
    other = await http.post(f"/v1/streams/{stream_id}/cancel", headers={"Authorization": "Bearer sk-mallory"})
    assert other.status_code == 404


async def test_disconnect_with_cancel_policy_aborts_the_generation(
    http: httpx.AsyncClient, live_server: LiveServer
) -> None:
    start = await live_server.wait_idle()
    async with http.stream(
        "POST", "/v1/chat/completions", json=stream_body(STORY, 64, bargein_on_disconnect="cancel")
    ) as response:
        events = await read_until(sse(response), 2)
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == start.num_free_blocks
    assert (
        stats.num_finished_by_reason.get("cancelled", 0)
        == start.num_finished_by_reason.get("cancelled", 0) + 1
    )
    rest = await resume(http, stream_id_of(events), events[-1].id)
    assert finish_of(rest) == "cancelled"


async def test_disconnect_by_default_lets_the_answer_finish(
    http: httpx.AsyncClient, live_server: LiveServer
) -> None:
    async with http.stream("POST", "/v1/chat/completions", json=stream_body(STORY, 24)) as response:
        events = await read_until(sse(response), 2)
    await live_server.wait_idle()
    rest = await resume(http, stream_id_of(events), events[-1].id)
    assert finish_of(rest) == "length"


async def test_a_non_streamed_request_whose_client_leaves_is_cancelled_by_policy(
    http: httpx.AsyncClient, live_server: LiveServer
) -> None:
    start = await live_server.wait_idle()
    body = {
        "model": "bargein",
        "messages": STORY,
        "max_tokens": 64,
        "temperature": 0,
        "bargein_on_disconnect": "cancel",
    }
    waiting = asyncio.create_task(http.post("/v1/chat/completions", json=body))

    def mid_answer() -> bool:
        assert not waiting.done(), waiting
        return live_server.stats().num_generated_tokens - start.num_generated_tokens >= 3

    await wait_until(mid_answer, "three tokens of the answer")
    waiting.cancel()  # the client gives up: its connection closes mid-answer
    with pytest.raises(asyncio.CancelledError):
        await waiting
    stats = await live_server.wait_idle()
    assert (
        stats.num_finished_by_reason.get("cancelled", 0)
        == start.num_finished_by_reason.get("cancelled", 0) + 1
    )
    assert stats.num_free_blocks == start.num_free_blocks
    assert stats.num_generated_tokens - start.num_generated_tokens < 64


def same_usage(again: Any, first: Any) -> bool:
    """The same counts, the second request reusing at least as much KV: it
    repeats the first's prompt, so its prefix is cached (whole blocks)."""
    cached = again.prompt_tokens_details.cached_tokens
    return (
        (again.prompt_tokens, again.completion_tokens, again.total_tokens)
        == (first.prompt_tokens, first.completion_tokens, first.total_tokens)
        and cached >= first.prompt_tokens_details.cached_tokens
        and cached < again.prompt_tokens
    )
