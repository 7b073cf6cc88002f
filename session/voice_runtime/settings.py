"""A session's audio settings: the ones in force, merged from ``session.update``, echoed back.

:class:`SessionAudio` is what a connection's voice side runs with (input
rate, turn detection, output rate and voice); :func:`merged` applies the
wire's partial ``audio`` update to it field by field, or says which field is
out of range; :func:`as_event` is how ``session.updated`` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from bargein.protocol import events as pe
from bargein.voice.audio import INPUT_RATES, OUTPUT_RATES
from bargein.voice.turns import TurnDetection

DEFAULT_OUTPUT_RATE = 24000  # OpenAI's realtime default
DEFAULT_INPUT_RATE = 24000  # OpenAI's too; clients capturing at 16 kHz say so
DEFAULT_VOICE = "joe"
VOICES = ("joe",)  # Piper en_US-joe-medium (voice/tts.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionAudio:
    """The audio settings in force in one session: the defaults with every
    accepted ``session.update``'s ``audio`` (the wire's
    :class:`bargein.protocol.events.AudioSettings`, a partial update) merged in.

    Attributes:
        input_rate: Hz of ``input_audio.append`` PCM16.
        turn_detection: server VAD parameters; None: no detection (the client
            commits its turns with ``input_audio.commit``).
        output_rate: Hz of ``response.audio.delta`` PCM16; None: text only.
        voice: the synthesizer voice.
    """

    input_rate: int = DEFAULT_INPUT_RATE
    turn_detection: TurnDetection | None = TurnDetection()
    output_rate: int | None = None
    voice: str = DEFAULT_VOICE

    def __post_init__(self) -> None:
        if self.input_rate not in INPUT_RATES:
            raise ValueError(f"input sample_rate={self.input_rate} must be one of {list(INPUT_RATES)}")
        if self.output_rate is not None and self.output_rate not in OUTPUT_RATES:
            raise ValueError(f"output sample_rate={self.output_rate} must be one of {list(OUTPUT_RATES)}")


def merged(settings: SessionAudio, update: pe.AudioSettings) -> SessionAudio:
    """``settings`` with a ``session.update``'s ``audio`` merged field by field.

    Raises:
        ValueError: a value is out of range (the message names the field).
    """
    new = settings
    if update.input is not None:
        if update.input.sample_rate is not None:
            new = replace(new, input_rate=update.input.sample_rate)
        td = update.input.turn_detection
        if td is not None:
            if td.type == "none":
                new = replace(new, turn_detection=None)  # its values are forgotten
            else:
                fields = {k: getattr(td, k) for k in _DETECTION_FIELDS if getattr(td, k) is not None}
                if td.type is None and new.turn_detection is None and fields:
                    raise ValueError(
                        "session.audio.input.turn_detection is off: turn it on with type 'server_vad'"
                    )
                if "silence_duration_ms" in fields:
                    # the pause that starts a speculative answer fits in any silence
                    # window the protocol allows ([0, 10000] ms)
                    fields["pause_ms"] = min(TurnDetection().pause_ms, fields["silence_duration_ms"])
                base = new.turn_detection or TurnDetection()
                new = replace(new, turn_detection=replace(base, **fields))
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


_DETECTION_FIELDS = (
    "threshold",
    "prefix_padding_ms",
    "silence_duration_ms",
    "interrupt_response",
    "create_response",
)


def as_event(settings: SessionAudio) -> pe.AudioSettings:
    """``settings`` as ``session.updated`` reports them."""
    td = settings.turn_detection
    detection = (
        pe.TURN_DETECTION_OFF
        if td is None
        else pe.TurnDetectionSettings(
            type="server_vad",
            threshold=td.threshold,
            prefix_padding_ms=td.prefix_padding_ms,
            silence_duration_ms=td.silence_duration_ms,
            interrupt_response=td.interrupt_response,
            create_response=td.create_response,
        )
    )
    return pe.AudioSettings(
        input=pe.AudioInputSettings(sample_rate=settings.input_rate, turn_detection=detection),  # type: ignore[arg-type]
        output=pe.AUDIO_OUTPUT_OFF
        if settings.output_rate is None
        else pe.AudioOutputSettings(sample_rate=settings.output_rate, voice=settings.voice),  # type: ignore[arg-type]
    )
