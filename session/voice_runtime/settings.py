"""A session's audio settings: the ones in force, merged from ``session.update``, echoed back.

:class:`SessionAudio` is what a connection's voice side runs with (input
rate, turn detection, output rate and voice); :func:`merged` applies the
wire's partial ``audio`` update to it field by field, or says which field is
out of range; :func:`as_event` is how ``session.updated`` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bargein.protocol import events as pe
from bargein.voice.audio import INPUT_RATES, OUTPUT_RATES
from bargein.voice.interruption import DEFAULT_INTERRUPTION, Interruption
from bargein.voice.semantic_turns import SemanticTurnDetection
from bargein.voice.turns import TurnDetection

DEFAULT_OUTPUT_RATE = 24000  # OpenAI's realtime default
DEFAULT_INPUT_RATE = 24000  # OpenAI's too; clients capturing at 16 kHz say so
DEFAULT_VOICE = "joe"
VOICES = ("joe",)  # Piper en_US-joe-medium (voice/tts.py)
# how a session finds its turns: server_vad's fixed silence, or semantic_vad's end-of-turn model
Detection = TurnDetection | SemanticTurnDetection


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionAudio:
    """The audio settings in force in one session: the defaults with every
    accepted ``session.update``'s ``audio`` (the wire's
    :class:`bargein.protocol.events.AudioSettings`, a partial update) merged in.

    Attributes:
        input_rate: Hz of ``input_audio.append`` PCM16.
        turn_detection: ``server_vad`` (:class:`TurnDetection`) or
            ``semantic_vad`` (:class:`SemanticTurnDetection`) parameters; None:
            no detection (the client commits its turns with ``input_audio.commit``).
        output_rate: Hz of ``response.audio.delta`` PCM16; None: text only.
        voice: the synthesizer voice.
    """

    input_rate: int = DEFAULT_INPUT_RATE
    turn_detection: Detection | None = TurnDetection()
    output_rate: int | None = None
    voice: str = DEFAULT_VOICE

    def __post_init__(self) -> None:
        if self.input_rate not in INPUT_RATES:
            raise ValueError(f"input sample_rate={self.input_rate} must be one of {list(INPUT_RATES)}")
        if self.output_rate is not None and self.output_rate not in OUTPUT_RATES:
            raise ValueError(f"output sample_rate={self.output_rate} must be one of {list(OUTPUT_RATES)}")


def merged(
    settings: SessionAudio, update: pe.AudioSettings, *, interruption: Interruption = DEFAULT_INTERRUPTION
) -> SessionAudio:
    """``settings`` with a ``session.update``'s ``audio`` merged field by field;
    ``interruption``: the endpoint's default, for a detection turned on from off.

    Raises:
        ValueError: a value is out of range (the message names the field).
    """
    new = settings
    if update.input is not None:
        if update.input.sample_rate is not None:
            new = replace(new, input_rate=update.input.sample_rate)
        if update.input.turn_detection is not None:
            new = replace(
                new,
                turn_detection=_merged_detection(
                    new.turn_detection, update.input.turn_detection, interruption
                ),
            )
    if update.output is not None:
        out = update.output
        if not out.enabled:
            new = replace(new, output_rate=None, voice=DEFAULT_VOICE)
        else:
            if out.voice is not None and out.voice not in VOICES:
                raise ValueError(f"session.audio.output.voice={out.voice!r} is not one of {list(VOICES)}")
            rate = out.sample_rate or new.output_rate or DEFAULT_OUTPUT_RATE
            new = replace(new, output_rate=rate, voice=out.voice or new.voice)
    return new


_PATH = "session.audio.input.turn_detection"
_SERVER_VAD_FIELDS = ("threshold", "prefix_padding_ms", "silence_duration_ms")
_SHARED_FIELDS = ("interrupt_response", "create_response")  # both types have them


def _merged_detection(
    current: Detection | None, td: pe.TurnDetectionSettings, default_interruption: Interruption
) -> Detection | None:
    """The turn detection in force after an update's ``turn_detection``: off
    for ``type: "none"``; the fields given merged into the detection in force
    when it has the same type; on a change of type, the new type's initial
    values with the shared fields (``interrupt_response``, ``create_response``)
    carried over.

    Raises:
        ValueError: fields without ``type`` while detection is off, or fields of
            the other type than the one in force.
    """
    if td.type == "none":
        return None  # its values are forgotten
    shared: dict[str, Any] = {k: getattr(td, k) for k in _SHARED_FIELDS if getattr(td, k) is not None}
    server = {k: getattr(td, k) for k in _SERVER_VAD_FIELDS if getattr(td, k) is not None}
    if td.type is None and current is None and (shared or server or td.eagerness or td.interruption):
        raise ValueError(f"{_PATH} is off: turn it on with type 'server_vad' or 'semantic_vad'")
    semantic = td.type == "semantic_vad" or (td.type is None and isinstance(current, SemanticTurnDetection))
    carried: dict[str, Any] = {"interruption": default_interruption}
    if current is not None:
        carried = {k: getattr(current, k) for k in (*_SHARED_FIELDS, "interruption")}
    if td.interruption is not None:
        shared["interruption"] = _merged_interruption(carried["interruption"], td.interruption)
    if semantic:
        if server:
            field = next(iter(server))
            raise ValueError(f"{_PATH}.{field} does not apply to semantic_vad (it takes eagerness)")
        base = current if isinstance(current, SemanticTurnDetection) else SemanticTurnDetection(**carried)
        if td.eagerness is not None:
            shared["eagerness"] = td.eagerness
        return replace(base, **shared)
    if td.eagerness is not None:
        raise ValueError(f"{_PATH}.eagerness applies to semantic_vad only: set type 'semantic_vad'")
    fields: dict[str, Any] = {**shared, **server}
    if "silence_duration_ms" in fields:
        # the pause that starts a speculative answer fits in any silence
        # window the protocol allows ([0, 10000] ms)
        fields["pause_ms"] = min(TurnDetection().pause_ms, server["silence_duration_ms"])
    base_vad = current if isinstance(current, TurnDetection) else TurnDetection(**carried)
    return replace(base_vad, **fields)


def _merged_interruption(current: Interruption, update: pe.InterruptionSettings) -> Interruption:
    """``current`` with the fields ``update`` gives (a list of backchannels replaces the list).

    Raises:
        ValueError: a value out of range (the message names it).
    """
    fields = {
        k: getattr(update, k)
        for k in ("mode", "min_words", "backchannels", "max_pause_ms")
        if getattr(update, k) is not None
    }
    try:
        return replace(current, **fields)
    except ValueError as exc:
        raise ValueError(f"{_PATH}.{exc}") from None


def _interruption_event(it: Interruption) -> pe.InterruptionSettings:
    return pe.InterruptionSettings(
        mode=it.mode, min_words=it.min_words, backchannels=it.backchannels, max_pause_ms=it.max_pause_ms
    )


def as_event(settings: SessionAudio) -> pe.AudioSettings:
    """``settings`` as ``session.updated`` reports them."""
    td = settings.turn_detection
    if td is None:
        detection = pe.TURN_DETECTION_OFF
    elif isinstance(td, SemanticTurnDetection):
        detection = pe.TurnDetectionSettings(
            type="semantic_vad",
            interrupt_response=td.interrupt_response,
            create_response=td.create_response,
            eagerness=td.eagerness,
            interruption=_interruption_event(td.interruption),
        )
    else:
        detection = pe.TurnDetectionSettings(
            type="server_vad",
            threshold=td.threshold,
            prefix_padding_ms=td.prefix_padding_ms,
            silence_duration_ms=td.silence_duration_ms,
            interrupt_response=td.interrupt_response,
            create_response=td.create_response,
            interruption=_interruption_event(td.interruption),
        )
    return pe.AudioSettings(
        input=pe.AudioInputSettings(sample_rate=settings.input_rate, turn_detection=detection),  # type: ignore[arg-type]
        output=pe.AUDIO_OUTPUT_OFF
        if settings.output_rate is None
        else pe.AudioOutputSettings(sample_rate=settings.output_rate, voice=settings.voice),  # type: ignore[arg-type]
    )
