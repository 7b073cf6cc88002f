"""A resume's speech synthesized again counts against the caller's audio rate
limit (``--rate-limit-audio``), as its voice turns do (issue 36, item 2): a
real server, the real model and synthesizer, real sockets."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from loadtests.bare_client import Conn
from loadtests.speech import noise_pcm16
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer, node_on_engine
from tests.app.voice_helpers import RATE, until, voice_session

pytestmark = pytest.mark.slow

# 0.1 s of audio a second, 1 s held: one clause of speech empties it for seconds
LIMITED = AdmissionConfig(rate_limit_audio_s=0.1, burst_s=10)


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["text"] for e in events if e["type"] == "response.delta")


async def spoken_answer(url: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A spoken answer of several sentences: its response.created and events."""
    conn = await Conn.open(url)
    try:
        await voice_session(conn, max_tokens=48)
        await conn.send(
            type="response.create",
            modalities=["text", "audio"],
            input=[{"role": "user", "content": "Tell me a story about a cat and the moon."}],
        )
        events: list[dict[str, Any]] = []
        created = await until(conn, "response.created", events)
        await until(conn, "response.done", events)
    finally:
        await conn.close()
    return created, events


async def test_a_resumes_speech_is_charged_to_the_callers_audio_rate(voice_server: LiveServer) -> None:
    """The first resume speaks while the caller's audio bucket holds any:
    past it the resumed audio stops with ``rate_limited`` (its text goes on
    to the end); the next resume with ``audio_from_ms``, and a voice turn,
    are refused at once until the bucket refills; one without audio is not."""
    settings = Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=32, max_frame_bytes=MAX_FRAME_BYTES),
        admission=LIMITED,
        server=ServerConfig(port=0, log_level="warning"),
    )
    with node_on_engine(voice_server, settings) as server:
        url = f"ws://{server.host}:{server.port}/v1/realtime"
        created, answer = await spoken_answer(url)  # a response's own speech is not charged
        spoken = [e for e in answer if e["type"] == "response.audio.delta"]
        assert spoken[-1]["end_ms"] > 3000, spoken[-1]
        resume = {
            "type": "stream.resume",
            "stream_id": created["stream_id"],
            "resume_token": created["resume_token"],
            "from": 0,
        }
        conn = await Conn.open(url)  # the same caller (client address) on another connection
        try:
            await voice_session(conn, max_tokens=48)
            await conn.send(**resume, audio_from_ms=0)
            events: list[dict[str, Any]] = []
            done = await until(conn, "response.done", events)
            assert done["finish_reason"] in ("stop", "length")
            (error,) = [e for e in events if e["type"] == "error"]
            assert (error["code"], error["response_id"]) == ("rate_limited", created["response_id"])
            assert error["retry_after_ms"] > 0 and "audio rate limit" in error["message"]
            replayed = [e for e in events if e["type"] == "response.audio.delta"]
            assert replayed, "the bucket was full: the first clause is spoken"
            assert [(e["start_ms"], e["end_ms"]) for e in replayed] == [
                (e["start_ms"], e["end_ms"]) for e in spoken[: len(replayed)]
            ]
            assert replayed[-1]["end_ms"] < spoken[-1]["end_ms"]  # it stopped there
            assert text_of(events) == text_of(answer)  # all of the text

            await conn.send(**resume, audio_from_ms=replayed[-1]["end_ms"], event_id="again")
            refused = await conn.expect("error")
            assert (refused["code"], refused["event_id"], refused["retryable"]) == (
                "rate_limited",
                "again",
                True,
            )
            assert refused["retry_after_ms"] >= 1000  # the bucket is in debt by about a clause

            await conn.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
            await conn.expect("session.updated")
            pcm = noise_pcm16(500, RATE, dbfs=-20)
            await conn.send(type="input_audio.append", audio=base64.b64encode(pcm).decode())
            await conn.send(type="input_audio.commit", event_id="turn")
            turn = await conn.expect("error")  # the same bucket: no transcription
            assert (turn["code"], turn["event_id"]) == ("rate_limited", "turn")

            await conn.send(**resume, event_id="text")  # text only: not audio
            assert (await conn.expect("stream.resumed"))["stream_id"] == created["stream_id"]
            await until(conn, "response.done", [])
        finally:
            await conn.close()
