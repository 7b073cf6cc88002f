"""Limits of a node's voice side (one per process)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class VoiceConfig:
    """Limits of the voice side.

    Attributes:
        mode: ``auto`` (voice when its stack is installed, text only otherwise,
            saying so at start-up), ``on`` (start-up fails without it) or
            ``off``.
        max_input_audio_ms: most uncommitted input audio a session holds
            (announced in ``session.created``'s limits).
        workers: threads running speech-to-text and synthesis (shared by
            every session of the process).
        max_turns: most turns of one connection being transcribed at once
            (queued or running in the shared threads; announced in
            ``session.created``'s limits): a connection's share of the
            threads, so one client's commits cannot queue work that delays
            every other session's turns.
        speculate: answer a turn at its first short pause (transcribed and
            submitted during the silence window; dropped, its KV blocks
            freed, when the user goes on), so the answer starts sooner.
        prefill: at a pause where no speculative answer starts, prefill the
            conversation plus the turn's partial transcript into the
            prefix cache (prefill-only, at the lowest priority), so the
            turn's answer has only its last words to prefill.
        max_input_audio_speed: a connection's input audio may arrive at most
            this many times faster than real time (beyond its burst): more is
            refused with ``rate_limited``. 0: no bound.
        input_audio_burst_ms: input audio a connection may send ahead of
            ``max_input_audio_speed``, ms (a client catching up after a
            network stall sends what it held at once).
        text_turn: ``semantic_vad`` also reads a turn's words at each scored
            pause (the transcript at the pause, shared with the speculative
            answer, scored by the bundled SmolLM2-135M-Instruct in fp32,
            about 540 MB, whatever model is served): words that do not end
            a message keep the turn open, words that clearly do end it.
        echo_cancellation: remove the echo of the audio a connection was
            sent from its input before the VAD sees it (WebRTC's AEC3,
            ``voice/echo.py``), so a client playing the answer through a
            speaker into its microphone does not barge in on it. About 1.5%
            of a core per live connection while it is active (docs/perf/voice.md).
            Off by default: live, AEC3 lets the echo through for a moment
            after each gap in the playback (a synthesis underrun, a pause),
            and it kept a user's backchannel over an answer without echo
            from the VAD (docs/perf/voice.md, "Live, over a socket").
        tool_filler: what a spoken response that is function calls says
            while the client runs them ("One moment."; ``""``: nothing, the
            default, as OpenAI's Realtime API: a call has no audio).
    """

    mode: str = "auto"
    max_input_audio_ms: int = 60_000
    workers: int = 2
    max_turns: int = 2
    speculate: bool = True
    prefill: bool = True
    max_input_audio_speed: float = 4.0
    input_audio_burst_ms: int = 10_000
    text_turn: bool = True
    echo_cancellation: bool = False
    tool_filler: str = ""

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "on", "off"):
            raise ValueError(f"voice={self.mode!r} must be 'auto', 'on' or 'off'")
        if self.max_input_audio_ms < 1000:
            raise ValueError(f"max_input_audio_ms={self.max_input_audio_ms} must be >= 1000")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if not self.max_input_audio_speed >= 0:  # NaN too
            raise ValueError(f"max_input_audio_speed={self.max_input_audio_speed} must be >= 0")
        if self.input_audio_burst_ms < 0:
            raise ValueError(f"input_audio_burst_ms={self.input_audio_burst_ms} must be >= 0")
        if len(self.tool_filler) > 200:
            raise ValueError(
                f"tool_filler has {len(self.tool_filler)} characters: a filler is a few words (200 at most)"
            )
        if self.max_turns < 1:
            raise ValueError(f"max_turns={self.max_turns} must be >= 1")
