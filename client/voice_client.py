"""The user's side of a voice conversation with bargein: audio in, turns found by the server.

:class:`VoiceClient` is a :class:`bargein.client.realtime_client.RealtimeClient` that
also sends ``input_audio.append`` (pcm16 mono at the session's input rate,
16 kHz by default) and follows the turns the server's VAD finds in it
(docs/protocol.md, "Audio")::

    async with VoiceClient("ws://127.0.0.1:8000/v1/realtime") as client:
        await client.update(audio=voice_settings())  # semantic_vad, 16 kHz in, 24 kHz out
        with WavSink("answer.wav", client.output_rate) as sink:
            turn = await client.talk("question.wav", on_audio=sink)
        print(turn.transcript, "->", turn.response.text)

``talk`` streams the file followed by silence, in real time by default (as a
microphone would: a chunk once its last sample "was recorded"), while
``voice_turn`` reads what the server makes of it: speech start and stop, the
committed user item and its transcript, then the response the server started
for it (its text and audio), until that response is done. ``send_audio`` and
``voice_turn`` are the two halves, for a live source.

Playing the answers as a user hears them (barge-in, and confirmed
interruptions: speech over an answer pauses it until the server says whether
it interrupts, docs/protocol.md 8.7) is :class:`~bargein.client.playback.AnswerPlayer`'s::

    player = client.player()  # the session's output rate and interruption mode
    turn = await client.talk("question.wav", player=player)
    # later turns: speech over the answer pauses it; an "mm-hm" resumes it,
    # a real interruption cuts it and sends response.cancel with what was played
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed

from bargein.client.pcm import Rechunker, read_wav, silence
from bargein.client.playback import AnswerPlayer, Clock, InterruptionMode
from bargein.client.realtime_client import (
    INPUT_RATE,
    OUTPUT_RATE,
    AudioSink,
    RealtimeClient,
    Response,
    ServerError,
)

TranscriptSink = Callable[[str, bool], None]  # (the transcript so far, whether it is final)
TextSink = Callable[[str], None]
MIN_CHUNK_MS, MAX_CHUNK_MS = 20, 100


def voice_settings(
    *,
    input_rate: int = INPUT_RATE,
    output_rate: int = OUTPUT_RATE,
    detection: str = "semantic_vad",
    create_response: bool = True,
    interrupt_response: bool = True,
    interruption: InterruptionMode | dict[str, Any] | None = None,
    **turn_detection: Any,
) -> dict[str, Any]:
    """``session.audio`` for a voice conversation with the server finding the
    turns (give it to :meth:`RealtimeClient.update` as ``audio=``).

    Args:
        input_rate, output_rate: sample rates of the user's and the answers' audio, Hz.
        detection: ``"semantic_vad"`` (the default: a turn ends when the
            server's end-of-turn model judges the user done, about 200 ms
            after a finished sentence, and a pause mid-sentence is waited
            out) or ``"server_vad"`` (a turn ends after a fixed silence).
        create_response: a turn's end starts a response.
        interrupt_response: the user's speech interrupts an answer (barge-in).
        interruption: how (``turn_detection.interruption``, docs/protocol.md
            8.7): ``"confirm"`` (the server's default: speech over an answer
            pauses its audio, and only words that are not a backchannel
            such as "mm-hm" cut it; otherwise it resumes), ``"immediate"``
            (any speech cuts it at once), or the whole object, e.g.
            ``{"mode": "confirm", "min_words": 2, "backchannels": ["mm-hm",
            "yeah"], "max_pause_ms": 500}``. None: not sent (the server's
            setting stays; a server without confirmed interruptions refuses
            the field).
        turn_detection: with ``semantic_vad``, ``eagerness`` (``"low"``,
            ``"medium"``, ``"high"`` or ``"auto"``); with ``server_vad``,
            ``threshold``, ``prefix_padding_ms``, ``silence_duration_ms``.
    """
    fields = {
        "type": detection,
        "create_response": create_response,
        "interrupt_response": interrupt_response,
        **turn_detection,
    }
    if interruption is not None:
        fields["interruption"] = {"mode": interruption} if isinstance(interruption, str) else interruption
    return {
        "input": {"sample_rate": input_rate, "turn_detection": fields},
        "output": {"sample_rate": output_rate},
    }


@dataclass(slots=True, kw_only=True)
class VoiceTurn:
    """One turn the user spoke and the answer to it (:meth:`VoiceClient.voice_turn`).

    Attributes:
        item_id: the user item the turn became (``input_audio.committed``).
        audio_start_ms, audio_end_ms: the turn on the input timeline, milliseconds.
        transcript: what the server heard (the last ``input_audio.transcript``).
        final: whether that transcript was the final one.
        response: the response the server started for the turn.
        discarded: ``input_audio.discarded`` events seen while following it:
            speech the server judged no turn (a cough, an "mm-hm", echo), whose
            item never becomes a user item.
    """

    item_id: str | None = None
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    transcript: str = ""
    final: bool = False
    response: Response | None = None
    discarded: list[dict[str, Any]] = field(default_factory=list)


class VoiceClient(RealtimeClient):
    """A realtime session that talks: see the module docstring; arguments as
    :class:`RealtimeClient`'s.

    Attributes:
        interruption_mode: ``turn_detection.interruption.mode`` in force
            (``session.updated``): ``"confirm"`` or ``"immediate"``;
            ``"immediate"`` also for a server that does not announce it
            (today's barge-in) or with turn detection off.
    """

    interruption_mode: InterruptionMode = "immediate"

    async def update(self, **session: Any) -> dict[str, Any]:
        """:meth:`RealtimeClient.update`, noting :attr:`interruption_mode`."""
        updated = await super().update(**session)
        audio = updated.get("session", {}).get("audio")
        if audio is not None:
            detection = (audio.get("input") or {}).get("turn_detection") or {}
            self.interruption_mode = (detection.get("interruption") or {}).get("mode", "immediate")
        return updated

    def player(self, *, clock: Clock | None = None) -> AnswerPlayer:
        """An :class:`AnswerPlayer` for this session's answers (its output rate
        and :attr:`interruption_mode`), for :meth:`voice_turn` and :meth:`talk`."""
        kwargs = {} if clock is None else {"clock": clock}
        return AnswerPlayer(self.output_rate, mode=self.interruption_mode, **kwargs)

    async def append_audio(self, pcm: bytes) -> None:
        """One ``input_audio.append`` of pcm16 mono at :attr:`input_rate`."""
        await self.send({"type": "input_audio.append", "audio": base64.b64encode(pcm).decode("ascii")})

    async def commit_audio(self) -> None:
        """``input_audio.commit``: end the user's turn now (push to talk)."""
        await self.send({"type": "input_audio.commit"})

    async def clear_audio(self) -> None:
        """``input_audio.clear``: drop the uncommitted input audio."""
        await self.send({"type": "input_audio.clear"})

    async def send_audio(
        self,
        audio: bytes | Iterable[bytes] | AsyncIterable[bytes],
        *,
        chunk_ms: int = 40,
        realtime: bool = True,
    ) -> int:
        """Send pcm16 mono at :attr:`input_rate` as ``input_audio.append`` events
        of ``chunk_ms`` each (the last may be shorter).

        Args:
            audio: one buffer, or pieces of any sizes (a live source).
            chunk_ms: milliseconds per event, 20 to 100.
            realtime: pace the events in real time, each once its last sample
                would have been recorded; False: as fast as the socket takes them.

        Returns:
            milliseconds of audio sent.

        Raises:
            ValueError: ``chunk_ms`` out of range.
        """
        if not MIN_CHUNK_MS <= chunk_ms <= MAX_CHUNK_MS:
            raise ValueError(f"{chunk_ms=} must be in [{MIN_CHUNK_MS}, {MAX_CHUNK_MS}] ms")
        rechunker = Rechunker(sample_rate=self.input_rate, chunk_ms=chunk_ms)
        loop = asyncio.get_running_loop()
        start_s = loop.time()
        sent_samples = 0

        async def send(chunk: bytes) -> None:
            nonlocal sent_samples
            sent_samples += len(chunk) // 2
            if realtime:  # a deadline from the start, so delays do not add up
                await asyncio.sleep(start_s + sent_samples / self.input_rate - loop.time())
            await self.append_audio(chunk)

        async for piece in _pieces(audio):
            for chunk in rechunker.push(piece):
                await send(chunk)
        if rest := rechunker.flush():
            await send(rest)
        return sent_samples * 1000 // self.input_rate

    async def talk(
        self,
        audio: str | os.PathLike[str] | bytes,
        *,
        chunk_ms: int = 40,
        realtime: bool = True,
        trailing_silence_ms: int = 4500,
        commit_timeout_s: float = 10.0,
        on_transcript: TranscriptSink | None = None,
        on_text: TextSink | None = None,
        on_audio: AudioSink | None = None,
        player: AnswerPlayer | None = None,
    ) -> VoiceTurn:
        """Speak one turn: send ``audio`` and then silence (the server's VAD ends
        the turn on it), and follow the turn until its response is done.

        Args:
            audio: a WAV file (any rate, channels, integer width: converted to
                :attr:`input_rate` mono), or pcm16 mono bytes at :attr:`input_rate`.
            chunk_ms, realtime: as :meth:`send_audio`.
            trailing_silence_ms: silence sent after ``audio``; more than the
                silence that ends the session's turns (``server_vad``'s
                ``silence_duration_ms``; with ``semantic_vad``, the
                eagerness' longest wait for a sentence that sounds unfinished:
                4 s for ``auto``). Only what the turn needs is sent: the
                rest stops once its response is done.
            commit_timeout_s, on_transcript, on_text, on_audio, player: as :meth:`voice_turn`.

        Returns:
            the turn; the audio still being sent when its response is done is
            not sent.

        Raises:
            TimeoutError: no turn was committed ``commit_timeout_s`` after the
                audio ended (the server heard no speech).
            ServerError, ConnectionClosed: as :meth:`voice_turn`.
            ValueError, FileNotFoundError: ``audio`` is no readable WAV file.
        """
        pcm = (
            bytes(audio)
            if isinstance(audio, (bytes, bytearray))
            else read_wav(audio, sample_rate=self.input_rate)
        )
        pcm += silence(trailing_silence_ms, self.input_rate)
        sender = asyncio.create_task(self.send_audio(pcm, chunk_ms=chunk_ms, realtime=realtime))
        try:
            return await self.voice_turn(
                sender=sender,
                commit_timeout_s=commit_timeout_s,
                on_transcript=on_transcript,
                on_text=on_text,
                on_audio=on_audio,
                player=player,
            )
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)  # its end, never ours

    async def voice_turn(
        self,
        *,
        sender: asyncio.Task[int] | None = None,
        commit_timeout_s: float = 10.0,
        on_transcript: TranscriptSink | None = None,
        on_text: TextSink | None = None,
        on_audio: AudioSink | None = None,
        player: AnswerPlayer | None = None,
    ) -> VoiceTurn:
        """Follow the next turn the server finds in the input audio, until the
        response it started is done (resuming it if the connection drops).

        Args:
            sender: the task sending the audio (:meth:`send_audio`), if any:
                once it has ended, a turn must be committed within
                ``commit_timeout_s`` of the last event, and its error is raised.
            on_transcript: gets each ``input_audio.transcript`` (text, final).
            on_text: gets each new piece of the response's text.
            on_audio: gets each new piece of the response's pcm16 (at :attr:`output_rate`).
            player: plays the answers (:meth:`player`): it sees every event,
                gets the response's audio, pauses and resumes it as the server
                says, and the ``response.cancel`` of each answer it cuts
                (with ``audio_end_ms`` of what it played) is sent from here.
                It keeps playing after this returns (the audio outlasts the
                response): call :meth:`voice_turn` again to follow the next turn.

        Raises:
            TimeoutError: see ``sender``.
            ServerError: an ``error`` from the server.
            ConnectionClosed: the connection dropped before the response
                started, or resuming it failed.
        """
        turn = VoiceTurn()
        while True:
            try:
                event = await self._next_event(turn, sender, commit_timeout_s)
            except ConnectionClosed:
                if turn.response is None or self.max_reconnects < 1:
                    raise
                await self._resume(turn.response)
                continue
            if player is not None and (cancel := player.take(event)) is not None:
                await self.send(cancel)
            response = turn.response
            if response is not None and event.get("response_id") == response.response_id:
                text = self._apply(response, event)
                if text and on_text is not None:
                    on_text(text)
                if response.done is not None:
                    return turn
            elif event["type"] == "error":
                raise ServerError(event)
            else:
                self._take_turn_event(turn, event, on_transcript, on_audio, player)

    async def events(self, player: AnswerPlayer | None = None) -> AsyncIterator[dict[str, Any]]:
        """Every server event as it comes, given to ``player`` first (the
        ``response.cancel`` of an answer it cuts is sent): to keep a player
        informed between turns, e.g. until an ``input_audio.discarded``. A
        dropped connection ends it (``ConnectionClosed``); nothing is resumed.
        """
        while True:
            event = await self._recv()
            if player is not None and (cancel := player.take(event)) is not None:
                await self.send(cancel)
            yield event

    def _take_turn_event(
        self,
        turn: VoiceTurn,
        event: dict[str, Any],
        on_transcript: TranscriptSink | None,
        on_audio: AudioSink | None,
        player: AnswerPlayer | None = None,
    ) -> None:
        """Note an input audio event, or the ``response.created`` of the turn, in ``turn``."""
        kind, item_id = event["type"], event.get("item_id")
        if kind == "input_audio.discarded":
            turn.discarded.append(event)
            if turn.item_id == item_id and turn.audio_end_ms is None:  # its partial transcript was not a turn
                turn.item_id, turn.transcript, turn.final = None, "", False
        elif kind == "input_audio.committed" and turn.item_id in (None, item_id):
            turn.item_id = item_id
            turn.audio_start_ms, turn.audio_end_ms = event["audio_start_ms"], event["audio_end_ms"]
        elif kind == "input_audio.transcript" and turn.item_id in (None, item_id):
            turn.item_id = item_id
            turn.transcript, turn.final = event["text"], event["final"]
            if on_transcript is not None:
                on_transcript(turn.transcript, turn.final)
        elif kind == "response.created" and turn.response is None:
            started_by = event.get("input_item_id")
            # the turn's own response: started by its item, or the first after its commit
            if (started_by or turn.item_id) is not None and turn.item_id in (None, started_by):
                turn.item_id = turn.item_id or started_by
                turn.response = self.current = Response(on_audio=on_audio)
                turn.response.take_created(event)
                if player is not None:
                    turn.response.on_audio = _both(player.sink(turn.response.response_id), on_audio)

    async def _next_event(
        self, turn: VoiceTurn, sender: asyncio.Task[int] | None, commit_timeout_s: float
    ) -> dict[str, Any]:
        """The next server event; while no turn is committed, also watch ``sender``
        (its error is raised; once it has ended, wait at most ``commit_timeout_s``)."""
        if sender is None or turn.item_id is not None:
            return await self._recv()
        if not sender.done():
            receive = asyncio.ensure_future(self._recv())
            await asyncio.wait({receive, sender}, return_when=asyncio.FIRST_COMPLETED)
            if receive.done():
                return receive.result()
            receive.cancel()  # a websockets receive is safe to cancel: nothing is lost
            await asyncio.gather(receive, return_exceptions=True)
        sender.result()
        try:
            async with asyncio.timeout(commit_timeout_s):
                return await self._recv()
        except TimeoutError:
            raise TimeoutError(
                f"the server committed no turn within {commit_timeout_s} s after the audio ended "
                "(it heard no speech?)"
            ) from None


def _both(first: AudioSink, second: AudioSink | None) -> AudioSink:
    """One sink that feeds ``first``, then ``second`` if any."""
    if second is None:
        return first

    def sink(pcm: bytes) -> None:
        first(pcm)
        second(pcm)

    return sink


async def _pieces(audio: bytes | Iterable[bytes] | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    """The pieces of ``audio``, whichever of its three forms it has."""
    if isinstance(audio, (bytes, bytearray, memoryview)):
        yield bytes(audio)
    elif isinstance(audio, AsyncIterable):
        async for piece in audio:
            yield bytes(piece)
    else:
        for piece in audio:
            yield bytes(piece)


__all__ = ("AnswerPlayer", "VoiceClient", "VoiceTurn", "voice_settings")
