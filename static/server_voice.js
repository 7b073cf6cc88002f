// Server voice for the bargein page: the microphone goes to the server as
// 16 kHz pcm16 (`input_audio.append`), the server finds the turns, transcribes
// them and speaks its answers (`response.audio.delta`, 24 kHz), which play
// here through Web Audio. When the user starts talking over an answer
// (`input_audio.speech_started`), playback stops at once and the client tells
// the server how much of the answer was heard (`response.cancel` with
// `audio_end_ms`), so the conversation keeps exactly that. With confirmed
// interruptions (`turn_detection.interruption.mode` "confirm", the server's
// default) the playback only pauses at first, and resumes where it stopped
// when the server finds the speech was no interruption (a cough, an "mm-hm").
//
// Positions are the protocol's: milliseconds of a response's output timeline,
// counted from samples; "played" is what the audio output has rendered, read
// from the AudioContext's clock.

import { countChars } from "./bargein.js";

export const INPUT_RATE = 16000;
export const OUTPUT_RATE = 24000;
/** Milliseconds of microphone audio per `input_audio.append`. */
export const CHUNK_MS = 40;
/** Lead before a response's first chunk plays: room for the next one to arrive. */
const START_LEAD_S = 0.08;
/** Lead before a resumed answer plays on: the kept chunks are scheduled again. */
const RESUME_LEAD_S = 0.02;
/**
 * Lead of a pause: the audio thread renders ahead of the `currentTime` the page
 * reads, so playback stops this much later, at a time not yet rendered, and
 * what is kept starts exactly there (stopping "now" would replay what was
 * already rendered).
 */
const PAUSE_LEAD_S = 0.05;

// The AudioWorklet, as a module of its own (loaded from a Blob URL): it runs on
// the audio thread at the context's rate (usually 48 kHz), low-pass filters
// below the target Nyquist frequency (windowed sinc, Blackman window) so that
// nothing aliases, resamples by linear interpolation between filtered samples,
// and posts Int16Array chunks of `chunkSamples`.
const DOWNSAMPLER = String.raw`
class BargeinDownsampler extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate, chunkSamples } = options.processorOptions;
    this.step = sampleRate / targetRate;            // input samples per output sample
    this.taps = lowPass(0.45 * Math.min(targetRate, sampleRate) / sampleRate, this.step);
    this.tail = new Float32Array(this.taps.length); // the last input samples, for the filter
    this.pos = this.taps.length - 1;                // next output, as an index into tail + block
    this.chunkSamples = chunkSamples;
    this.chunk = new Int16Array(chunkSamples);
    this.filled = 0;
  }

  process(inputs) {
    const block = inputs[0] && inputs[0][0];
    if (!block) return true;
    const buf = new Float32Array(this.tail.length + block.length);
    buf.set(this.tail);
    buf.set(block, this.tail.length);
    while (this.pos + 1 < buf.length) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      this.emit(this.filtered(buf, i) * (1 - frac) + this.filtered(buf, i + 1) * frac);
      this.pos += this.step;
    }
    this.pos -= buf.length - this.tail.length;
    this.tail = buf.slice(buf.length - this.tail.length);
    return true;
  }

  filtered(buf, n) {
    const taps = this.taps;
    let acc = 0;
    for (let k = 0; k < taps.length; k += 1) acc += taps[k] * buf[n - k];
    return acc;
  }

  emit(value) {
    const clipped = Math.max(-1, Math.min(1, value));
    this.chunk[this.filled++] = Math.round(clipped * 32767);
    if (this.filled === this.chunk.length) {
      this.port.postMessage(this.chunk, [this.chunk.buffer]); // transferred: this.chunk is now empty
      this.chunk = new Int16Array(this.chunkSamples);
      this.filled = 0;
    }
  }
}

// Windowed-sinc low-pass: cutoff in cycles per input sample; unity gain at DC.
function lowPass(cutoff, step) {
  if (step <= 1) return new Float32Array([1]);     // nothing to remove when not downsampling
  const numTaps = 16 * Math.ceil(step) + 1;
  const taps = new Float32Array(numTaps);
  const mid = (numTaps - 1) / 2;
  let sum = 0;
  for (let k = 0; k < numTaps; k += 1) {
    const x = k - mid;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const w = 0.42 - 0.5 * Math.cos((2 * Math.PI * k) / (numTaps - 1)) + 0.08 * Math.cos((4 * Math.PI * k) / (numTaps - 1));
    taps[k] = sinc * w;
    sum += taps[k];
  }
  for (let k = 0; k < numTaps; k += 1) taps[k] /= sum;
  return taps;
}

registerProcessor("bargein-downsampler", BargeinDownsampler);
`;

