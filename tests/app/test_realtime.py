"""End to end over real sockets: the bundled model behind uvicorn, a websockets client."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import LiveServer

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0}
# The default format (int4) and exact fp32 both answer this with "The capital of
# France is Paris."; asked "What is ...?" int4 answers in French: its first
# token is a near-tie ("L" 0.146, "The" 0.093).
FRANCE = "Name the capital of France."


async def test_health_ready_and_static_page(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_server.http_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        page = await http.get("/")
        assert page.status_code == 200 and "<html" in page.text
        debug = (await http.get("/debug/engine")).json()
        assert debug["stats"]["num_total_blocks"] > 0


async def test_capital_of_france_streams_paris(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        assert client.session["type"] == "session.created"
        assert client.session["limits"]["max_context_tokens"] == 512
        deltas = [d async for d in client.respond(FRANCE, max_tokens=24, **GREEDY)]
        response = client.current
        assert response is not None and response.done is not None
    text = "".join(deltas)
    assert "Paris" in text
    assert len(deltas) > 1, "the answer should stream in several deltas"
    assert response.done["finish_reason"] in ("stop", "length")
    assert response.done["end"] == response.done["usage"]["completion_tokens"]
    # The deltas tile the stream: contiguous offsets from 0 to the end.
    ranges = [(e["start"], e["end"]) for e in response.events if e["type"] == "response.delta"]
    assert ranges[0][0] == 0 and ranges[-1][1] == response.done["end"]
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    # ... and their text is the stream's text, as a replay from offset 0 shows.
    assert await replay_text(live_server, response.stream_id, response.resume_token) == text


async def replay_text(live_server: LiveServer, stream_id: str, resume_token: str) -> str:
    """The whole text of a stream, read again through ``stream.resume`` from 0."""
    async with RealtimeClient(live_server.ws_url) as client:
        await client.send(
            {"type": "stream.resume", "stream_id": stream_id, "resume_token": resume_token, "from": 0}
        )
        parts = []
        while True:
            event = await client._recv()
            if event["type"] == "response.delta":
                parts.append(event["text"])
            elif event["type"] == "response.done":
                return "".join(parts)


async def test_two_turns_keep_context(live_server: LiveServer) -> None:
    async with RealtimeClient(live_server.ws_url) as client:
        await client.update(instructions="You are a helpful assistant. Answer briefly.")
        first = await client.chat("My name is Alice. Please remember it.", max_tokens=24, **GREEDY)
        second = await client.chat("What is my name?", max_tokens=24, **GREEDY)
    assert first
    assert "Alice" in second
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    assert "My name is Alice" in prompt and first in prompt


async def test_cancel_mid_answer_frees_blocks_and_cuts_the_turn(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as client:
        received: list[str] = []
        async for delta in client.respond("Write a long story about a dragon.", max_tokens=64, **GREEDY):
            received.append(delta)
            if len(received) == 4:
                break
        response = client.current
        assert response is not None
        heard = len("".join(received)) - 2
        done = await client.cancel(heard_chars=heard)
        assert done["finish_reason"] == "interrupted"
        assert done["end"] < 64
        # Nothing of that response after its response.done.
        assert response.events[-1]["type"] == "response.done"
        await client.send({"type": "ping"})
        assert (await client._recv())["type"] == "pong"
        stats = await live_server.wait_idle()
        assert stats.num_free_blocks == start.num_free_blocks
        assert stats.num_finished_by_reason.get("interrupted", 0) > start.num_finished_by_reason.get(
            "interrupted", 0
        )
        # The next prompt holds the assistant text cut at heard_chars.
        await client.chat("Go on.", max_tokens=4, **GREEDY)
    cut = "".join(received)[:heard]
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    assert f"<|im_start|>assistant\n{cut}<|im_end|>" in prompt


async def test_dropped_connection_resumes_byte_for_byte(live_server: LiveServer) -> None:
    question = "Explain in a few sentences why the sky is blue."
    async with RealtimeClient(live_server.ws_url) as client:
        reference = await client.chat(question, max_tokens=48, **GREEDY)
    before = await live_server.wait_idle()
    async with RealtimeClient(live_server.ws_url) as client:
        parts: list[str] = []
        async for delta in client.respond(question, max_tokens=48, **GREEDY):
            parts.append(delta)
            if len(parts) == 2:
                client.abort_transport()  # the network drops mid-answer
        assert client.num_resumes == 1
        response = client.current
        assert response is not None and response.done is not None
    assert "".join(parts) == reference
    after = await live_server.wait_idle()
    # One answer's worth of tokens was generated, none twice for the resume.
    assert after.num_generated_tokens - before.num_generated_tokens == response.done["end"]


async def test_thirty_two_concurrent_sessions_all_complete(live_server: LiveServer) -> None:
    countries = ["France", "Germany", "Japan", "Spain"]

    async def ask(country: str) -> tuple[str, str, dict]:
        async with RealtimeClient(live_server.ws_url) as client:
            text = await client.chat(f"Name the capital of {country}.", max_tokens=12, **GREEDY)
            assert client.current is not None and client.current.done is not None
            return country, text, client.current.done

    # What each question gets alone (greedy) is the correct answer under load too:
    # greedy answers do not depend on what else shares the batch.
    alone = {country: text for country, text, _ in [await ask(c) for c in countries]}
    assert "Paris" in alone["France"]
    results = await asyncio.gather(*(ask(c) for c in countries * 8))
    assert len(results) == 32
    for country, text, done in results:
        assert done["finish_reason"] in ("stop", "length")
        assert done["end"] == done["usage"]["completion_tokens"] > 0
        assert text == alone[country], (country, text, alone[country])


async def test_msgpack_subprotocol_carries_the_same_events(live_server: LiveServer) -> None:
    import msgpack
    from websockets.asyncio.client import connect

    async with connect(live_server.ws_url, subprotocols=["bargein.v1.msgpack"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "bargein.v1.msgpack"
        created = msgpack.unpackb(await ws.recv())
        assert created["type"] == "session.created"
        await ws.send(
            msgpack.packb(
                {
                    "type": "response.create",
                    "max_tokens": 12,
                    "temperature": 0.0,
                    "input": [{"role": "user", "content": FRANCE}],
                }
            )
        )
        text = ""
        while True:
            frame = await ws.recv()
            assert isinstance(frame, bytes)
            event = msgpack.unpackb(frame)
            if event["type"] == "response.delta":
                text += event["text"]
            if event["type"] == "response.done":
                break
    assert "Paris" in text
