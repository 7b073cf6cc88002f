"""The voice loop against hostile or unlucky clients: a real server, real
models, real sockets.

Garbage and oversized audio, rate changes with audio held, commits of
nothing, clears in the middle of a turn, cancels and resumes with audio
positions that do not fit, settings changed while a turn is transcribed,
sockets that vanish in the middle of a turn or of the speech, and many
connections streaming at once. After each the server goes on: the
connection (or the next one) is served, the engine ends idle with its KV
blocks free, and the server logs no error and no task exception.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from bargein.app.embedded import EmbeddedServer
from bargein.session.voice_runtime.config import VoiceConfig
from loadtests.bare_client import Conn
from loadtests.speech import noise_pcm16, silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.log_capture import Records, server_log
from tests.app.voice_helpers import (
    CHUNK_MS,
    RATE,
    send_audio,
    until,
    voice_server,
    voice_session,
    voice_threads_idle,
)
from tests.speech import espeak_pcm16
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

MAX_TOKENS = 12  # short answers: the tests are about the voice loop, not the text


@pytest.fixture(scope="module")
def plain_server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """live_server's engine and voice models behind a server that answers a
    turn only at its end (no speculative answer at a pause), so a test can
    act between a turn's end and its answer."""
    with voice_server(live_server, VoiceConfig(speculate=False)) as server:
        yield server


@pytest.fixture(scope="module")
def long_answer_server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """live_server's engine and voice models behind a server that allows
    answers of 400 tokens (live_server allows 64; its context is 512)."""
    with voice_server(live_server, VoiceConfig(), max_tokens=400) as server:
        yield server


@contextlib.contextmanager
def clean_server_log() -> Iterator[Records]:
    """Fails if the server logs a warning, an error or a task exception meanwhile."""
    with server_log("uvicorn.error", "bargein", "asyncio", level=logging.WARNING) as records:
        yield records
        gc.collect()  # a task whose exception nobody retrieved is reported when collected
    assert not records.records, [r.getMessage() for r in records.records]


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def until_pong(conn: Conn) -> list[dict[str, Any]]:
    """Everything before the answer to a ping (the connection still serves)."""
    await conn.send(type="ping")
    events: list[dict[str, Any]] = []
    await until(conn, "pong", events)
    return events[:-1]


def turn(text: str) -> bytes:
    return silence_pcm16(300, RATE) + espeak_pcm16(text, RATE) + silence_pcm16(900, RATE)


async def settled(server: LiveServer, free_blocks: int) -> None:
    """The engine runs nothing and every KV block is free again."""
    stats = await server.wait_idle()
    assert stats.num_free_blocks == free_blocks == stats.num_total_blocks


def check_spoken(events: list[dict[str, Any]], response_id: str) -> None:
    """8.6: audio deltas in order, never ahead of the text, then one audio.done, then the done."""
    mine = [e for e in events if e.get("response_id") == response_id]
    kinds = [e["type"] for e in mine]
    assert kinds.count("response.audio.done") == 1, kinds
    assert kinds.index("response.audio.done") < kinds.index("response.done"), kinds
    assert "response.audio.delta" not in kinds[kinds.index("response.audio.done") :], kinds
    sent, end_ms = 0, 0
    for e in mine:
        if e["type"] == "response.delta":
            sent += len(e["text"])
        elif e["type"] == "response.audio.delta":
            assert e["start_ms"] == end_ms and e["text_end"] <= sent
            end_ms = e["end_ms"]


# ---- garbage -------------------------------------------------------------------------


async def test_garbage_audio_is_refused_and_the_connection_goes_on(voice_server: LiveServer) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            for fields, code in [
                ({"audio": b64(b"\x00\x01\x02")}, "invalid_parameter"),  # not whole samples
                ({"audio": "!!!!"}, "invalid_message"),  # not base64
                ({"audio": "AAE"}, "invalid_message"),  # unpadded
                ({"audio": "AA AA==="}, "invalid_message"),
                ({"audio": 12}, "invalid_message"),
                ({"audio": None}, "invalid_message"),
                ({}, "invalid_message"),
            ]:
                await conn.send(type="input_audio.append", event_id="g", **fields)
                error = await conn.expect("error")
                assert (error["code"], error["event_id"]) == (code, "g"), (fields, error)
            # any whole samples are audio: loud random bytes, nothing at all
            await conn.send(type="input_audio.append", audio="")
            await send_audio(conn, noise_pcm16(3000, 24000, dbfs=-3.0), rate=24000)
            await conn.send(type="input_audio.clear")
            events = await until_pong(conn)
            assert not [e for e in events if e["type"] in ("error", "input_audio.committed")], events
        finally:
            await conn.close()


