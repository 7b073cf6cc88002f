// bargein.js: a browser (and Node >= 22) client for the bargein realtime
// protocol v1 over JSON (see PROTOCOL.md). One file, no dependencies, no build.
// Node 20 needs --experimental-websocket (or pass `options.WebSocket`).
//
//   import { BargeinClient } from "/bargein.js";
//   const client = new BargeinClient("ws://127.0.0.1:8000/v1/realtime");
//   await client.connect();
//   const reply = client.send("Name three rivers.", { max_tokens: 64 });
//   for await (const delta of reply) console.log(delta.text);
//
// Offsets, not luck, keep the text whole across reconnects: every response
// remembers the `end` of the last delta it accepted, resumes from there, and
// drops (or trims) replayed deltas it already holds. Audio (a server that
// announces `limits.max_input_audio_ms`) works the same way in milliseconds:
// `appendAudio(pcm16)` sends the user's audio, a response's `audio` events
// carry its spoken answer, and a resume asks for the audio from `audioEndMs`.
//
// Confirmed interruptions (`session.audio.input.turn_detection.interruption`,
// mode `confirm`, PROTOCOL.md 8.7): speech over a spoken answer first pauses
// its audio (`response.audio.paused`: the response's `audiopaused` event, and
// `paused` is true); the server then either resumes it from the same
// millisecond (`response.audio.resumed`: `audioresumed`; an
// `input_audio.discarded` event for the speech's item follows, seen by
// `event` listeners: that speech is no user turn) or interrupts it as a
// barge-in (`response.done` with `finish_reason: "interrupted"`). A player
// holds its buffered audio while paused and plays on after the resume; see
// server_voice.js.

/** The WebSocket subprotocol for JSON frames. */
export const SUBPROTOCOL = "bargein.v1.json";

/** Close codes after which reconnecting cannot help (RFC 6455 and PROTOCOL.md). */
const FATAL_CLOSE_CODES = new Set([1002, 1003, 1007, 1008, 1009, 1010]);

/** Close code this client uses when it abandons a socket on purpose and resumes. */
const DROP_CLOSE_CODE = 4000;

/**
 * Counts characters the way the server does (Unicode code points), which is
 * the unit of `heard_chars`. A JS string's `length` counts UTF-16 units instead.
 * @param {string} text
 * @returns {number}
 */
export function countChars(text) {
  let count = 0;
  for (let i = 0; i < text.length; i += 1) {
    const unit = text.charCodeAt(i);
    // A high surrogate followed by a low one is a single code point.
    if (unit >= 0xd800 && unit <= 0xdbff && i + 1 < text.length) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) i += 1;
    }
    count += 1;
  }
  return count;
}

/** An error reported by the server (`type: "error"`) or by this client. */
export class BargeinError extends Error {
  /**
   * @param {string} code  protocol error code (`conflict`, `not_found`, ...) or a
   *   client code: `connection_lost`, `closed`, `stream_gap`, `frame_too_large`
   * @param {string} message  human readable
   * @param {{retryable?: boolean, retryAfterMs?: number, responseId?: string}} [extra]
   */
  constructor(code, message, extra = {}) {
    super(message);
    this.name = "BargeinError";
    this.code = code;
    this.retryable = Boolean(extra.retryable);
    this.retryAfterMs = extra.retryAfterMs ?? null;
    this.responseId = extra.responseId ?? null;
  }

  /** @param {Record<string, any>} event  a server `error` event */
  static fromEvent(event) {
    return new BargeinError(String(event.code ?? "unknown"), String(event.message ?? ""), {
      retryable: event.retryable,
      retryAfterMs: event.retry_after_ms,
      responseId: event.response_id,
    });
  }
}

/**
 * pcm16 samples as the protocol's base64 (little-endian, whatever the platform).
 * @param {Int16Array} pcm
 * @returns {string}
 */
export function pcmToBase64(pcm) {
  const bytes = new Uint8Array(pcm.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < pcm.length; i += 1) view.setInt16(2 * i, pcm[i], true);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(binary);
}

