"""The Python client's playback of answers (client/playback.py) and its voice
turns (client/voice_client.py) on scripted server events: confirmed
interruptions pause and resume the audio with nothing lost or repeated, a
real one cuts it and says what was played. A fake clock, no server."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from bargein.client.playback import AnswerPlayer, Playback
from bargein.client.voice_client import VoiceClient, voice_settings

RATE = 24000  # samples per second
MS = RATE // 1000 * 2  # bytes per millisecond of pcm16


class Clock:
    """Seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def tick(self, ms: float) -> None:
        self.now += ms / 1000


def ramp(start_ms: int, end_ms: int) -> bytes:
    """pcm16 whose sample n (from the answer's start) is n mod 32768: every sample tells its place."""
    first, last = start_ms * RATE // 1000, end_ms * RATE // 1000
    return b"".join((n % 32768).to_bytes(2, "little") for n in range(first, last))


def positions(pcm: bytes) -> list[int]:
    return [int.from_bytes(pcm[i : i + 2], "little") for i in range(0, len(pcm), 2)]


def expected(ms: int) -> list[int]:
    """:func:`positions` of the first ``ms`` of :func:`ramp`."""
    return [n % 32768 for n in range(ms * RATE // 1000)]


# ---- Playback ---------------------------------------------------------------------------


def test_playback_plays_in_real_time_and_waits_when_the_buffer_runs_dry() -> None:
    clock = Clock()
    playback = Playback(RATE, clock=clock)
    assert (playback.played_ms, playback.pending) == (0, False)
    playback.push(ramp(0, 100))
    clock.tick(40)
    assert playback.played_ms == 40 and playback.buffered_samples == 60 * 24
    clock.tick(100)  # dry after 60 ms: a 40 ms gap
    assert playback.played_ms == 100 and not playback.pending
    playback.push(ramp(100, 200))
    clock.tick(30)  # the new audio starts when it arrives, not back in the gap
    assert playback.played_ms == 130
    assert positions(playback.take_played()) == expected(130)


def test_pause_keeps_the_buffer_and_resume_plays_on_from_the_same_sample() -> None:
    clock = Clock()
    playback = Playback(RATE, clock=clock)
    playback.push(ramp(0, 500))
    clock.tick(123.5)
    heard = playback.take_played()
    assert playback.pause() is True and playback.pause() is False  # idempotent
    at = playback.played_samples
    clock.tick(700)  # a long pause: nothing plays
    assert playback.played_samples == at and playback.buffered_samples == 500 * 24 - at
    assert playback.take_played() == b""
    assert playback.resume() is True and playback.resume() is False
    clock.tick(1000)
    heard += playback.take_played()
    assert positions(heard) == expected(500)  # every sample once, in order
    assert (playback.num_pauses, playback.num_resumes) == (1, 1)


def test_cut_drops_the_unplayed_audio_and_later_pushes() -> None:
    clock = Clock()
    playback = Playback(RATE, clock=clock)
    playback.push(ramp(0, 300))
    clock.tick(80)
    playback.pause()
    clock.tick(200)
    assert playback.cut() == 80  # frozen at the pause
    playback.push(ramp(300, 400))
    clock.tick(500)
    assert (playback.played_ms, playback.pending, playback.received_samples) == (80, False, 80 * 24)
    assert playback.cut() == 80 and playback.resume() is False


# ---- AnswerPlayer on scripted events ------------------------------------------------------


def created(response_id: str, item_id: str | None = None) -> dict[str, Any]:
    event = {"type": "response.created", "response_id": response_id, "stream_id": response_id[2:]}
    return event | ({"input_item_id": item_id} if item_id else {})


def scripted_answer(mode: str = "confirm") -> tuple[AnswerPlayer, Clock]:
    """A player that got 1 s of an answer r_1 and has played 300 ms of it."""
    clock = Clock()
    player = AnswerPlayer(RATE, mode=mode, clock=clock)  # type: ignore[arg-type]
    assert player.take(created("r_1", "item_1")) is None
    player.sink("r_1")(ramp(0, 1000))
    clock.tick(300)
    return player, clock


def test_a_false_interruption_pauses_then_resumes_with_the_whole_answer_played() -> None:
    player, clock = scripted_answer()
    playback = player.playbacks["r_1"]
    heard = playback.take_played()
    assert (
        player.take({"type": "input_audio.speech_started", "item_id": "item_2", "audio_start_ms": 9000})
        is None
    )
    assert player.paused and playback.played_ms == 300
    paused = {"type": "response.audio.paused", "response_id": "r_1", "stream_id": "1", "end_ms": 1000}
    assert player.take(paused) is None
    clock.tick(400)  # the server decides: a cough
    assert playback.played_ms == 300 and playback.buffered_samples == 700 * 24
    assert player.take({"type": "response.audio.resumed", "response_id": "r_1", "from_ms": 1000}) is None
    discarded = {"type": "input_audio.discarded", "item_id": "item_2", "reason": "no_words", "transcript": ""}
    assert player.take(discarded) is None
    assert (
        player.take({"type": "input_audio.speech_stopped", "item_id": "item_2", "audio_end_ms": 9300}) is None
    )
    assert not player.paused and player.discarded == [discarded]
    player.sink("r_1")(ramp(1000, 1500))  # the deltas go on from from_ms
    clock.tick(2000)
    heard += playback.take_played()
    assert positions(heard) == expected(1500)  # nothing lost, nothing repeated
    assert player.cancels == [] and (playback.num_pauses, playback.num_resumes) == (1, 1)


def test_discarded_alone_resumes_an_answer_whose_audio_had_all_been_sent() -> None:
    player, clock = scripted_answer()
    player.take({"type": "response.audio.done", "response_id": "r_1", "end_ms": 1000})
    player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "stop"})
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})  # no pause comes: done
    assert player.paused
    clock.tick(300)
    player.take(
        {"type": "input_audio.discarded", "item_id": "item_2", "reason": "backchannel", "transcript": "mm-hm"}
    )
    clock.tick(1000)
    assert not player.paused and player.playbacks["r_1"].played_ms == 1000 and player.cancels == []