async def test_the_biggest_append_a_frame_holds_is_taken_and_one_byte_more_closes_1009(
    voice_server: LiveServer,
) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        limit = conn.created["limits"]["max_frame_bytes"]
        try:
            head = '{"type":"input_audio.append","audio":"'
            room = (limit - len(head) - 2) // 4 * 3  # bytes of audio whose base64 fits
            frame = head + b64(bytes(room - room % 2)) + '"}'  # about 1 s of silence at 24 kHz
            assert limit - 4 < len(frame) <= limit
            for _ in range(3):
                await conn.ws.send(frame)
            assert await until_pong(conn) == []
            await conn.ws.send(frame[:-2] + 'A"}' + " " * (limit - len(frame)))
            with pytest.raises(ConnectionClosed):
                await conn.recv()
            assert conn.ws.close_code == 1009
        finally:
            await conn.close()
        again = await Conn.open(voice_server.ws_url)  # the server serves the next client
        await again.close()


# ---- rates, commits and clears ---------------------------------------------------------------


async def test_a_rate_change_and_the_input_timeline_across_it(voice_server: LiveServer) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            # the default rate is 24 kHz; detection off: the client commits
            await conn.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
            await conn.expect("session.updated")
            second = (espeak_pcm16("one two three", 24000) + silence_pcm16(1000, 24000))[: 2 * 24000]
            await send_audio(conn, second, rate=24000)
            await conn.send(
                type="session.update", event_id="r", session={"audio": {"input": {"sample_rate": RATE}}}
            )
            error = await conn.expect("error")
            assert (error["code"], error["event_id"]) == ("conflict", "r")
            await conn.send(type="input_audio.commit")
            events: list[dict[str, Any]] = []
            committed = await until(conn, "input_audio.committed", events)
            assert (committed["audio_start_ms"], committed["audio_end_ms"]) == (0, 1000)
            await until(conn, "input_audio.transcript", events)
            await conn.send(type="session.update", session={"audio": {"input": {"sample_rate": RATE}}})
            assert (await conn.expect("session.updated"))["session"]["audio"]["input"]["sample_rate"] == RATE
            await send_audio(conn, silence_pcm16(500, RATE))
            await conn.send(type="input_audio.commit")
            committed = await until(conn, "input_audio.committed", events)
            assert (committed["audio_start_ms"], committed["audio_end_ms"]) == (1000, 1500)
            transcript = await until(conn, "input_audio.transcript", events)
            assert transcript["text"] == ""  # silence has no words
            assert not [e for e in events if e["type"] in ("error", "response.created")]
        finally:
            await conn.close()


async def test_commits_of_nothing_are_empty_turns_that_start_nothing(voice_server: LiveServer) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            await voice_session(
                conn, max_tokens=MAX_TOKENS
            )  # server VAD with create_response: still nothing to answer
            for _ in range(3):
                await conn.send(type="input_audio.commit")
            events = await until_pong(conn)
            for _ in range(6 - len(events)):  # the transcripts come off the event loop
                events.append(await conn.recv())
            committed = [e for e in events if e["type"] == "input_audio.committed"]
            transcripts = [e for e in events if e["type"] == "input_audio.transcript"]
            assert [(c["audio_start_ms"], c["audio_end_ms"]) for c in committed] == [(0, 0)] * 3
            assert [t["text"] for t in transcripts] == [""] * 3
            assert {t["item_id"] for t in transcripts} == {c["item_id"] for c in committed}
            assert not [e for e in await until_pong(conn) if e["type"] == "response.created"]
        finally:
            await conn.close()


