"""Exceptions of the voice package."""

from __future__ import annotations


class VoiceError(Exception):
    """Base of every exception the voice package raises on purpose."""


class InputAudioFull(VoiceError):
    """Appending would hold more uncommitted input audio than the session allows.

    The app answers it as the protocol says for ``input_audio.append`` beyond
    ``limits.max_input_audio_ms`` (``invalid_parameter``); the buffer is left
    as it was, without the refused chunk.

    Attributes:
        limit_ms: the most uncommitted input audio a session holds, in milliseconds.
    """

    def __init__(self, limit_ms: int) -> None:
        super().__init__(f"uncommitted input audio would exceed max_input_audio_ms={limit_ms}")
        self.limit_ms = limit_ms
