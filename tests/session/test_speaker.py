"""Speaker: a response's delivered text spoken as ``response.audio.delta`` events.

With a stand-in synthesizer (``tests/session/voice_fakes.py``: 20 ms of audio
a character at 24 kHz, each word ending where its characters end), so every
offset below can be computed by hand. The real synthesizer is exercised end
to end in ``tests/app/test_voice.py``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import pytest

from bargein.protocol import events as pe
from bargein.session.runtime.delivery import Delivery
from bargein.session.streams.log import MemoryTokenLog, StreamEnd, StreamWrite
from bargein.session.voice_runtime.speaker import Speaker
from tests.session.test_delivery import BrokenReadLog, new_stream, step
from tests.session.voice_fakes import FakeSynth
from tests.waiting import HANG_GUARD_S, wait_until

RATE = 24000
MS_PER_CHAR = 20  # FakeSynth's 480 samples a character at 24 kHz
TEXT = "Paris is the capital of France. It sits on the Seine, a long river; boats go by."


class Wire:
    """Records what the speaker sends, with the text fed before each send;
    the send of event number ``block_at`` waits until ``gate`` opens (a slow
    socket), the others yield once."""

    def __init__(self, block_at: int | None = None) -> None:
        self.events: list[Any] = []
        self.fed_at_send: list[int] = []
        self.fed = 0
        self.block_at = block_at
        self.gate = asyncio.Event()

    async def send(self, event: object) -> None:
        self.events.append(event)
        self.fed_at_send.append(self.fed)
        if len(self.events) - 1 == self.block_at:
            await self.gate.wait()
        else:
            await asyncio.sleep(0)

    def audio(self) -> list[pe.ResponseAudioDelta]:
        return [e for e in self.events if isinstance(e, pe.ResponseAudioDelta)]


async def in_thread(fn: Any) -> Any:
    return await asyncio.to_thread(fn)


def speaker(wire: Wire, synth: FakeSynth, *, skip_before_ms: int = 0) -> Speaker:
    return Speaker(
        synth,
        response_id="r1",
        stream_id="s1",
        sample_rate=RATE,
        send=wire.send,
        run_blocking=in_thread,
        skip_before_ms=skip_before_ms,
        clock=time.monotonic,
    )


async def speak(
    text: str, pieces: list[int], *, skip_before_ms: int = 0, synth: FakeSynth | None = None
) -> Wire:
    """Feed ``text`` cut at ``pieces``, letting the worker run between feeds, then finish."""
    wire = Wire()
    s = speaker(wire, synth or FakeSynth(), skip_before_ms=skip_before_ms)
    lo = 0
    for hi in [*pieces, len(text)]:
        wire.fed += hi - lo
        s.feed(text[lo:hi])
        lo = hi
        for _ in range(5):
            await asyncio.sleep(0)
    await asyncio.wait_for(s.finish(), HANG_GUARD_S)
    return wire


async def test_audio_is_contiguous_and_text_end_grows_within_the_text_fed() -> None:
    wire = await speak(TEXT, [3, 9, 20, 31, 33, 50, 60])
    audio = wire.audio()
    assert audio and isinstance(wire.events[-1], pe.ResponseAudioDone)
    assert wire.events[-1].end_ms == audio[-1].end_ms  # the length of the audio sent
    assert [a.start_ms for a in audio] == [0] + [a.end_ms for a in audio[:-1]]
    text_ends = [a.text_end for a in audio]
    assert text_ends == sorted(text_ends)
    for event, fed in zip(wire.events, wire.fed_at_send, strict=True):
        if isinstance(event, pe.ResponseAudioDelta):
            assert event.text_end <= fed  # never ahead of the text the client has
            assert len(event.audio) == 2 * RATE * (event.end_ms - event.start_ms) // 1000
            assert event.end_ms - event.start_ms <= 200  # chunk_ms
    assert text_ends[-1] == len(TEXT)  # all of it was spoken
    # the timeline is the text's: 20 ms a character (every segment is spoken)
    assert audio[-1].end_ms == len(TEXT) * MS_PER_CHAR


async def test_the_first_word_is_spoken_alone_and_a_cut_in_it_keeps_that_word() -> None:
    """Fed token by token, the first audio is the first word's, synthesized
    once the next token shows the word ended; what the user heard maps to
    characters across the first segment's end as everywhere else."""
    wire = Wire()
    synth = FakeSynth()
    s = speaker(wire, synth)
    for token in ("Par", "is"):
        s.feed(token)
        wire.fed += len(token)
    for _ in range(5):
        await asyncio.sleep(0)
    assert synth.texts == []  # "Paris" may still go on
    s.feed(" is")
    wire.fed += 3
    await wait_until(lambda: wire.audio(), "the first word's audio")
    assert synth.texts == ["Paris"]
    first = wire.audio()[0]
    assert (first.start_ms, first.end_ms, first.text_end) == (0, 5 * MS_PER_CHAR, len("Paris"))
    assert s.cut_chars(40) == len("Paris")  # heard inside the first word: cut after it
    rest = TEXT[len("Paris is") :]
    s.feed(rest)
    wire.fed += len(rest)
    await asyncio.wait_for(s.finish(), HANG_GUARD_S)
    assert synth.texts[1] == " is the capital of France."  # then clause by clause
    assert "".join(synth.texts) == TEXT
    at_second = 5 * MS_PER_CHAR + len(" is") * MS_PER_CHAR
    assert s.cut_chars(5 * MS_PER_CHAR) == len("Paris")  # heard the first segment exactly
    assert s.cut_chars(at_second - 1) == len("Paris is")  # one word into the second
    assert wire.audio()[-1].text_end == len(TEXT)