async def test_commits_past_the_connections_share_of_the_voice_threads_are_refused(
    voice_server: LiveServer,
) -> None:
    """Issue 36, p03: commits sent without waiting queue at most
    ``max_voice_turns`` transcriptions; the next is ``rate_limited`` and keeps
    its audio, committed once a turn is transcribed."""
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            assert conn.created["limits"]["max_voice_turns"] == 2
            await voice_session(conn, max_tokens=MAX_TOKENS, output=False)
            await conn.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
            await conn.expect("session.updated")
            for n in range(3):  # 1 s of noise each, as fast as the socket takes them
                await conn.send(
                    type="input_audio.append", audio=b64(noise_pcm16(1000, RATE, dbfs=-20, seed=n))
                )
                await conn.send(type="input_audio.commit", event_id=f"commit-{n}")
            events: list[dict[str, Any]] = []
            error = await until(conn, "error", events)
            assert (error["code"], error["event_id"], error["retryable"]) == (
                "rate_limited",
                "commit-2",
                True,
            )
            assert error["retry_after_ms"] >= 100
            while len([e for e in events if e["type"] == "input_audio.transcript"]) < 2:
                events.append(await conn.recv())
            assert len([e for e in events if e["type"] == "input_audio.committed"]) == 2
            await conn.send(type="input_audio.commit")  # the refused commit's audio is still held
            committed = await conn.expect("input_audio.committed")
            assert (committed["audio_start_ms"], committed["audio_end_ms"]) == (2000, 3000)
            await conn.expect("input_audio.transcript")
        finally:
            await conn.close()


async def test_a_clear_in_the_middle_of_a_turn_drops_it_and_the_next_turn_is_heard(
    voice_server: LiveServer,
) -> None:
    free = voice_server.stats().num_free_blocks
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS, output=False)
            words = silence_pcm16(300, RATE) + espeak_pcm16("Tell me a long story about the sea", RATE)
            await send_audio(conn, words)
            events: list[dict[str, Any]] = []
            await until(conn, "input_audio.speech_started", events)
            await conn.send(type="input_audio.clear")
            await send_audio(conn, silence_pcm16(1500, RATE))
            events = await until_pong(conn)
            assert not [e for e in events if e["type"] != "input_audio.speech_started"], events
            cleared_at = 1000 * len(words) // 2 // RATE
            await send_audio(conn, turn("What is the capital of France?"))
            committed = await until(conn, "input_audio.committed", events)
            assert committed["audio_start_ms"] >= cleared_at
            transcript = await until(conn, "input_audio.transcript", events)
            assert "capital" in transcript["text"].lower()
            created = await until(conn, "response.created", events)
            assert created["input_item_id"] == committed["item_id"]
            await until(conn, "response.done", events)
        finally:
            await conn.close()
        await settled(voice_server, free)


# ---- cancels and resumes with audio positions ---------------------------------------------


async def spoken(conn: Conn, prompt: str, **fields: Any) -> list[dict[str, Any]]:
    """A spoken response to ``prompt``, read to its response.done."""
    await conn.send(type="response.create", input=[{"role": "user", "content": prompt}], **fields)
    events: list[dict[str, Any]] = []
    await until(conn, "response.done", events)
    return events


async def test_cancels_with_audio_positions_that_fit_no_response(voice_server: LiveServer) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS)
            first = await spoken(conn, "Name a color.", response_id="first")
            second = await spoken(conn, "Name a fruit.", response_id="second")
            check_spoken(first, "first")
            check_spoken(second, "second")
            for fields, code in [
                ({"response_id": "nope", "audio_end_ms": 100}, "not_found"),
                ({"response_id": "second", "audio_end_ms": 2**31}, "invalid_parameter"),
                ({"response_id": "second", "audio_end_ms": -1}, "invalid_parameter"),
                ({"response_id": "second", "audio_end_ms": "10"}, "invalid_message"),
            ]:
                await conn.send(type="response.cancel", event_id="c", **fields)
                error = await conn.expect("error")
                assert (error["code"], error["event_id"]) == (code, "c"), (fields, error)
            # past the audio: all of it; an older response: answered, nothing else changes
            for response_id in ("second", "first"):
                await conn.send(type="response.cancel", response_id=response_id, audio_end_ms=2**31 - 1)
                done = await conn.expect("response.done")
                assert done["response_id"] == response_id
            assert await until_pong(conn) == []
        finally:
            await conn.close()


