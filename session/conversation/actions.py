"""What goes into and comes out of :meth:`bargein.session.conversation.state.Conversation.handle`
besides the client events of :mod:`bargein.protocol.events`.

Internal events report what the service learned (from the engine, the token
log or the socket); actions say what the service must do. All are frozen,
slotted, keyword-only dataclasses, so a test compares them with ``==``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bargein.engine.request import FinishReason, SamplingParams
from bargein.protocol import events as pe


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One conversation item, as the chat template takes it.

    ``item_id`` names it for the item events below (OpenAI's
    ``conversation.item.*``); the session gives every item it holds one. It
    is left out of ``==``: two messages are equal when the model sees the same.

    Tools (session/conversation/tools.py): an assistant turn that made calls
    holds them as the model answered them (the generic format's JSON); a
    ``tool`` turn holds one call's result, ``call_id`` naming the call
    (left out of ``==`` too: the model sees results in the order of the calls).
    """

    role: str
    content: str
    item_id: str | None = field(default=None, compare=False)
    call_id: str | None = field(default=None, compare=False)


# ---- item events: the conversation edited item by item ---------------------
# Not bargein wire events: the OpenAI realtime adapter (bargein.app.openai.realtime)
# makes them from conversation.item.* and translates the answers below back.


@dataclass(frozen=True, slots=True, kw_only=True)
class AddItem:
    """Insert ``item`` after ``previous_item_id`` (None: at the end; ``"root"``:
    first). Answered with :class:`ItemAdded`, or ``error``.

    ``audio``: pcm16 at the session's input rate, whose transcript the
    connection makes the item's content (its voice pipeline transcribes it).
    """

    item: Message
    previous_item_id: str | None = None
    audio: bytes | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteItem:
    """Remove item ``item_id``. Answered with :class:`ItemDeleted`, or ``error``."""

    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveItem:
    """Ask for item ``item_id``. Answered with :class:`ItemRetrieved`, or ``error``."""

    item_id: str
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateItem:
    """Cut the assistant item ``item_id`` to what the user heard.

    ``heard_chars`` (code points; None: everything delivered) is clamped to
    what this connection delivered of it; ``audio_end_ms`` is the audio the
    user heard of a spoken response, turned into ``heard_chars`` by the
    connection. An item still generating is cancelled, as ``response.cancel``
    with the same cut. Answered with :class:`ItemTruncated`, or ``error``.
    """

    item_id: str
    heard_chars: int | None = None
    audio_end_ms: int | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemAdded:
    """``item`` is in the conversation, after ``previous_item_id`` (None: first)."""

    item: Message
    previous_item_id: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDeleted:
    """Item ``item_id`` left the conversation."""

    item_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemRetrieved:
    """Item ``item`` as the conversation holds it now."""

    item: Message


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemTruncated:
    """The assistant item ``item_id`` now holds its first ``kept_chars`` code points."""

    item_id: str
    kept_chars: int
    audio_end_ms: int | None


# ---- internal events: what the service reports back -----------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Submitted:
    """The engine accepted the active response's request."""

    response_id: str
    resume_token: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitFailed:
    """The request was refused before generating (e.g. ``prompt_too_long``);
    ``retry_after_ms`` for ``overloaded`` and ``rate_limited``."""

    response_id: str
    code: pe.ErrorCode
    message: str
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivered:
    """Text of a response that was just written to the socket."""

    stream_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumedFrom:
    """The client resumed the stream (``stream.resume``) from an offset, so it
    holds the stream's text before that offset: ``text``, and nothing more.

    It replaces what the session counted as delivered, which after a
    ``session.resume`` is the saved (possibly stale) count of an earlier
    connection: a resume from before its end would count the replayed text
    twice, one from past it would miss what the earlier connection sent.
    """

    stream_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationFinished:
    """The engine finished a request (any reason) and ``text`` is all of it.

    ``expired``: the server cancelled the request because it waited in the
    queue past its deadline without being scheduled; the response never
    started (the client hears ``overloaded`` from the stream's end).
    """

    stream_id: str
    text: str
    finish_reason: FinishReason
    expired: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Disconnected:
    """The client's connection closed."""


# ---- actions: what the service must do ------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Send:
    """Send ``event`` (a :mod:`bargein.protocol.events` server event) to the client."""

    event: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Submit:
    """Render ``messages`` with the chat template and submit them as a request;
    with ``prompt`` (a legacy HTTP completion), submit that text as is instead.

    Answer with :class:`Submitted` or :class:`SubmitFailed`.
    """

    response_id: str
    stream_id: str
    messages: tuple[Message, ...]
    params: SamplingParams
    prompt: str | None = None
    tool_mode: pe.ToolMode | None = None  # kept with the stream: how its answer is read for calls


@dataclass(frozen=True, slots=True, kw_only=True)
class StartDelivery:
    """Start the delivery task of a stream on this connection."""

    response_id: str
    stream_id: str
    from_offset: int = 0
    tool_mode: pe.ToolMode | None = None  # read its answer for calls (response.function_call_arguments.*)


@dataclass(frozen=True, slots=True, kw_only=True)
class Abort:
    """Abort the engine request of ``stream_id`` (its blocks are freed).

    ``requested_at`` is the ``now`` of the event that asked for it, for the
    interrupt-latency histogram. ``kept_chars``: how many characters of the
    response's text the conversation keeps (a barge-in's heard text), so the
    KV of just those tokens stays in the prefix cache for the next turn;
    None keeps it all.
    """

    stream_id: str
    reason: FinishReason
    requested_at: float
    kept_chars: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StopDelivery:
    """Stop delivering a finished stream and send its ``response.done`` again."""

    response_id: str
    stream_id: str


Action = Send | Submit | StartDelivery | Abort | StopDelivery