async def test_the_audio_does_not_depend_on_how_the_text_was_chunked() -> None:
    one = await speak(TEXT, [])
    many = await speak(TEXT, list(range(1, len(TEXT))))
    timeline = [(a.start_ms, a.end_ms, a.text_end) for a in one.audio()]
    assert timeline == [(a.start_ms, a.end_ms, a.text_end) for a in many.audio()]


async def test_no_audio_goes_out_after_stop_and_audio_done_ends_at_the_last_delta() -> None:
    wire = Wire(block_at=1)  # the second delta is on a slow wire
    s = speaker(wire, FakeSynth())
    wire.fed = len(TEXT)
    s.feed(TEXT)
    await wait_until(lambda: len(wire.audio()) == 2, "the second delta on the slow wire")
    s.stop()  # a barge-in while the second delta is being written
    sent = len(wire.audio())
    wire.gate.set()
    # finish() returns once the worker has ended: whatever it would still send is sent by then
    await asyncio.wait_for(s.finish(), HANG_GUARD_S)
    assert len(wire.audio()) == sent
    done = wire.events[-1]
    assert isinstance(done, pe.ResponseAudioDone)
    assert done.end_ms == wire.audio()[-1].end_ms
    # the cut counts every delta written, the one in flight at the stop included
    assert s.cut_chars(None) >= wire.audio()[-1].text_end


async def test_a_stop_during_synthesis_sends_no_audio_of_it() -> None:
    wire = Wire()
    synth = FakeSynth()
    synth.gate.clear()
    s = speaker(wire, synth)
    s.feed(TEXT)
    await wait_until(lambda: synth.texts, "the synthesis to start")
    s.stop()
    synth.gate.set()
    await asyncio.wait_for(s.finish(), HANG_GUARD_S)
    await wait_until(lambda: synth.finished, "the synthesis thread to end")  # nothing of it goes out
    assert wire.events == [pe.ResponseAudioDone(response_id="r1", stream_id="s1", end_ms=0)]
    assert s.cut_chars(None) == 0


async def test_a_response_without_text_has_its_audio_done_at_zero() -> None:
    wire = Wire()
    s = speaker(wire, FakeSynth())
    await s.finish()
    assert wire.events == [pe.ResponseAudioDone(response_id="r1", stream_id="s1", end_ms=0)]