/**
 * The downsampler node of `context`: mono in, Int16Array chunks of CHUNK_MS at
 * `rate` posted on its port (nothing on its output).
 * @param {BaseAudioContext} context
 * @param {number} rate
 * @returns {Promise<AudioWorkletNode>}
 */
export async function createDownsampler(context, rate) {
  const url = URL.createObjectURL(new Blob([DOWNSAMPLER], { type: "text/javascript" }));
  try {
    await context.audioWorklet.addModule(url);
  } finally {
    URL.revokeObjectURL(url);
  }
  return new AudioWorkletNode(context, "bargein-downsampler", {
    processorOptions: { targetRate: rate, chunkSamples: (rate * CHUNK_MS) / 1000 },
    channelCount: 1,
    channelCountMode: "explicit", // a stereo device is mixed down to mono
  });
}

/**
 * The microphone, as pcm16 chunks at `rate`: event `chunk` (detail: an
 * Int16Array of CHUNK_MS).
 */
export class Microphone extends EventTarget {
  /** @param {AudioContext} context @param {number} [rate] */
  constructor(context, rate = INPUT_RATE) {
    super();
    this.context = context;
    this.rate = rate;
    this.stream = null;
    this.node = null;
    this.source = null;
  }

  /** Asks for the microphone (echo cancellation on: the server does not cancel echo). */
  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { echoCancellation: true, noiseSuppression: true, channelCount: 1 },
    });
    this.source = this.context.createMediaStreamSource(this.stream);
    this.node = await createDownsampler(this.context, this.rate);
    this.node.port.onmessage = (message) => this.dispatchEvent(new CustomEvent("chunk", { detail: message.data }));
    this.source.connect(this.node);
    // The node writes nothing to its output; connected, the graph pulls it every render quantum.
    this.node.connect(this.context.destination);
  }

  stop() {
    this.node?.port.close();
    this.node?.disconnect();
    this.source?.disconnect();
    for (const track of this.stream?.getTracks() ?? []) track.stop();
    this.node = this.source = this.stream = null;
  }
}

/**
 * Plays responses' audio back to back and knows, for each, how much was heard.
 *
 * Every chunk becomes an AudioBufferSourceNode scheduled where the previous one
 * ends (later if the network fell behind: a gap, not a rush). Each scheduled
 * chunk keeps its place on both clocks, so the played position of a response
 * is exact across gaps: the output timeline millisecond at the AudioContext time
 * being rendered by the output device, capped at what was received.
 *
 * `pause()` holds the playback without suspending the AudioContext (the
 * microphone runs on it too, and the server must go on hearing the user): every
 * chunk not yet rendered is unscheduled and kept, the one being rendered is
 * split at the sample the context has reached, and chunks that arrive while
 * paused are kept too. `resume()` schedules what was kept from that sample on,
 * so nothing is lost and nothing is played twice. `stop()` (barge-in) drops
 * everything not played.
 */
export class Player {
  /**
   * @param {AudioContext} context
   * @param {AudioNode} [output]  where the audio goes (default: the context's destination)
   */
  constructor(context, output = context.destination) {
    this.context = context;
    this.output = output;
    /**
     * @type {Map<string, {heard?: {ms: number, textEnd: number}, stoppedSamples?: number,
     *   segments: Array<Segment>, held: Array<Segment>}>}
     *   segments: scheduled (or played) chunks, in timeline order; held: chunks kept while paused
     */
    this.responses = new Map();
    this.nextAt = 0; // context time where the next chunk starts
    this.lastId = null; // the response whose audio came last
    this.paused = false;
    this.pausedAt = 0; // context time of the pause (the sample where playback stopped)
    this.pauses = 0;
    this.resumes = 0;
  }

