// Voice mode for the bargein page: Web Speech API recognition turns the
// user's words into turns; speechSynthesis speaks the answer as it streams,
// one sentence-sized utterance at a time, and reports how many characters
// were actually spoken when the user cuts in (from utterance boundary events).

import { countChars } from "./bargein.js";

/** A sentence end, optionally followed by closing quotes or brackets, then space; or a line break. */
const SENTENCE_END = /[.!?…;:]["'”’)\]]*\s+|\n+/g;
/** An utterance longer than this is cut at a space even without a sentence end. */
const MAX_UTTERANCE_CHARS = 220;

/**
 * What this browser offers.
 * @returns {{recognition: boolean, synthesis: boolean}}
 */
export function voiceSupport() {
  return {
    recognition: Boolean(globalThis.SpeechRecognition ?? globalThis.webkitSpeechRecognition),
    synthesis: Boolean(globalThis.speechSynthesis && globalThis.SpeechSynthesisUtterance),
  };
}

/**
 * Speaks one response as its deltas arrive and keeps count of what was heard.
 * Positions are UTF-16 indexes into the response text; `heardChars` converts
 * to code points, the unit of `heard_chars`.
 */
export class Speaker {
  /** @param {SpeechSynthesis} synth */
  constructor(synth) {
    this.synth = synth;
    this.text = "";      // all text received for the response
    this.queued = 0;     // text[0, queued) is handed to utterances
    this.spoken = 0;     // text[0, spoken) has been spoken
    this.pending = 0;    // utterances queued and not yet ended
    this.silenced = false;
  }

  /** True while an utterance is queued or being spoken. */
  get speaking() {
    return !this.silenced && this.pending > 0;
  }

  /** Characters (code points) of the response the user has heard. */
  get heardChars() {
    return countChars(this.text.slice(0, this.spoken));
  }

  /** @param {string} text  a new delta */
  push(text) {
    if (this.silenced) return;
    this.text += text;
    this._speakComplete(false);
  }

  /** The response ended: speak what is left. */
  finish() {
    if (!this.silenced) this._speakComplete(true);
  }

  /** Stops speech at once. @returns {number} characters heard (code points) */
  silence() {
    this.silenced = true;
    this.synth.cancel();
    return this.heardChars;
  }

  _speakComplete(all) {
    const rest = this.text.slice(this.queued);
    let cut = all ? rest.length : lastSentenceEnd(rest);
    if (cut === 0 && rest.length > MAX_UTTERANCE_CHARS) cut = rest.lastIndexOf(" ") + 1;
    if (cut <= 0) return;
    for (const [start, end] of sentences(rest.slice(0, cut))) this._utter(this.queued + start, this.queued + end);
    this.queued += cut;
  }

  _utter(start, end) {
    const text = this.text.slice(start, end);
    if (!text.trim()) {
      this.spoken = Math.max(this.spoken, end);
      return;
    }
    const utterance = new SpeechSynthesisUtterance(text);
    const hear = (upTo) => {
      if (!this.silenced) this.spoken = Math.max(this.spoken, upTo);
    };
    // A boundary fires as a word starts: count that word as heard.
    utterance.onboundary = (event) => hear(start + event.charIndex + (event.charLength || wordLength(text, event.charIndex)));
    const finished = () => {
      this.pending -= 1;
      hear(end);
    };
    utterance.onend = finished;
    utterance.onerror = () => { this.pending -= 1; };
    this.pending += 1;
    this.synth.speak(utterance);
  }
}

/**
 * Continuous recognition that restarts itself; events: `speechstart` (the
 * user began talking: the moment to barge in), `transcript` (detail: final
 * text), `error` (detail: a message for the page).
 */
export class Listener extends EventTarget {
  constructor(lang = navigator.language || "en-US") {
    super();
    const Recognition = globalThis.SpeechRecognition ?? globalThis.webkitSpeechRecognition;
    this.recognition = new Recognition();
    this.recognition.lang = lang;
    this.recognition.continuous = true;
    this.recognition.interimResults = true;
    this.active = false;
    this.heardSpeech = false;
    this.recognition.onspeechstart = () => this._speechStarted();
    this.recognition.onresult = (event) => this._onResult(event);
    this.recognition.onerror = (event) => this._onError(event.error);
    // Recognition ends by itself after silence; keep listening while on.
    this.recognition.onend = () => {
      if (this.active) this.recognition.start();
    };
  }

  start() {
    this.active = true;
    this.recognition.start();
  }

  stop() {
    this.active = false;
    this.recognition.abort();
  }

  _speechStarted() {
    if (this.heardSpeech) return;
    this.heardSpeech = true;
    this.dispatchEvent(new CustomEvent("speechstart"));
  }

  _onResult(event) {
    for (let i = event.resultIndex; i < event.results.length; i += 1) {
      const result = event.results[i];
      const text = result[0].transcript.trim();
      if (!text) continue;
      this._speechStarted(); // some engines send results without speechstart
      if (result.isFinal) {
        this.heardSpeech = false;
        this.dispatchEvent(new CustomEvent("transcript", { detail: text }));
      }
    }
  }

  _onError(code) {
    if (code === "no-speech" || code === "aborted") return;
    const messages = {
      "not-allowed": "Microphone access was refused.",
      "service-not-allowed": "This browser does not allow speech recognition here.",
      network: "Speech recognition needs its online service, which is unreachable.",
      "audio-capture": "No microphone was found.",
    };
    this.active = false;
    this.dispatchEvent(new CustomEvent("error", { detail: messages[code] ?? `Speech recognition failed (${code}).` }));
  }
}

/** UTF-16 index just past the last sentence end in `text`, or 0. */
function lastSentenceEnd(text) {
  let cut = 0;
  for (const match of text.matchAll(SENTENCE_END)) cut = match.index + match[0].length;
  return cut;
}

/** Splits `text` into [start, end) ranges, one sentence each. */
function sentences(text) {
  const ranges = [];
  let start = 0;
  for (const match of text.matchAll(SENTENCE_END)) {
    const end = match.index + match[0].length;
    ranges.push([start, end]);
    start = end;
  }
  if (start < text.length) ranges.push([start, text.length]);
  return ranges;
}

function wordLength(text, from) {
  const match = /^\S+/.exec(text.slice(from));
  return match ? match[0].length : 0;
}
