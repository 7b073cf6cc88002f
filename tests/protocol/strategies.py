"""Hypothesis strategies for every v1 event, within the protocol's rules."""

from __future__ import annotations

from hypothesis import strategies as st

from bargein.protocol import events as ev

# Strings as a real client sends them: any code point UTF-8 can carry.
text = st.text(st.characters(codec="utf-8"), max_size=20)
ids = st.text(st.characters(codec="utf-8"), min_size=1, max_size=64)
counts = st.integers(0, 2**63 - 1)
client_counts = st.integers(0, ev.MAX_OFFSET)  # what a client may send (offsets, counts)


def _opt(strategy: st.SearchStrategy) -> st.SearchStrategy:  # type: ignore[type-arg]
    return st.none() | strategy


event_id = _opt(st.text(st.characters(codec="utf-8"), max_size=64))
stop = st.lists(st.text(st.characters(codec="utf-8"), min_size=1, max_size=8), max_size=4).map(tuple)
sampling = {
    "max_tokens": _opt(st.integers(1, ev.MAX_OFFSET)),
    "temperature": _opt(st.floats(0, 100, allow_nan=False) | st.integers(0, 5).map(float)),
    "top_p": _opt(st.floats(0, 1, exclude_min=True)),
    "top_k": _opt(st.integers(0, 50_000)),
    "seed": _opt(st.integers(0, 2**63 - 1)),
    "stop": _opt(stop),
}
input_item = st.builds(ev.InputItem, role=st.sampled_from(["system", "user", "assistant"]), content=text)
defaults = st.builds(ev.SamplingDefaults, **sampling)

# Audio: pcm16 is whole samples (an even number of bytes) from a client.
pcm16 = st.binary(max_size=64).map(lambda b: b[: len(b) // 2 * 2])
sample_rates = st.sampled_from([16000, 24000])
turn_detection = st.just(ev.TURN_DETECTION_OFF) | st.builds(
    ev.TurnDetectionSettings,
    type=_opt(st.just("server_vad")),
    threshold=_opt(st.floats(0, 1, exclude_min=True, exclude_max=True)),
    prefix_padding_ms=_opt(st.integers(0, 10_000)),
    silence_duration_ms=_opt(st.integers(0, 10_000)),
    interrupt_response=_opt(st.booleans()),
    create_response=_opt(st.booleans()),
)
audio_output = st.just(ev.AUDIO_OUTPUT_OFF) | st.builds(
    ev.AudioOutputSettings, sample_rate=_opt(sample_rates), voice=_opt(ids)
)
audio_settings = st.builds(
    ev.AudioSettings,
    input=_opt(
        st.builds(ev.AudioInputSettings, sample_rate=_opt(sample_rates), turn_detection=_opt(turn_detection))
    ),
    output=_opt(audio_output),
)
modalities = st.sampled_from([("text",), ("text", "audio"), ("audio", "text")])

settings = st.builds(
    ev.SessionSettings,
    instructions=_opt(text),
    defaults=_opt(defaults),
    on_disconnect=_opt(st.sampled_from(["continue", "cancel"])),
    include_token_ids=_opt(st.booleans()),
    audio=_opt(audio_settings),
)

client_events = st.one_of(
    st.builds(ev.SessionUpdate, session=settings, event_id=event_id),
    st.builds(
        ev.ResponseCreate,
        response_id=_opt(ids),
        input=_opt(st.lists(input_item, max_size=3).map(tuple)),
        interrupt_active=_opt(st.booleans()),
        modalities=_opt(modalities),
        event_id=event_id,
        **sampling,
    ),
    st.builds(
        ev.ResponseCancel,
        response_id=ids,
        heard_chars=_opt(client_counts),
        audio_end_ms=_opt(client_counts),
        event_id=event_id,
    ),
    st.builds(
        ev.StreamResume,
        stream_id=ids,
        resume_token=text,
        from_=client_counts,
        audio_from_ms=_opt(client_counts),
        event_id=event_id,
    ),
    st.builds(ev.SessionResume, session_id=ids, session_token=text, event_id=event_id),
    st.builds(ev.Ping, event_id=event_id),
    st.builds(ev.InputAudioAppend, audio=pcm16, event_id=event_id),
    st.builds(ev.InputAudioCommit, event_id=event_id),
    st.builds(ev.InputAudioClear, event_id=event_id),
)

server_events = st.one_of(
    st.builds(
        ev.SessionCreated,
        session_id=ids,
        session_token=text,
        model=text,
        limits=st.builds(
            ev.Limits,
            max_frame_bytes=counts,
            max_prompt_tokens=counts,
            max_tokens=counts,
            max_context_tokens=counts,
            max_conversation_bytes=_opt(counts),
            max_input_audio_ms=_opt(counts),
        ),
    ),
    st.builds(ev.SessionUpdated, session=settings),
    st.builds(
        ev.SessionResumed,
        session_id=ids,
        turns=counts,
        active=_opt(
            st.builds(ev.ActiveStream, response_id=ids, stream_id=ids, resume_token=text, end=counts)
        ),
    ),
    st.builds(ev.ResponseCreated, response_id=ids, stream_id=ids, resume_token=text, input_item_id=_opt(ids)),
    st.builds(
        ev.ResponseDelta,
        response_id=ids,
        stream_id=ids,
        start=counts,
        end=counts,
        text=text,
        token_ids=_opt(st.lists(st.integers(0, 2**31), max_size=5).map(tuple)),
    ),
    st.builds(
        ev.ResponseDone,
        response_id=ids,
        stream_id=ids,
        end=counts,
        finish_reason=st.sampled_from(["stop", "length", "interrupted", "cancelled", "error"]),
        usage=st.builds(ev.Usage, prompt_tokens=counts, completion_tokens=counts, cached_tokens=counts),
    ),
    st.builds(
        ev.StreamResumed,
        stream_id=ids,
        response_id=ids,
        from_=counts,
        status=st.sampled_from(["live", "complete"]),
    ),
    st.builds(
        ev.ErrorEvent,
        code=st.sampled_from(ev.ErrorCode),
        message=text,
        retryable=st.booleans(),
        retry_after_ms=_opt(counts),
        event_id=event_id,
        response_id=_opt(ids),
    ),
    st.just(ev.Pong()),
    st.builds(ev.InputAudioSpeechStarted, audio_start_ms=counts, item_id=_opt(ids)),
    st.builds(ev.InputAudioSpeechStopped, audio_end_ms=counts, item_id=_opt(ids)),
    st.builds(ev.InputAudioCommitted, item_id=ids, audio_start_ms=counts, audio_end_ms=counts),
    st.builds(
        ev.InputAudioTranscript,
        item_id=ids,
        text=text,
        final=st.booleans(),
        error=_opt(st.builds(ev.TranscriptionError, code=st.sampled_from(ev.ErrorCode), message=text)),
    ),
    st.builds(
        ev.ResponseAudioDelta,
        response_id=ids,
        stream_id=ids,
        audio=st.binary(max_size=64),
        start_ms=counts,
        end_ms=counts,
        text_end=counts,
    ),
    st.builds(ev.ResponseAudioDone, response_id=ids, stream_id=ids, end_ms=counts),
)
