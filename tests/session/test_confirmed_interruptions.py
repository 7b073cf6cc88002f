"""The confirm mode's judgements racing the end of the speech (``session/voice_runtime/interruptions.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from bargein.session.voice_runtime.interruptions import ConfirmedInterruptions
from bargein.voice.interruption import Interruption


class FakeSpeaker:
    """An answer being spoken: paused, stopped or resumed by the judgements."""

    response_id, stream_id, sent_end_ms = "story", "s1", 1200
    stopped = False

    def heard_text(self, now: float, *, before_ms: int, after_ms: int) -> str:
        return "Once upon a time"

    def pause(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def resume(self) -> None:
        pass


class Observer:
    def interruption_decided(self, **_: Any) -> None:
        pass


async def test_speech_confirmed_while_its_end_was_judged_is_the_turn() -> None:
    """The pause's judgement confirms the interruption (the answer is cut)
    while the judgement of the whole speech, started at its end, is still
    running and then reads no interruption: the speech must still be the
    user's turn (CI saw the turn never committed after such a cut)."""
    whole_done = asyncio.Event()
    cuts: list[list[str]] = []
    sent: list[Any] = []

    async def transcribe(audio: Any, span: tuple[int, int]) -> str:
        if span[1] == 900:  # the pause: the user's own words
            return "Stop, tell me about dogs instead."
        await whole_done.wait()  # the whole speech: slower, and heard as a backchannel
        return "mm-hm"

    async def cut(response_ids: list[str], now: float) -> None:
        cuts.append(list(response_ids))

    async def send(event: Any) -> None:
        sent.append(event)

    def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        return asyncio.create_task(coro, name=name)

    confirm = ConfirmedInterruptions(
        send=send,
        transcribe=transcribe,
        cut=cut,
        spawn=spawn,
        clock=lambda: 0.0,
        observer=Observer(),  # type: ignore[arg-type]
    )
    speaker = FakeSpeaker()
    confirm.pause(
        [speaker],  # type: ignore[list-item]
        item_id="item_1",
        audio_start_ms=0,
        onset_ms=100,
        config=Interruption(mode="confirm"),
        now=0.0,
    )
    confirm.paused(None, (0, 900))
    ended = asyncio.create_task(confirm.ended(None, (0, 2000)))
    for _ in range(20):  # the pause's judgement runs and cuts
        await asyncio.sleep(0)
    assert cuts == [["story"]] and speaker.stopped
    whole_done.set()
    assert await ended is True
    assert not [e for e in sent if type(e).__name__ == "InputAudioDiscarded"]
