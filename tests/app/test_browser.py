"""The browser client (static/) in Debian's chromium against a real bargein server.

Playwright drives the system chromium (never a downloaded browser). Every test
fails on any console error or uncaught page error. Set ``BARGEIN_SCREENSHOT``
to a path to save a screenshot of the page mid-answer (docs/img/chat.png).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.app.browser import ANSWER, launch, pages_on

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROMPT = "Write two sentences about the sea."


@pytest.fixture(scope="module")
def bargein_url(live_server: Any) -> str:
    """The shared real server (tests/app/conftest.py) that also serves static/."""
    return live_server.http_url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium, one per module (a launch costs about a second)."""
    with launch() as browser:
        yield browser


@pytest.fixture
def open_page(browser: Any, bargein_url: str) -> Iterator[Any]:
    """Opens pages on the client; fails the test on any console or page error."""
    with pages_on(browser, bargein_url) as open_:
        yield open_


def test_answer_streams_in(open_page: Any) -> None:
    page = open_page()
    page.ask(PROMPT)
    page.wait_for_streaming_text(min_chars=1)
    if screenshot := os.environ.get("BARGEIN_SCREENSHOT"):
        page.wait_for_streaming_text(min_chars=100)
        page.page.screenshot(path=screenshot)
    assert page.wait_for_end() in {"stop", "length"}
    deltas = page.of_type(page.received, "response.delta")
    assert len(deltas) >= 2, "the answer arrived in one piece, not streamed"
    assert page.answer_text() == "".join(delta["text"] for delta in deltas)
    assert page.answer_text().strip()
    assert page.page.inner_text("#stat-ttft").endswith("ms")


def test_stop_ends_answer_with_nothing_more(open_page: Any) -> None:
    page = open_page("max_tokens=64&temperature=0")
    page.ask("Tell me a long story about a lighthouse keeper.")
    page.wait_for_streaming_text(min_chars=20)
    # Read the screen and press Stop in one task, so no delta lands in between.
    shown = page.page.evaluate(
        "() => { const t = document.querySelector('.msg.assistant:last-of-type .text').textContent;"
        " document.getElementById('stop').click(); return t; }"
    )
    assert page.wait_for_end() == "stopped"
    stopped = page.page.locator(ANSWER).get_attribute("data-response-id")
    # The moment has passed once a next answer ended: the server writes a
    # connection's events in order, so anything of the stopped one came before.
    page.ask("Say hi.")
    page.page.wait_for_function(
        "(id) => document.querySelector('.msg.assistant:last-of-type').dataset.responseId !== id", arg=stopped
    )
    page.wait_for_end()
    assert page.page.inner_text(f'.msg.assistant[data-response-id="{stopped}"] .text') == shown
    (cancel,) = page.of_type(page.sent, "response.cancel")
    assert cancel["heard_chars"] == len(shown)
    (done,) = [d for d in page.of_type(page.received, "response.done") if d["response_id"] == stopped]
    assert done["finish_reason"] == "interrupted"
    assert done["usage"]["completion_tokens"] < 64


# Records the client's states and whether the "reconnecting" note was shown,
# however briefly (a poll could miss it).
WATCH_RECONNECT = """() => {
  const watched = window.__watched = { states: [], noteShown: false };
  window.bargein.addEventListener('statechange', (event) => watched.states.push(event.detail.state));
  const note = document.getElementById('reconnecting');
  new MutationObserver(() => { if (!note.hidden) watched.noteShown = true; })
    .observe(note, { attributes: true });
}"""