/**
 * The protocol's base64 audio as pcm16 samples.
 * @param {string} text
 * @returns {Int16Array}
 */
export function base64ToPcm(text) {
  const binary = atob(text);
  const view = new DataView(new ArrayBuffer(binary.length - (binary.length % 2)));
  for (let i = 0; i < view.byteLength; i += 1) view.setUint8(i, binary.charCodeAt(i));
  const pcm = new Int16Array(view.byteLength / 2);
  for (let i = 0; i < pcm.length; i += 1) pcm[i] = view.getInt16(2 * i, true);
  return pcm;
}

/**
 * @typedef {object} AudioChunk  one piece of a response's spoken answer
 * @property {Int16Array} pcm  pcm16 samples at the session's output rate, not heard before
 * @property {number} startMs  output timeline position of the first sample
 * @property {number} endMs  position after the last sample
 * @property {number} textEnd  code points of the response text spoken by `endMs`
 */

/**
 * @typedef {object} Delta  one piece of a response, as accepted by the client
 * @property {string} text  text of tokens [start, end) not seen before
 * @property {number} start  token offset of the first token
 * @property {number} end  token offset after the last token
 */

/**
 * One assistant turn. Async-iterable over its deltas; also an EventTarget:
 * `created`, `delta` (detail: Delta), `audio` (detail: AudioChunk), `audiodone`
 * (detail: the `response.audio.done` event), `audiopaused` (detail: the
 * `response.audio.paused` event: speech started over it; hold the playback,
 * keeping what is buffered), `audioresumed` (detail: the
 * `response.audio.resumed` event: play on from where it paused; its audio
 * goes on from `from_ms`), `resumed` (detail: the `stream.resumed` event),
 * `done` (detail: the `response.done` event), `error` (detail: BargeinError).
 *
 * After `cancel()` no further deltas or audio are handed out (what is on screen
 * stays what was heard) although late ones are still counted in `text`, `end`
 * and `audioEndMs`. A response the server started by itself (a voice turn) has
 * `fromServer` true and its `inputItemId`.
 */
export class BargeinResponse extends EventTarget {
  /** @param {BargeinClient} client @param {string} id */
  constructor(client, id) {
    super();
    this.client = client;
    /** @type {string} client-chosen response_id */
    this.id = id;
    /** @type {string | null} */
    this.streamId = null;
    /** @type {string | null} */
    this.resumeToken = null;
    /** All text received so far, in offset order, without repeats. */
    this.text = "";
    /** Token offset after the last accepted delta: where a resume starts. */
    this.end = 0;
    /** @type {string | null} `stop`, `length`, `interrupted`, `cancelled`, `error` */
    this.finishReason = null;
    /** @type {{prompt_tokens: number, completion_tokens: number, cached_tokens: number} | null} */
    this.usage = null;
    this.cancelled = false;
    /** @type {BargeinError | null} */
    this.error = null;
    /** @type {Delta[]} deltas handed out, for iterators that start late */
    this.deltas = [];
    this.finished = false;
    /** Output timeline ms after the last audio accepted: where a resume's audio starts. */
    this.audioEndMs = 0;
    /** Code points of `text` spoken by `audioEndMs`. */
    this.textEnd = 0;
    this.audioDone = false;
    /** True between `response.audio.paused` and `response.audio.resumed` (or its end). */
    this.paused = false;
    /** Number of `response.audio.paused` events taken. */
    this.pauses = 0;
    /** True for a response the server started (a voice turn's), not `send()`. */
    this.fromServer = false;
    /** @type {string | null} the user item of the voice turn that started it */
    this.inputItemId = null;
    // Token offset -> this.text.length at that offset, to trim a replayed delta
    // that starts before `end` at a boundary this client has seen.
    this._boundaries = new Map([[0, 0]]);
    /** @type {Set<() => void>} */
    this._wakers = new Set();
    this._eventId = null; // of the last request about this response that awaits an answer
    this._cancel = null; // the response.cancel sent for it, if any
    /** Resolves with the `response.done` event; rejects with a BargeinError. */
    this.done = new Promise((resolve, reject) => {
      this._resolve = resolve;
      this._reject = reject;
    });
    this.done.catch(() => {}); // rejection is also reported through iteration and `error`
  }

