"""One benchmark voice session: a microphone paced in real time, the
server's events stamped as they arrive, and what one turn measured.

A turn is followed by the user item it became on the server, never by "the
next response": the turn is the ``input_audio.committed`` whose
``audio_end_ms`` reaches the utterance's last voiced sample (within
``END_SLACK_MS``), its answer the ``response.created`` that names that item
(``input_item_id``). A turn cut in two by the turn detector, a barge-in's
own turn or a response left from an earlier turn cannot be mistaken for it.
A turn whose answer does not end within ``turn_timeout_s`` is counted as
lost, with every event the client saw meanwhile, and the session goes on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

from loadtests.speech import silence_pcm16
from loadtests.voice_utterances import Utterance, voiced_bounds

RATE = 16000
CHUNK_MS = 40
CHUNK_BYTES = RATE * 2 * CHUNK_MS // 1000
END_SLACK_MS = 300  # a VAD's end of speech may fall a few frames before the last voiced sample
BREATH_MS = 800  # silence between a turn's answer and the next utterance


class ModeRefused(Exception):
    """The server refused the session's turn detection (``error`` to its ``session.update``)."""


def turn_detection(mode: str) -> dict[str, Any]:
    """The ``turn_detection`` of a mode: ``server_vad`` or ``semantic_vad:<eagerness>``.

    Raises:
        ValueError: another mode.
    """
    if mode == "server_vad":
        return {"type": "server_vad"}
    kind, _, eagerness = mode.partition(":")
    if kind != "semantic_vad" or eagerness not in ("low", "medium", "high", "auto"):
        raise ValueError(f"mode {mode!r}: server_vad or semantic_vad:<low|medium|high|auto>")
    return {"type": "semantic_vad", "eagerness": eagerness}


@dataclass(slots=True)
class Mark:
    """When a marked sample was captured and when the chunk holding it was sent.

    Attributes:
        captured: when a real microphone would have captured it (monotonic s):
            the chunk goes out once its last sample is captured, so this is
            the send time less the audio after the sample in the chunk.
        sent: when the chunk holding it was sent (monotonic s).
        input_ms: the sample's place on the server's input timeline, ms.
    """

    captured: float
    sent: float
    input_ms: int


