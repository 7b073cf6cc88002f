"""The page's server voice in Debian's chromium: a fake microphone, the real server.

Chromium's fake capture device plays a WAV file made here by espeak-ng (and
sox, to 48 kHz mono 16-bit, which the fake device takes): 1 s of silence, a
question, 8 s of silence (``GAP_S``), a second sentence that talks over the
answer, then a long silence (chromium loops the file). The page sends it to
the server at 16 kHz with semantic turn detection (``semantic_vad``, the
page's default), shows what the server heard, plays the answer through Web
Audio, and when the second sentence starts cuts the answer where it was heard.

The scripted tests check the client module and the downsampling worklet
without the server's voice; the end-to-end one needs a server with audio
(``session.created`` ``limits.max_input_audio_ms``) and skips without it
(fails in CI).
"""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.browser import launch, pages_on
from tests.needs import missing, playwright_sync_api
from tests.waiting import wait_until_sync

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "Tell me a long story about a dragon."  # Whisper tiny.en hears it whole at any start
SECOND = "Wait, stop. What is two plus two?"
QUERY = "max_tokens=64&temperature=0"
# Silence between the question and the second sentence, while the answer starts
# playing: its first audio comes 2-3 s after the question on a quiet 2-core
# machine, up to about 6 s under load; the answer (64 tokens) speaks for longer.
GAP_S = 8.0
FORMAT = ("-r", "48000", "-c", "1", "-b", "16", "-e", "signed")  # what chromium's fake microphone reads


def speech_wav(folder: Path) -> Path:
    """The fake microphone's file: silence, the question, GAP_S, the second sentence, a long silence."""
    for binary in ("espeak-ng", "sox"):
        if shutil.which(binary) is None:
            missing(f"{binary} is not installed (Debian's {binary} package)")
    pieces = []
    for name, seconds, text in (("question", 1.0, QUESTION), ("second", GAP_S, SECOND)):
        pieces.append(folder / f"{name}-before.wav")
        sox("-n", *FORMAT, str(pieces[-1]), "trim", "0", str(seconds))
        spoken = folder / f"{name}-espeak.wav"
        subprocess.run(
            ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(spoken), text], check=True, timeout=60
        )
        pieces.append(folder / f"{name}.wav")
        sox(str(spoken), *FORMAT, str(pieces[-1]))  # espeak's 22,050 Hz, resampled by sox
    pieces.append(folder / "after.wav")
    sox("-n", *FORMAT, str(pieces[-1]), "trim", "0", "40")
    out = folder / "microphone.wav"
    sox(*[str(p) for p in pieces], str(out))
    return out