  /**
   * Schedules one `response.audio.delta` (keeps it, while paused).
   * @param {string} responseId
   * @param {{pcm: Int16Array, startMs: number, endMs: number, textEnd: number}} chunk
   * @param {number} rate  samples per second of `pcm`
   */
  play(responseId, chunk, rate = OUTPUT_RATE) {
    let record = this.responses.get(responseId);
    if (!chunk.pcm.length || record?.heard) return; // heard stays frozen once stopped
    if (!record) {
      record = { segments: [], held: [] };
      this.responses.set(responseId, record);
      this.nextAt = Math.max(this.nextAt, this.context.currentTime + START_LEAD_S);
    }
    this.lastId = responseId;
    const segment = { pcm: chunk.pcm, rate, startMs: chunk.startMs, endMs: chunk.endMs, textEnd: chunk.textEnd };
    if (this.paused) record.held.push(segment);
    else this._schedule(record, segment);
  }

  /** Starts `segment` where the previous chunk ends (or now). */
  _schedule(record, segment) {
    const buffer = this.context.createBuffer(1, segment.pcm.length, segment.rate);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < segment.pcm.length; i += 1) samples[i] = segment.pcm[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.output);
    const at = Math.max(this.nextAt, this.context.currentTime);
    source.start(at);
    this.nextAt = at + buffer.duration;
    record.segments.push({ ...segment, at, until: this.nextAt, source });
  }

  /** The context time of the sample the output device renders now (while paused: the pause's). */
  heardAt() {
    if (this.paused) return this.pausedAt;
    const stamp = this.context.getOutputTimestamp?.();
    return stamp && stamp.contextTime > 0 ? stamp.contextTime : this.context.currentTime;
  }

  /**
   * How much of a response was heard.
   * @param {string} responseId
   * @returns {{ms: number, textEnd: number}}  output timeline ms played, and the
   *   response text (code points) spoken by the chunk playing (or last played)
   */
  played(responseId) {
    const record = this.responses.get(responseId);
    if (record?.heard) return record.heard; // stopped: frozen where it stopped
    const t = this.heardAt();
    let ms = 0;
    let textEnd = 0;
    for (const seg of record?.segments ?? []) {
      if (t <= seg.at) break;
      textEnd = seg.textEnd;
      if (t < seg.until) {
        ms = seg.startMs + Math.min(seg.endMs - seg.startMs, (t - seg.at) * 1000);
        break;
      }
      ms = seg.endMs;
    }
    return { ms: Math.floor(ms), textEnd };
  }

  /**
   * Samples of a response the context has rendered (played) so far: after its
   * end, all its audio when nothing was lost or repeated.
   * @param {string} responseId
   */
  samplesPlayed(responseId) {
    const record = this.responses.get(responseId);
    if (!record) return 0;
    if (record.heard) return record.stoppedSamples;
    const t = this.paused ? this.pausedAt : this.context.currentTime;
    let total = 0;
    for (const seg of record.segments) total += renderedSamples(seg, t);
    return total;
  }

  /** Whether audio of `responseId` is still to be heard (held while paused, or scheduled). */
  pending(responseId) {
    const record = this.responses.get(responseId);
    if (!record || record.heard) return false;
    if (record.held.length > 0) return true;
    return record.segments.length > 0 && this.heardAt() < record.segments.at(-1).until;
  }

  /**
   * Holds the playback where it is (a confirmed interruption being decided):
   * what is not yet rendered is kept for `resume()`.
   * @returns {boolean} whether it was playing (false when already paused)
   */
  pause() {
    if (this.paused) return false;
    const cut = this.context.currentTime + PAUSE_LEAD_S; // not rendered yet: the samples before it play
    for (const record of this.responses.values()) {
      if (record.heard) continue;
      const kept = [];
      const held = [];
      for (const seg of record.segments) {
        if (seg.until <= cut) {
          kept.push(seg);
          continue;
        }
        seg.source.stop(cut); // before its start: it never plays
        const done = renderedSamples(seg, cut);
        const msAt = seg.startMs + (done * 1000) / seg.rate;
        if (done > 0) kept.push({ ...seg, pcm: seg.pcm.subarray(0, done), endMs: msAt, until: cut });
        if (done < seg.pcm.length) {
          held.push({ pcm: seg.pcm.subarray(done), rate: seg.rate, startMs: msAt, endMs: seg.endMs, textEnd: seg.textEnd });
        }
      }
      record.segments = kept;
      record.held = held.concat(record.held);
    }
    this.paused = true;
    this.pausedAt = cut;
    this.pauses += 1;
    this.nextAt = 0;
    return true;
  }

  /**
   * Plays on from the sample where `pause()` stopped, with what arrived meanwhile.
   * @returns {boolean} whether it was paused
   */
  resume() {
    if (!this.paused) return false;
    this.paused = false;
    this.resumes += 1;
    // after the pause's own end: the sources play up to `pausedAt`
    this.nextAt = Math.max(this.context.currentTime + RESUME_LEAD_S, this.pausedAt);
    for (const record of this.responses.values()) {
      const held = record.held;
      record.held = [];
      for (const seg of held) this._schedule(record, seg);
    }
    return true;
  }

  /** Stops every scheduled chunk at once (barge-in); what was heard of each response stays as it was. */
  stop() {
    for (const [responseId, record] of this.responses) {
      if (!record.heard) {
        record.heard = this.played(responseId);
        record.stoppedSamples = this.samplesPlayed(responseId);
      }
      for (const seg of record.segments) {
        seg.source.stop(); // allowed after its end too: every source here was started
        seg.source.disconnect();
      }
      record.segments = [];
      record.held = [];
    }
    this.paused = false;
    this.nextAt = 0;
  }
}

