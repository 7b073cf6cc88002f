"""Confirmed interruptions in the page's server voice (static/server_voice.js), in Debian's chromium.

In ``confirm`` mode (``turn_detection.interruption``, docs/protocol.md 8.7),
speech over a spoken answer pauses its playback, keeping the buffered audio;
``response.audio.resumed`` (a cough, an "mm-hm": ``input_audio.discarded``)
plays on from the same sample, and a real interruption cuts it as a barge-in.

The scripted test drives the page's ``ServerVoice`` and ``Player`` with a
scripted socket and counts, behind the player, the frames the AudioContext
actually renders: the whole answer, once, across a pause. The end-to-end one
talks to the real server through a fake microphone the test plays into
(``getUserMedia`` answered by a MediaStream the test feeds, so that the
backchannel starts the moment the answer's first audio arrives, while the
response is still active, whatever the machine's speed; a fixed file played by
chromium's ``--use-file-for-fake-audio-capture`` cannot wait for that): the
question, then "yeah" over the answer; the page must pause, resume and play
the answer's every sample. It needs a server with audio (skips without it,
fails in CI) and one with confirmed interruptions (an expected failure until
the server announces ``interruption`` in ``session.updated``).
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.browser import launch, pages_on
from tests.needs import missing, playwright_sync_api

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUESTION = "Tell me a long story about a dragon."  # as tests/app/test_voice_browser.py
BACKCHANNEL = "Yeah."  # one word: never a real interruption (min_words 2), a backchannel besides
QUERY = "max_tokens=64&temperature=0"
RATE = 16000  # the fake microphone's files


# ---- a microphone the test plays into ------------------------------------------------

# Before the page's scripts: getUserMedia gets a MediaStream fed by an AudioContext
# of its own (silence until the test plays pcm16 into it with fakeMic.play).
FAKE_MIC = """(() => {
  const context = new AudioContext({ sampleRate: 48000 });
  const sink = context.createMediaStreamDestination();
  let nextAt = 0;
  window.fakeMic = {
    context,
    async play(b64, rate) {
      await context.resume();
      const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
      const view = new DataView(bytes.buffer);
      const buffer = context.createBuffer(1, bytes.length / 2, rate);
      const data = buffer.getChannelData(0);
      for (let i = 0; i < data.length; i += 1) data[i] = view.getInt16(2 * i, true) / 32768;
      const source = context.createBufferSource();
      source.buffer = buffer;
      source.connect(sink);
      nextAt = Math.max(nextAt, context.currentTime + 0.05);
      source.start(nextAt);
      nextAt += buffer.duration;
      return nextAt - context.currentTime;  // seconds until it has all been "said"
    },
  };
  navigator.mediaDevices.getUserMedia = async () => { await context.resume(); return sink.stream; };
})();"""


def spoken(folder: Path, name: str, text: str) -> bytes:
    """``text`` spoken by espeak-ng, as pcm16 mono at RATE (sox resamples), with 0.3 s of silence after."""
    for binary in ("espeak-ng", "sox"):
        if shutil.which(binary) is None:
            missing(f"{binary} is not installed (Debian's {binary} package)")
    raw, out = folder / f"{name}-espeak.wav", folder / f"{name}.raw"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), text], check=True, timeout=60)
    subprocess.run(
        ["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", "-e", "signed", "-t", "raw", str(out)]
        + ["pad", "0", "0.3"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out.read_bytes()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    folder = tmp_path_factory.mktemp("interruption")
    return {"question": spoken(folder, "question", QUESTION), "yeah": spoken(folder, "yeah", BACKCHANNEL)}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # the fake device answers the scripted test's getUserMedia (its beeps go to a scripted socket)
    args = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with launch(args) as browser:
        yield browser


@pytest.fixture
def open_page(browser: Any, live_server: Any) -> Iterator[Any]:
    with pages_on(browser, live_server.http_url) as open_:
        yield open_


# ---- the page's ServerVoice and Player, scripted ---------------------------------------

# A scripted server in confirm mode: an answer r1 of 1.5 s (a constant level),
# "mm-hm" over it at about 300 ms (paused, then resumed: a false interruption),
# then a second answer r2 that a real interruption cuts while paused, then an
# answer r3 whose audio had all been sent, cut by the words of a new turn,
# and an answer r4 resumed at the pause of a "yeah" that turns into a question
# (cut at its end). A
# worklet behind the player counts the frames rendered at the level.
SCRIPTED = """async () => {
  const { BargeinClient } = await import('/bargein.js');
  const { ServerVoice, Player } = await import('/server_voice.js');
  const sockets = [];
  class ScriptedSocket {
    constructor() { Object.assign(this, { readyState: 0, sent: [] }); sockets.push(this);
                    setTimeout(() => { this.readyState = 1; this.onopen?.(); }, 0); }
    send(frame) { this.sent.push(JSON.parse(frame)); }
    close() { this.readyState = 3; }
    push(event) { this.onmessage?.({ data: JSON.stringify(event) }); }
  }
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const until = async (ready) => { while (!ready()) await sleep(5); };
  const client = new BargeinClient('ws://scripted', { WebSocket: ScriptedSocket, pingIntervalMs: 0 });
  const connected = client.connect();
  await until(() => sockets[0]?.readyState === 1);
  const socket = sockets[0];
  socket.push({ type: 'session.created', session_id: 's1', session_token: 't1',
                limits: { max_frame_bytes: 1 << 20, max_input_audio_ms: 60000 } });
  await connected;
  const voice = new ServerVoice(client, { interruption: 'confirm' });
  const events = [];
  for (const kind of ['pause', 'resume', 'bargein', 'discarded'])
    voice.addEventListener(kind, (e) => events.push([kind, e.detail.responseId ?? e.detail.item_id ?? e.detail.response?.id]));
  const started = voice.start();
  await until(() => socket.sent.some((e) => e.type === 'session.update'));
  const update = socket.sent.find((e) => e.type === 'session.update');
  socket.push({ type: 'session.updated', session: { audio: {
    input: { sample_rate: 16000, turn_detection: { ...update.session.audio.input.turn_detection,
             interruption: { mode: 'confirm', min_words: 2, backchannels: ['mm-hm'], max_pause_ms: 500 } } },
    output: { sample_rate: 24000, voice: 'amy' } } } });
  await started;
  // count what the player renders: frames above half the level
  const context = voice.context;
  const url = URL.createObjectURL(new Blob([`registerProcessor('counter', class extends AudioWorkletProcessor {
    constructor() { super(); this.n = 0; this.port.onmessage = () => this.port.postMessage(this.n); }
    process(inputs) { const x = inputs[0] && inputs[0][0]; if (x) for (const v of x) if (v > 0.25) this.n += 1; return true; }
  });`], { type: 'text/javascript' }));
  await context.audioWorklet.addModule(url);
  const counter = new AudioWorkletNode(context, 'counter');
  counter.connect(context.destination);
  const rendered = () => new Promise((resolve) => { counter.port.onmessage = (m) => resolve(m.data); counter.port.postMessage(0); });
  voice.player = new Player(context, counter);
  const player = voice.player;

  const level = (ms) => { const bytes = new Uint8Array(ms * 48);
    for (let i = 0; i < bytes.length; i += 2) new DataView(bytes.buffer).setInt16(i, 16384, true);
    let s = ''; for (const b of bytes) s += String.fromCharCode(b); return btoa(s); };
  const audio = (id, start, end) => ({ type: 'response.audio.delta', response_id: id, stream_id: 's' + id,
    audio: level(end - start), start_ms: start, end_ms: end, text_end: end / 100 });
  const answer = (id, item) => socket.push({ type: 'response.created', response_id: id, stream_id: 's' + id,
    resume_token: 'rt', input_item_id: item });
  const played = (id) => player.played(id).ms;
  const out = {};

  // r1: a false interruption
  answer('r1', 'item1');
  for (let ms = 0; ms < 1000; ms += 100) socket.push(audio('r1', ms, ms + 100));
  await until(() => played('r1') >= 300);
  socket.push({ type: 'input_audio.speech_started', item_id: 'item2', audio_start_ms: 5000 });
  out.pausedAtOnce = player.paused;
  socket.push({ type: 'input_audio.transcript', item_id: 'item2', text: 'mm-hm', final: false });
  socket.push({ type: 'response.audio.paused', response_id: 'r1', stream_id: 'sr1', end_ms: 1000 });
  await sleep(150);  // past the pause's lead: nothing renders now
  const frozen = [played('r1'), player.samplesPlayed('r1'), await rendered()];
  await sleep(400);
  out.frozen = [frozen, [played('r1'), player.samplesPlayed('r1'), await rendered()]];
  socket.push({ type: 'response.audio.resumed', response_id: 'r1', stream_id: 'sr1', from_ms: 1000 });
  socket.push({ type: 'input_audio.discarded', item_id: 'item2', reason: 'backchannel', transcript: 'mm-hm' });
  socket.push({ type: 'input_audio.speech_stopped', item_id: 'item2', audio_end_ms: 5400 });
  for (let ms = 1000; ms < 1500; ms += 100) socket.push(audio('r1', ms, ms + 100));
  socket.push({ type: 'response.audio.done', response_id: 'r1', stream_id: 'sr1', end_ms: 1500 });
  socket.push({ type: 'response.done', response_id: 'r1', stream_id: 'sr1', end: 9, finish_reason: 'stop', usage: {} });
  await until(() => !player.pending('r1'));
  await sleep(100);
  out.r1 = { samples: player.samplesPlayed('r1'), rendered: await rendered(), rate: context.sampleRate,
             played: played('r1'), paused: voice.paused };

  // r2: a real interruption, while paused
  answer('r2', 'item3');
  for (let ms = 0; ms < 1000; ms += 100) socket.push(audio('r2', ms, ms + 100));
  await until(() => played('r2') >= 200);
  socket.push({ type: 'input_audio.speech_started', item_id: 'item4', audio_start_ms: 9000 });
  socket.push({ type: 'response.audio.paused', response_id: 'r2', stream_id: 'sr2', end_ms: 1000 });
  await sleep(300);
  const heldAt = played('r2');
  socket.push({ type: 'response.audio.done', response_id: 'r2', stream_id: 'sr2', end_ms: 1000 });
  socket.push({ type: 'response.done', response_id: 'r2', stream_id: 'sr2', end: 5, finish_reason: 'interrupted', usage: {} });
  out.r2 = { heldAt, cancel: socket.sent.find((e) => e.type === 'response.cancel' && e.response_id === 'r2'),
             pending: player.pending('r2'), paused: player.paused };

  // r3: all its audio sent (done), then the words of a new turn over it
  answer('r3', 'item4');
  for (let ms = 0; ms < 1000; ms += 100) socket.push(audio('r3', ms, ms + 100));
  socket.push({ type: 'response.audio.done', response_id: 'r3', stream_id: 'sr3', end_ms: 1000 });
  socket.push({ type: 'response.done', response_id: 'r3', stream_id: 'sr3', end: 5, finish_reason: 'stop', usage: {} });
  await until(() => played('r3') >= 200);
  socket.push({ type: 'input_audio.speech_started', item_id: 'item5', audio_start_ms: 12000 });
  out.r3paused = player.paused;
  await sleep(200);
  const r3HeldAt = played('r3');
  socket.push({ type: 'input_audio.transcript', item_id: 'item5', text: 'Wait, stop.', final: true });
  out.r3 = { heldAt: r3HeldAt, cancel: socket.sent.find((e) => e.type === 'response.cancel' && e.response_id === 'r3'),
             pending: player.pending('r3') };
  // r4: "yeah" resumed at a pause, then "but what about Tuesday?": cut at the speech's end
  answer('r4', 'item5');
  for (let ms = 0; ms < 1000; ms += 100) socket.push(audio('r4', ms, ms + 100));
  await until(() => played('r4') >= 100);
  socket.push({ type: 'input_audio.speech_started', item_id: 'item6', audio_start_ms: 15000 });
  socket.push({ type: 'response.audio.paused', response_id: 'r4', stream_id: 'sr4', end_ms: 1000 });
  await sleep(200);
  const r4HeldAt = played('r4');
  socket.push({ type: 'response.audio.resumed', response_id: 'r4', stream_id: 'sr4', from_ms: 1000 });
  out.r4PlaysOn = !player.paused && voice.judging === 'item6';
  await sleep(300);
  socket.push({ type: 'input_audio.speech_stopped', item_id: 'item6', audio_end_ms: 16000 });
  socket.push({ type: 'input_audio.committed', item_id: 'item6', audio_start_ms: 15000, audio_end_ms: 16000 });
  socket.push({ type: 'input_audio.transcript', item_id: 'item6', text: 'Yeah, but what about Tuesday?', final: true });
  out.r4 = { heldAt: r4HeldAt, cancel: socket.sent.find((e) => e.type === 'response.cancel' && e.response_id === 'r4'),
             judging: voice.judging };
  out.cancels = socket.sent.filter((e) => e.type === 'response.cancel').map((e) => e.response_id);
  out.events = events;
  voice.stop().catch(() => {});  // its session.update is never answered here
  return out;
}"""


def test_scripted_confirmed_interruptions_pause_resume_and_cut_the_playback(open_page: Any) -> None:
    page = open_page()
    out = page.page.evaluate(SCRIPTED)
    # r1: the playback held at once (at speech_started), frozen while paused, then resumed
    assert out["pausedAtOnce"] is True
    (ms_a, samples_a, rendered_a), (ms_b, samples_b, rendered_b) = out["frozen"]
    assert ms_a >= 300 and (ms_a, samples_a, rendered_a) == (ms_b, samples_b, rendered_b)
    r1 = out["r1"]
    assert r1["samples"] == 1500 * 24, r1  # every sample of the answer, once
    assert r1["played"] == 1500 and r1["paused"] is False
    # the frames rendered: 1.5 s at the context's rate, to within a frame per chunk edge
    assert abs(r1["rendered"] - 1.5 * r1["rate"]) <= 20, r1
    # r2: cut where it was held, with what was played
    r2 = out["r2"]
    assert r2["cancel"]["audio_end_ms"] == r2["heldAt"] >= 200
    assert r2["pending"] is False and r2["paused"] is False
    # r3: held by the client (its audio all sent), cut by the new turn's words
    assert out["r3paused"] is True
    assert out["r3"]["cancel"]["audio_end_ms"] == out["r3"]["heldAt"] >= 200
    # r4: resumed at the speech's pause, played on, cut when its end made it a turn
    assert out["r4PlaysOn"] is True and out["r4"]["judging"] is None
    assert out["r4"]["cancel"]["audio_end_ms"] > out["r4"]["heldAt"] >= 100
    assert out["cancels"] == ["r2", "r3", "r4"]  # none for the false interruption
    assert out["events"] == [
        ["pause", "r1"],
        ["resume", "r1"],
        ["discarded", "item2"],
        ["pause", "r2"],
        ["bargein", "r2"],
        ["pause", "r3"],
        ["bargein", "r3"],
        ["pause", "r4"],
        ["resume", "r4"],
        ["bargein", "r4"],
    ]


# ---- end to end: "yeah" over the answer, against the server ----------------------------

WAIT_MS = 180_000


def test_a_backchannel_over_the_answer_pauses_and_resumes_it_with_all_its_audio_played(
    open_page: Any, live_server: Any, speech: dict[str, bytes]
) -> None:
    page = open_page(QUERY, init_script=FAKE_MIC)
    if not page.page.evaluate("window.bargein.audioAvailable"):
        missing("the server serves no audio (no limits.max_input_audio_ms): the voice stack is not installed")
    page.page.click("#voice")
    page.page.wait_for_function(
        "() => document.getElementById('voice-status').textContent.startsWith('Listening')", timeout=30_000
    )
    in_force = page.of_type(page.received, "session.updated")[-1]["session"]["audio"]["input"][
        "turn_detection"
    ]
    if (in_force.get("interruption") or {}).get("mode") != "confirm":
        pytest.xfail(
            "needs the server side of confirmed interruptions (no interruption.mode confirm in force)"
        )
    say = f"(b64) => window.fakeMic.play(b64, {RATE})"
    page.page.evaluate(say, base64.b64encode(speech["question"]).decode())
    page.page.wait_for_selector('.msg.user[data-status="heard"]', timeout=WAIT_MS)
    # the moment the answer's first audio arrives, "yeah" over it
    page.page.wait_for_function(
        "() => window.bargeinVoice?.player?.lastId != null", timeout=WAIT_MS, polling=10
    )
    page.page.evaluate(say, base64.b64encode(speech["yeah"]).decode())
    answer = ".msg.assistant >> nth=0"
    try:
        page.page.wait_for_function(
            "() => Number(document.querySelector('.msg.assistant')?.dataset.resumes ?? 0) >= 1",
            timeout=60_000,
        )
        # played to its end: the response done and nothing left to hear
        page.page.wait_for_function(
            """() => { const v = window.bargeinVoice, r = window.bargein.responses.get(v.player.lastId);
                       return r.finished && !v.player.pending(r.id); }""",
            timeout=WAIT_MS,
            polling=50,
        )
    except playwright_sync_api().TimeoutError as exc:
        raise AssertionError(f"the answer was not paused and resumed to its end: {story(page)}") from exc
    created = page.of_type(page.received, "response.created")[0]
    rid = created["response_id"]
    mine = [e for e in page.received if e.get("response_id") == rid]
    kinds = [e["type"] for e in mine]
    assert "response.audio.paused" in kinds and "response.audio.resumed" in kinds, story(page)
    paused = next(e for e in mine if e["type"] == "response.audio.paused")
    resumed = next(e for e in mine if e["type"] == "response.audio.resumed")
    assert resumed["from_ms"] == paused["end_ms"]
    (done,) = [e for e in mine if e["type"] == "response.done"]
    assert done["finish_reason"] in ("stop", "length"), story(page)
    # the speech was discarded, shown as no user turn, and cancelled nothing
    (discarded,) = page.of_type(page.received, "input_audio.discarded")
    assert discarded["reason"] in ("backchannel", "no_words"), discarded
    assert page.page.query_selector(f'.msg.user[data-item-id="{discarded["item_id"]}"]') is None
    assert len(page.page.query_selector_all(".msg.user")) == 1
    assert [c for c in page.of_type(page.sent, "response.cancel") if c["response_id"] == rid] == []
    # every sample of the answer's audio was played, once
    total = sum(len(base64.b64decode(e["audio"])) // 2 for e in mine if e["type"] == "response.audio.delta")
    audio_done = next(e for e in mine if e["type"] == "response.audio.done")
    assert abs(total - audio_done["end_ms"] * 24) < 24 * len(mine)  # 24 kHz; each delta's end_ms rounds down
    played = page.page.evaluate("(id) => window.bargeinVoice.player.samplesPlayed(id)", rid)
    assert played == total, (played, total)
    assert page.page.get_attribute(answer, "data-pauses") == "1"
    assert page.page.get_attribute(answer, "data-paused") == "false"
    assert page.page.get_attribute(answer, "data-status") in ("stop", "length")


def story(page: Any) -> str:
    """What happened, for a failure message: the server's events (deltas summed) and the bubbles."""
    kinds: list[str] = []
    for event in page.received:
        kind = event["type"]
        if kind in ("response.delta", "response.audio.delta") and kinds and kinds[-1].startswith(kind):
            continue
        if kind == "response.done":
            kind += f"({event['finish_reason']})"
        if kind == "input_audio.transcript":
            kind += f"({event['text']!r}, {event['final']})"
        if kind == "input_audio.discarded":
            kind += f"({event['reason']}, {event.get('transcript')!r})"
        kinds.append(kind)
    bubbles = page.page.evaluate(
        "() => [...document.querySelectorAll('.msg')].map((m) => [m.className, m.dataset.status,"
        " m.dataset.pauses, m.dataset.resumes, m.querySelector('.text').textContent.slice(0, 60)])"
    )
    return f"events {kinds}; bubbles {bubbles}"