def test_a_real_interruption_cuts_the_answer_where_it_paused_and_cancels_with_that() -> None:
    player, clock = scripted_answer()
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    player.take({"type": "response.audio.paused", "response_id": "r_1", "end_ms": 1000})
    clock.tick(450)
    player.take({"type": "response.audio.done", "response_id": "r_1", "end_ms": 1000})
    cancel = player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "interrupted"})
    assert cancel == {"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 300}
    playback = player.playbacks["r_1"]
    assert not playback.pending and not player.paused
    # the echo of the cancel changes nothing
    assert (
        player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "interrupted"}) is None
    )
    assert player.cancels == [cancel]


def test_words_over_an_answer_already_sent_cut_it_at_the_final_transcript() -> None:
    player, clock = scripted_answer()
    player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "stop"})
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    clock.tick(200)
    player.take({"type": "input_audio.transcript", "item_id": "item_2", "text": "wait", "final": False})
    assert player.paused and player.cancels == []
    cancel = player.take(
        {"type": "input_audio.transcript", "item_id": "item_2", "text": "Wait, stop.", "final": True}
    )
    assert cancel == {"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 300}
    assert player.take(created("r_2", "item_2")) is None


def test_an_empty_final_transcript_resumes() -> None:
    player, clock = scripted_answer()
    player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "stop"})
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    player.take({"type": "input_audio.transcript", "item_id": "item_2", "text": "", "final": True})
    clock.tick(200)
    assert not player.paused and player.playbacks["r_1"].played_ms == 500


def test_immediate_mode_cuts_at_the_first_speech() -> None:
    player, clock = scripted_answer("immediate")
    cancel = player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    assert cancel == {"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 300}
    assert (
        player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "interrupted"}) is None
    )


def test_speech_with_nothing_playing_pauses_nothing() -> None:
    player, clock = scripted_answer()
    clock.tick(1000)  # all played
    assert player.take({"type": "input_audio.speech_started", "item_id": "item_2"}) is None
    assert not player.paused


# ---- the session setting ----------------------------------------------------------------


def test_voice_settings_carries_the_interruption_setting() -> None:
    assert "interruption" not in voice_settings()["input"]["turn_detection"]
    assert voice_settings(interruption="immediate")["input"]["turn_detection"]["interruption"] == {
        "mode": "immediate"
    }
    full = {"mode": "confirm", "min_words": 3, "backchannels": ["mm-hm"], "max_pause_ms": 400}
    assert voice_settings(interruption=full)["input"]["turn_detection"]["interruption"] == full