/**
 * @typedef {object} Segment  a chunk of a response's audio in the Player
 * @property {Int16Array} pcm  its samples
 * @property {number} rate  samples per second
 * @property {number} startMs  output timeline ms of its first sample
 * @property {number} endMs  ms after its last sample
 * @property {number} textEnd  code points spoken by `endMs`
 * @property {number} [at]  context time it starts (scheduled only)
 * @property {number} [until]  context time it ends
 * @property {AudioBufferSourceNode} [source]
 */

/** Samples of a scheduled segment rendered by context time `t`. */
function renderedSamples(seg, t) {
  if (t <= seg.at) return 0;
  if (t >= seg.until) return seg.pcm.length;
  return Math.min(seg.pcm.length, Math.round((t - seg.at) * seg.rate));
}

/**
 * The whole server voice mode on one BargeinClient: microphone to server, audio
 * of every response to the Player, barge-in on `input_audio.speech_started`.
 *
 * Interruptions follow `session.audio.input.turn_detection.interruption.mode`
 * in force (PROTOCOL.md 8.7):
 * - `immediate` (and a server that announces no `interruption`): speech over an
 *   answer cuts it at once, as a barge-in.
 * - `confirm`: that speech pauses the playback, keeping its buffered audio
 *   (`response.audio.paused` says the server paused the response too). The
 *   playback resumes from the same sample on `response.audio.resumed` (the
 *   speech is still judged again at its end: "yeah, but what about Tuesday?"
 *   cuts it then), or on `input_audio.discarded` for the speech's item (a
 *   cough, an "mm-hm", echo: the verdict, no user turn; its partial
 *   transcript, if shown, is taken back). A real
 *   interruption cuts it as a barge-in: `response.done` with `finish_reason:
 *   "interrupted"`, or, for an answer whose audio had all been sent (the server
 *   no longer pauses it; it still plays here), the speech's final transcript
 *   with words (resumed when it has none) or a response that starts.
 *
 * Events (CustomEvent): `state` (detail: "listening" when the user speaks,
 * "speaking" while an answer's audio arrives, "off"), `bargein` (detail:
 * {response, ms, textEnd}: the answer the user talked over, cut at what was heard),
 * `pause` (detail: {responseId, itemId}: playback held for the speech `itemId`),
 * `resume` (detail: {responseId, itemId}: playback goes on: a false
 * interruption), `discarded` (detail: the `input_audio.discarded` event).
 */
