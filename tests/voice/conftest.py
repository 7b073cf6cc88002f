"""The voice models, loaded once for the whole test session.

Without the voice stack the tests that use them skip on a developer's
machine and fail in CI (tests/needs.py).
"""

from __future__ import annotations

import pytest

from bargein.voice.models import VoiceModels, load_voice_models
from tests.needs import voice_stack


@pytest.fixture(scope="session")
def voice_models() -> VoiceModels:
    """The VAD, transcriber and synthesizer (how long they take to load:
    loadtests/voice_models_bench.py)."""
    voice_stack()
    return load_voice_models()