# ---- VoiceClient.voice_turn on a scripted socket -------------------------------------------


class ScriptedVoiceClient(VoiceClient):
    """A VoiceClient whose server is a list of events; what it sends is kept."""

    def __init__(self, events: list[dict[str, Any]], clock: Clock, ticks: dict[int, float]) -> None:
        super().__init__("ws://scripted")
        self.script = events
        self.clock, self.ticks = clock, ticks  # event index -> ms to wait before it
        self.sent: list[dict[str, Any]] = []
        self._index = 0

    async def send(self, event: dict[str, Any]) -> None:
        self.sent.append(json.loads(json.dumps(event)))

    async def _recv(self) -> dict[str, Any]:
        self.clock.tick(self.ticks.get(self._index, 0))
        event = self.script[self._index]
        self._index += 1
        return event


def audio(response_id: str, start_ms: int, end_ms: int, text_end: int) -> dict[str, Any]:
    return {
        "type": "response.audio.delta",
        "response_id": response_id,
        "stream_id": response_id[2:],
        "audio": base64.b64encode(ramp(start_ms, end_ms)).decode(),
        "start_ms": start_ms,
        "end_ms": end_ms,
        "text_end": text_end,
    }


def r1(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "response_id": "r_1", "stream_id": "1", **fields}