export class ServerVoice extends EventTarget {
  /**
   * @param {import("./bargein.js").BargeinClient} client
   * @param {{interruption?: "confirm" | "immediate" | Record<string, any>}} [options]
   *   `interruption`: the session's `turn_detection.interruption` to ask for (a
   *   mode, or the whole object); absent: the server's default (`confirm` on a
   *   server with confirmed interruptions) and nothing sent, so older servers
   *   do not refuse it
   */
  constructor(client, options = {}) {
    super();
    this.client = client;
    this.options = options;
    this.context = null;
    this.microphone = null;
    this.player = null;
    this.active = false;
    this._audioOn = false; // the session.update that turned audio on was accepted
    this._followed = new WeakSet();
    this._speechItem = null; // the item of the last speech_started
    /**
     * Speech over an answer whose verdict is still to come (its item, and the
     * answer): the playback is held, or plays on after a resume at a pause.
     * @type {{itemId: string | null, responseId: string} | null}
     */
    this._overlap = null;
    this._onEvent = (event) => this._serverEvent(event.detail);
    this._onResponse = (event) => this._follow(event.detail);
  }

  /** `turn_detection.interruption.mode` in force: `confirm` or `immediate`. */
  get interruptionMode() {
    return this.client.audio?.input?.turn_detection?.interruption?.mode ?? "immediate";
  }

  /** Whether the playback is held, waiting for the server's verdict on speech over it. */
  get paused() {
    return Boolean(this.player?.paused);
  }

  /** The item of the speech over an answer whose verdict is still to come, or null. */
  get judging() {
    return this._overlap?.itemId ?? null;
  }

  /** Turns server audio on for the session and opens the microphone. */
  async start() {
    this.context = new AudioContext();
    await this.context.resume(); // started from a click: allowed to play
    this.player = new Player(this.context);
    this.microphone = new Microphone(this.context, INPUT_RATE);
    this.microphone.addEventListener("chunk", (event) => this.client.appendAudio(event.detail));
    this.client.addEventListener("event", this._onEvent);
    this.client.addEventListener("response", this._onResponse);
    this.active = true;
    // the server ends a turn when its end-of-turn model hears the user done
    // (about 200 ms after a finished sentence), and waits out a pause mid-sentence
    const turnDetection = { type: "semantic_vad", eagerness: "auto", create_response: true, interrupt_response: true };
    const { interruption } = this.options;
    if (interruption) turnDetection.interruption = typeof interruption === "string" ? { mode: interruption } : interruption;
    try {
      await this.client.updateSession({
        audio: { input: { sample_rate: INPUT_RATE, turn_detection: turnDetection }, output: { sample_rate: OUTPUT_RATE } },
      });
      this._audioOn = true;
      await this.microphone.start();
    } catch (error) {
      await this.stop();
      throw error;
    }
    for (const response of this.client.responses.values()) if (!response.finished) this._follow(response);
  }

  /** Closes the microphone, silences playback and turns server audio off. */
  async stop() {
    if (!this.active) return;
    this.active = false;
    this.client.removeEventListener("event", this._onEvent);
    this.client.removeEventListener("response", this._onResponse);
    this.microphone?.stop();
    this.player?.stop();
    this._overlap = null;
    const context = this.context;
    this.context = this.microphone = this.player = null;
    this._setState("off");
    await context?.close();
    if (this._audioOn) {
      this._audioOn = false;
      await this.client.updateSession({ audio: { input: { turn_detection: null }, output: null } });
    }
  }

  /**
   * Barge-in: silence the answer being played (or held) and tell the server
   * what was heard (`audio_end_ms`); also for an answer whose text (and audio)
   * had all arrived.
   * @param {import("./bargein.js").BargeinResponse} [target]  the answer to cut
   *   (default: the active one, else the one whose audio came last)
   * @returns {{response: import("./bargein.js").BargeinResponse, ms: number, textEnd: number} | null}
   */
  interrupt(target) {
    if (!this.player) return null;
    const active = this.client.activeResponse;
    const response = target ?? active ?? (this.player.lastId ? this.client.responses.get(this.player.lastId) : null);
    if (!response || response.cancelled) return null;
    if (response !== active && !this.player.pending(response.id)) return null; // heard to its end
    const { ms, textEnd } = this.player.played(response.id);
    this.player.stop();
    this._overlap = null;
    response.cancel({ audioEndMs: ms });
    const cut = { response, ms, textEnd };
    this.dispatchEvent(new CustomEvent("bargein", { detail: cut }));
    return cut;
  }

