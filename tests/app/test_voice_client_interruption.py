"""The Python voice client's AnswerPlayer against the real server: "yeah" over
the answer pauses it, the server resumes it (a backchannel: no turn), and the
player plays every sample of the answer, once (confirmed interruptions,
docs/protocol.md 8.7). The speech is espeak-ng's; the server must serve audio
(skips without it, fails in CI)."""

from __future__ import annotations

import asyncio

import pytest

from bargein.client.pcm import silence
from bargein.client.voice_client import VoiceClient, voice_settings
from tests.app.conftest import LiveServer
from tests.speech import espeak_pcm16
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

QUESTION = "Tell me a long story about a dragon."  # as tests/app/test_voice_browser.py
GREEDY = {"temperature": 0, "max_tokens": 64}


async def test_a_backchannel_pauses_and_resumes_the_answer_and_the_player_plays_all_of_it(
    voice_server: LiveServer,
) -> None:
    client = VoiceClient(voice_server.ws_url)
    await client.connect()
    try:
        await client.update(audio=voice_settings(interruption="confirm"), defaults=GREEDY)
        assert client.interruption_mode == "confirm"
        rate = client.input_rate
        question = espeak_pcm16(QUESTION, rate) + silence(1000, rate)
        yeah = espeak_pcm16("Yeah.", rate) + silence(1500, rate)
        player = client.player()
        first_audio = asyncio.Event()

        async def microphone() -> None:
            """The question, silence until the answer's first audio, "yeah" over it, then silence."""
            await client.send_audio(question)
            while not first_audio.is_set():
                await client.send_audio(silence(40, rate))
            await client.send_audio(yeah)
            while True:
                await client.send_audio(silence(100, rate))

        sender = asyncio.create_task(microphone())
        try:
            async with asyncio.timeout(180):
                turn = await client.voice_turn(player=player, on_audio=lambda pcm: first_audio.set())
                discarded = list(turn.discarded)
                if not discarded:  # the speech may end after the answer's audio was all sent
                    async for event in client.events(player):
                        if event["type"] == "input_audio.discarded":
                            discarded.append(event)
                            break
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        response = turn.response
        assert response is not None and response.done is not None
        assert response.done["finish_reason"] in ("stop", "length"), response.done
        paused = [e for e in response.events if e["type"] == "response.audio.paused"]
        resumed = [e for e in response.events if e["type"] == "response.audio.resumed"]
        assert len(paused) == len(resumed) == 1, [e["type"] for e in response.events]
        assert resumed[0]["from_ms"] == paused[0]["end_ms"]
        assert (response.num_pauses, response.num_resumes, response.paused) == (1, 1, False)
        (event,) = discarded
        assert event["reason"] in ("backchannel", "no_words"), event
        assert player.cancels == []  # nothing was cut
        playback = player.playbacks[response.response_id]
        assert playback.num_pauses >= 1 and playback.num_resumes == playback.num_pauses
        # the player plays the answer to its end: every sample received, once
        await wait_until(lambda: not playback.pending, "the answer to play to its end", guard_s=120)
        played = playback.take_played()
        assert playback.played_samples == playback.received_samples == len(response.audio) // 2
        assert played == bytes(response.audio)
    finally:
        await client.close()