async def test_voice_turn_pauses_resumes_and_then_barges_in_with_what_was_played() -> None:
    clock = Clock()
    turn_events = [
        {"type": "input_audio.speech_started", "item_id": "item_1", "audio_start_ms": 0},
        {"type": "input_audio.speech_stopped", "item_id": "item_1", "audio_end_ms": 900},
        {"type": "input_audio.committed", "item_id": "item_1", "audio_start_ms": 0, "audio_end_ms": 900},
        {"type": "input_audio.transcript", "item_id": "item_1", "text": "Tell me a story.", "final": True},
        created("r_1", "item_1") | {"resume_token": "t"},
        r1("response.delta", start=0, end=3, text="Once upon a time"),
        audio("r_1", 0, 400, 9),  # 6: plays from here
        # an "mm-hm" at 200 ms: paused, then resumed from 400 ms
        {"type": "input_audio.speech_started", "item_id": "item_2", "audio_start_ms": 3000},
        {"type": "input_audio.transcript", "item_id": "item_2", "text": "mm-hm", "final": False},
        r1("response.audio.paused", end_ms=400),
        r1("response.audio.resumed", from_ms=400),
        {
            "type": "input_audio.discarded",
            "item_id": "item_2",
            "reason": "backchannel",
            "transcript": "mm-hm",
        },
        {"type": "input_audio.speech_stopped", "item_id": "item_2", "audio_end_ms": 3400},
        audio("r_1", 400, 800, 16),
        r1("response.audio.done", end_ms=800),
        r1("response.done", end=3, finish_reason="stop", usage={}),
        # the next turn talks over the rest: a real interruption of an answer already sent
        {"type": "input_audio.speech_started", "item_id": "item_3", "audio_start_ms": 5000},
        {"type": "input_audio.speech_stopped", "item_id": "item_3", "audio_end_ms": 5600},
        {"type": "input_audio.committed", "item_id": "item_3", "audio_start_ms": 5000, "audio_end_ms": 5600},
        {"type": "input_audio.transcript", "item_id": "item_3", "text": "Stop, please.", "final": True},
        {
            "type": "response.created",
            "response_id": "r_2",
            "stream_id": "2",
            "resume_token": "t",
            "input_item_id": "item_3",
        },
        {"type": "response.done", "response_id": "r_2", "stream_id": "2", "end": 0, "finish_reason": "stop"},
    ]
    # ms of the clock before event i: 200 ms of play, a 450 ms pause, then 100 ms more
    ticks = {7: 200, 10: 450, 16: 100, 19: 50}
    client = ScriptedVoiceClient(turn_events, clock, ticks)
    client.output_rate = RATE
    client.interruption_mode = "confirm"
    player = client.player(clock=clock)
    heard: list[bytes] = []
    first = await client.voice_turn(player=player, on_audio=lambda pcm: None)
    assert first.item_id == "item_1" and first.response is not None
    assert (first.response.num_pauses, first.response.num_resumes, first.response.paused) == (1, 1, False)
    assert [d["item_id"] for d in first.discarded] == ["item_2"]
    playback = player.playbacks["r_1"]
    assert playback.played_ms == 200 and playback.buffered_samples == 600 * 24  # the pause lost nothing
    heard.append(playback.take_played())
    second = await client.voice_turn(player=player)
    # item_3 paused the answer at 300 ms, and its words cut it there
    assert second.item_id == "item_3" and second.transcript == "Stop, please."
    assert client.sent == [{"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 300}]
    heard.append(playback.take_played())
    assert positions(b"".join(heard)) == expected(300)


async def test_a_discarded_partial_is_not_the_turn() -> None:
    clock = Clock()
    events = [
        {"type": "input_audio.speech_started", "item_id": "item_1"},
        {"type": "input_audio.transcript", "item_id": "item_1", "text": "hmm", "final": False},
        {"type": "input_audio.discarded", "item_id": "item_1", "reason": "backchannel", "transcript": "hmm"},
        {"type": "input_audio.speech_started", "item_id": "item_2"},
        {"type": "input_audio.committed", "item_id": "item_2", "audio_start_ms": 0, "audio_end_ms": 900},
        {"type": "input_audio.transcript", "item_id": "item_2", "text": "Hello there.", "final": True},
        {
            "type": "response.created",
            "response_id": "r_2",
            "stream_id": "2",
            "resume_token": "t",
            "input_item_id": "item_2",
        },
        {"type": "response.done", "response_id": "r_2", "stream_id": "2", "end": 0, "finish_reason": "stop"},
    ]
    client = ScriptedVoiceClient(events, clock, {})
    turn = await client.voice_turn()
    assert (turn.item_id, turn.transcript) == ("item_2", "Hello there.")
    assert [d["item_id"] for d in turn.discarded] == ["item_1"]


@pytest.mark.parametrize(("announced", "mode"), [(None, "immediate"), ({"mode": "confirm"}, "confirm")])
async def test_the_mode_in_force_comes_from_session_updated(announced: Any, mode: str) -> None:
    detection: dict[str, Any] = {"type": "semantic_vad"}
    if announced is not None:
        detection["interruption"] = announced
    updated = {
        "type": "session.updated",
        "session": {"audio": {"input": {"sample_rate": 16000, "turn_detection": detection}, "output": None}},
    }
    client = ScriptedVoiceClient([updated], Clock(), {})
    await client.update(audio=voice_settings())
    assert client.interruption_mode == mode and client.player().mode == mode


def test_a_response_that_starts_while_held_ends_the_held_answer() -> None:
    player, clock = scripted_answer()
    player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "stop"})
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    clock.tick(100)
    cancel = player.take(created("r_2", "item_2"))
    assert cancel == {"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 300}
    assert not player.paused and player.current is player.playbacks["r_2"]


def test_a_backchannel_that_turns_into_a_question_is_cut_at_its_end_after_the_resume() -> None:
    player, clock = scripted_answer()
    player.take({"type": "response.done", "response_id": "r_1", "finish_reason": "stop"})
    player.take({"type": "input_audio.speech_started", "item_id": "item_2"})
    player.take({"type": "response.audio.paused", "response_id": "r_1", "end_ms": 1000})
    clock.tick(300)
    player.take(
        {"type": "response.audio.resumed", "response_id": "r_1", "from_ms": 1000}
    )  # "yeah" at a pause
    assert not player.paused and player.judging == "item_2"
    clock.tick(200)  # plays on while the user goes on: "but what about Tuesday?"
    player.take({"type": "input_audio.speech_stopped", "item_id": "item_2"})
    player.take(
        {"type": "input_audio.committed", "item_id": "item_2", "audio_start_ms": 0, "audio_end_ms": 900}
    )
    final = {
        "type": "input_audio.transcript",
        "item_id": "item_2",
        "text": "Yeah, but Tuesday?",
        "final": True,
    }
    assert player.take(final) == {"type": "response.cancel", "response_id": "r_1", "audio_end_ms": 500}
    assert player.judging is None
