"""Review of the OpenAI Realtime endpoint: what OpenAI clients really send, and
the races they run, against the real server through the official ``openai``
SDK. Every server event is checked against the SDK's own pydantic models (the
SDK's ``recv()`` builds them unchecked: a typed client in another language, or
one that validates, would choke on what it lets through)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent

from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

SERVER_EVENT = pydantic.TypeAdapter(RealtimeServerEvent)
EXTENSIONS = {"bargein.session.resumed", "bargein.stream.resumed"}  # section 11.4
TEXT_ONLY = {"type": "realtime", "output_modalities": ["text"]}


def user(text: str, **fields: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}], **fields}


class Conn:
    """An SDK realtime connection whose every event is validated on receipt."""

    def __init__(self, conn: Any) -> None:
        self.sdk = conn

    async def send(self, event: dict[str, Any]) -> None:
        await self.sdk.send(event)

    async def recv(self, timeout_s: float = 30.0) -> dict[str, Any]:
        event = json.loads(await asyncio.wait_for(self.sdk.recv_bytes(), timeout_s))
        if event["type"] not in EXTENSIONS:
            SERVER_EVENT.validate_python(event)  # raises on what OpenAI's schema does not allow
        return event

    async def until(self, kind: str, seen: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        while True:
            event = await self.recv()
            if seen is not None:
                seen.append(event)
            if event["type"] == kind:
                return event

    async def quiet(self, timeout_s: float = 1.0) -> list[dict[str, Any]]:
        """What comes until nothing does for ``timeout_s``."""
        out = []
        with contextlib.suppress(TimeoutError):
            while True:
                out.append(await self.recv(timeout_s))
        return out


@contextlib.asynccontextmanager
async def realtime(server: LiveServer) -> AsyncIterator[Conn]:
    client = openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="sk-review", max_retries=0)
    async with client.realtime.connect(model="bargein") as sdk:
        conn = Conn(sdk)
        conn.created = await conn.recv()  # type: ignore[attr-defined]
        yield conn


async def text_turn(conn: Conn, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A text session's user item and greedy response; its ``response.done``."""
    await conn.send({"type": "session.update", "session": TEXT_ONLY})
    await conn.until("session.updated")
    await conn.send({"type": "conversation.item.create", "item": user(prompt)})
    await conn.until("conversation.item.done")
    await conn.send(
        {"type": "response.create", "response": {"max_output_tokens": max_tokens, "temperature": 0}}
    )
    return await conn.until("response.done")


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def append(conn: Conn, pcm: bytes, rate: int = 24000) -> None:
    step = rate * 2 * 40 // 1000  # 40 ms chunks, as a microphone sends them
    for lo in range(0, len(pcm), step):
        await conn.send({"type": "input_audio_buffer.append", "audio": b64(pcm[lo : lo + step])})


async def test_nan_and_infinity_are_not_json(live_server: LiveServer) -> None:
    """Python's json accepts NaN; bargein's own decoder and OpenAI's do not. A
    NaN temperature must not reach the sampler."""
    async with realtime(live_server) as conn:
        await text_turn(conn, "Hello", max_tokens=2)
        requests = len(live_server.recent_requests())
        for constant in ("NaN", "Infinity", "-Infinity"):
            frame = '{"type":"response.create","response":{"max_output_tokens":2,"temperature":%s}}'
            await conn.sdk._connection.send(frame % constant)  # the SDK itself cannot send NaN
            (event,) = await conn.quiet()
            assert event["type"] == "error" and event["error"]["code"] == "invalid_json"
        assert len(live_server.recent_requests()) == requests


async def test_a_cancel_of_a_finished_response_is_answered(live_server: LiveServer) -> None:
    """The race every barge-in client runs: its cancel reaches the server just
    after the response ended. OpenAI answers ``response_cancel_not_active``;
    silence leaves a client waiting for an answer that never comes."""
    async with realtime(live_server) as conn:
        done = await text_turn(conn, "Hello", max_tokens=3)
        await conn.send({"type": "response.cancel", "response_id": done["response"]["id"]})
        events = await conn.quiet()
        assert [(e["type"], e["error"]["code"]) for e in events] == [("error", "response_cancel_not_active")]


