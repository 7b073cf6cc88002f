"""Partial transcripts and the speculative prefill of a voice turn, with the
voice fakes (a scripted transcriber, a VAD that hears loud frames) and the
stepped engine: what is shown, in which order, what is prefilled, what the
turn's end reuses, and what a busy pool skips."""

from __future__ import annotations

from typing import Any

from bargein.protocol import events as pe
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.session.voice_runtime.partials import PartialTranscript, stable_text
from tests.session.voice_fakes import Client as VoiceClient
from tests.session.voice_fakes import (
    FakeModels,
    FakeSynth,
    FakeTranscriber,
    FakeVad,
    done,
    silence,
    speech,
    voice_service,
)

NO_SPECULATION = VoiceConfig(speculate=False)
PAUSE = silence(256)  # 8 frames: past pause_ms (200), short of the 500 ms window


async def client(*texts: str, config: VoiceConfig = NO_SPECULATION) -> VoiceClient:
    models = FakeModels(vad=FakeVad(), transcriber=FakeTranscriber(*texts), synthesizer=FakeSynth())
    service, engine, models = await voice_service(models, config=config)
    return VoiceClient(service, engine, models)


def transcripts(c: VoiceClient) -> list[tuple[str, bool]]:
    return [(e.text, e.final) for e in c.of(pe.InputAudioTranscript)]


def prefills(c: VoiceClient) -> list[Any]:
    return [r for r in c.engine.requests if r.prefill_only]


def test_a_partial_is_shown_only_while_it_extends_the_last_one() -> None:
    assert stable_text("  I'd like a table for. ") == "I'd like a table for"
    partial = PartialTranscript("item_1")
    assert partial.next("I'd like.") == "I'd like"
    assert partial.next("I'd like.") is None  # nothing new
    assert partial.next("I would like a table") is None  # revises shown words
    assert partial.next("I'd like a table, for") == "I'd like a table, for"
    assert partial.next("") is None
    assert (partial.shown, partial.num_skipped) == ("I'd like a table, for", 1)


async def test_partials_extend_one_another_before_the_final_and_each_pause_prefills_the_turn() -> None:
    c = await client("Book a table.", "Book a table for two.", "Book a table for two at seven.")
    try:
        await c.voice_session(output=False)
        await c.audio(silence(320) + speech(640) + PAUSE)
        await c.wait_for(pe.InputAudioTranscript)
        await c.wait_until(lambda: len(prefills(c)) == 1, "the first pause prefilled")
        await c.audio(speech(640) + PAUSE)
        await c.wait_for(pe.InputAudioTranscript, 2)
        await c.wait_until(lambda: len(prefills(c)) == 2, "the second pause prefilled")
        first, second = prefills(c)
        assert first.request_id != second.request_id
        assert c.engine.aborted[0][0] == first.request_id  # one prefill per connection: the newer replaces it
        # the prefill's prompt: the conversation, then the turn's words so far as the user's item
        prefilled = c.engine.tokenizer.conversations[-1]  # type: ignore[attr-defined]
        assert prefilled[-1] == {"role": "user", "content": "Book a table for two."}
        # the third pause and the turn's end at it, in one append
        await c.audio(speech(640) + silence(800), chunk_ms=2000)
        (created,) = await c.wait_for(pe.ResponseCreated)
        assert transcripts(c) == [
            ("Book a table", False),
            ("Book a table for two", False),
            ("Book a table for two at seven.", True),
        ]
        names = c.kinds()
        last_partial = max(
            i for i, e in enumerate(c.events) if isinstance(e, pe.InputAudioTranscript) and not e.final
        )
        assert last_partial < names.index("InputAudioSpeechStopped") < names.index("InputAudioCommitted")
        # the turn ended at the pause just transcribed: its transcript was reused, not made again
        assert c.models.transcriber.finished == 3  # type: ignore[attr-defined]
        assert len(prefills(c)) == 2  # the turn's own request came at once: no prefill for it
        real = [r for r in c.engine.requests if not r.prefill_only]
        assert len(real) == 1 and real[0].request_id == created.stream_id
        committed = c.of(pe.InputAudioCommitted)[0]
        assert {e.item_id for e in c.of(pe.InputAudioTranscript)} == {committed.item_id}
    finally:
        await done(c)


async def test_a_revised_guess_is_not_shown_and_the_final_carries_the_turn() -> None:
    c = await client("Book a table.", "Look, a table for two.", "Look, a table for two at seven.")
    try:
        await c.voice_session(output=False)
        await c.audio(silence(320) + speech(640) + PAUSE)
        await c.wait_for(pe.InputAudioTranscript)
        await c.audio(speech(640) + PAUSE)
        await c.wait_until(lambda: c.models.transcriber.finished == 2, "the second pause transcribed")  # type: ignore[attr-defined]
        await c.audio(speech(640) + silence(800), chunk_ms=2000)
        await c.wait_for(pe.ResponseCreated)
        assert transcripts(c) == [("Book a table", False), ("Look, a table for two at seven.", True)]
    finally:
        await done(c)


async def test_a_busy_voice_pool_skips_partials_and_prefills() -> None:
    c = await client("What time is it?", config=VoiceConfig(speculate=False, workers=1))
    try:
        await c.voice_session(output=False)
        await c.audio(silence(320) + speech(640) + PAUSE)
        await c.audio(speech(640) + silence(800))
        await c.wait_for(pe.ResponseCreated)
        assert transcripts(c) == [("What time is it?", True)]  # no thread to spare: no partial
        assert not prefills(c)
    finally:
        await done(c)


async def test_without_prefill_the_partials_stay() -> None:
    c = await client(
        "Book a table.", "Book a table for two.", config=VoiceConfig(speculate=False, prefill=False)
    )
    try:
        await c.voice_session(output=False)
        await c.audio(silence(320) + speech(640) + PAUSE)
        await c.wait_for(pe.InputAudioTranscript)
        await c.audio(speech(640) + silence(800), chunk_ms=2000)
        await c.wait_for(pe.ResponseCreated)
        assert transcripts(c)[0] == ("Book a table", False) and not prefills(c)
    finally:
        await done(c)
