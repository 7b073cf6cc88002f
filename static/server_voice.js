// Server voice for the bargein page: the microphone goes to the server as
// 16 kHz pcm16 (`input_audio.append`), the server finds the turns, transcribes
// them and speaks its answers (`response.audio.delta`, 24 kHz), which play
// here through Web Audio. When the user starts talking over an answer
// (`input_audio.speech_started`), playback stops at once and the client tells
// the server how much of the answer was heard (`response.cancel` with
// `audio_end_ms`), so the conversation keeps exactly that.
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
 */
export class Player {
  /** @param {AudioContext} context */
  constructor(context) {
    this.context = context;
    /** @type {Map<string, {heard?: {ms: number, textEnd: number}, segments: Array<{at: number, until: number, startMs: number, endMs: number, textEnd: number, source: AudioBufferSourceNode}>}>} */
    this.responses = new Map();
    this.nextAt = 0; // context time where the next chunk starts
    this.lastId = null; // the response whose audio came last
  }

  /**
   * Schedules one `response.audio.delta`.
   * @param {string} responseId
   * @param {{pcm: Int16Array, startMs: number, endMs: number, textEnd: number}} chunk
   * @param {number} rate  samples per second of `pcm`
   */
  play(responseId, chunk, rate = OUTPUT_RATE) {
    let record = this.responses.get(responseId);
    if (!chunk.pcm.length || record?.heard) return; // heard stays frozen once stopped
    const buffer = this.context.createBuffer(1, chunk.pcm.length, rate);
    const samples = buffer.getChannelData(0);
    for (let i = 0; i < chunk.pcm.length; i += 1) samples[i] = chunk.pcm[i] / 32768;
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    if (!record) {
      record = { segments: [] };
      this.responses.set(responseId, record);
      this.nextAt = Math.max(this.nextAt, now + START_LEAD_S);
    }
    const at = Math.max(this.nextAt, now);
    source.start(at);
    this.nextAt = at + buffer.duration;
    record.segments.push({ at, until: this.nextAt, startMs: chunk.startMs, endMs: chunk.endMs, textEnd: chunk.textEnd, source });
    this.lastId = responseId;
  }

  /** The context time of the sample the output device renders now. */
  heardAt() {
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

  /** Whether audio of `responseId` is still to be heard. */
  pending(responseId) {
    const segments = this.responses.get(responseId)?.segments ?? [];
    return segments.length > 0 && this.heardAt() < segments.at(-1).until;
  }

  /** Stops every scheduled chunk at once (barge-in); what was heard of each response stays as it was. */
  stop() {
    for (const [responseId, record] of this.responses) {
      record.heard = this.played(responseId);
      for (const seg of record.segments) {
        seg.source.stop(); // allowed after its end too: every source here was started
        seg.source.disconnect();
      }
      record.segments = [];
    }
    this.nextAt = 0;
  }
}

/**
 * The whole server voice mode on one BargeinClient: microphone to server, audio
 * of every response to the Player, barge-in on `input_audio.speech_started`.
 *
 * Events (CustomEvent): `state` (detail: "listening" when the user speaks,
 * "speaking" while an answer's audio arrives, "off"), `bargein` (detail:
 * {response, ms, textEnd}: the answer the user talked over, cut at what was heard).
 */
export class ServerVoice extends EventTarget {
  /** @param {import("./bargein.js").BargeinClient} client */
  constructor(client) {
    super();
    this.client = client;
    this.context = null;
    this.microphone = null;
    this.player = null;
    this.active = false;
    this._audioOn = false; // the session.update that turned audio on was accepted
    this._followed = new WeakSet();
    this._onEvent = (event) => this._serverEvent(event.detail);
    this._onResponse = (event) => this._follow(event.detail);
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
    try {
      await this.client.updateSession({
        audio: {
          input: {
            sample_rate: INPUT_RATE,
            // the server ends a turn when its end-of-turn model hears the user done
            // (about 200 ms after a finished sentence), and waits out a pause mid-sentence
            turn_detection: { type: "semantic_vad", eagerness: "auto", create_response: true, interrupt_response: true },
          },
          output: { sample_rate: OUTPUT_RATE },
        },
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
   * Barge-in: silence the answer being played and tell the server what was heard
   * (`audio_end_ms`); also for an answer whose text (and audio) had all arrived.
   * @returns {{response: import("./bargein.js").BargeinResponse, ms: number, textEnd: number} | null}
   */
  interrupt() {
    if (!this.player) return null;
    const active = this.client.activeResponse;
    const response = active ?? (this.player.lastId ? this.client.responses.get(this.player.lastId) : null);
    if (!response || response.cancelled) return null;
    if (response !== active && !this.player.pending(response.id)) return null; // heard to its end
    const { ms, textEnd } = this.player.played(response.id);
    this.player.stop();
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
    if (event.type === "input_audio.speech_started") {
      this.interrupt();
      this._setState("listening");
    } else if (event.type === "response.audio.delta") {
      this._setState("speaking");
    }
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
