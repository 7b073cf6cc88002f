"""End of turn by meaning: Smart Turn v3.2 on onnxruntime, scoring whether a turn is complete.

Smart Turn v3.2 (Daily's, BSD-2-Clause) is a Whisper-tiny encoder with a
classifier head, trained to tell a finished utterance ("What is the capital
of France?") from one that pauses mid-way ("I'd like to book a table
for..."), from the audio alone: words and intonation. The ``pipecat-ai``
wheel ships it as ``pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx``;
bargein reads that file out of the installed package folder and imports
nothing of pipecat (installed ``--no-deps``, its runtime would not import).

Input, as pipecat's ``LocalSmartTurnAnalyzerV3`` feeds it: the last 8 s of
the turn at 16 kHz (a shorter turn is zero-padded at the start, a longer one
keeps its end), as Whisper's 80-bin log-mel features of an 8 s window
(transformers' ``WhisperFeatureExtractor`` with ``chunk_length=8``, the
waveform normalized to zero mean and unit variance): ``input_features``
``[1, 80, 800]`` float32. Output: ``[1, 1]``, the probability (after the
model's own sigmoid) that the turn is complete.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .errors import VoiceUnavailable
from .own_thread import on_own_thread

SAMPLE_RATE = 16000
WINDOW_S = 8  # the model hears the last 8 s of a turn
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE
_MODEL_IN_PACKAGE = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")


def smart_turn_model_path() -> Path:
    """Path of ``smart-turn-v3.2-cpu.onnx`` in the installed pipecat-ai wheel.

    Found without importing ``pipecat``: its package ``__init__`` files import
    its runtime's dependencies, which bargein does not install.

    Raises:
        VoiceUnavailable: pipecat-ai is not installed, or its model file is missing.
    """
    spec = importlib.util.find_spec("pipecat")
    if spec is None or not spec.submodule_search_locations:
        raise VoiceUnavailable(
            "pipecat-ai (Smart Turn, the end-of-turn model) is not installed: "
            "`pip install --no-deps pipecat-ai` (`make install`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*_MODEL_IN_PACKAGE)
    if not path.is_file():
        raise VoiceUnavailable(f"pipecat-ai has no {path}: install pipecat-ai >= 1.0 (`make install`)")
    return path


def last_window(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The 8 s the model hears of ``audio`` (float32 ``[num_samples]``, 16 kHz):
    its last ``WINDOW_SAMPLES``, zero-padded at the start when shorter, as
    pipecat's ``truncate_audio_to_last_n_seconds`` does; float32 ``[WINDOW_SAMPLES]``."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)[-WINDOW_SAMPLES:]
    return np.pad(audio, (WINDOW_SAMPLES - audio.size, 0))


class EndOfTurnModel:
    """Smart Turn v3.2, loaded once; :meth:`probability` scores one turn's audio.

    Thread-safe: an onnxruntime session may be run from several threads at
    once, and each call computes its features on a thread of its own
    (:func:`~bargein.voice.own_thread.on_own_thread`).

    Args:
        model_path: the ONNX file; default: the pipecat-ai wheel's.
        num_threads: CPU threads one scoring uses (1: the calling thread only).

    Raises:
        VoiceUnavailable: see :func:`smart_turn_model_path`.
    """

    def __init__(self, model_path: Path | None = None, num_threads: int = 1) -> None:
        import onnxruntime as ort
        from transformers import WhisperFeatureExtractor

        options = ort.SessionOptions()
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        path = model_path if model_path is not None else smart_turn_model_path()
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        (model_input,) = self._session.get_inputs()
        self._input_name = model_input.name
        self._features = WhisperFeatureExtractor(
            feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=WINDOW_S
        )

    def features(self, audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The model's input for ``audio`` (float32 ``[num_samples]``, 16 kHz, in
        [-1, 1]): log-mel features of :func:`last_window`, float32 ``[1, 80, 800]``."""
        window = last_window(audio)
        features = on_own_thread(
            lambda: (
                self._features(
                    window,
                    sampling_rate=SAMPLE_RATE,
                    padding="max_length",
                    max_length=WINDOW_SAMPLES,
                    truncation=True,
                    do_normalize=True,
                    return_tensors="np",
                ).input_features
            )
        )
        return np.ascontiguousarray(features, dtype=np.float32)

    def probability(self, audio: npt.NDArray[np.float32]) -> float:
        """The probability, in [0, 1], that the turn spoken in ``audio`` is
        complete (float32 ``[num_samples]``, 16 kHz mono in [-1, 1]: the turn so
        far, its trailing silence included; only its last 8 s count)."""
        (output,) = self._session.run(None, {self._input_name: self.features(audio)})
        return float(np.asarray(output).reshape(-1)[0])
