"""The voice package's exceptions."""

from __future__ import annotations


class VoiceError(Exception):
    """Base of every exception the voice package raises on purpose."""


class VoiceUnavailable(VoiceError):
    """A piece of the voice stack (a Python package, a model file or a binary) is missing.

    ``reason`` says which piece and how to install it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PhonemizeError(VoiceError):
    """espeak-ng failed on a text (it exited non-zero or could not be run)."""


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