  /**
   * Barge-in: stop this response. The server keeps `heardChars` characters of
   * it in the conversation, or the text spoken in its first `audioEndMs`
   * milliseconds of audio (default: everything delivered). Also for a response
   * that has ended (the most recent one): it re-cuts that turn.
   * @param {{heardChars?: number, audioEndMs?: number}} [options]
   */
  cancel(options = {}) {
    this.client.cancel(this, options);
  }

  /** @returns {AsyncIterator<Delta>} every delta from the first, then ends at `done` */
  async *[Symbol.asyncIterator]() {
    let index = 0;
    for (;;) {
      while (index < this.deltas.length) yield this.deltas[index++];
      if (this.error) throw this.error;
      if (this.finished) return;
      await new Promise((wake) => this._wakers.add(wake));
    }
  }

  /** @param {Record<string, any>} event  `response.created` */
  _onCreated(event) {
    this.streamId = event.stream_id;
    this.resumeToken = event.resume_token;
    this.inputItemId = event.input_item_id ?? null;
    this._emit("created", event);
  }

  /**
   * Accepts audio once, as `_onDelta` does text: by output timeline milliseconds.
   * @param {Record<string, any>} event  `response.audio.delta`
   * @param {number} rate  samples per second of the audio
   */
  _onAudioDelta(event, rate) {
    if (this.finished || event.end_ms <= this.audioEndMs) return;
    let pcm = base64ToPcm(String(event.audio));
    if (event.start_ms < this.audioEndMs) pcm = pcm.subarray(Math.floor(((this.audioEndMs - event.start_ms) * rate) / 1000));
    const startMs = Math.max(event.start_ms, this.audioEndMs);
    this.audioEndMs = event.end_ms;
    this.textEnd = event.text_end;
    if (this.cancelled) return;
    this._emit("audio", { pcm, startMs, endMs: event.end_ms, textEnd: event.text_end });
  }

  /** @param {Record<string, any>} event  `response.audio.paused` */
  _onAudioPaused(event) {
    if (this.paused || this.finished) return;
    this.paused = true;
    this.pauses += 1;
    this._emit("audiopaused", event);
  }

  /** @param {Record<string, any>} event  `response.audio.resumed` */
  _onAudioResumed(event) {
    if (!this.paused) return;
    this.paused = false;
    this._emit("audioresumed", event);
  }

  /** @param {Record<string, any>} event  `response.audio.done` */
  _onAudioDone(event) {
    if (this.audioDone) return;
    this.audioDone = true;
    this.paused = false;
    this._emit("audiodone", event);
  }

  /** @param {Record<string, any>} event  `stream.resumed` */
  _onResumed(event) {
    this._emit("resumed", event);
  }

  /**
   * Accepts a delta once: drops one that is wholly old, trims one that overlaps.
   * @param {Record<string, any>} event  `response.delta`
   * @returns {Delta | null} the new part, or null when there is none
   */
  _onDelta(event) {
    if (this.finished || event.end <= this.end) return null;
    let text = String(event.text);
    if (event.start !== this.end) {
      const at = event.start < this.end ? this._boundaries.get(event.start) : undefined;
      if (at === undefined || !text.startsWith(this.text.slice(at))) {
        this._fail(new BargeinError("stream_gap", `delta [${event.start}, ${event.end}) does not continue offset ${this.end}`));
        return null;
      }
      text = text.slice(this.text.length - at);
    }
    this.text += text;
    this.end = event.end;
    this._boundaries.set(this.end, this.text.length);
    if (this.cancelled) return null;
    const delta = { text, start: event.start, end: event.end };
    this.deltas.push(delta);
    this._emit("delta", delta);
    return delta;
  }