async def test_cuts_fall_on_word_boundaries_at_most_one_word_past_what_was_heard() -> None:
    wire = Wire()
    s = speaker(wire, FakeSynth())
    s.feed(TEXT)
    await s.finish()
    words = [m.end() for m in re.finditer(r"\S+", TEXT)]
    last = 0
    for ms in range(0, len(TEXT) * MS_PER_CHAR + 300, 7):
        cut = s.cut_chars(ms)
        assert cut == 0 or cut in words, (ms, cut, TEXT[:cut])
        assert cut >= last  # monotone
        last = cut
        # the words whose audio ended by ms (FakeSynth: char_end * 20 ms), plus the one being spoken
        heard = sum(1 for end in words if end * MS_PER_CHAR <= ms)
        assert len(TEXT[:cut].split()) <= heard + 1
        assert len(TEXT[:cut].split()) >= heard
    assert s.cut_chars(None) == len(TEXT)
    assert s.cut_chars(2**31 - 1) == len(TEXT)  # past the audio: all of it


async def test_a_resume_re_derives_the_same_timeline_from_audio_from_ms() -> None:
    first = (await speak(TEXT, [10, 40])).audio()
    from_ms = 1234  # inside a chunk
    again = (await speak(TEXT, [5], skip_before_ms=from_ms)).audio()
    assert again[0].start_ms == from_ms
    holding = next(a for a in first if a.start_ms <= from_ms < a.end_ms)
    assert (again[0].end_ms, again[0].text_end) == (holding.end_ms, holding.text_end)
    after = [(a.start_ms, a.end_ms, a.text_end) for a in first if a.start_ms > from_ms]
    assert [(a.start_ms, a.end_ms, a.text_end) for a in again[1:]] == after
    assert len(again[0].audio) == 2 * RATE * (holding.end_ms - from_ms) // 1000


async def test_a_resume_past_the_audio_sends_only_the_audio_done() -> None:
    wire = await speak(TEXT, [], skip_before_ms=10**6)
    assert [type(e) for e in wire.events] == [pe.ResponseAudioDone]


async def test_a_resume_synthesizes_only_from_the_segment_that_holds_audio_from_ms() -> None:
    first_synth = FakeSynth()
    first = (await speak(TEXT, [], synth=first_synth)).audio()
    segments = first_synth.texts  # "Paris", " is the capital of France.", ...
    starts_ms = [sum(map(len, segments[:i])) * MS_PER_CHAR for i in range(len(segments))]
    for from_ms in (0, starts_ms[1] - 1, starts_ms[1], starts_ms[2] + 5):
        synth = FakeSynth()
        again = (await speak(TEXT, [], skip_before_ms=from_ms, synth=synth)).audio()
        held = max(i for i, start in enumerate(starts_ms) if start <= from_ms)
        # the segment holding from_ms and those after it are synthesized, the others only timed
        assert synth.texts == segments[held:], from_ms
        # timed first: those starting before from_ms (the one holding it too, if it does)
        assert synth.timed == [seg for seg, start in zip(segments, starts_ms, strict=True) if start < from_ms]
        tail = [(a.start_ms, a.end_ms, a.text_end) for a in first if a.end_ms > from_ms]
        assert [(a.end_ms, a.text_end) for a in again] == [(e, t) for _, e, t in tail]


async def test_a_resume_at_the_end_synthesizes_nothing_and_gives_the_audio_length() -> None:
    synth = FakeSynth()
    wire = await speak(TEXT, [], skip_before_ms=len(TEXT) * MS_PER_CHAR, synth=synth)
    assert [type(e) for e in wire.events] == [pe.ResponseAudioDone]
    assert wire.events[0].end_ms == len(TEXT) * MS_PER_CHAR
    assert synth.texts == []  # every segment placed by its timing alone
    assert "".join(synth.timed) == TEXT


