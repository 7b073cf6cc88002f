"""OpenAI's Realtime API on ``/v1/realtime``, driven by the official ``openai``
SDK (``client.realtime.connect``) against the real server: the clients people
already use, unchanged, on bargein's sessions."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import websockets

from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.streams.log import StreamEnd
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer, node_on_engine
from tests.speech import espeak_pcm16
from tests.waiting import HANG_GUARD_S

pytestmark = pytest.mark.slow

KEY = "sk-realtime-test"
TEXT_ONLY = {"type": "realtime", "output_modalities": ["text"]}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


@contextlib.asynccontextmanager
async def realtime(server_url: str, **kwargs: Any) -> AsyncIterator[Any]:
    """An SDK realtime connection, its ``session.created`` read."""
    client = openai.AsyncOpenAI(base_url=server_url + "/v1", api_key=KEY, max_retries=0)
    async with client.realtime.connect(model="bargein", **kwargs) as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        conn.created = created
        yield conn


async def next_of(conn: Any, kind: str, seen: list[Any] | None = None) -> Any:
    """Events up to the first of ``kind`` (collected into ``seen``); that one."""
    async for event in conn:
        if seen is not None:
            seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"closed before {kind}")


async def text_session(conn: Any) -> None:
    await conn.session.update(session=TEXT_ONLY)
    await next_of(conn, "session.updated")


async def answer(conn: Any, prompt: str, max_tokens: int = 24) -> tuple[str, Any, list[Any]]:
    """Add a user item, ask for a greedy response; (joined deltas, response.done, events)."""
    await conn.conversation.item.create(item=user(prompt))
    await next_of(conn, "conversation.item.done")
    await conn.send(
        {"type": "response.create", "response": {"max_output_tokens": max_tokens, "temperature": 0}}
    )
    seen: list[Any] = []
    done = await next_of(conn, "response.done", seen)
    deltas = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    return deltas, done, seen


async def test_a_three_turn_text_conversation(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        assert conn.created.session.model
        assert conn.created.session.bargein["session_id"]  # the resume extension
        await text_session(conn)
        texts = []
        for prompt in ("My name is Ada.", "What is two plus two?", "Say goodbye."):
            deltas, done, seen = await answer(conn, prompt)
            kinds = [e.type for e in seen]
            assert kinds[:4] == [
                "response.created",
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
            ]
            assert kinds[-5:] == [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
            text_done = next(e for e in seen if e.type == "response.output_text.done")
            assert deltas and text_done.text == deltas
            assert done.response.status in ("completed", "incomplete")
            assert done.response.output[0].content[0].text == deltas
            usage = done.response.usage
            assert usage.output_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
            texts.append(deltas)
        # the third prompt held the whole conversation: the engine saw every turn
        prompt_text = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        for earlier in ("My name is Ada.", texts[0], "What is two plus two?", texts[1], "Say goodbye."):
            assert earlier.strip() in prompt_text
        assert done.response.usage.input_token_details.cached_tokens > 0  # the earlier turns' KV was reused


async def test_cancel_mid_answer_frees_the_blocks_and_nothing_follows(live_server: LiveServer) -> None:
    start = await live_server.wait_idle()
    async with realtime(live_server.http_url) as conn:
        await text_session(conn)
        await conn.conversation.item.create(item=user("Write a long story about a dragon."))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        created = await next_of(conn, "response.created")
        await next_of(conn, "response.output_text.delta")
        await conn.response.cancel()  # no response_id: the active one
        seen: list[Any] = []
        done = await next_of(conn, "response.done", seen)
        assert done.response.id == created.response.id
        assert done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        assert done.response.usage.output_tokens < 64
        stats = await live_server.wait_idle()
        assert stats.num_free_blocks == start.num_free_blocks
        # nothing of the cancelled response comes after its response.done
        await conn.session.update(session=TEXT_ONLY)
        after = await next_of(conn, "session.updated", seen := [])
        assert after and not [e for e in seen if e.type.startswith("response.")]
        # a cancel with nothing active is refused in OpenAI's words
        await conn.response.cancel()
        error = await next_of(conn, "error")
        assert error.error.code == "response_cancel_not_active"


async def test_truncate_cuts_the_item_and_the_next_prompt_holds_the_cut(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        await text_session(conn)
        await conn.conversation.item.create(item=user("Write a long story about a dragon."))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        heard = ""
        async for event in conn:
            if event.type == "response.output_text.delta":
                heard += event.delta
                if len(heard) >= 12:
                    break
        item_id = event.item_id
        # the OpenAI barge-in: cancel, then truncate at what was played (a text
        # item has no audio: the cut is what was delivered when the cancel arrived)
        await conn.response.cancel()
        done = await next_of(conn, "response.done")
        delivered = done.response.output[0].content[0].text
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=0)
        truncated = await next_of(conn, "conversation.item.truncated")
        assert truncated.item_id == item_id
        await conn.conversation.item.retrieve(item_id=item_id)
        item = (await next_of(conn, "conversation.item.retrieved")).item
        assert item.content[0].text == delivered and delivered.startswith(heard)
        _, done, _ = await answer(conn, "Go on.", max_tokens=4)
        prompt = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        assert delivered.strip() in prompt and "Go on." in prompt


async def test_items_are_edited_by_id(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        await text_session(conn)
        await conn.conversation.item.create(item={**user("first"), "id": "item_first"})
        added = await next_of(conn, "conversation.item.added")
        assert added.item.id == "item_first" and added.previous_item_id is None
        await conn.conversation.item.create(
            item={**user("zeroth"), "id": "item_zero"}, previous_item_id="root"
        )
        assert (await next_of(conn, "conversation.item.added")).previous_item_id is None
        await conn.conversation.item.create(item=user("second"), previous_item_id="item_first")
        second = await next_of(conn, "conversation.item.added")
        assert second.previous_item_id == "item_first" and second.item.id
        await conn.conversation.item.delete(item_id="item_zero")
        assert (await next_of(conn, "conversation.item.deleted")).item_id == "item_zero"
        await conn.conversation.item.retrieve(item_id="item_zero")
        assert (await next_of(conn, "error")).error.code == "not_found"
        _, done, _ = await answer(conn, "third", max_tokens=2)
        prompt = live_server.tokenizer.decode(list(live_server.recent_requests()[-1].prompt_token_ids))
        assert "zeroth" not in prompt
        assert prompt.index("first") < prompt.index("second") < prompt.index("third")


async def test_bad_events_get_error_events_and_the_session_goes_on(live_server: LiveServer) -> None:
    async with realtime(live_server.http_url) as conn:
        await text_session(conn)
        cases = [
            (
                {
                    "type": "response.create",
                    "event_id": "e1",
                    "response": {"tools": [{"type": "mcp", "server_label": "s"}]},
                },
                "unsupported",
                "response.tools[0].type",
            ),
            (
                {
                    "type": "session.update",
                    "event_id": "e2",
                    "session": {"type": "realtime", "voice_speed": 2},
                },
                "unknown_parameter",
                "session.voice_speed",
            ),
            (
                {
                    "type": "conversation.item.create",
                    "event_id": "e3",
                    "item": {"type": "function_call", "name": "f"},
                },
                "missing_required_parameter",
                "item.arguments",
            ),
            (
                {
                    "type": "conversation.item.create",
                    "event_id": "e4",
                    "item": {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "x"}],
                    },
                },
                "unknown_parameter",
                None,
            ),
            ({"type": "output_audio_buffer.clear", "event_id": "e5"}, "unknown_event", "type"),
            (
                {"type": "response.create", "event_id": "e6", "response": {"max_output_tokens": 0}},
                "invalid_value",
                "response.max_output_tokens",
            ),
        ]
        for event, code, param in cases:
            await conn.send(event)
            error = await next_of(conn, "error")
            assert error.error.event_id == event["event_id"], error
            assert error.error.code in (code, "unsupported"), error
            if param is not None:
                assert error.error.param == param
            assert error.error.type == "invalid_request_error"
        # an empty conversation: the session's own refusal, in OpenAI's error shape
        await conn.send({"type": "response.create", "event_id": "e7"})
        error = await next_of(conn, "error")
        assert (error.error.code, error.error.event_id) == ("invalid_parameter", "e7")
        deltas, done, _ = await answer(conn, "Still there?", max_tokens=4)
        assert deltas and done.response.status in ("completed", "incomplete")


async def test_not_json_is_an_error_event(live_server: LiveServer) -> None:
    url = live_server.ws_url + "?model=bargein"
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send("{not json")
        error = json.loads(await ws.recv())
        assert error["type"] == "error" and error["error"]["code"] == "invalid_json"
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert json.loads(await ws.recv())["type"] == "session.updated"


async def test_a_key_is_required_when_keys_are_configured(live_server: LiveServer) -> None:
    settings = Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=16),
        server=ServerConfig(port=0, log_level="warning", api_keys=KEY),
    )
    with node_on_engine(live_server, settings) as node:
        base = f"http://{node.host}:{node.port}"
        no_key = openai.AsyncOpenAI(base_url=base + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with no_key.realtime.connect(model="bargein"):
                pass
        assert refused.value.response.status_code == 401
        async with realtime(base) as conn:  # the right key in the Authorization header
            assert conn.created.type == "session.created"
        # OpenAI's browser clients: the key in a subprotocol, `realtime` echoed
        url = f"ws://{node.host}:{node.port}/v1/realtime?model=bargein"
        protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
        async with websockets.connect(url, subprotocols=protocols) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"


async def test_the_sdks_reconnecting_connection_resumes_without_regenerating(live_server: LiveServer) -> None:
    """A drop mid-answer: the SDK reconnects by itself (close 1012); the client
    re-attaches its session and replays the stream from the last token offset
    it got (``bargein.resume``), and the engine generated the answer once."""
    reconnects: list[int] = []

    def on_reconnecting(event: Any) -> None:
        reconnects.append(event.close_code)

    async with realtime(live_server.http_url, on_reconnecting=on_reconnecting) as conn:
        ids = conn.created.session.bargein
        await text_session(conn)
        await conn.conversation.item.create(item=user("Write a long story about a dragon."))
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 48, "temperature": 0}})
        created = await next_of(conn, "response.created")
        stream = created.response.bargein
        before, end = "", 0
        async for event in conn:
            if event.type == "response.output_text.delta":
                before += event.delta
                end = event.bargein["end"]
                if end >= 8:
                    break
        requests = len(live_server.recent_requests())
        for writer in list(live_server.state.writers):  # the server restarts this connection
            closing = asyncio.run_coroutine_threadsafe(writer.close(1012), writer.task.get_loop())
            await asyncio.wrap_future(closing)
        fresh = await next_of(conn, "session.created")  # the SDK reconnected
        assert reconnects == [1012] and fresh.session.bargein["session_id"] != ids["session_id"]
        await conn.send(
            {
                "type": "bargein.resume",
                "session_id": ids["session_id"],
                "session_token": ids["session_token"],
                "stream": {
                    "stream_id": stream["stream_id"],
                    "resume_token": stream["resume_token"],
                    "from": end,
                },
            }
        )
        seen: list[Any] = []
        done = await next_of(conn, "response.done", seen)
        after = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
        assert "bargein.session.resumed" in [e["type"] if isinstance(e, dict) else e.type for e in seen]
        assert done.response.id == created.response.id
        assert done.response.usage.output_tokens == 48 or done.response.status == "completed"
        # the log holds the whole answer, once, and the client has all of it
        text = await asyncio.wait_for(
            _stream_text(live_server.state.service, stream["stream_id"]), HANG_GUARD_S
        )
        assert before + after == text
        assert len(live_server.recent_requests()) == requests  # nothing generated twice


async def _stream_text(service: Any, stream_id: str) -> str:
    """The whole text of a stream, read from the token log to its end."""
    parts = []
    async for item in service.log.read(stream_id, 0):
        if isinstance(item, StreamEnd):
            return "".join(parts)
        parts.append(item.text)
    raise AssertionError("the stream ended without its end")


async def test_a_spoken_turn_round_trip_through_the_sdk(voice_server: LiveServer) -> None:
    """OpenAI's defaults on a server with voice: server VAD on 24 kHz input,
    spoken answers. Synthesized speech in, transcript and audio out."""
    pcm = (
        silence_pcm16(400, 24000)
        + espeak_pcm16("What is the capital of France?", 24000)
        + silence_pcm16(1200, 24000)
    )
    async with realtime(voice_server.http_url) as conn:
        session = conn.created.session
        assert session.output_modalities == ["audio"]
        assert session.audio.input.turn_detection.type == "server_vad"
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 12})
        await next_of(conn, "session.updated")
        step = 24000 * 2 * 40 // 1000  # 40 ms chunks, as a microphone sends them
        for lo in range(0, len(pcm), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[lo : lo + step]).decode())
        seen: list[Any] = []
        done = await next_of(conn, "response.done", seen)
        kinds = [e.type for e in seen]
        for kind in (
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_audio_transcript.delta",
            "response.output_audio.delta",
            "response.output_audio.done",
            "response.output_audio_transcript.done",
        ):
            assert kind in kinds, (kind, kinds)
        started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
        committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
        transcript = next(
            e for e in seen if e.type == "conversation.item.input_audio_transcription.completed"
        )
        assert started.item_id == committed.item_id == transcript.item_id
        assert "capital" in transcript.transcript.lower()
        audio = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
        assert len(audio) > 24000 * 2 // 10  # over 100 ms of 24 kHz pcm16
        assert done.response.output_modalities == ["audio"]
        spoken = done.response.output[0].content[0]
        assert spoken.type == "output_audio" and spoken.transcript


BROWSER_CLIENT = """async ([url, key]) => {
  // what OpenAI's browser clients do: the key in a subprotocol beside `realtime`
  const ws = new WebSocket(url, ["realtime", "openai-insecure-api-key." + key]);
  const events = [];
  const done = new Promise((resolve, reject) => {
    ws.onmessage = (m) => {
      const e = JSON.parse(m.data);
      events.push(e);
      if (e.type === "session.created") {
        ws.send(JSON.stringify({type: "session.update", session: {type: "realtime", output_modalities: ["text"]}}));
        ws.send(JSON.stringify({type: "conversation.item.create", item: {type: "message", role: "user",
          content: [{type: "input_text", text: "Name a colour."}]}}));
        ws.send(JSON.stringify({type: "response.create", response: {max_output_tokens: 8}}));
      }
      if (e.type === "response.done") resolve();
    };
    ws.onerror = () => reject(new Error("socket error"));
    ws.onclose = (c) => reject(new Error("closed " + c.code));
  });
  await done;
  const protocol = ws.protocol;
  ws.close();
  return {protocol, events};
}"""


@pytest.mark.browser
def test_a_browser_client_with_the_key_in_its_subprotocol(live_server: LiveServer) -> None:
    from tests.app.browser import launch

    settings = Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=16),
        server=ServerConfig(port=0, log_level="warning", api_keys=KEY),
    )
    with node_on_engine(live_server, settings) as node, launch() as browser:
        page = browser.new_page()
        page.goto(f"http://{node.host}:{node.port}/")
        url = f"ws://{node.host}:{node.port}/v1/realtime"
        result = page.evaluate(BROWSER_CLIENT, [url, KEY])
        page.close()
    assert result["protocol"] == "realtime"
    events = result["events"]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "session.created" and kinds[-1] == "response.done"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    done_text = next(e["text"] for e in events if e["type"] == "response.output_text.done")
    assert deltas and deltas == done_text


async def test_an_audio_item_is_transcribed_into_the_conversation(voice_server: LiveServer) -> None:
    pcm = espeak_pcm16("The moon.", 24000)  # one frame: under the test server's 64 KiB
    async with realtime(voice_server.http_url) as conn:
        await text_session(conn)
        content = [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}]
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": content})
        added = await next_of(conn, "conversation.item.added")
        assert "moon" in added.item.content[0].text.lower()
        deltas, done, _ = await answer(conn, "Briefly.", max_tokens=4)
        prompt = voice_server.tokenizer.decode(list(voice_server.recent_requests()[-1].prompt_token_ids))
        assert added.item.content[0].text in prompt


async def test_rate_limits_are_reported_at_each_response(live_server: LiveServer) -> None:
    settings = Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=16),
        server=ServerConfig(port=0, log_level="warning"),
        admission=AdmissionConfig(rate_limit_requests=5.0, rate_limit_tokens=1000.0, burst_s=2.0),
    )
    with node_on_engine(live_server, settings) as node:
        async with realtime(f"http://{node.host}:{node.port}") as conn:
            await text_session(conn)
            _, _, seen = await answer(conn, "Hi.", max_tokens=4)
            (update,) = [e for e in seen if e.type == "rate_limits.updated"]
            limits = {limit.name: limit for limit in update.rate_limits}
            assert limits["requests"].limit == 10 and limits["requests"].remaining == 9
            assert limits["tokens"].limit == 2000 and limits["tokens"].remaining < 2000
            assert 0 < limits["requests"].reset_seconds <= 0.2 + 1e-9


async def test_speech_over_a_spoken_answer_cancels_it_as_turn_detected(voice_server: LiveServer) -> None:
    """Barge-in by voice, OpenAI's way: the server's VAD cancels the answer
    (``turn_detected``); the client then truncates the item at what it played."""
    question = (
        silence_pcm16(300, 24000)
        + espeak_pcm16("Tell me a long story about a dragon.", 24000)
        + silence_pcm16(1000, 24000)
    )
    step = 24000 * 2 * 40 // 1000
    async with realtime(voice_server.http_url) as conn:
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 64})
        await next_of(conn, "session.updated")
        for lo in range(0, len(question), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(question[lo : lo + step]).decode())
        first_audio = await next_of(conn, "response.output_audio.delta")
        interrupt = espeak_pcm16("Stop, stop please.", 24000) + silence_pcm16(800, 24000)
        for lo in range(0, len(interrupt), step):
            await conn.input_audio_buffer.append(audio=base64.b64encode(interrupt[lo : lo + step]).decode())
        seen: list[Any] = []
        done = await next_of(conn, "response.done", seen)
        assert done.response.id == first_audio.response_id
        assert (done.response.status, done.response.status_details.reason) == ("cancelled", "turn_detected")
        kinds = [e.type for e in seen]
        assert "input_audio_buffer.speech_started" in kinds
        # nothing of the answer's audio after the user's speech started
        started = kinds.index("input_audio_buffer.speech_started")
        assert "response.output_audio.delta" not in kinds[started:]
        item_id = done.response.output[0].id
        await conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=200)
        assert (await next_of(conn, "conversation.item.truncated")).audio_end_ms == 200
        await conn.conversation.item.retrieve(item_id=item_id)
        item = (await next_of(conn, "conversation.item.retrieved")).item
        heard = item.content[0].transcript
        assert item.content[0].type == "output_audio"
        assert len(heard) < len(done.response.output[0].content[0].transcript) or not heard