def test_dropped_connection_resumes_to_the_uninterrupted_text(open_page: Any) -> None:
    query = "max_tokens=64&temperature=0"
    reference = open_page(query)
    reference.ask(PROMPT)
    reference.wait_for_end()
    expected = reference.answer_text()

    page = open_page(query)
    page.ask(PROMPT)
    page.wait_for_streaming_text(min_chars=10)
    page.page.evaluate(WATCH_RECONNECT)
    page.page.click("#drop")
    assert page.wait_for_end() == reference.page.get_attribute(ANSWER, "data-status")
    watched = page.page.evaluate("window.__watched")
    assert watched["states"] == ["reconnecting", "resuming", "open"]
    assert watched["noteShown"]
    assert page.answer_text() == expected
    assert page.sockets == 2
    (resume,) = page.of_type(page.sent, "stream.resume")
    (done,) = page.of_type(page.received, "response.done")
    assert 0 < resume["from"] < done["end"], "the drop did not happen mid-answer"
    assert page.page.inner_text("#stat-resumes") == f"1 (from {resume['from']})"
    assert page.page.is_hidden("#reconnecting")


# The client module alone, on a scripted socket: replays, overlaps and unknown
# events that a healthy server rarely produces on cue.
SCRIPTED_RESUME = """async () => {
  const { BargeinClient, countChars } = await import('/bargein.js');
  const sockets = [];
  class ScriptedSocket {
    constructor(url, protocols) {
      Object.assign(this, { url, protocols, readyState: 0, sent: [] });
      sockets.push(this);
      setTimeout(() => { this.readyState = 1; this.onopen?.(); }, 0);
    }
    send(frame) { this.sent.push(JSON.parse(frame)); }
    close() { this.readyState = 3; }
    push(event) { this.onmessage?.({ data: typeof event === 'string' ? event : JSON.stringify(event) }); }
  }
  const until = async (ready) => { while (!ready()) await new Promise((resolve) => setTimeout(resolve, 5)); };
  const client = new BargeinClient('ws://scripted/v1/realtime',
    { WebSocket: ScriptedSocket, apiKey: 'k1', initialDelayMs: 1, pingIntervalMs: 0 });
  const connected = client.connect();
  await until(() => sockets[0]?.readyState === 1);
  const [first] = sockets;
  first.push('not json');
  first.push({ type: 'from.the.future', x: 1 });
  first.push({ type: 'session.created', session_id: 's1', session_token: 't1', model: 'm',
               limits: { max_frame_bytes: 400 } });
  await connected;
  const tooBig = await client.send('x'.repeat(400)).done.catch((error) => error.code);
  const reply = client.send('hi', { max_tokens: 9 });
  const create = first.sent.at(-1);
  const delta = (start, end, text) => ({ type: 'response.delta', response_id: reply.id, stream_id: 'st', start, end, text });
  first.push({ type: 'response.created', response_id: reply.id, stream_id: 'st', resume_token: 'rt' });
  first.push(delta(0, 2, 'Hello'));
  first.push(delta(2, 3, ' wor'));
  client.drop();
  await until(() => sockets[1]?.sent.length === 1);
  const second = sockets[1];
  const sessionResume = second.sent[0];
  second.push({ type: 'session.created', session_id: 's2', session_token: 't2', limits: {} });
  second.push({ type: 'session.resumed', session_id: 's1', turns: 1, active: null });
  const streamResume = second.sent[1];
  second.push({ type: 'stream.resumed', stream_id: 'st', response_id: reply.id, from: 3, status: 'live' });
  second.push(delta(0, 2, 'Hello'));          // wholly old: dropped
  second.push(delta(2, 5, ' world!'));        // overlaps [2, 3): trimmed
  second.push({ type: 'another.new.event' });
  second.push(delta(5, 6, ' \\u{1F642}'));
  second.push({ type: 'response.done', response_id: reply.id, stream_id: 'st', end: 6,
                finish_reason: 'stop', usage: { prompt_tokens: 1, completion_tokens: 6, cached_tokens: 0 } });
  const pieces = [];
  for await (const piece of reply) pieces.push(piece.text);
  return { protocols: first.protocols, tooBig, create, sessionResume, streamResume, pieces, text: reply.text,
           chars: countChars(reply.text), sessionId: client.sessionId, state: client.state,
           finish: reply.finishReason, resumes: client.resumes };
}"""