async def test_cancel_without_an_id_stops_a_stream_resumed_alone(live_server: LiveServer) -> None:
    """``bargein.resume`` with ``stream`` only follows a live response; the SDK's
    ``response.cancel()`` (no id) must cancel it, not say nothing is active."""
    async with realtime(live_server) as first:
        await first.send({"type": "session.update", "session": TEXT_ONLY})
        await first.until("session.updated")
        await first.send(
            {"type": "conversation.item.create", "item": user("Write a long story about a cat.")}
        )
        await first.send({"type": "response.create", "response": {"max_output_tokens": 64, "temperature": 0}})
        stream = (await first.until("response.created"))["response"]["bargein"]
        await first.until("response.output_text.delta")
    async with realtime(live_server) as conn:
        resume = {"stream_id": stream["stream_id"], "resume_token": stream["resume_token"], "from": 0}
        await conn.send({"type": "bargein.resume", "stream": resume})
        await conn.until("response.output_text.delta")
        await conn.send({"type": "response.cancel"})
        seen: list[dict[str, Any]] = []
        done = await conn.until("response.done", seen)
        assert not [e for e in seen if e["type"] == "error"]
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["usage"]["output_tokens"] < 64


async def test_every_event_of_a_spoken_turn_fits_openais_schema(voice_server: LiveServer) -> None:
    """A spoken turn by server VAD: every event validates against the SDK's models
    (``transcription.completed`` requires ``usage``)."""
    pcm = silence_pcm16(400, 24000) + espeak_pcm16("What is the capital of France?", 24000)
    async with realtime(voice_server) as conn:
        await conn.send({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 6}})
        await conn.until("session.updated")
        await append(conn, pcm + silence_pcm16(1200, 24000))
        seen: list[dict[str, Any]] = []
        await conn.until("response.done", seen)
        (completed,) = [
            e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"
        ]
        assert "capital" in completed["transcript"].lower()
        assert completed["usage"]["type"] == "duration" and completed["usage"]["seconds"] > 1


async def test_an_empty_commit_is_refused_and_adds_no_item(voice_server: LiveServer) -> None:
    """Push to talk with nothing said: bargein adds no item, so the client must
    not be told of one (OpenAI: ``input_audio_buffer_commit_empty``)."""
    async with realtime(voice_server) as conn:
        session = {**TEXT_ONLY, "audio": {"input": {"turn_detection": None}}}
        await conn.send({"type": "session.update", "session": session})
        await conn.until("session.updated")
        await conn.send({"type": "input_audio_buffer.commit"})
        events = await conn.quiet(2.0)
        assert [(e["type"], e["error"]["code"]) for e in events] == [
            ("error", "input_audio_buffer_commit_empty")
        ]


async def test_a_committed_turn_without_words_is_taken_back(voice_server: LiveServer) -> None:
    """Silence committed: the item announced at the commit is not in the
    conversation, so the client hears it deleted (not ``done``)."""
    async with realtime(voice_server) as conn:
        session = {**TEXT_ONLY, "audio": {"input": {"turn_detection": None}}}
        await conn.send({"type": "session.update", "session": session})
        await conn.until("session.updated")
        await append(conn, silence_pcm16(600, 24000))
        await conn.send({"type": "input_audio_buffer.commit"})
        events = await conn.quiet(3.0)
        kinds = [e["type"] for e in events]
        assert "conversation.item.done" not in kinds
        if "conversation.item.added" in kinds:
            added = next(e for e in events if e["type"] == "conversation.item.added")
            assert kinds[-1] == "conversation.item.deleted"
            await conn.send({"type": "conversation.item.retrieve", "item_id": added["item"]["id"]})
            assert (await conn.until("error"))["error"]["code"] == "not_found"


@pytest.mark.xfail(
    strict=True,
    reason="a push-to-talk turn's item waits in the voice channel for the next response.create "
    "(VoiceChannel._pending_items): announced with conversation.item.added/done, it is not in the "
    "conversation until then, so retrieve/delete/previous_item_id miss it and a text item created "
    "meanwhile goes before it in the prompt",
)
async def test_a_committed_push_to_talk_item_is_in_the_conversation_at_once(voice_server: LiveServer) -> None:
    async with realtime(voice_server) as conn:
        session = {**TEXT_ONLY, "audio": {"input": {"turn_detection": None}}}
        await conn.send({"type": "session.update", "session": session})
        await conn.until("session.updated")
        await append(conn, espeak_pcm16("What is the capital of France?", 24000))
        await conn.send({"type": "input_audio_buffer.commit"})
        item_id = (await conn.until("input_audio_buffer.committed"))["item_id"]
        await conn.until("conversation.item.done")
        # the item the client was told of is in the conversation, and it is the last one
        await conn.send({"type": "conversation.item.create", "item": user("And of Spain?")})
        added = await conn.until("conversation.item.added")
        assert added["previous_item_id"] == item_id
        await conn.send({"type": "conversation.item.retrieve", "item_id": item_id})
        assert (await conn.until("conversation.item.retrieved"))["item"]["id"] == item_id


