"""The Python voice client (client/voice_client.py) and ``bargein chat --voice`` against the real server.

The question is a WAV file spoken by Debian's espeak-ng (22,050 Hz, resampled
to 16 kHz by the client); the live server hears it with its VAD, transcribes
it, and answers in text and speech. The answer's audio is written to a WAV
file and heard again by the server's own Whisper, to check it says the text.
They need a server with audio (the voice stack installed) and skip without
it (fail in CI).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bargein.client import voice_client as voice_client_module
from bargein.client.pcm import WavSink, read_wav, silence
from bargein.client.realtime_client import drop_connection
from bargein.client.voice_client import VoiceClient, voice_settings
from tests.app.conftest import LiveServer
from tests.needs import missing

pytestmark = pytest.mark.slow

# int4 answers "What is the capital of France?" in French (a near tie at its first token,
# tests/app/test_exact_default.py), which the English voice cannot say for Whisper to hear
QUESTION = "Name the capital of France."
GREEDY = {"temperature": 0, "max_tokens": 24}


@pytest.fixture(scope="module")
def question_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The question as espeak-ng writes it (22,050 Hz mono): the client resamples it."""
    if shutil.which("espeak-ng") is None:
        missing("espeak-ng is not installed (Debian's espeak-ng package)")
    path = tmp_path_factory.mktemp("voice") / "question.wav"
    # at 135 words a minute Whisper tiny.en hears this question word for word
    subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "135", "-w", str(path), QUESTION], check=True, timeout=60
    )
    with wave.open(str(path)) as wav:
        assert wav.getframerate() != 16000  # the resampling path is the one tested
    return path


async def voice_client(server: LiveServer) -> VoiceClient:
    client = VoiceClient(server.ws_url)
    await client.connect()
    assert client.has_audio
    await client.update(audio=voice_settings(), defaults=GREEDY)
    return client


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower()) if len(w) > 2}


def transcribe(server: LiveServer, path: Path) -> str:
    """What the server's Whisper hears in a WAV file."""
    pcm = np.frombuffer(read_wav(path, sample_rate=16000), dtype="<i2").astype(np.float32) / 32768
    return str(server.state.voice.models.transcriber.transcribe(pcm))


async def test_talk_sends_a_wav_file_and_gets_the_transcript_and_the_spoken_answer(
    voice_server: LiveServer, question_wav: Path, tmp_path: Path
) -> None:
    client = await voice_client(voice_server)
    transcripts: list[tuple[str, bool]] = []
    texts: list[str] = []
    try:
        with WavSink(tmp_path / "answer.wav", client.output_rate) as sink:
            turn = await client.talk(
                question_wav,
                realtime=False,
                on_transcript=lambda text, final: transcripts.append((text, final)),
                on_text=texts.append,
                on_audio=sink,
            )
    finally:
        await client.close()
    assert "capital" in turn.transcript.lower() and "france" in turn.transcript.lower()
    assert turn.final and transcripts[-1] == (turn.transcript, True)
    assert turn.item_id is not None and 0 <= turn.audio_start_ms < turn.audio_end_ms
    response = turn.response
    assert response is not None and response.done is not None
    assert response.input_item_id == turn.item_id
    assert response.done["finish_reason"] in ("stop", "length")
    assert response.text.strip() and "".join(texts) == response.text
    # every sample of the answer arrived once, in order, and went to the file
    assert response.audio_done is not None and response.audio_done["end_ms"] == response.audio_end_ms
    assert abs(len(response.audio) - response.audio_end_ms * 48) < 48  # 24 kHz pcm16; end_ms rounds down
    assert sink.duration_ms == response.audio_end_ms > 500
    assert response.text_end >= len(response.text.rstrip()) - 1  # all of it spoken
    with wave.open(str(tmp_path / "answer.wav")) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getnframes()) == (24000, 1, sink.num_samples)
    # the audio speaks the answer's text: Whisper hears most of its words in the file
    said, heard = words(response.text), words(transcribe(voice_server, tmp_path / "answer.wav"))
    assert len(said & heard) >= len(said) // 2, (response.text, heard)