async def test_resumes_with_audio_positions_past_the_end_or_of_text(voice_server: LiveServer) -> None:
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS)
            events = await spoken(conn, "Name a color.", response_id="voiced")
            created = next(e for e in events if e["type"] == "response.created")
            audio_end = [e for e in events if e["type"] == "response.audio.done"][0]["end_ms"]
            text = await spoken(conn, "Name a fruit.", response_id="text", modalities=["text"])
            text_created = next(e for e in text if e["type"] == "response.created")
            assert not [e for e in text if e["type"].startswith("response.audio")]
            for target, from_ms in ((created, audio_end + 1), (created, 2**31 - 1), (text_created, 0)):
                await conn.send(
                    type="stream.resume",
                    stream_id=target["stream_id"],
                    resume_token=target["resume_token"],
                    audio_from_ms=from_ms,
                    **{"from": 0},
                )
                replay: list[dict[str, Any]] = []
                await until(conn, "response.done", replay)
                assert not [e for e in replay if e["type"] in ("error", "response.audio.delta")], replay
                if target is text_created:  # a text-only response: audio_from_ms is ignored
                    assert not [e for e in replay if e["type"].startswith("response.audio")]
            assert await until_pong(conn) == []
        finally:
            await conn.close()


# ---- settings changed while a turn is transcribed --------------------------------------------


async def test_output_turned_off_while_a_turn_is_transcribed_answers_it_in_text(
    plain_server: EmbeddedServer,
) -> None:
    with clean_server_log():
        conn = await Conn.open(plain_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS)
            await send_audio(conn, turn("What is the capital of France?"))
            events: list[dict[str, Any]] = []
            await until(conn, "input_audio.committed", events)
            await conn.send(type="session.update", session={"audio": {"output": None}})
            await until(conn, "response.done", events)
            kinds = [e["type"] for e in events]
            assert kinds.index("session.updated") < kinds.index("input_audio.transcript")
            assert "response.created" in kinds and not [k for k in kinds if k.startswith("response.audio")]
        finally:
            await conn.close()


async def test_detection_turned_off_while_a_turn_is_transcribed_leaves_it_to_the_client(
    plain_server: EmbeddedServer,
) -> None:
    with clean_server_log():
        conn = await Conn.open(plain_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS, output=False)
            await send_audio(conn, turn("What is the capital of France?"))
            events: list[dict[str, Any]] = []
            committed = await until(conn, "input_audio.committed", events)
            await conn.send(type="session.update", session={"audio": {"input": {"turn_detection": None}}})
            await until(conn, "input_audio.transcript", events)
            assert not [e for e in await until_pong(conn) if e["type"] == "response.created"]
            await conn.send(type="response.create")  # push to talk: the client asks
            created = await until(conn, "response.created", events)
            assert created["input_item_id"] == committed["item_id"]
            await until(conn, "response.done", events)
        finally:
            await conn.close()


# ---- sockets that vanish -------------------------------------------------------------------


async def test_a_socket_lost_in_the_middle_of_a_turn_leaves_nothing_behind(voice_server: LiveServer) -> None:
    free = voice_server.stats().num_free_blocks
    with clean_server_log():
        for lost_at in ("input_audio.speech_started", "input_audio.committed"):
            conn = await Conn.open(voice_server.ws_url)
            await voice_session(conn, max_tokens=MAX_TOKENS)
            await send_audio(conn, turn("Tell me about the moon."))
            await until(conn, lost_at, [])
            conn.drop()
        await settled(voice_server, free)
        # a transcription still running ends with nothing to send to (and nothing logged)
        await voice_threads_idle(voice_server.state.voice)  # type: ignore[arg-type]