async def test_a_synthesis_failure_costs_the_audio_not_the_response(caplog: pytest.LogCaptureFixture) -> None:
    wire = Wire()
    synth = FakeSynth()
    synth.fail = "Seine"
    s = speaker(wire, synth)
    with caplog.at_level(logging.ERROR, logger="bargein.session.voice_runtime.speaker"):
        s.feed(TEXT)
        await asyncio.wait_for(s.finish(), HANG_GUARD_S)
    audio = wire.audio()
    assert audio and audio[-1].text_end < TEXT.index("Seine")
    assert isinstance(wire.events[-1], pe.ResponseAudioDone) and wire.events[-1].end_ms == audio[-1].end_ms
    assert "speech synthesis failed" in caplog.text


# ---- with a delivery: the order of a spoken response's events ----------------------


def is_audio(event: object) -> bool:
    return isinstance(event, (pe.ResponseAudioDelta, pe.ResponseAudioDone))


def check_order(events: list[Any]) -> None:
    """Audio deltas, then one audio.done, all before the response's end (done or error)."""
    kinds = [type(e) for e in events]
    assert kinds.count(pe.ResponseAudioDone) == 1, kinds
    done_at = kinds.index(pe.ResponseAudioDone)
    assert all(not is_audio(e) for e in events[done_at + 1 :]), kinds
    end_at = next(i for i, e in enumerate(events) if isinstance(e, (pe.ResponseDone, pe.ErrorEvent)))
    assert done_at < end_at, kinds
    sent = 0
    for event in events:
        if isinstance(event, pe.ResponseDelta):
            sent += len(event.text)
        elif isinstance(event, pe.ResponseAudioDelta):
            assert event.text_end <= sent


WORDS = ["Paris", " is", " the", " capital", " of", " France", "."]


async def write_all(log: MemoryTokenLog, reason: str = "stop") -> None:
    for i in range(len(WORDS)):
        await log.write_step(step(i))
    end = StreamEnd(
        end=len(WORDS), finish_reason=reason, prompt_tokens=9, completion_tokens=len(WORDS), cached_tokens=0
    )
    await log.write_step([StreamWrite(stream_id="s1", entry=None, finish=end)])


def delivery(log: MemoryTokenLog, wire: Wire, s: Speaker) -> Delivery:
    return Delivery(log, response_id="r1", stream_id="s1", from_offset=0, send=wire.send, subscribers=(s,))


async def test_a_delivered_response_is_spoken_whole_before_its_done() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    await write_all(log)
    wire = Wire()
    await asyncio.wait_for(delivery(log, wire, speaker(wire, FakeSynth())).run(), HANG_GUARD_S)
    check_order(wire.events)
    assert isinstance(wire.events[-1], pe.ResponseDone)
    assert wire.audio()[-1].text_end == len("".join(WORDS))


async def test_an_interrupted_response_sends_its_audio_done_then_its_done() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    wire = Wire()
    s = speaker(wire, FakeSynth())
    fed: list[str] = []  # the delivery feeds its subscribers what it hands on_delivered, at once
    task = asyncio.create_task(
        Delivery(
            log,
            response_id="r1",
            stream_id="s1",
            from_offset=0,
            send=wire.send,
            subscribers=(s,),
            on_delivered=fed.append,
        ).run()
    )
    await log.write_step(step(0))
    await wait_until(lambda: "".join(fed) == WORDS[0], "the first word fed to the speaker")
    s.stop()  # a barge-in, before the first word is known to end: nothing of it spoken
    for i in range(1, len(WORDS)):
        await log.write_step(step(i))
    end = StreamEnd(end=7, finish_reason="interrupted", prompt_tokens=9, completion_tokens=7, cached_tokens=0)
    await log.write_step([StreamWrite(stream_id="s1", entry=None, finish=end)])
    await asyncio.wait_for(task, HANG_GUARD_S)
    check_order(wire.events)
    assert not wire.audio()
    assert isinstance(wire.events[-1], pe.ResponseDone) and wire.events[-1].finish_reason == "interrupted"