  /** @param {Record<string, any>} event  `response.done` */
  _onDone(event) {
    if (this.finished) return;
    this.finished = true;
    this.paused = false;
    this.finishReason = event.finish_reason ?? null;
    this.usage = event.usage ?? null;
    this._emit("done", event);
    this._resolve(event);
  }

  /** @param {BargeinError} error */
  _fail(error) {
    if (this.finished) return;
    this.finished = true;
    this.finishReason = "error";
    this.error = error;
    this._emit("error", error);
    this._reject(error);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
    for (const wake of this._wakers) wake();
    this._wakers.clear();
  }
}

/**
 * @typedef {object} ClientOptions
 * @property {string} [apiKey]  sent as the `bearer.<key>` subprotocol
 * @property {Record<string, any>} [session]  `session.update` settings applied on
 *   connect (and again if a reconnect had to start a new session)
 * @property {number} [initialDelayMs=250]  first reconnect delay
 * @property {number} [maxDelayMs=8000]  cap of the exponential backoff
 * @property {number} [maxAttempts=Infinity]  reconnect attempts before giving up
 * @property {number} [pingIntervalMs=15000]  ping after this much silence (0: never)
 * @property {number} [pingTimeoutMs=10000]  drop and resume if a ping gets no answer
 * @property {typeof WebSocket} [WebSocket]  implementation (default: the global one)
 */

/**
 * A connection to a bargein server that survives dropped sockets.
 *
 * Events (all CustomEvent): `statechange` (detail: {state, attempt, delayMs}),
 * `event` (detail: every server event, unknown types included), `sent`
 * (detail: every client event), `response` (detail: a new BargeinResponse:
 * from `send()`, or one the server started for a voice turn), `error`
 * (detail: a BargeinError not tied to one response), `sessionlost` (detail: a
 * BargeinError: after a reconnect the server no longer had the conversation, so
 * the client goes on in a new session; streams still resume).
 *
 * States: `idle` -> `connecting` -> `open` <-> (`reconnecting` -> `resuming`)
 * -> `closed`. While not `open`, sends are queued and go out after the resume.
 */
export class BargeinClient extends EventTarget {
  /** @param {string} url  e.g. `ws://host:8000/v1/realtime` @param {ClientOptions} [options] */
  constructor(url, options = {}) {
    super();
    this.url = url;
    this.options = {
      initialDelayMs: 250, maxDelayMs: 8000, maxAttempts: Infinity,
      pingIntervalMs: 15000, pingTimeoutMs: 10000, ...options,
    };
    this._WebSocket = options.WebSocket ?? globalThis.WebSocket;
    this.state = "idle";
    this.attempt = 0;
    /** @type {string | null} */ this.sessionId = null;
    /** @type {string | null} */ this.sessionToken = null;
    /** @type {Record<string, number> | null} limits from `session.created` */
    this.limits = null;
    /** @type {string | null} */ this.model = null;
    /** @type {Record<string, any> | null} `session.audio` in force (from `session.updated`) */
    this.audio = null;
    /** @type {Map<string, BargeinResponse>} */
    this.responses = new Map();
    /** Number of streams resumed (`stream.resumed`) since connect(). */
    this.resumes = 0;
    this._ws = null;
    this._outbox = [];
    this._nextEventId = 1;
    this._pending = new Map(); // event_id -> {resolve, reject, type}
    this._updates = []; // pending session.update promises, answered in order
    this._lastRx = 0;
    this._timer = null;
    this._keepalive = null;
    this._ready = null;
    this._created = null; // session.created seen on the current socket
    this._resumeEventId = null;
    // Back online: skip the rest of the backoff wait (unless an attempt is under way).
    this._onOnline = () => {
      if (this.state !== "reconnecting" || this._ws) return;
      clearTimeout(this._timer);
      this._openSocket();
    };
  }

  /** Whether the server hears and speaks audio (it announces `limits.max_input_audio_ms`). */
  get audioAvailable() {
    return this.limits?.max_input_audio_ms != null;
  }