async def test_a_livekit_style_session_update_with_noise_reduction_applies(voice_server: LiveServer) -> None:
    pcm = {"type": "audio/pcm", "rate": 24000}
    session = {
        "type": "realtime",
        "model": "gpt-realtime",
        "output_modalities": ["text"],
        "instructions": "Answer in one word.",
        "audio": {
            "input": {
                "format": pcm,
                "noise_reduction": {"type": "near_field"},
                "transcription": {"model": "gpt-4o-transcribe"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
            },
            "output": {"format": pcm, "voice": "marin", "speed": 1.0},
        },
        "max_output_tokens": "inf",
        "tool_choice": "auto",
        "tracing": None,
    }
    async with realtime(voice_server) as conn:
        await conn.send({"type": "session.update", "session": session})
        (event,) = await conn.quiet()
        assert event["type"] == "session.updated"
        assert event["session"]["instructions"] == "Answer in one word."
        assert event["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}  # echoed


async def test_openais_largest_max_output_tokens_is_accepted(live_server: LiveServer) -> None:
    async with realtime(live_server) as conn:
        session = {**TEXT_ONLY, "instructions": "Be brief.", "max_output_tokens": 4096}
        await conn.send({"type": "session.update", "session": session})
        (event,) = await conn.quiet()
        assert event["type"] == "session.updated"
        assert event["session"]["instructions"] == "Be brief."
        assert event["session"]["max_output_tokens"] == 64  # clamped to the server's --max-tokens


async def test_nothing_of_a_deleted_item_follows_its_deletion(live_server: LiveServer) -> None:
    async with realtime(live_server) as conn:
        await conn.send({"type": "session.update", "session": TEXT_ONLY})
        await conn.until("session.updated")
        await conn.send(
            {"type": "conversation.item.create", "item": user("Write a long story about a dragon.")}
        )
        await conn.send({"type": "response.create", "response": {"max_output_tokens": 60, "temperature": 0}})
        item_id = (await conn.until("response.output_item.added"))["item"]["id"]
        await conn.until("response.output_text.delta")
        await conn.send({"type": "response.cancel"})
        await conn.send({"type": "conversation.item.delete", "item_id": item_id})
        seen: list[dict[str, Any]] = []
        await conn.until("response.done", seen)
        seen += await conn.quiet()
        kinds = [e["type"] for e in seen if e["type"] != "response.output_text.delta"]
        assert kinds[-1] == "conversation.item.deleted", kinds


@pytest.mark.xfail(
    strict=True,
    reason="bargein.resume restores bargein's settings (instructions, max tokens, the audio "
    "settings) but not the OpenAI-only ones kept per connection (OpenAISession.audio_output, "
    "max_output_tokens): a resumed text session speaks on a server with voice",
)
async def test_a_resumed_text_session_answers_in_text(voice_server: LiveServer) -> None:
    async with realtime(voice_server) as first:
        await first.send({"type": "session.update", "session": {**TEXT_ONLY, "max_output_tokens": 3}})
        await first.until("session.updated")
        await first.send({"type": "conversation.item.create", "item": user("Hello")})
        await first.until("conversation.item.done")
        ids = first.created["session"]["bargein"]  # type: ignore[attr-defined]
    async with realtime(voice_server) as conn:
        resume = {"session_id": ids["session_id"], "session_token": ids["session_token"]}
        await conn.send({"type": "bargein.resume", **resume})
        await conn.until("bargein.session.resumed")
        await conn.send({"type": "response.create"})
        done = await conn.until("response.done")
        assert done["response"]["output_modalities"] == ["text"]
        assert done["response"]["max_output_tokens"] == 3