@pytest.mark.parametrize("exc", [RuntimeError("injected"), None])
async def test_a_failed_delivery_ends_its_audio_before_the_error(exc: BaseException | None) -> None:
    log = BrokenReadLog(exc)
    await new_stream(log)
    await log.write_step(step(0))
    wire = Wire()
    await asyncio.wait_for(delivery(log, wire, speaker(wire, FakeSynth())).run(), HANG_GUARD_S)
    check_order(wire.events)
    assert isinstance(wire.events[-1], pe.ErrorEvent)


async def test_a_delivery_cancelled_while_its_audio_is_synthesized_is_cancelled() -> None:
    log = MemoryTokenLog()
    await new_stream(log)
    await write_all(log)
    wire = Wire()
    synth = FakeSynth()
    synth.gate.clear()
    s = speaker(wire, synth)
    finishing = asyncio.Event()
    finish = s.finish

    async def noted_finish() -> None:
        finishing.set()
        await finish()

    s.finish = noted_finish  # type: ignore[method-assign]
    task = asyncio.create_task(delivery(log, wire, s).run())
    await wait_until(lambda: synth.texts, "the synthesis to start")
    # the delivery waits in Speaker.finish for the synthesis
    await asyncio.wait_for(finishing.wait(), HANG_GUARD_S)
    task.cancel()  # the connection closed
    try:
        await asyncio.wait_for(asyncio.shield(task), HANG_GUARD_S)
    except asyncio.CancelledError:
        pass
    finally:
        synth.gate.set()
    assert task.cancelled()  # not swallowed
    assert not [e for e in wire.events if isinstance(e, (pe.ResponseDone, pe.ResponseAudioDone))]


def test_the_playback_estimate_stalls_where_the_audio_ran_dry_and_holds_while_paused() -> None:
    """played_ms: a chunk plays from when it was sent or when the audio before
    it ends, whichever is later (a synthesis underrun leaves the client
    silent), and a pause holds it; a confirmed interruption cuts there."""
    now = [10.0]
    s = Speaker(
        FakeSynth(),
        response_id="r1",
        stream_id="s1",
        sample_rate=RATE,
        send=Wire().send,
        run_blocking=in_thread,
        clock=lambda: now[0],
    )
    assert s.played_ms(10.0) == 0  # nothing sent
    s._scheduled(10.0, 0, 200)
    s._scheduled(10.01, 200, 400)  # queued behind the first: back to back
    s._scheduled(10.9, 400, 600)  # the client ran dry at 10.4
    s.sent_end_ms = 600
    assert s.played_ms(10.3) == 300
    assert s.played_ms(10.6) == 400  # silent until the chunk arrived
    assert s.played_ms(11.0) == 500
    now[0] = 11.0
    s.pause()
    assert s.played_ms(11.8) == 500
    now[0] = 12.0
    s.resume()
    assert s.played_ms(12.05) == 550
    assert s.played_ms(13.0) == 600  # never past what was sent


async def test_a_call_answer_says_the_filler_without_moving_text_end() -> None:
    wire = Wire()
    synth = FakeSynth()
    s = Speaker(
        synth,
        response_id="r1",
        stream_id="s1",
        sample_rate=RATE,
        send=wire.send,
        run_blocking=in_thread,
        clock=time.monotonic,
        tool_filler="One moment.",
    )
    s.on_delta("")  # a call's JSON is never fed: the delivery passes no text of it
    s.on_calls()
    await s.on_end()
    audio = wire.audio()
    assert audio and audio[-1].end_ms == len("One moment.") * MS_PER_CHAR
    assert {a.text_end for a in audio} == {0}  # no part of the response text
    (done,) = [e for e in wire.events if isinstance(e, pe.ResponseAudioDone)]
    assert done.end_ms == audio[-1].end_ms
    assert s.cut_chars(None) == 0


async def test_without_a_filler_a_call_answer_has_no_audio() -> None:
    wire = Wire()
    s = speaker(wire, FakeSynth())
    s.on_calls()
    await s.on_end()
    assert wire.audio() == []
    assert [e.end_ms for e in wire.events if isinstance(e, pe.ResponseAudioDone)] == [0]