async def test_a_socket_lost_while_an_answer_is_spoken_leaves_nothing_behind(
    voice_server: LiveServer,
) -> None:
    free = voice_server.stats().num_free_blocks
    writers = len(voice_server.state.writers)
    with clean_server_log():
        conn = await Conn.open(voice_server.ws_url)
        await voice_session(conn, max_tokens=MAX_TOKENS)
        await conn.send(
            type="response.create",
            max_tokens=64,
            input=[{"role": "user", "content": "Tell me a long story about a dragon."}],
        )
        await until(conn, "response.audio.delta", [])
        conn.drop()
        await settled(voice_server, free)
        await wait_until(
            lambda: len(voice_server.state.writers) == writers, "the lost connection's end", poll_s=0.05
        )


async def test_a_socket_lost_during_a_pause_cancels_the_answer_started_there(
    long_answer_server: EmbeddedServer,
) -> None:
    server = LiveServer(
        host=long_answer_server.host, port=long_answer_server.port, state=long_answer_server.state
    )
    free = server.stats().num_free_blocks
    finished = dict(server.stats().num_finished_by_reason)
    with clean_server_log():
        conn = await Conn.open(server.ws_url)
        await voice_session(conn, max_tokens=MAX_TOKENS, silence_duration_ms=6000)
        # an answer far longer than the drop takes to be seen, even on a loaded box
        # (64 tokens could end by length first, and the test would not show the cancel)
        await conn.send(type="session.update", session={"defaults": {"temperature": 0, "max_tokens": 400}})
        await conn.expect("session.updated")
        # by id: recent_requests keeps the last 256 only, so its length stops growing
        before = {r.request_id for r in server.recent_requests()}

        def new() -> list[str]:
            return [r.request_id for r in server.recent_requests() if r.request_id not in before]

        await send_audio(conn, silence_pcm16(300, RATE) + espeak_pcm16("Tell me a long story about", RATE))
        # A pause: well past pause_ms (200 ms) of silence, far short of the 6 s window;
        # counted in audio, so with no more sent it stays a pause until the answer is submitted.
        await send_audio(conn, silence_pcm16(1000, RATE), pace_s=CHUNK_MS / 1000)
        await wait_until(new, "an answer started at the pause")
        assert len(new()) == 1
        conn.drop()

        def ended() -> dict[str, int] | None:  # a submit reaches the engine's counts at its next step
            now = dict(server.stats().num_finished_by_reason)
            return now if sum(now.values()) > sum(finished.values()) else None

        now = await wait_until(ended, "the answer at the pause to end", poll_s=0.05)
        # the client never saw it: cancelled at once, not generated for nobody
        assert {k: v - finished.get(k, 0) for k, v in now.items() if v != finished.get(k, 0)} == {
            "cancelled": 1
        }
        await settled(server, free)


# ---- many at once ----------------------------------------------------------------------------------


async def test_many_connections_streaming_audio_at_once_are_each_answered(voice_server: LiveServer) -> None:
    free = voice_server.stats().num_free_blocks
    questions = ["What is two plus two?", "Name a big city.", "What color is the sky?", "Say hello."] * 2
    audio = {q: turn(q) for q in set(questions)}

    async def one(question: str) -> list[dict[str, Any]]:
        conn = await Conn.open(voice_server.ws_url)
        try:
            await voice_session(conn, max_tokens=MAX_TOKENS)
            sender = asyncio.create_task(send_audio(conn, audio[question], pace_s=0.005))
            events: list[dict[str, Any]] = []
            await until(conn, "response.done", events)
            await sender
            return events
        finally:
            await conn.close()

    with clean_server_log():
        answers = await asyncio.wait_for(asyncio.gather(*(one(q) for q in questions)), 240)
        for events in answers:
            kinds = [e["type"] for e in events]
            assert "error" not in kinds, events
            committed = events[kinds.index("input_audio.committed")]
            created = events[kinds.index("response.created")]
            assert created["input_item_id"] == committed["item_id"]
            assert kinds.index("input_audio.transcript") < kinds.index("response.created")
            check_spoken(events, created["response_id"])
        await settled(voice_server, free)


def test_the_frame_arithmetic_of_this_file() -> None:
    head = '{"type":"input_audio.append","audio":"'
    assert json.loads(head + b64(b"\x00\x00") + '"}')["audio"] == "AAA="
