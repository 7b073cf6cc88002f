"""Every voice turn that ends gets an answer, a refusal or an error: never silence (issue 38).

Real models over a real socket. A turn is answered speculatively at its
first short pause, out of the client's sight; when that answer cannot start
(its ``response.create`` refused by admission), nothing of it may reach the
client early, and the turn, once it ends, must still be answered as any
turn is: here, refused again, after its transcript. Before the fix the
speculative refusal went out unseen-answer first, before the turn's
transcript, and the turn then ended in silence.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.voice_runtime.config import VoiceConfig
from loadtests.bare_client import Conn
from loadtests.speech import silence_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import RATE, send_audio, until, voice_server, voice_session
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

# One request per principal, then none for 100 s: the second response.create is refused.
ONE_REQUEST = AdmissionConfig(rate_limit_requests=0.01, burst_s=100.0)


@pytest.fixture(scope="module")
def one_request_server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """live_server's engine and voice models, answers at a pause on, one
    request per principal then ``rate_limited``."""
    with voice_server(live_server, VoiceConfig(speculate=True), ONE_REQUEST) as server:
        yield server


async def test_a_turn_whose_answer_at_the_pause_was_refused_gets_the_refusal_after_its_transcript(
    one_request_server: EmbeddedServer,
) -> None:
    conn = await Conn.open(f"ws://{one_request_server.host}:{one_request_server.port}/v1/realtime")
    try:
        await voice_session(conn, max_tokens=4)
        # the principal's one request: a text answer
        await conn.send(
            type="response.create", input=[{"role": "user", "content": "Hi"}], modalities=["text"]
        )
        await until(conn, "response.done", [])
        # a spoken question: its pause comes before its end, so it is answered
        # (refused) speculatively first
        speech = silence_pcm16(300, RATE) + espeak_pcm16("What is the capital of France?", RATE)
        await send_audio(conn, speech + silence_pcm16(1200, RATE))
        events: list[dict[str, Any]] = []
        committed = await until(conn, "input_audio.committed", events)
        transcript = await until(conn, "input_audio.transcript", events)
        assert transcript["item_id"] == committed["item_id"] and "capital" in transcript["text"].lower()
        # nothing of the answer started unseen reached the client
        assert not [e for e in events if e["type"] == "error"], "an error before the turn's transcript"
        # then the turn's answer, or its refusal: not silence
        while (answer := await conn.recv())["type"] not in ("response.created", "error"):
            pass
        assert answer["type"] == "error" and answer["code"] == "rate_limited", answer
    finally:
        await conn.close()
