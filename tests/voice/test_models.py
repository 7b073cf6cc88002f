"""Loading the voice stack, and saying what is missing when it cannot be."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bargein.voice.models import VoiceUnavailable, load_voice_models, voice_stack_status

MODEL_LIBRARIES = ("onnxruntime", "onnx", "soxr", "ctranslate2", "tokenizers", "silero_vad")


def test_importing_the_models_module_loads_no_model_library() -> None:
    code = (
        "import sys, bargein.voice.models\n"
        f"print(sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_a_missing_espeak_is_named_with_its_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no espeak-ng
    reason = voice_stack_status()
    assert reason is not None and "espeak-ng" in reason and "apt-get install espeak-ng" in reason
    with pytest.raises(VoiceUnavailable, match="espeak-ng is not on PATH") as raised:
        load_voice_models()
    assert raised.value.reason == reason
