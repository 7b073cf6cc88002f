// The bargein page: chat view, Stop, barge-in by typing or talking, a live
// panel, and a "drop connection" control that shows the auto-resume.
//
// Two voice modes: server voice (the default when the server announces audio:
// the microphone streams to the server, which finds the turns, transcribes
// them and speaks its answers; server_voice.js) and browser speech (the Web
// Speech API hears and speaks here; voice.js).

import { BargeinClient, countChars } from "./bargein.js";
import { ServerVoice, headOf } from "./server_voice.js";
import { Listener, Speaker, voiceSupport } from "./voice.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);

const ui = {
  messages: $("messages"), prompt: $("prompt"), composer: $("composer"), send: $("send"),
  stop: $("stop"), drop: $("drop"), voice: $("voice"), voiceMode: $("voice-mode"), voiceStatus: $("voice-status"),
  conn: $("conn"), note: $("reconnecting"), noteText: $("reconnecting-text"), error: $("page-error"),
  maxTokens: $("max-tokens"), temperature: $("temperature"), instructions: $("instructions"),
};

const STATE_LABELS = {
  idle: "idle", connecting: "connecting…", open: "connected", reconnecting: "reconnecting…",
  resuming: "resuming…", closed: "disconnected",
};

/** The answer on screen now: its BargeinResponse, its elements and its timings. */
let turn = null;
/** Every answer on screen, by response id (a barge-in may cut one that is no longer `turn`). */
const turns = new Map();
/** Browser speech mode: the recognition, or null when off. */
let listener = null;
/** Server voice mode: the ServerVoice, or null when off. */
let serverVoice = null;
/** User bubbles of spoken turns, by item id (filled in by their transcripts). */
const spokenTurns = new Map();
/** Items the server discarded (no turn: a cough, an "mm-hm", echo): their late events show nothing. */
const discardedItems = new Set();
let audioTicker = 0;

const client = new BargeinClient(realtimeUrl(), {
  apiKey: params.get("key") ?? undefined,
  session: params.get("instructions") ? { instructions: params.get("instructions") } : undefined,
});
globalThis.bargein = client; // for the developer console

