"""The voice package's exceptions."""

from __future__ import annotations


class VoiceError(Exception):
    """Base of the voice package's errors."""


class VoiceUnavailable(VoiceError):
    """A piece of the voice stack (a Python package, a model file or a binary) is missing.

    ``reason`` says which piece and how to install it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PhonemizeError(VoiceError):
    """espeak-ng failed on a text (it exited non-zero or could not be run)."""
