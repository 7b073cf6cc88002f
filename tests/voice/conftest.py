"""The voice models, loaded once for the whole test session.

Without the voice stack the tests that use them skip on a developer's
machine and fail in CI (tests/needs.py).
"""

from __future__ import annotations

import time

import pytest

from bargein.voice.models import VoiceModels, load_voice_models
from tests.needs import voice_stack


@pytest.fixture(scope="session")
def voice_models() -> VoiceModels:
    """The VAD, transcriber and synthesizer; prints how long they took to load."""
    voice_stack()
    start = time.perf_counter()
    models = load_voice_models()
    print(f"\nvoice models loaded in {time.perf_counter() - start:.2f} s")
    return models
