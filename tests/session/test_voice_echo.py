"""The echo canceller in ``VoiceInput`` (issue 39): the answer a client plays
through its speaker into its microphone starts no turn, the user talking
over it still does, and without the canceller the echo barges in.

The real Silero VAD and the default ``server_vad`` detector, the project's
Piper voice as the answer (sent as the voice channel sends it, through
``VoiceInput.played``), a simulated room (loadtests/echo_sim.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from bargein.session.voice_runtime.audio_input import VoiceInput
from bargein.session.voice_runtime.config import VoiceConfig
from bargein.session.voice_runtime.runtime import VoiceRuntime
from bargein.session.voice_runtime.settings import SessionAudio
from bargein.voice.audio import float_to_pcm16, pcm16_to_float
from bargein.voice.turns import SpeechStarted, SpeechStopped, TurnDetection, TurnEvent
from loadtests.echo_sim import USER, Scene, piper_answer, simulate
from tests.needs import voice_stack
from tests.speech import espeak_pcm16

pytestmark = pytest.mark.slow

RATE = 16000


@pytest.fixture(scope="module")
def models() -> SimpleNamespace:
    voice_stack()
    from bargein.voice.tts import Synthesizer
    from bargein.voice.vad import SileroVad

    return SimpleNamespace(vad=SileroVad(), synthesizer=Synthesizer())


@pytest.fixture(scope="module")
def answer(models: SimpleNamespace) -> np.ndarray:
    return piper_answer(models.synthesizer, 24000)


@pytest.fixture
def runtimes() -> Iterator[list[VoiceRuntime]]:
    made: list[VoiceRuntime] = []
    yield made
    for runtime in made:
        runtime.close()


def run_session(
    models: SimpleNamespace,
    runtimes: list[VoiceRuntime],
    answer: np.ndarray,
    *,
    echo_cancellation: bool,
    user: np.ndarray | None = None,
    turn_detection: bool = True,
) -> tuple[VoiceInput, list[tuple[TurnEvent, np.ndarray | None]], int]:
    """The answer sent and played at 24 kHz, the microphone appended at 16 kHz
    in 20 ms PCM16 appends: the input, what its detector saw, the samples appended."""
    runtime = VoiceRuntime(models, VoiceConfig(echo_cancellation=echo_cancellation))
    runtimes.append(runtime)
    settings = SessionAudio(input_rate=RATE, output_rate=24000)
    if not turn_detection:
        settings = SessionAudio(input_rate=RATE, output_rate=24000, turn_detection=None)
    inp = VoiceInput(runtime, settings)
    seen: list[tuple[TurnEvent, np.ndarray | None]] = []
    appended = 0

    def append(samples: np.ndarray, arrived_at: float) -> np.ndarray:
        nonlocal appended
        seen.extend(inp.append(float_to_pcm16(samples), arrived_at))
        appended += len(samples)
        return samples

    simulate(answer, 24000, Scene(delay_ms=100, gain_db=-10.0), append, inp.played, user=user, user_at_s=3.0)
    return inp, seen, appended


def test_the_answer_echoed_into_the_microphone_starts_no_turn(
    models: SimpleNamespace, runtimes: list[VoiceRuntime], answer: np.ndarray
) -> None:
    _, seen, _ = run_session(models, runtimes, answer, echo_cancellation=True)
    assert [event for event, _ in seen] == []


def test_without_the_canceller_the_echo_barges_in(
    models: SimpleNamespace, runtimes: list[VoiceRuntime], answer: np.ndarray
) -> None:
    _, seen, _ = run_session(models, runtimes, answer, echo_cancellation=False)
    assert any(isinstance(event, SpeechStarted) for event, _ in seen)


def test_the_user_talking_over_the_echo_starts_a_turn_whose_audio_is_cleaned(
    models: SimpleNamespace, runtimes: list[VoiceRuntime], answer: np.ndarray
) -> None:
    user = pcm16_to_float(espeak_pcm16(USER, RATE))
    _, seen, _ = run_session(models, runtimes, answer, echo_cancellation=True, user=user)
    events = [event for event, _ in seen]
    starts = [e for e in events if isinstance(e, SpeechStarted)]
    assert len(starts) == 1
    onset_ms = starts[0].audio_start_ms + TurnDetection().prefix_padding_ms
    assert 3500 <= onset_ms <= 3500 + 1000 * len(user) / RATE  # the simulation's 0.5 s lead, the user at 3 s
    (stopped,) = [(e, audio) for e, audio in seen if isinstance(e, SpeechStopped)]
    assert stopped[1] is not None and len(stopped[1]) >= len(user) * 0.8


def test_a_commit_holds_as_many_samples_as_were_appended(
    models: SimpleNamespace, runtimes: list[VoiceRuntime], answer: np.ndarray
) -> None:
    inp, _, appended = run_session(models, runtimes, answer, echo_cancellation=True, turn_detection=False)
    start, end, audio = inp.take_all()
    assert len(audio) == appended  # the canceller's frame remainder came out at the commit
    assert (start, end) == (0, 1000 * appended // RATE)