function realtimeUrl() {
  if (params.get("ws")) return params.get("ws");
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}/v1/realtime`;
}

// ---- sending -----------------------------------------------------------------

function samplingParams() {
  const out = {};
  if (ui.maxTokens.value) out.max_tokens = Number(ui.maxTokens.value);
  if (ui.temperature.value) out.temperature = Number(ui.temperature.value);
  return out;
}

/** Sends `text` as the next user turn; barges in if an answer is still running. */
function submit(text) {
  const active = Boolean(turn && !turn.response.finished);
  bargeIn(); // the voice may still be speaking an answer whose text is complete
  addMessage("user", text);
  const response = client.send(text, { ...samplingParams(), interruptActive: active });
  showResponse(response);
}

/**
 * The user talked over the answer: silence it at once; the server keeps only
 * what was spoken, even when the text had all arrived (speech lags the text).
 * Typed barge-in without voice needs nothing here: `interrupt_active` does it.
 */
function bargeIn() {
  if (serverVoice) {
    const cut = serverVoice.interrupt();
    if (cut) markCut(cut, "interrupted");
    return;
  }
  const speaker = turn?.speaker;
  if (!speaker || speaker.silenced || turn.response.cancelled) return;
  const unheard = speaker.speaking || !turn.response.finished;
  const heardChars = speaker.silence();
  if (!unheard) return;
  turn.heardChars = heardChars;
  turn.response.cancel({ heardChars });
}

/** Stop button: the answer ends where the screen (or the voice) got to. */
function stop() {
  if (!turn || turn.response.cancelled) return;
  if (serverVoice) {
    const cut = serverVoice.interrupt();
    if (cut) markCut(cut, "stopped");
    if (!turn.response.finished) setStatus(turn, "stopping", "stopping…");
    ui.stop.disabled = true;
    return;
  }
  if (turn.response.finished && !turn.speaker?.speaking) return;
  const heardChars = turn.speaker ? turn.speaker.silence() : countChars(turn.shown);
  turn.heardChars = heardChars;
  turn.response.cancel({ heardChars });
  if (!turn.response.finished) setStatus(turn, "stopping", "stopping…");
  ui.stop.disabled = true;
}

// ---- rendering ---------------------------------------------------------------

function addMessage(role, text) {
  $("empty")?.remove();
  const item = document.createElement("li");
  item.className = `msg ${role}`;
  const bubble = document.createElement("div");
  bubble.className = "bubble";
  const body = document.createElement("span");
  body.className = "text";
  body.append(document.createTextNode(text));
  bubble.append(body);
  const meta = document.createElement("div");
  meta.className = "meta";
  item.append(bubble, meta);
  const atBottom = isScrolledDown();
  ui.messages.append(item);
  if (atBottom) scrollDown();
  return { item, node: body.firstChild, meta };
}

/**
 * An answer cut by a barge-in or Stop in server voice: the text the user heard
 * stays, the rest is shown as not heard (the server kept the heard part).
 * @param {{response: import("./bargein.js").BargeinResponse, ms: number, textEnd: number}} cut
 * @param {"interrupted" | "stopped"} status
 */
function markCut({ response, ms, textEnd }, status) {
  const shown = turns.get(response.id);
  if (!shown) return;
  Object.assign(shown, { cutStatus: status, heardChars: textEnd, playedMs: ms });
  if (shown.item.dataset.paused) shown.item.dataset.paused = "false";
  shown.item.dataset.playedMs = String(ms);
  shown.item.dataset.heardChars = String(textEnd);
  const heard = headOf(shown.shown, textEnd);
  if (heard.length < shown.shown.length) {
    shown.node.data = heard;
    const rest = document.createElement("span");
    rest.className = "unheard";
    rest.title = "Not heard: cut by the barge-in";
    rest.textContent = shown.shown.slice(heard.length);
    shown.node.after(rest);
  }
  // An answer whose text had all arrived is cut all the same (the server re-cuts its turn).
  if (response.finished) setStatus(shown, status, doneLabel(shown, status));
}

/** @param {import("./bargein.js").BargeinResponse} response */
function showResponse(response) {
  if (response.inputItemId) spokenTurn(response.inputItemId); // the question's bubble comes first
  const { item, node, meta } = addMessage("assistant", "");
  item.dataset.responseId = response.id;
  const speaker = listener && voiceSupport().synthesis ? new Speaker(speechSynthesis) : null;
  turn = { response, item, node, meta, speaker, shown: "", sentAt: performance.now(), firstAt: 0, firstEnd: 0 };
  turns.set(response.id, turn);
  const mine = turn;
  setStatus(mine, "streaming", "");
  ui.stop.disabled = false;
  resetStats();
  response.addEventListener("created", () => {
    setText("stat-stream", response.streamId);
    $("stat-stream").title = response.streamId;
  });
  response.addEventListener("delta", (event) => onDelta(mine, event.detail));
  response.addEventListener("done", (event) => onDone(mine, event.detail));
  response.addEventListener("error", (event) => onResponseError(mine, event.detail));
}

function onDelta(current, delta) {
  const atBottom = isScrolledDown();
  current.node.appendData(delta.text);
  current.shown += delta.text;
  current.speaker?.push(delta.text);
  if (atBottom) scrollDown();
  const now = performance.now();
  if (!current.firstAt) {
    current.firstAt = now;
    current.firstEnd = delta.end;
    if (current === turn) setText("stat-ttft", `${Math.round(now - current.sentAt)} ms`);
  }
  if (current !== turn) return;
  const seconds = (now - current.firstAt) / 1000;
  if (seconds > 0.05) setText("stat-tps", ((delta.end - current.firstEnd) / seconds).toFixed(1));
  setText("stat-offsets", `[${delta.start}, ${delta.end})`);
  setText("stat-end", String(delta.end));
}

function onDone(current, done) {
  current.speaker?.finish();
  const reason = done.finish_reason;
  current.usage = done.usage;
  setStatus(current, finalStatus(current, reason), doneLabel(current, reason));
  if (current === turn) {
    ui.stop.disabled = !current.speaker?.speaking && !serverVoice?.player?.pending(current.response.id); // Stop can still silence the voice
    setText("stat-finish", reason);
    setText("stat-end", String(done.end));
  }
}

/** An answer's end as the page shows it: a cut's own status, "stopped" for Stop, else the finish reason. */
function finalStatus(current, reason) {
  return current.cutStatus ?? (reason === "interrupted" && current.response.cancelled ? "stopped" : reason);
}

function doneLabel(current, reason) {
  const labels = { stop: "done", length: "length limit", interrupted: "interrupted", cancelled: "cancelled", error: "error" };
  const status = finalStatus(current, reason);
  const usage = current.usage ? ` · ${current.usage.completion_tokens} tokens` : "";
  const played = current.playedMs === undefined ? "" : ` · ${current.playedMs} ms heard`;
  const heard = current.heardChars === undefined ? "" : ` · ${current.heardChars} chars kept`;
  const label = status === "stopped" ? "stopped" : labels[status] ?? status;
  return `${label}${usage}${played}${heard}`;
}

function onResponseError(current, error) {
  setStatus(current, "error", `error: ${error.message || error.code}`);
  if (current === turn) ui.stop.disabled = true;
  reportError(`${error.code}: ${error.message}`);
}

function setStatus(current, status, label) {
  current.item.dataset.status = status;
  current.item.setAttribute("aria-busy", String(status === "streaming"));
  current.meta.textContent = label;
}

function isScrolledDown() {
  const list = ui.messages;
  return list.scrollHeight - list.scrollTop - list.clientHeight < 40;
}

function scrollDown() {
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

function setText(id, text) {
  $(id).textContent = text;
}

function resetStats() {
  for (const id of ["stat-ttft", "stat-tps", "stat-offsets", "stat-end", "stat-stream", "stat-finish", "stat-audio"]) setText(id, "–");
}

/** Errors are shown on the page and logged: none are expected in normal use. */
function reportError(message) {
  ui.error.textContent = message;
  ui.error.dataset.kind = "error";
  ui.error.hidden = false;
  console.error(`bargein: ${message}`);
}

// ---- connection ----------------------------------------------------------------

function onStateChange({ state, attempt, delayMs }) {
  ui.conn.dataset.state = state;
  ui.conn.textContent = STATE_LABELS[state] ?? state;
  setText("stat-state", attempt && state !== "open" ? `${state} (try ${attempt})` : state);
  const away = state === "reconnecting" || state === "resuming";
  ui.note.hidden = !away;
  if (state === "reconnecting") ui.noteText.textContent = `Connection lost · reconnecting in ${(delayMs / 1000).toFixed(1)} s`;
  if (state === "resuming") ui.noteText.textContent = "Reconnected · resuming where it stopped";
  ui.drop.disabled = state !== "open";
}

client.addEventListener("statechange", (event) => onStateChange(event.detail));
client.addEventListener("event", (event) => {
  const detail = event.detail;
  if (detail.type === "stream.resumed") setText("stat-resumes", `${client.resumes} (from ${detail.from})`);
  else if (detail.type === "input_audio.committed") spokenTurn(detail.item_id);
  else if (detail.type === "input_audio.transcript") onTranscript(detail);
  else if (detail.type === "input_audio.discarded") onDiscarded(detail);
});
// Answers the server starts by itself: the replies to spoken turns.
client.addEventListener("response", (event) => {
  if (event.detail.fromServer) showResponse(event.detail);
});
client.addEventListener("error", (event) => reportError(`${event.detail.code}: ${event.detail.message}`));
client.addEventListener("sessionlost", () => {
  // Not an error of the page: the answer still resumes, only older turns are forgotten.
  ui.error.textContent = "Reconnected in a new session: the server no longer had this conversation, so the next turn starts fresh.";
  ui.error.dataset.kind = "warning";
  ui.error.hidden = false;
  console.warn("bargein: session not resumed; continuing in a new session");
});

// ---- voice ---------------------------------------------------------------------

/**
 * Speech the server judged no turn and no interruption (`input_audio.discarded`):
 * its bubble, if a partial transcript made one, goes; the voice line says what was ignored.
 */
function onDiscarded({ item_id: itemId, reason, transcript }) {
  discardedItems.add(itemId);
  const bubble = spokenTurns.get(itemId);
  if (bubble) {
    bubble.item.remove();
    spokenTurns.delete(itemId);
  }
  const what = transcript ? `"${transcript}"` : { no_words: "a sound", echo: "the answer's echo" }[reason] ?? reason;
  if (serverVoice) ui.voiceStatus.textContent = `(ignored: ${what}) Speaking. Talk over the answer to interrupt it.`;
}

/** The user bubble of a spoken turn, made when the server commits the turn. */
function spokenTurn(itemId) {
  let bubble = spokenTurns.get(itemId);
  if (!bubble) {
    bubble = addMessage("user", "…");
    bubble.item.dataset.itemId = itemId;
    bubble.item.dataset.status = "transcribing";
    spokenTurns.set(itemId, bubble);
  }
  return bubble;
}

function onTranscript({ item_id: itemId, text, final }) {
  if (discardedItems.has(itemId)) return;
  const bubble = spokenTurn(itemId);
  bubble.node.data = text || (final ? "(nothing heard)" : "…");
  if (final) bubble.item.dataset.status = "heard";
}

function toggleVoice() {
  if (serverVoice) {
    stopServerVoice();
    return;
  }
  if (listener) {
    listener.stop();
    listener = null;
    // The rest of the answer is read, not heard: silence it and show it on screen.
    turn?.speaker?.silence();
    if (turn) turn.speaker = null;
    ui.voice.setAttribute("aria-pressed", "false");
    ui.voiceMode.disabled = false;
    ui.voiceStatus.textContent = "";
    return;
  }
  if (ui.voiceMode.value === "server") {
    startServerVoice();
    return;
  }
  const support = voiceSupport();
  if (!support.recognition || !support.synthesis) {
    const missing = [!support.recognition && "speech recognition", !support.synthesis && "speech synthesis"].filter(Boolean);
    ui.voiceStatus.textContent = `Voice mode is unavailable: this browser lacks ${missing.join(" and ")}.`;
    return;
  }
  listener = new Listener();
  listener.addEventListener("speechstart", bargeIn);
  listener.addEventListener("transcript", (event) => submit(event.detail));
  listener.addEventListener("error", (event) => {
    toggleVoice();
    ui.voiceStatus.textContent = event.detail;
  });
  listener.start();
  ui.voice.setAttribute("aria-pressed", "true");
  ui.voiceMode.disabled = true; // one mode at a time: turn voice off to switch
  ui.voiceStatus.textContent = "Listening. Talk over the answer to interrupt it (headphones avoid the answer interrupting itself).";
}

async function startServerVoice() {
  // ?interruption=immediate|confirm asks for that mode; else the server's default
  const voice = new ServerVoice(client, { interruption: params.get("interruption") ?? undefined });
  serverVoice = voice;
  globalThis.bargeinVoice = voice; // for the developer console
  voice.addEventListener("bargein", (event) => markCut(event.detail, "interrupted"));
  voice.addEventListener("pause", (event) => markPaused(event.detail.responseId, true));
  voice.addEventListener("resume", (event) => markPaused(event.detail.responseId, false));
  voice.addEventListener("state", (event) => {
    const notes = { listening: "Hearing you…", speaking: "Speaking. Talk over the answer to interrupt it." };
    if (notes[event.detail]) ui.voiceStatus.textContent = notes[event.detail];
  });
  ui.voice.setAttribute("aria-pressed", "true");
  ui.voiceMode.disabled = true;
  ui.voiceStatus.textContent = "Opening the microphone…";
  try {
    await voice.start();
  } catch (error) {
    if (serverVoice === voice) serverVoice = null;
    ui.voice.setAttribute("aria-pressed", "false");
    ui.voiceMode.disabled = false;
    ui.voiceStatus.textContent = microphoneMessage(error);
    return;
  }
  ui.voiceStatus.textContent = "Listening (server voice). Talk over the answer to interrupt it.";
  audioTicker = setInterval(showPlayed, 100);
}

/**
 * An answer's playback held (speech over it, the server deciding) or resumed:
 * `data-paused`, and the counts `data-pauses` and `data-resumes`, on its bubble.
 */
function markPaused(responseId, paused) {
  const shown = turns.get(responseId);
  if (paused) ui.voiceStatus.textContent = "Paused: hearing you…";
  if (!shown) return;
  const key = paused ? "pauses" : "resumes";
  shown.item.dataset[key] = String(Number(shown.item.dataset[key] ?? 0) + 1);
  shown.item.dataset.paused = String(paused);
}

function stopServerVoice() {
  const voice = serverVoice;
  serverVoice = null;
  clearInterval(audioTicker);
  ui.voice.setAttribute("aria-pressed", "false");
  ui.voiceMode.disabled = false;
  ui.voiceStatus.textContent = "";
  voice.stop().catch((error) => reportError(`voice off: ${error.message}`));
}

function microphoneMessage(error) {
  const messages = {
    NotAllowedError: "Microphone access was refused.",
    NotFoundError: "No microphone was found.",
    SecurityError: "The microphone needs a secure page: https:// (or localhost).",
  };
  return messages[error?.name] ?? `Server voice failed: ${error?.message ?? error}`;
}

/** The live panel's "Audio" line, and the answer's `data-played-ms`, while it plays. */
function showPlayed() {
  if (!serverVoice || !turn || turn.cutStatus) return;
  const { ms } = serverVoice.played(turn.response);
  turn.item.dataset.playedMs = String(ms);
  setText("stat-audio", `${ms} ms played of ${turn.response.audioEndMs}`);
  if (turn.response.finished) ui.stop.disabled = !serverVoice.player?.pending(turn.response.id);
}

/** The voice mode to offer: server voice when the server has audio, unless the URL says `?voice=browser`. */
function chooseVoiceMode() {
  const server = ui.voiceMode.querySelector('option[value="server"]');
  server.disabled = !client.audioAvailable;
  server.textContent = client.audioAvailable ? "Server voice" : "Server voice (not on this server)";
  const wanted = params.get("voice") ?? (client.audioAvailable ? "server" : "browser");
  ui.voiceMode.value = wanted === "server" && !client.audioAvailable ? "browser" : wanted;
}

// ---- wiring --------------------------------------------------------------------

ui.composer.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text) return;
  ui.prompt.value = "";
  submit(text);
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.composer.requestSubmit();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape") stop();
});
ui.stop.addEventListener("click", stop);
ui.drop.addEventListener("click", () => client.drop());
ui.voice.addEventListener("click", toggleVoice);
ui.instructions.addEventListener("change", () => {
  client.updateSession({ instructions: ui.instructions.value }).catch((error) => reportError(error.message));
});

ui.maxTokens.value = params.get("max_tokens") ?? "";
ui.temperature.value = params.get("temperature") ?? "";
ui.instructions.value = params.get("instructions") ?? "";
client.connect().then(
  (created) => {
    setText("stat-model", created.model ?? "–");
    $("stat-model").title = created.model ?? "";
    chooseVoiceMode();
  },
  (error) => reportError(`could not connect: ${error.message}`),
);
ui.prompt.focus();