def test_client_resumes_without_repeating_or_losing_text(open_page: Any) -> None:
    page = open_page()
    result = page.page.evaluate(SCRIPTED_RESUME)
    assert result["protocols"] == ["bargein.v1.json", "bearer.k1"]
    assert result["tooBig"] == "frame_too_large"
    assert result["create"]["type"] == "response.create"
    assert result["create"]["input"] == [{"role": "user", "content": "hi"}]
    assert result["create"]["max_tokens"] == 9
    assert result["sessionResume"] | {"event_id": None} == {
        "type": "session.resume",
        "session_id": "s1",
        "session_token": "t1",
        "event_id": None,
    }
    assert result["streamResume"] | {"event_id": None} == {
        "type": "stream.resume",
        "stream_id": "st",
        "resume_token": "rt",
        "from": 3,
        "event_id": None,
    }
    assert result["pieces"] == ["Hello", " wor", "ld!", " \N{SLIGHTLY SMILING FACE}"]
    assert result["text"] == "Hello world! \N{SLIGHTLY SMILING FACE}"
    assert result["chars"] == len(result["text"])
    assert result["sessionId"] == "s1"
    assert (result["state"], result["finish"], result["resumes"]) == ("open", "stop", 1)


def test_typing_enter_while_answering_barges_in(open_page: Any) -> None:
    page = open_page("max_tokens=64&temperature=0")
    page.ask("Tell me a long story about a lighthouse keeper.")
    page.wait_for_streaming_text(min_chars=10)
    page.ask("Name one color.")
    assert page.wait_for_end() in {"stop", "length"}
    first, second = page.of_type(page.sent, "response.create")
    assert "interrupt_active" not in first and second["interrupt_active"] is True
    done = {d["response_id"]: d["finish_reason"] for d in page.of_type(page.received, "response.done")}
    assert done[first["response_id"]] == "interrupted"
    assert page.page.get_attribute(".msg.assistant >> nth=0", "data-status") == "interrupted"
    assert page.answer_text().strip()


# Speech APIs with a scripted voice: utterances "speak" one word per 120 ms with
# boundary events, as Chrome's do; recognition hears what the test says.
SCRIPTED_SPEECH = r"""
(() => {
  const spoken = [];      // per utterance: the text spoken so far
  window.__spoken = () => spoken.join('');
  window.__wordsSpoken = 0;
  window.SpeechSynthesisUtterance = class { constructor(text) { this.text = text; } };
  const synth = {
    queue: [], current: null, timer: 0,
    speak(u) { this.queue.push(u); if (!this.current) this.next(); },
    next() {
      const u = this.current = this.queue.shift() ?? null;
      if (!u) return;
      const slot = spoken.push('') - 1;
      const words = [...u.text.matchAll(/\S+/g)];
      let i = 0;
      const step = () => {
        if (this.current !== u) return;
        if (i === words.length) {
          spoken[slot] = u.text; this.current = null; u.onend?.({}); this.next(); return;
        }
        const w = words[i++];
        spoken[slot] = u.text.slice(0, w.index + w[0].length);
        window.__wordsSpoken += 1;
        u.onboundary?.({ name: 'word', charIndex: w.index, charLength: w[0].length });
        this.timer = setTimeout(step, 120);
      };
      step();
    },
    cancel() {
      clearTimeout(this.timer);
      const all = [this.current, ...this.queue].filter(Boolean);
      this.current = null; this.queue = [];
      for (const u of all) u.onerror?.({ error: 'interrupted' });
    },
    getVoices() { return []; },
  };
  Object.defineProperty(window, 'speechSynthesis', { value: synth, configurable: true });
  window.webkitSpeechRecognition = window.SpeechRecognition = class {
    start() { window.__recognition = this; }
    abort() {}
  };
  window.__say = (text) => {
    const r = window.__recognition;
    r.onspeechstart?.();
    const result = Object.assign([{ transcript: text }], { isFinal: true });
    setTimeout(() => r.onresult?.({ resultIndex: 0, results: [result] }), 50);
  };
})();
"""