  /** Samples per second of the responses' audio. */
  get outputRate() {
    return this.audio?.output?.sample_rate ?? 24000;
  }

  /** The response still generating or being delivered, if any. */
  get activeResponse() {
    let last = null;
    for (const response of this.responses.values()) if (!response.finished) last = response;
    return last;
  }

  /**
   * Opens the connection; resolves with the `session.created` event once the
   * session (and `options.session`, if given) is in place.
   * @returns {Promise<Record<string, any>>}
   * @throws {BargeinError} `closed` when the socket closes before the session exists
   */
  connect() {
    if (this.state !== "idle" && this.state !== "closed") return this._ready.promise;
    this._ready = deferred();
    this.attempt = 0;
    this.resumes = 0;
    this._setState("connecting");
    this._openSocket();
    this._startKeepalive();
    globalThis.addEventListener?.("online", this._onOnline);
    return this._ready.promise;
  }

  /**
   * Changes the session (`session.update`); once accepted, it is also applied
   * to a new session after a reconnect.
   * @param {Record<string, any>} session  any of instructions, defaults, on_disconnect,
   *   include_token_ids, audio (e.g. `{input: {turn_detection: {interruption: {mode:
   *   "confirm"}}}}`: speech over an answer pauses it until the server decides)
   * @returns {Promise<Record<string, any>>} the settings now in force
   */
  updateSession(session) {
    const pending = deferred();
    const eventId = this._send({ type: "session.update", session }, pending);
    const accepted = (settings) => {
      this.options.session = { ...(this.options.session ?? {}), ...session };
      pending.resolve(settings);
    };
    this._updates.push({ eventId, resolve: accepted, reject: pending.reject });
    return pending.promise;
  }

  /**
   * Appends pcm16 mono at the session's input rate to the user's audio
   * (`input_audio.append`). A live source: while the connection is not open the
   * audio is dropped, not queued.
   * @param {Int16Array} pcm
   * @returns {boolean} whether it was sent
   */
  appendAudio(pcm) {
    if (this.state !== "open") return false;
    this._send({ type: "input_audio.append", audio: pcmToBase64(pcm) });
    return true;
  }

  /** Ends the user's turn now (`input_audio.commit`: push to talk). */
  commitAudio() {
    this._send({ type: "input_audio.commit" });
  }

  /** Drops the uncommitted input audio (`input_audio.clear`). */
  clearAudio() {
    this._send({ type: "input_audio.clear" });
  }

  /**
   * Starts the next assistant turn (`response.create`).
   * @param {string | Array<{role: string, content: string}>} input  a user message, or items
   * @param {Record<string, any> & {interruptActive?: boolean}} [params]  max_tokens,
   *   temperature, top_p, top_k, seed, stop; `interruptActive` barges in on an active response
   * @returns {BargeinResponse}
   */
  send(input, params = {}) {
    const { interruptActive, ...sampling } = params;
    const items = typeof input === "string" ? [{ role: "user", content: input }] : input;
    const response = new BargeinResponse(this, newId("resp"));
    this.responses.set(response.id, response);
    this._emit("response", response);
    const event = { type: "response.create", response_id: response.id, input: items, ...sampling };
    if (interruptActive) event.interrupt_active = true;
    response._eventId = this._send(event, { reject: (error) => response._fail(error) });
    return response;
  }

  /**
   * Barge-in on `response` (`response.cancel`). Safe to call more than once.
   * @param {BargeinResponse | string} response  a BargeinResponse or its id
   * @param {{heardChars?: number, audioEndMs?: number}} [options]  characters the user
   *   saw or heard (code points), or milliseconds of its audio the user heard
   */
  cancel(response, options = {}) {
    const target = typeof response === "string" ? this.responses.get(response) : response;
    const id = typeof response === "string" ? response : response.id;
    const event = { type: "response.cancel", response_id: id };
    if (options.heardChars !== undefined) event.heard_chars = Math.max(0, Math.floor(options.heardChars));
    if (options.audioEndMs !== undefined) event.audio_end_ms = Math.max(0, Math.floor(options.audioEndMs));
    if (target) {
      target.cancelled = true;
      target._cancel = event; // sent again after a resume, in case the socket lost it
    }
    this._send(event);
  }