class Mic:
    """Streams PCM16 in real time over one socket, in ``CHUNK_MS`` chunks
    sent as a microphone would (each once its last sample is captured),
    silence when nothing is queued; remembers when marked samples went."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.marks: dict[str, Mark] = {}
        self._pending: list[tuple[int, str]] = []  # (byte offset in the stream, name)
        self._sent = 0  # bytes sent
        self._queued = 0  # bytes queued, not yet sent

    def say(self, pcm: bytes, marks: dict[str, int]) -> None:
        """Queue ``pcm``; ``marks``: name -> sample index in it to time."""
        base = self._sent + self._queued
        for name, sample in marks.items():
            self.marks.pop(name, None)  # an earlier utterance's mark of the same name
            self._pending.append((base + 2 * sample, name))
        for lo in range(0, len(pcm), CHUNK_BYTES):
            self.queue.put_nowait(pcm[lo : lo + CHUNK_BYTES])
        self._queued += len(pcm)

    async def run(self) -> None:
        """Send chunks until cancelled."""
        start = time.monotonic()
        n = 0
        silence = silence_pcm16(CHUNK_MS, RATE)
        while True:
            n += 1
            await asyncio.sleep(max(0.0, start + n * CHUNK_MS / 1000 - time.monotonic()))
            chunk = silence if self.queue.empty() else self.queue.get_nowait()
            from_queue = chunk is not silence
            if from_queue:
                self._queued -= len(chunk)
            audio = base64.b64encode(chunk).decode()
            await self.ws.send(json.dumps({"type": "input_audio.append", "audio": audio}))
            now = time.monotonic()
            end = self._sent + len(chunk)
            for offset, name in list(self._pending) if from_queue else []:
                if offset < end:
                    after_s = (end - offset - 2) / 2 / RATE  # the chunk's audio after the sample
                    self.marks[name] = Mark(
                        captured=now - after_s, sent=now, input_ms=offset // 2 * 1000 // RATE
                    )
                    self._pending.remove((offset, name))
            self._sent = end


@dataclass(slots=True)
class Event:
    """A server event and when it arrived (monotonic s)."""

    at: float
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data.get("type"))


@dataclass(slots=True)
class Turn:
    """What one turn measured: seconds from the utterance's last voiced
    sample (barge-in: from the interruption's first), None where not seen.

    Attributes:
        stopped: ``input_audio.speech_stopped`` of the turn's speech.
        committed: ``input_audio.committed`` of the turn (the end-of-turn decision).
        transcript: its final ``input_audio.transcript``.
        first_token: the answer's first ``response.delta``.
        first_audio: the answer's first ``response.audio.delta`` (voice to voice).
        stall: seconds a client playing the answer from its first audio
            waited for audio that had not arrived yet (0: no gap).
        finish: the answer's ``finish_reason``.
        lost: no answer ended, and no refusal came, within the turn's time limit.
        refused: the code of the ``error`` that came instead of the answer
            (after the turn's transcript, before any ``response.created`` of
            it) or instead of its ``response.done`` (naming its response).
        errors: ``code: message`` of each ``error`` meanwhile.
        cut_off: (mid-sentence-pause set) the user was answered before
            finishing: a ``response.created`` or audio arrived before the
            utterance's last chunk went out, or a turn that ended before the
            utterance did got a ``response.created`` (on a loaded server that
            answer may come after the user finished: a cut all the same).
        split: (same) the turn detector committed a turn that ended before the
            utterance did.
        barge_started: ``input_audio.speech_started`` of a barge-in.
        barge_done: the interrupted answer's ``response.done``.
        trace: the events of a lost turn (type and arrival, s from its end).
    """

    stopped: float | None = None
    committed: float | None = None
    transcript: float | None = None
    first_token: float | None = None
    first_audio: float | None = None
    stall: float | None = None
    finish: str | None = None
    lost: bool = False
    refused: str | None = None
    errors: list[str] = field(default_factory=list)
    cut_off: bool = False
    split: bool = False
    barge_started: float | None = None
    barge_done: float | None = None
    trace: list[str] = field(default_factory=list)


class VoiceSession:
    """One connection to ``/v1/realtime`` speaking in ``mode``.

    Args:
        ws: the open socket.
        mode: ``server_vad`` or ``semantic_vad:<eagerness>``.
        turn_timeout_s: a turn with no answer done by then is lost.
    """

    def __init__(self, ws: Any, mode: str, *, turn_timeout_s: float) -> None:
        self.ws = ws
        self.mode = mode
        self.mic = Mic(ws)
        self.turn_timeout_s = turn_timeout_s
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Set the session up (greedy answers of up to 40 tokens, 16 kHz in,
        24 kHz out, the mode's turn detection) and start the microphone.

        Raises:
            ModeRefused: the server answered the update with an ``error``.
        """
        json.loads(await self.ws.recv())  # session.created
        audio = {
            "input": {"sample_rate": RATE, "turn_detection": turn_detection(self.mode)},
            "output": {"sample_rate": 24000},
        }
        session = {"defaults": {"temperature": 0, "max_tokens": 40}, "audio": audio}
        await self.ws.send(json.dumps({"type": "session.update", "session": session}))
        while True:
            answer = json.loads(await self.ws.recv())
            if answer["type"] == "error":
                raise ModeRefused(f"{answer.get('code')}: {answer.get('message')}")
            if answer["type"] == "session.updated":
                break
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self.mic.run())]

    async def stop(self) -> None:
        """Stop the microphone and the reader."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _read(self) -> None:
        async for frame in self.ws:
            self._events.put_nowait(Event(at=time.monotonic(), data=json.loads(frame)))

    async def _next(self, deadline: float) -> Event | None:
        try:
            return await asyncio.wait_for(self._events.get(), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            return None

    async def question(self, utterance: Utterance, barge: Utterance | None = None) -> Turn:
        """Say a complete question and follow its answer; with ``barge``, say
        it over the answer once its first audio arrived, and follow the
        interruption and the barge-in's own turn too."""
        self.mic.say(utterance.pcm, {"end": utterance.end_sample})
        turn = Turn()
        deadline = time.monotonic() + self.turn_timeout_s
        follow = _Follow(self, "end", turn)
        barge_follow: _Follow | None = None
        while not follow.done or (barge_follow is not None and not barge_follow.done):
            event = await self._next(deadline)
            if event is None:
                turn.lost = True
                turn.trace = follow.trace + ([] if barge_follow is None else barge_follow.trace)
                break
            first_audio = turn.first_audio is None
            follow.see(event)
            if barge is not None and first_audio and turn.first_audio is not None:
                first, _ = voiced_bounds(barge.pcm)
                self.mic.say(barge.pcm, {"barge": first, "barge_end": barge.end_sample})
                barge_follow = _Follow(self, "barge_end", Turn())
            if barge_follow is not None:
                barge_follow.see(event)
                self._see_barge(event, turn, follow.response_id)
        turn.stall = follow.stall()
        self.mic.say(silence_pcm16(BREATH_MS, RATE), {})
        return turn

    def _see_barge(self, event: Event, turn: Turn, response_id: str | None) -> None:
        onset = self.mic.marks.get("barge")
        if onset is None:
            return
        if event.type == "input_audio.speech_started" and turn.barge_started is None:
            turn.barge_started = event.at - onset.captured
        elif event.type == "response.done" and event.data.get("response_id") == response_id:
            if event.at > onset.captured:  # else the answer ended before the barge-in
                turn.barge_done = event.at - onset.captured

    async def paused(self, utterance: Utterance) -> Turn:
        """Say a sentence with a pause inside and follow it to its answer:
        an answer shown before its last chunk went out is a false cut-off."""
        assert utterance.pause_sample is not None
        self.mic.say(utterance.pcm, {"end": utterance.end_sample})
        turn = Turn()
        deadline = time.monotonic() + self.turn_timeout_s
        follow = _Follow(self, "end", turn)
        split_items = set()  # turns committed before the sentence ended
        while not follow.done:
            event = await self._next(deadline)
            if event is None:
                turn.lost = True
                turn.trace = follow.trace
                break
            end = self.mic.marks.get("end")
            before_end = end is None or event.at < end.sent
            if before_end and event.type in ("response.created", "response.audio.delta"):
                turn.cut_off = True
            if event.type == "input_audio.committed" and not follow.is_final(event):
                turn.split = True
                split_items.add(event.data.get("item_id"))
            if event.type == "response.created" and event.data.get("input_item_id") in split_items:
                turn.cut_off = True  # the part before the pause was answered, however late
            follow.see(event)
        self.mic.say(silence_pcm16(BREATH_MS, RATE), {})
        return turn