def sox(*args: str) -> None:
    subprocess.run(["sox", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def microphone_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return speech_wav(tmp_path_factory.mktemp("voice"))


@pytest.fixture(scope="module")
def browser(microphone_wav: Path) -> Iterator[Any]:
    """Headless chromium whose microphone plays ``microphone_wav`` (granted without asking)."""
    args = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={microphone_wav}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with launch(args) as browser:
        yield browser


@pytest.fixture
def open_page(browser: Any, live_server: Any) -> Iterator[Any]:
    with pages_on(browser, live_server.http_url) as open_:
        yield open_


# ---- the client module and the worklet, scripted -------------------------------------

# bargein.js on a scripted socket: a server with audio, a response it starts
# by itself, audio deltas, a drop and a resume that replays overlapping audio,
# then a barge-in by milliseconds.
SCRIPTED_AUDIO = """async () => {
  const { BargeinClient, base64ToPcm } = await import('/bargein.js');
  const sockets = [];
  class ScriptedSocket {
    constructor() { Object.assign(this, { readyState: 0, sent: [] }); sockets.push(this);
                    setTimeout(() => { this.readyState = 1; this.onopen?.(); }, 0); }
    send(frame) { this.sent.push(JSON.parse(frame)); }
    close() { this.readyState = 3; }
    push(event) { this.onmessage?.({ data: JSON.stringify(event) }); }
  }
  const until = async (ready) => { while (!ready()) await new Promise((resolve) => setTimeout(resolve, 5)); };
  const client = new BargeinClient('ws://scripted', { WebSocket: ScriptedSocket, initialDelayMs: 1, pingIntervalMs: 0 });
  const connected = client.connect();
  await until(() => sockets[0]?.readyState === 1);
  const first = sockets[0];
  first.push({ type: 'session.created', session_id: 's1', session_token: 't1',
               limits: { max_frame_bytes: 65536, max_input_audio_ms: 60000 } });
  await connected;
  const updated = client.updateSession({ audio: { output: { sample_rate: 24000 } } });
  first.push({ type: 'session.updated', session: { audio: { input: { sample_rate: 16000 }, output: { sample_rate: 24000 } } } });
  await updated;
  const appended = client.appendAudio(new Int16Array([1, -1, 32767, -32768]));
  const started = [];
  client.addEventListener('response', (event) => started.push(event.detail));
  first.push({ type: 'input_audio.committed', item_id: 'item1', audio_start_ms: 0, audio_end_ms: 900 });
  first.push({ type: 'response.created', response_id: 'r1', stream_id: 'st1', resume_token: 'rt1', input_item_id: 'item1' });
  const response = started[0];
  const chunks = [];
  response.addEventListener('audio', (event) => chunks.push(
    { startMs: event.detail.startMs, endMs: event.detail.endMs, textEnd: event.detail.textEnd,
      samples: event.detail.pcm.length, first: event.detail.pcm[0] }));
  const pcm = (ms, value) => {
    const bytes = new Uint8Array(ms * 48);
    for (let i = 0; i < bytes.length; i += 2) new DataView(bytes.buffer).setInt16(i, value + i / 2, true);
    return btoa(String.fromCharCode(...bytes));
  };
  const audio = (start, end, value, textEnd) => ({ type: 'response.audio.delta', response_id: 'r1', stream_id: 'st1',
    audio: pcm(end - start, value), start_ms: start, end_ms: end, text_end: textEnd });
  first.push({ type: 'response.delta', response_id: 'r1', stream_id: 'st1', start: 0, end: 2, text: 'Once upon' });
  first.push(audio(0, 40, 100, 4));
  first.push(audio(40, 80, 200, 9));
  client.drop();
  await until(() => sockets[1]?.sent.length === 1);
  const second = sockets[1];
  second.push({ type: 'session.created', session_id: 's2', session_token: 't2', limits: { max_input_audio_ms: 60000 } });
  second.push({ type: 'session.resumed', session_id: 's1', turns: 1, active: null });
  const resume = second.sent[1];
  second.push({ type: 'stream.resumed', stream_id: 'st1', response_id: 'r1', from: 2, status: 'live' });
  second.push(audio(40, 80, 200, 9));       // wholly heard before: dropped
  second.push(audio(60, 120, 300, 12));     // overlaps [60, 80): its first 20 ms are dropped
  response.cancel({ audioEndMs: 95.7 });
  second.push(audio(120, 160, 400, 14));    // after the cancel: counted, not handed out
  return { appended, append: first.sent.find((e) => e.type === 'input_audio.append'),
           fromServer: response.fromServer, inputItemId: response.inputItemId, available: client.audioAvailable,
           rate: client.outputRate, resume, chunks, audioEndMs: response.audioEndMs,
           cancel: second.sent.find((e) => e.type === 'response.cancel'),
           decoded: Array.from(base64ToPcm(btoa('\\x01\\x00\\xff\\xff\\xff\\x7f\\x00\\x80'))) };
}"""


def test_client_sends_audio_follows_server_responses_and_resumes_their_audio(open_page: Any) -> None:
    page = open_page()
    result = page.page.evaluate(SCRIPTED_AUDIO)
    assert result["appended"] is True and result["available"] is True
    assert base64.b64decode(result["append"]["audio"]) == struct.pack("<4h", 1, -1, 32767, -32768)
    assert result["decoded"] == [1, -1, 32767, -32768]
    assert (result["fromServer"], result["inputItemId"], result["rate"]) == (True, "item1", 24000)
    assert result["resume"] | {"event_id": None} == {
        "type": "stream.resume",
        "stream_id": "st1",
        "resume_token": "rt1",
        "from": 2,
        "audio_from_ms": 80,
        "event_id": None,
    }
    # 24 samples per ms at 24 kHz; the overlapping chunk starts 20 ms (480 samples) in
    assert result["chunks"] == [
        {"startMs": 0, "endMs": 40, "textEnd": 4, "samples": 960, "first": 100},
        {"startMs": 40, "endMs": 80, "textEnd": 9, "samples": 960, "first": 200},
        {"startMs": 80, "endMs": 120, "textEnd": 12, "samples": 960, "first": 300 + 480},
    ]
    assert result["audioEndMs"] == 160
    assert result["cancel"] | {"event_id": None} == {
        "type": "response.cancel",
        "response_id": "r1",
        "audio_end_ms": 95,
        "event_id": None,
    }


# The microphone worklet on an OfflineAudioContext at 48 kHz: a 440 Hz tone
# (kept) and a 12 kHz one (above 8 kHz: it would alias to 4 kHz unless filtered).
DOWNSAMPLE = """async (frequency) => {
  const { createDownsampler } = await import('/server_voice.js');
  const context = new OfflineAudioContext(1, 48000, 48000);
  const node = await createDownsampler(context, 16000);
  const chunks = [];
  node.port.onmessage = (message) => chunks.push(message.data);
  const tone = new OscillatorNode(context, { frequency });
  const gain = new GainNode(context, { gain: 0.5 });
  tone.connect(gain).connect(node);
  node.connect(context.destination);
  tone.start();
  await context.startRendering();
  await new Promise((resolve) => setTimeout(resolve, 200));  // the last posted chunks
  const samples = chunks.flatMap((chunk) => Array.from(chunk)).slice(1600);  // past the filter's start
  let crossings = 0;
  for (let i = 1; i < samples.length; i += 1) if ((samples[i - 1] < 0) !== (samples[i] < 0)) crossings += 1;
  const rms = Math.sqrt(samples.reduce((sum, x) => sum + x * x, 0) / samples.length) / 32768;
  return { sizes: [...new Set(chunks.map((c) => c.length))], total: chunks.length * chunks[0].length,
           hz: crossings / 2 / (samples.length / 16000), rms };
}"""


def test_microphone_worklet_downsamples_to_16_khz_without_aliasing(open_page: Any) -> None:
    page = open_page()
    kept = page.page.evaluate(DOWNSAMPLE, 440)
    assert kept["sizes"] == [640]  # 40 ms at 16 kHz per chunk
    assert 15000 <= kept["total"] <= 16000  # one second of audio, in whole chunks
    assert abs(kept["hz"] - 440) < 5
    assert abs(kept["rms"] - 0.5 / 2**0.5) < 0.02  # the tone's level, unchanged
    removed = page.page.evaluate(DOWNSAMPLE, 12000)
    assert removed["rms"] < 0.001, removed  # filtered out (-50 dB), not folded to 4 kHz


def test_voice_mode_defaults_to_server_voice_exactly_when_the_server_has_audio(open_page: Any) -> None:
    page = open_page()
    has_audio = page.page.evaluate("window.bargein.audioAvailable")
    assert page.page.input_value("#voice-mode") == ("server" if has_audio else "browser")
    assert page.page.is_disabled('#voice-mode option[value="server"]') is not has_audio
    page = open_page(QUERY + "&voice=browser")
    assert page.page.input_value("#voice-mode") == "browser"


# ---- end to end: the fake microphone against the server's voice ---------------------

WAIT_MS = 180_000


def test_spoken_question_is_heard_answered_aloud_and_cut_by_the_second_sentence(
    open_page: Any, live_server: Any
) -> None:
    # immediate interruptions: the page cuts at speech_started with what it
    # played. (In confirm mode the server judges the overlap by its estimate
    # of the page's playback, and a headless Chromium on a loaded box plays
    # seconds behind it: tests/app/test_voice_interruption_browser.py.)
    page = open_page(QUERY + "&interruption=immediate")
    if not page.page.evaluate("window.bargein.audioAvailable"):
        missing("the server serves no audio (no limits.max_input_audio_ms): the voice stack is not installed")
    page.page.click("#voice")
    page.page.wait_for_function(
        "() => document.getElementById('voice-status').textContent.startsWith('Listening')", timeout=30_000
    )
    # the page asks for semantic turn detection, and the server has it in force
    (update,) = [u for u in page.of_type(page.sent, "session.update") if u["session"].get("audio")]
    assert update["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    in_force = page.of_type(page.received, "session.updated")[-1]["session"]["audio"]["input"]
    assert in_force["turn_detection"]["type"] == "semantic_vad" and in_force["turn_detection"]["eagerness"]
    # what the server heard of the question, as the user's bubble
    page.page.wait_for_selector('.msg.user[data-status="heard"]', timeout=WAIT_MS)
    heard = page.page.inner_text(".msg.user >> nth=0").lower()
    assert "story" in heard and "dragon" in heard, heard
    # the answer plays, and the second sentence talks over it
    first = ".msg.assistant >> nth=0"
    try:
        page.page.wait_for_function(
            "() => document.querySelector('.msg.assistant')?.dataset.status === 'interrupted'",
            timeout=60_000,  # the second sentence comes GAP_S after the question
        )
    except playwright_sync_api().TimeoutError as exc:  # say what the page saw instead
        raise AssertionError(f"the answer was not interrupted: {story(page)}") from exc
    created = page.of_type(page.received, "response.created")[0]
    audio = [
        e
        for e in page.of_type(page.received, "response.audio.delta")
        if e["response_id"] == created["response_id"]
    ]
    assert audio, "no audio of the answer arrived"
    assert any(
        e["type"] == "input_audio.speech_started" for e in page.received[page.received.index(audio[0]) :]
    )
    (cancel,) = [
        c for c in page.of_type(page.sent, "response.cancel") if c["response_id"] == created["response_id"]
    ]
    played_ms = int(page.page.get_attribute(first, "data-played-ms"))
    assert played_ms > 0, f"the second sentence came before the answer played (a loaded machine? {GAP_S=})"
    assert cancel["audio_end_ms"] == played_ms
    assert played_ms <= audio[-1]["end_ms"]
    done = [
        d for d in page.of_type(page.received, "response.done") if d["response_id"] == created["response_id"]
    ]
    assert done[0]["finish_reason"] in (
        "interrupted",
        "stop",
        "length",
    )  # a finished answer gets the late cancel
    # the bubble keeps what was heard; the text beyond it is marked as not heard
    heard_chars = int(page.page.get_attribute(first, "data-heard-chars"))
    kept = page.page.evaluate("() => document.querySelector('.msg.assistant .text').firstChild.data")
    assert len(kept) == heard_chars  # code points, as text_end counts
    unheard = page.page.query_selector(f"{first} >> .unheard")
    assert kept + (unheard.inner_text() if unheard else "") == "".join(
        d["text"]
        for d in page.of_type(page.received, "response.delta")
        if d["response_id"] == created["response_id"]
    )
    # the second sentence became the next turn
    page.page.wait_for_selector('.msg.user[data-status="heard"] >> nth=1', timeout=WAIT_MS)
    second = page.page.inner_text(".msg.user >> nth=1")
    assert "stop" in second.lower() or "two" in second.lower() or "2" in second, second
    # and its answer's prompt holds the first answer cut where the page cut it:
    # the page at the text_end of the chunk playing, the server at a word
    # boundary, keeping the word being spoken (at most one past the chunk's text)
    prompt = next_prompt(live_server, second)
    in_prompt = prompt.split("<|im_start|>assistant\n")[-2].split("<|im_end|>")[0].strip()
    answer = kept + (unheard.inner_text() if unheard else "")
    playing_through = next((e["text_end"] for e in audio if e["end_ms"] > played_ms), audio[-1]["text_end"])
    assert answer.startswith(in_prompt) and in_prompt.startswith(kept.strip()), (in_prompt, kept)
    assert len(in_prompt.split()) <= len(answer[:playing_through].split()) + 1, (in_prompt, kept)


def story(page: Any) -> str:
    """What happened, for a failure message: the server's events (audio summed) and the bubbles."""
    kinds: list[str] = []
    for event in page.received:
        kind = event["type"]
        if kind in ("response.delta", "response.audio.delta") and kinds and kinds[-1].startswith(kind):
            continue  # one entry per run of deltas
        if kind == "response.done":
            kind += f"({event['finish_reason']})"
        if kind == "response.audio.done":
            kind += f"({event['end_ms']} ms)"
        kinds.append(kind)
    bubbles = page.page.evaluate(
        "() => [...document.querySelectorAll('.msg')].map((m) => [m.className, m.dataset.status,"
        " m.dataset.playedMs, m.querySelector('.text').textContent.slice(0, 80)])"
    )
    return f"events {kinds}; bubbles {bubbles}"


def next_prompt(live_server: Any, user_text: str, timeout_s: float = 60.0) -> str:
    """The prompt of the first engine request that holds ``user_text`` (waits for it)."""

    def holding() -> str | None:
        for request in reversed(live_server.recent_requests()):
            prompt = str(live_server.tokenizer.decode(request.prompt_token_ids))
            if user_text in prompt:
                return prompt
        return None

    return wait_until_sync(
        holding, f"a request with {user_text!r} in its prompt", guard_s=timeout_s, poll_s=0.1
    )