def test_talking_over_the_voice_cuts_the_turn_to_what_was_spoken(open_page: Any, live_server: Any) -> None:
    page = open_page("max_tokens=64&temperature=0&voice=browser", init_script=SCRIPTED_SPEECH)
    page.page.click("#voice")
    assert page.page.get_attribute("#voice", "aria-pressed") == "true"
    page.page.evaluate("window.__say('Write two sentences about the sea.')")
    page.page.wait_for_function("() => window.__wordsSpoken >= 4", timeout=60_000)
    spoken = page.page.evaluate("() => { window.__say('Name one color.'); return window.__spoken(); }")
    page.page.wait_for_function("() => document.querySelectorAll('.msg.assistant').length === 2")
    assert page.wait_for_end() in {"stop", "length"}
    first_text = page.page.inner_text(".msg.assistant >> nth=0 >> .text")
    (cancel,) = page.of_type(page.sent, "response.cancel")
    assert cancel["heard_chars"] == len(spoken)
    assert first_text.startswith(spoken) and len(first_text) > len(spoken)
    # The next turn's prompt holds the answer cut to what was spoken, not more.
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    unheard = first_text[len(spoken) :].strip()
    assert spoken.strip() in prompt
    assert spoken.strip() + " " + unheard.split()[0] not in prompt
    assert "Name one color." in prompt


def test_voice_mode_says_when_the_browser_lacks_speech(open_page: Any) -> None:
    page = open_page(
        "max_tokens=48&temperature=0&voice=browser",
        init_script="delete window.webkitSpeechRecognition; delete window.SpeechRecognition;",
    )
    page.page.click("#voice")
    assert page.page.get_attribute("#voice", "aria-pressed") == "false"
    assert "lacks speech recognition" in page.page.inner_text("#voice-status")


SCRIPTED_SESSION_LOST = """async () => {
  const { BargeinClient } = await import('/bargein.js');
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
  const lost = [];
  client.addEventListener('sessionlost', (event) => lost.push(event.detail.code));
  const connected = client.connect();
  await until(() => sockets[0]?.readyState === 1);
  sockets[0].push({ type: 'session.created', session_id: 's1', session_token: 't1', limits: {} });
  await connected;
  const reply = client.send('hi');
  const delta = (start, end, text) => ({ type: 'response.delta', response_id: reply.id, stream_id: 'st', start, end, text });
  sockets[0].push({ type: 'response.created', response_id: reply.id, stream_id: 'st', resume_token: 'rt' });
  sockets[0].push(delta(0, 2, 'Hello'));
  reply.cancel({ heardChars: 3 });
  client.drop();
  await until(() => sockets[1]?.sent.length === 1);
  const second = sockets[1];
  second.push({ type: 'session.created', session_id: 's2', session_token: 't2', limits: {} });
  second.push({ type: 'error', code: 'not_found', message: 'no such session', retryable: false,
                event_id: second.sent[0].event_id });
  second.push(delta(2, 3, ' there'));  // after Stop: counted, not handed out
  second.push({ type: 'response.done', response_id: reply.id, stream_id: 'st', end: 3,
                finish_reason: 'interrupted', usage: { prompt_tokens: 1, completion_tokens: 3, cached_tokens: 0 } });
  const pieces = [];
  for await (const piece of reply) pieces.push(piece.text);
  return { lost, sessionId: client.sessionId, sent: second.sent.map(({ event_id, ...rest }) => rest),
           pieces, text: reply.text, finish: reply.finishReason, state: client.state };
}"""


def test_client_goes_on_when_the_session_is_gone_and_repeats_its_cancel(open_page: Any) -> None:
    page = open_page()
    result = page.page.evaluate(SCRIPTED_SESSION_LOST)
    assert result["lost"] == ["not_found"]
    assert result["sessionId"] == "s2"
    assert result["sent"] == [
        {"type": "session.resume", "session_id": "s1", "session_token": "t1"},
        {"type": "stream.resume", "stream_id": "st", "resume_token": "rt", "from": 2},
        {"type": "response.cancel", "response_id": result["sent"][2]["response_id"], "heard_chars": 3},
    ]
    assert result["pieces"] == ["Hello"]
    assert result["text"] == "Hello there"
    assert (result["finish"], result["state"]) == ("interrupted", "open")