class _Follow:
    """Follows the turn that ends at mark ``end_mark`` to its answer's ``response.done``."""

    def __init__(self, session: VoiceSession, end_mark: str, turn: Turn) -> None:
        self._marks = session.mic.marks
        self._end_mark = end_mark
        self.turn = turn
        self.item_id: str | None = None
        self.response_id: str | None = None
        self.done = False
        self.trace: list[str] = []
        self._audio: list[tuple[float, int]] = []  # (arrival, start_ms) of the answer's audio

    def is_final(self, event: Event) -> bool:
        """Whether a ``committed`` is the turn's: it ends at the mark or later."""
        end = self._marks.get(self._end_mark)
        return end is not None and int(event.data.get("audio_end_ms", -1)) >= end.input_ms - END_SLACK_MS

    def see(self, event: Event) -> None:
        end = self._marks.get(self._end_mark)
        if end is None or self.done:
            return
        since = event.at - end.captured
        data, kind, turn = event.data, event.type, self.turn
        self.trace.append(f"{since:+.3f} {kind}")
        if kind == "error":
            turn.errors.append(f"{data.get('code')}: {data.get('message')}")
            refused = turn.transcript is not None and self.response_id is None  # its response.create
            if refused or (self.response_id is not None and data.get("response_id") == self.response_id):
                turn.refused = str(data.get("code"))  # an error instead of the answer, or of its end
                self.done = True
        elif kind == "input_audio.speech_stopped" and turn.stopped is None and self.is_final(event):
            turn.stopped = since
        elif kind == "input_audio.committed" and self.item_id is None and self.is_final(event):
            self.item_id = data.get("item_id")
            turn.committed = since
        elif (
            kind == "input_audio.transcript"
            and data.get("final", True)
            and data.get("item_id") == self.item_id
        ):
            turn.transcript = since
            if self.item_id is not None and not data.get("text"):
                self.done = True  # no words: no answer is due
        elif (
            kind == "response.created"
            and self.item_id is not None
            and data.get("input_item_id") == self.item_id
        ):
            self.response_id = data.get("response_id")
        elif self.response_id is None or data.get("response_id") != self.response_id:
            return
        elif kind == "response.delta" and turn.first_token is None:
            turn.first_token = since
        elif kind == "response.audio.delta":
            if turn.first_audio is None:
                turn.first_audio = since
            self._audio.append((event.at, int(data["start_ms"])))
        elif kind == "response.done":
            turn.finish = data.get("finish_reason")
            self.done = True

    def stall(self) -> float | None:
        """Seconds a client playing the answer from its first audio on would
        have waited for audio not yet arrived."""
        if not self._audio:
            return None
        start, waited = self._audio[0][0], 0.0
        for at, start_ms in self._audio:
            due = start + start_ms / 1000 + waited
            waited += max(0.0, at - due)
        return waited