  /**
   * Closes the socket without cancelling anything, then resumes like after a
   * network failure. For demonstrations and tests.
   */
  drop() {
    if (this._ws && (this.state === "open" || this.state === "resuming")) this._abandonSocket("dropped by client");
  }

  /** Closes for good: no reconnect; unfinished responses fail with `closed`. */
  close() {
    clearTimeout(this._timer);
    clearInterval(this._keepalive);
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      detach(ws);
      ws.close(1000, "client closed");
    }
    this._shutdown(new BargeinError("closed", "the client was closed"));
  }

  // ---- sockets -----------------------------------------------------------

  _openSocket() {
    const protocols = [SUBPROTOCOL];
    if (this.options.apiKey) protocols.push(`bearer.${this.options.apiKey}`);
    const ws = new this._WebSocket(this.url, protocols);
    this._ws = ws;
    this._created = null;
    ws.onopen = () => this._onOpen();
    ws.onmessage = (message) => this._onFrame(message.data);
    ws.onclose = (close) => this._onClose(close.code, close.reason);
    ws.onerror = () => {}; // a close event always follows and carries the code
  }

  _onOpen() {
    this._lastRx = Date.now();
    if (this.state !== "reconnecting") return;
    this._setState("resuming");
    const event = { type: "session.resume", session_id: this.sessionId, session_token: this.sessionToken };
    this._resumeEventId = this._send(event, { direct: true, reject: (error) => this._onSessionLost(error) });
  }

  _onClose(code, reason) {
    const ws = this._ws;
    if (ws) detach(ws);
    this._ws = null;
    if (this.state === "connecting" || FATAL_CLOSE_CODES.has(code)) {
      const error = new BargeinError("closed", `connection closed (${code}${reason ? ` ${reason}` : ""})`);
      this._ready?.reject(error);
      this._shutdown(error);
      return;
    }
    this._scheduleReconnect();
  }

  /** Forgets the current socket at once (a dead one may take minutes to close) and resumes. */
  _abandonSocket(reason) {
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      detach(ws);
      ws.close(DROP_CLOSE_CODE, reason);
    }
    this._scheduleReconnect();
  }

  _scheduleReconnect() {
    if (this.attempt >= this.options.maxAttempts) {
      this._shutdown(new BargeinError("connection_lost", "gave up reconnecting", { retryable: true }));
      return;
    }
    const { initialDelayMs, maxDelayMs } = this.options;
    const ceiling = Math.min(maxDelayMs, initialDelayMs * 2 ** this.attempt);
    // "Equal jitter": half fixed, half random, so a fleet of clients spreads out.
    const delayMs = Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
    this.attempt += 1;
    this._setState("reconnecting", delayMs);
    clearTimeout(this._timer);
    this._timer = setTimeout(() => this._openSocket(), delayMs);
  }

  _startKeepalive() {
    const { pingIntervalMs, pingTimeoutMs } = this.options;
    clearInterval(this._keepalive);
    if (!pingIntervalMs) return;
    this._keepalive = setInterval(() => {
      if (this.state !== "open" || !this._ws) return;
      const silentMs = Date.now() - this._lastRx;
      if (silentMs > pingIntervalMs + pingTimeoutMs) this._abandonSocket("ping timeout");
      else if (silentMs > pingIntervalMs) this._send({ type: "ping" });
    }, Math.min(pingIntervalMs, pingTimeoutMs) / 2);
  }

  // ---- incoming ----------------------------------------------------------

  /** @param {unknown} data  one frame */
  _onFrame(data) {
    this._lastRx = Date.now();
    let event;
    try {
      event = JSON.parse(typeof data === "string" ? data : new TextDecoder().decode(data));
    } catch {
      return; // not ours to judge: the protocol only grows, so skip what we cannot read
    }
    if (event === null || typeof event !== "object" || typeof event.type !== "string") return;
    const handler = SERVER_EVENTS[event.type];
    if (handler) handler.call(this, event);
    this._emit("event", event); // after the client's own bookkeeping, so listeners see it done
  }

  _onSessionCreated(event) {
    this.limits = event.limits ?? this.limits;
    this.model = event.model ?? this.model;
    this._created = event;
    if (this.state !== "connecting") return; // on a reconnect, session.resume decides
    this._adoptSession(event);
    const ready = () => {
      this._setState("open");
      this._flushOutbox();
      this._ready.resolve(event);
    };
    this._applySession(ready, (error) => {
      this._ready.reject(error);
      this.close();
    });
  }

  /** Sends `options.session` (if any) ahead of everything queued, then calls `resolve`. */
  _applySession(resolve, reject) {
    if (!this.options.session) {
      resolve();
      return;
    }
    const eventId = this._send({ type: "session.update", session: this.options.session }, { direct: true, reject });
    this._updates.push({ eventId, resolve, reject });
  }

  _onSessionUpdated(event) {
    this.audio = event.session?.audio ?? this.audio;
    const update = this._updates.shift();
    if (!update) return;
    this._pending.delete(update.eventId);
    update.resolve(event.session);
  }

  _onSessionResumed(event) {
    this._pending.delete(this._resumeEventId);
    this._resumeStreams(event.active ?? null);
  }

  /** The conversation could not be re-attached: carry on in the new session. */
  _onSessionLost(error) {
    this._emit("sessionlost", error);
    if (this._created) this._adoptSession(this._created);
    this._applySession(() => {}, (lost) => this._emit("error", lost));
    this._resumeStreams(null);
  }

  /** After a reconnect: ask for every unfinished stream from the offset we hold. */
  _resumeStreams(active) {
    for (const response of this.responses.values()) {
      if (response.finished) continue;
      if (!response.streamId && active?.response_id === response.id) {
        response._onCreated(active);
      }
      if (!response.streamId) {
        response._fail(new BargeinError("connection_lost", "the connection dropped before the response started", { retryable: true }));
        continue;
      }
      const event = { type: "stream.resume", stream_id: response.streamId, resume_token: response.resumeToken, from: response.end };
      if (this.audio?.output || response.audioEndMs > 0) event.audio_from_ms = response.audioEndMs;
      response._eventId = this._send(event, { direct: true, reject: (error) => response._fail(error) });
      if (response._cancel) this._send(response._cancel, { direct: true });
    }
    this.attempt = 0;
    this._setState("open");
    this._flushOutbox();
  }

  _onResponseEvent(event) {
    const response = this.responses.get(event.response_id) ?? this._serverStarted(event);
    if (!response) return;
    if (event.type === "response.delta") {
      response._onDelta(event);
      return;
    }
    if (event.type === "response.audio.delta") {
      response._onAudioDelta(event, this.outputRate);
      return;
    }
    if (event.type === "response.audio.done") {
      response._onAudioDone(event);
      return;
    }
    if (event.type === "response.audio.paused") {
      response._onAudioPaused(event);
      return;
    }
    if (event.type === "response.audio.resumed") {
      response._onAudioResumed(event);
      return;
    }
    this._pending.delete(response._eventId); // answered: created, resumed or done
    if (event.type === "response.created") response._onCreated(event);
    else if (event.type === "stream.resumed") {
      this.resumes += 1;
      response._onResumed(event);
    }
    else if (event.type === "response.done") response._onDone(event);
  }

  /** A `response.created` the client did not ask for (server VAD started it): a new response. */
  _serverStarted(event) {
    if (event.type !== "response.created") return null;
    const response = new BargeinResponse(this, event.response_id);
    response.fromServer = true;
    response.inputItemId = event.input_item_id ?? null; // known to `response` listeners already
    this.responses.set(response.id, response);
    this._emit("response", response);
    return response;
  }

  _onError(event) {
    const error = BargeinError.fromEvent(event);
    const pending = event.event_id ? this._pending.get(event.event_id) : undefined;
    if (pending) {
      this._pending.delete(event.event_id);
      if (pending.type === "session.update") this._updates = this._updates.filter((u) => u.eventId !== event.event_id);
      pending.reject(error);
      return;
    }
    const response = event.response_id ? this.responses.get(event.response_id) : undefined;
    if (response) response._fail(error);
    else this._emit("error", error);
  }

  // ---- outgoing ----------------------------------------------------------

  /**
   * Sends now when open, else queues. `reject` is called if the server answers
   * this event with an `error` (matched by event_id).
   * @returns {string} the event_id
   */
  _send(event, { reject, direct = false } = {}) {
    const eventId = `evt_${this._nextEventId++}`;
    const framed = { ...event, event_id: eventId };
    const tooBig = this._checkSize(framed);
    if (tooBig) {
      if (reject) reject(tooBig);
      else this._emit("error", tooBig);
      return eventId;
    }
    if (reject) this._pending.set(eventId, { reject, type: event.type });
    if (direct || this.state === "open") this._sendDirect(framed);
    else this._outbox.push(framed);
    return eventId;
  }

  /** The server closes the socket (1009) on a frame over its limit: refuse it here instead. */
  _checkSize(event) {
    const maxBytes = this.limits?.max_frame_bytes;
    if (!maxBytes) return null;
    const numBytes = new TextEncoder().encode(JSON.stringify(event)).length;
    if (numBytes <= maxBytes) return null;
    return new BargeinError("frame_too_large", `${event.type} is ${numBytes} bytes; the server takes at most ${maxBytes}`);
  }

  _sendDirect(event) {
    if (!this._ws || this._ws.readyState !== 1) {
      this._outbox.push(event);
      return;
    }
    this._ws.send(JSON.stringify(event));
    this._emit("sent", event);
  }

  _flushOutbox() {
    const queued = this._outbox;
    this._outbox = [];
    for (const event of queued) this._sendDirect(event);
  }

  // ---- bookkeeping ---------------------------------------------------------

  _adoptSession(event) {
    this.sessionId = event.session_id;
    this.sessionToken = event.session_token;
  }

  _shutdown(error) {
    clearTimeout(this._timer);
    clearInterval(this._keepalive);
    globalThis.removeEventListener?.("online", this._onOnline);
    this._outbox = [];
    for (const response of this.responses.values()) response._fail(error);
    for (const { reject } of this._pending.values()) reject(error);
    this._pending.clear();
    for (const update of this._updates) update.reject(error);
    this._updates = [];
    if (this.state !== "closed") this._setState("closed");
  }

  _setState(state, delayMs = 0) {
    this.state = state;
    this._emit("statechange", { state, attempt: this.attempt, delayMs });
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

/** Server event type -> handler; anything else is ignored (the protocol only grows). */
const SERVER_EVENTS = {
  "session.created": BargeinClient.prototype._onSessionCreated,
  "session.updated": BargeinClient.prototype._onSessionUpdated,
  "session.resumed": BargeinClient.prototype._onSessionResumed,
  "response.created": BargeinClient.prototype._onResponseEvent,
  "response.delta": BargeinClient.prototype._onResponseEvent,
  "response.done": BargeinClient.prototype._onResponseEvent,
  "stream.resumed": BargeinClient.prototype._onResponseEvent,
  "response.audio.delta": BargeinClient.prototype._onResponseEvent,
  "response.audio.done": BargeinClient.prototype._onResponseEvent,
  "response.audio.paused": BargeinClient.prototype._onResponseEvent,
  "response.audio.resumed": BargeinClient.prototype._onResponseEvent,
  error: BargeinClient.prototype._onError,
};

function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => {}); // callers that care await it
  return { promise, resolve, reject };
}

function detach(ws) {
  ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
}

function newId(prefix) {
  const random = globalThis.crypto?.randomUUID?.() ?? `${Date.now().toString(36)}${Math.random().toString(36).slice(2)}`;
  return `${prefix}_${random.replaceAll("-", "")}`;
}