class PacingSleeps:
    """``asyncio`` as app/voice_client.py sees it, noting each sleep it asks for."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(seconds)


async def test_send_audio_is_paced_in_real_time_unless_told_otherwise(
    voice_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = await voice_client(voice_server)
    pacing = PacingSleeps()
    monkeypatch.setattr(voice_client_module, "asyncio", pacing)
    try:
        started = time.monotonic()
        sent_ms = await client.send_audio(silence(1000, client.input_rate), chunk_ms=20)
        paced_s = time.monotonic() - started
        paced = list(pacing.slept)
        pacing.slept.clear()
        assert await client.send_audio(silence(1000, client.input_rate), realtime=False) == 1000
        await client.update(defaults=GREEDY)  # raises if the server refused an append
    finally:
        await client.close()
    assert sent_ms == 1000
    # Paced: each of the 50 chunks waits for the moment its last sample "was recorded"
    # (a lower bound: load only makes it later), the deadlines counted from the start.
    assert len(paced) == 50 and paced_s >= 0.98, (len(paced), paced_s)
    assert not pacing.slept  # realtime=False: as fast as the socket takes them, no pacing at all
    with pytest.raises(ValueError, match="chunk_ms"):
        await client.send_audio(b"", chunk_ms=200)


async def test_a_dropped_connection_resumes_the_answers_audio_where_it_stopped(
    voice_server: LiveServer, question_wav: Path
) -> None:
    client = await voice_client(voice_server)
    pieces: list[bytes] = []

    def drop_after_the_first_piece(pcm: bytes) -> None:
        pieces.append(pcm)
        if len(pieces) == 1:
            drop_connection(client)

    try:
        turn = await client.talk(question_wav, realtime=False, on_audio=drop_after_the_first_piece)
    finally:
        await client.close()
    response = turn.response
    assert response is not None and response.done is not None
    assert client.num_resumes == 1 and len(pieces) > 1
    # resumed with audio_from_ms: the audio goes on with nothing missing or twice
    assert b"".join(pieces) == bytes(response.audio)
    assert abs(len(response.audio) - response.audio_end_ms * 48) < 48
    assert response.audio_done is not None and response.audio_done["end_ms"] == response.audio_end_ms


async def test_cancel_after_the_answer_ended_re_cuts_its_turn_at_the_audio_heard(
    voice_server: LiveServer, question_wav: Path
) -> None:
    client = await voice_client(voice_server)
    try:
        turn = await client.talk(question_wav, realtime=False)
        response = turn.response
        assert response is not None and response.done is not None
        first = response.done
        heard_ms = response.audio_end_ms // 3
        again = await client.cancel(audio_end_ms=heard_ms)  # the user heard a third of it
        assert again["response_id"] == first["response_id"]
        await client.chat("Thanks.", **GREEDY)
    finally:
        await client.close()
    prompt = voice_server.tokenizer.decode(voice_server.recent_requests()[-1].prompt_token_ids)
    kept = prompt.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0]
    assert kept and response.text.startswith(kept) and len(kept) < len(response.text.rstrip())


def test_chat_voice_speaks_the_file_prints_the_turn_and_writes_the_answer(
    voice_server: LiveServer, question_wav: Path, tmp_path: Path
) -> None:
    out = tmp_path / "reply.wav"
    chat = subprocess.run(
        [sys.executable, "-m", "bargein", "chat", "--url", voice_server.ws_url, "--voice", str(question_wav)]
        + ["--voice-out", str(out), "--fast", "--max-tokens", "24"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert chat.returncode == 0, chat.stderr
    heard, _, answer = chat.stdout.partition("\n")
    assert heard.startswith("> ") and "france" in heard.lower()
    assert answer.strip()
    assert f"answer audio: {out}" in chat.stderr and "Traceback" not in chat.stderr
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnframes() > 24000 // 2


def test_chat_voice_writes_beside_the_question_by_default_and_says_when_a_file_is_no_wav(
    voice_server: LiveServer, question_wav: Path, tmp_path: Path
) -> None:
    question = tmp_path / "q.wav"
    shutil.copy(question_wav, question)
    base = [sys.executable, "-m", "bargein", "chat", "--url", voice_server.ws_url, "--max-tokens", "24"]
    base += ["--fast", "--voice"]
    chat = subprocess.run([*base, str(question)], capture_output=True, text=True, timeout=300, check=False)
    assert chat.returncode == 0, chat.stderr
    assert (tmp_path / "q.answer.wav").stat().st_size > 1000
    notes = tmp_path / "notes.txt"
    notes.write_text("not audio")
    bad = subprocess.run([*base, str(notes)], capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "is not a WAV file" in bad.stderr and "Traceback" not in bad.stderr


async def test_talk_says_when_the_audio_holds_no_speech(voice_server: LiveServer) -> None:
    client = await voice_client(voice_server)
    try:
        with pytest.raises(TimeoutError, match="committed no turn"):
            await client.talk(silence(2000, client.input_rate), realtime=False, commit_timeout_s=3.0)
    finally:
        await client.close()