  /** Played milliseconds and heard text of a response. */
  played(response) {
    return this.player ? this.player.played(response.id) : { ms: 0, textEnd: 0 };
  }

  _follow(response) {
    if (this._followed.has(response)) return;
    this._followed.add(response);
    response.addEventListener("audio", (event) => {
      if (this.player) this.player.play(response.id, event.detail, this.client.outputRate);
    });
  }

  _serverEvent(event) {
    switch (event.type) {
      case "input_audio.speech_started": {
        this._speechItem = event.item_id ?? null;
        const playing = this._playingId();
        if (this.interruptionMode !== "confirm") this.interrupt();
        else if (playing) this._hold(playing);
        this._setState("listening");
        break;
      }
      case "response.audio.paused":
        this._hold(event.response_id);
        break;
      case "response.audio.resumed":
        // the speech is judged again at its end ("yeah, but what about Tuesday?"): still overlapping
        if (this._overlap?.responseId === event.response_id) this._playOn();
        break;
      case "input_audio.discarded":
        if (this._overlap && this._overlap.itemId === event.item_id) this._release();
        this.dispatchEvent(new CustomEvent("discarded", { detail: event }));
        break;
      case "input_audio.transcript":
        if (event.final && this._overlap && this._overlap.itemId === event.item_id) {
          if (String(event.text ?? "").trim()) this._cutOverlapped();
          else this._release(); // nothing heard: no turn
        }
        break;
      case "response.created":
        if (this._overlap) this._cutOverlapped(); // the speech was a turn (or another began): the answer ends
        break;
      case "response.done": {
        if (event.finish_reason !== "interrupted") break;
        const response = this.client.responses.get(event.response_id);
        if (response && !response.cancelled && this.player?.pending(response.id)) this.interrupt(response);
        else if (this._overlap?.responseId === event.response_id) this._overlap = null;
        break;
      }
      case "response.audio.delta":
        this._setState("speaking");
        break;
      default:
        break;
    }
  }

  /** The response whose audio is still to be heard, if any. */
  _playingId() {
    const id = this.player?.lastId;
    return id && this.player.pending(id) ? id : null;
  }

  /** Speech over the answer `responseId` (confirm mode): hold its playback until the verdict. */
  _hold(responseId) {
    if (!this.player || !responseId) return;
    this._overlap = { itemId: this._speechItem, responseId };
    if (this.player.pause()) this.dispatchEvent(new CustomEvent("pause", { detail: { ...this._overlap } }));
  }

  /** The playback goes on from where it paused. */
  _playOn() {
    const detail = { ...this._overlap };
    if (this.player?.resume()) this.dispatchEvent(new CustomEvent("resume", { detail }));
  }

  /** A false interruption, for good: the playback goes on (if still held). */
  _release() {
    this._playOn();
    this._overlap = null;
  }

  /** A real interruption of the answer the speech was over: cut it where it was heard. */
  _cutOverlapped() {
    const overlap = this._overlap;
    this._overlap = null;
    const response = overlap ? this.client.responses.get(overlap.responseId) : null;
    if (response) this.interrupt(response);
  }

  _setState(state) {
    this.dispatchEvent(new CustomEvent("state", { detail: state }));
  }
}

/** The text of `text` up to `chars` code points (where an answer was cut). */
export function headOf(text, chars) {
  let units = 0;
  for (let n = 0; n < chars && units < text.length; n += 1) {
    const code = text.codePointAt(units);
    units += code > 0xffff ? 2 : 1;
  }
  return text.slice(0, units);
}

/** Code points in `text` (re-exported for the page). */
export { countChars };
