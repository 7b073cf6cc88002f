"""Silero VAD (v6, ONNX) run with onnxruntime: speech probability per 32 ms frame.

The model is stateful: each call takes 512 new samples at 16 kHz preceded by
the last 64 samples of the previous call (its context), and the recurrent
state [2, 1, 128] that the previous call returned; it returns the speech
probability and the next state (silero_vad/utils_vad.py, ``OnnxWrapper``, in
the silero-vad wheel). :class:`SileroVad` holds the shared session;
:class:`VadStream` holds one audio stream's state and context.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .errors import VoiceUnavailable

SAMPLE_RATE = 16000
FRAME_SAMPLES = 512  # 32 ms
CONTEXT_SAMPLES = 64
_STATE_SHAPE = (2, 1, 128)


def silero_model_path() -> Path:
    """Path of ``silero_vad.onnx`` in the installed silero-vad wheel.

    Found without importing ``silero_vad``: its ``__init__`` imports torch and
    calls ``torch.set_num_threads(1)``, which would slow the engine's CPU path.

    Raises:
        VoiceUnavailable: silero-vad is not installed, or its model file is missing.
    """
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise VoiceUnavailable("silero-vad is not installed: `pip install silero-vad` (`make install`)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise VoiceUnavailable(
            f"silero-vad has no {path}: reinstall it (`pip install --force-reinstall silero-vad`)"
        )
    return path


class SileroVad:
    """The Silero VAD model, loaded once; :meth:`stream` makes per-stream detectors.

    onnxruntime sessions may be run from several threads at once, so one
    instance serves every stream.
    """

    def __init__(self, model_path: Path | None = None, num_threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = num_threads
        options.inter_op_num_threads = 1
        path = model_path if model_path is not None else silero_model_path()
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def stream(self) -> VadStream:
        """A detector for one audio stream, starting from silence."""
        return VadStream(self)

    def _run(
        self, x: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]:
        # x: [1, CONTEXT_SAMPLES + FRAME_SAMPLES]; state: [2, 1, 128]
        prob, next_state = self._session.run(
            None, {"input": x, "state": state, "sr": np.array(SAMPLE_RATE, dtype=np.int64)}
        )
        return float(prob[0, 0]), next_state


class VadStream:
    """Speech probability of consecutive frames of one 16 kHz stream. Not thread-safe."""

    def __init__(self, vad: SileroVad) -> None:
        self._vad = vad
        self.reset()

    def reset(self) -> None:
        """Forget the audio so far (model state and context), as at the stream's start."""
        self._state = np.zeros(_STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def probability(self, frame: npt.NDArray[np.float32]) -> float:
        """Probability in [0, 1] that the next frame is speech.

        Args:
            frame: float32 ``[FRAME_SAMPLES]`` at 16 kHz, in [-1, 1], following
                the previous frame of this stream.

        Raises:
            ValueError: ``frame`` is not ``FRAME_SAMPLES`` samples.
        """
        if frame.shape != (FRAME_SAMPLES,):
            raise ValueError(f"a VAD frame is {FRAME_SAMPLES} samples, got shape {frame.shape}")
        x = np.concatenate([self._context, frame.astype(np.float32, copy=False)])[None, :]
        prob, self._state = self._vad._run(x, self._state)
        self._context = x[0, -CONTEXT_SAMPLES:]
        return prob
