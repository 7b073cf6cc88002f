"""One realtime conversation as a state machine (sans-I/O).

``Conversation.handle(event, now) -> list[Action]``: the event is a decoded client
event of :mod:`bargein.protocol.events` or one of the internal events below (what the
service learned from the engine, the token log or the socket); the actions
say what the service must do (send an event, submit or abort an engine
request, start delivering a stream). Time is an argument, never read here.

States (:class:`State`)::

    IDLE --response.create--> SUBMITTING --Submitted--> GENERATING
      ^                           |                        |
      +------SubmitFailed---------+    GenerationFinished, |
      +---------------response.cancel, interrupt_active----+
    any --Disconnected--> CLOSED

A response is *active* from ``response.create`` until the engine finishes it
or the client cancels it. A cancel cuts the assistant turn at once to what
was heard (``heard_chars``, clamped to what was delivered; default: all that
was delivered), so a ``response.create`` right after it, in the same burst of
frames, already builds its prompt from the cut turn. Events the current state
does not allow raise :class:`IllegalTransition` (they mean a bug in the
caller, never bad client input: that is answered with an ``error`` event).
"""

from __future__ import annotations

import enum
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bargein.engine.request import FinishReason, SamplingParams
from bargein.protocol import events as pe
from bargein.session.conversation.actions import (
    Abort,
    Action,
    AddItem,
    DeleteItem,
    Delivered,
    Disconnected,
    GenerationFinished,
    ItemAdded,
    ItemDeleted,
    ItemRetrieved,
    ItemTruncated,
    Message,
    ResumedFrom,
    RetrieveItem,
    Send,
    StartDelivery,
    StopDelivery,
    Submit,
    SubmitFailed,
    Submitted,
    TruncateItem,
)
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.tool_plan import ToolPlan, checked_tools, choice_problem, plan_tools
from bargein.session.conversation.tools import Tool, calls_of, calls_text, settled_calls, with_system_text
from bargein.session.errors import SessionError

SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")
_REMEMBERED_RESPONSES = 64  # finished responses a late cancel can still name


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` (a lone surrogate, which JSON lets through, counts 3)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def assistant_item_id(stream_id: str) -> str:
    """The id of the assistant item a response's stream becomes: made from the
    stream, so the same on every node and after a resume."""
    return f"item_{stream_id}"


class State(enum.Enum):
    """Where the conversation stands."""

    IDLE = "idle"  # no active response
    SUBMITTING = "submitting"  # prompt being tokenized and submitted
    GENERATING = "generating"  # the engine is producing the active response
    CLOSED = "closed"  # the connection is gone


class IllegalTransition(SessionError):
    """An event arrived that the session's state does not allow."""

    def __init__(self, state: State, event: object) -> None:
        super().__init__(f"{type(event).__name__} is illegal in state {state.name}")
        self.state = state
        self.event = event


@dataclass(slots=True, kw_only=True)
class _Response:
    """What the session remembers of one response."""

    response_id: str
    stream_id: str
    delivered: str = ""  # text written to the socket so far
    event_id: str | None = None  # of its response.create, echoed by a submit error
    turn_index: int | None = None  # its assistant turn, once it has one
    num_input_turns: int = 0  # conversation items its response.create appended
    instructions: str | None = None  # of its response.create, replacing the session's
    tool_mode: pe.ToolMode | None = None  # how its answer is read for calls (None: no tools)

    @property
    def item_id(self) -> str:
        """Its assistant item's id."""
        return assistant_item_id(self.stream_id)


@dataclass(slots=True, kw_only=True)
class ConversationSettings:
    """The session settings now in force (``session.update``)."""

    instructions: str | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    on_disconnect: str = "continue"
    include_token_ids: bool = False
    tools: tuple[Tool, ...] = ()
    tool_choice: pe.ToolChoice = "auto"

    def to_event(self) -> pe.SessionSettings:
        """The settings as ``session.updated`` reports them."""
        return pe.SessionSettings(
            instructions=self.instructions,
            defaults=pe.SamplingDefaults(**self.defaults),
            on_disconnect=self.on_disconnect,  # type: ignore[arg-type]
            include_token_ids=self.include_token_ids,
            tools=tuple(
                pe.FunctionTool(
                    name=t.name, description=t.description or None, parameters=pe.JsonText(t.parameters)
                )
                for t in self.tools
            ),
            tool_choice=self.tool_choice,
        )


def _error(
    code: pe.ErrorCode, message: str, event: object | None = None, response_id: str | None = None
) -> Send:
    return Send(
        event=pe.ErrorEvent(
            code=code,
            message=message,
            retryable=code.retryable,
            event_id=getattr(event, "event_id", None),
            response_id=response_id,
        )
    )


class Conversation:
    """The conversation of one connection.

    Args:
        config: limits and defaults.
        session_id: the id announced in ``session.created``.
        new_id: makes stream ids (default: random UUID hex).
    """

    def __init__(
        self,
        config: SessionConfig,
        *,
        session_id: str | None = None,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
    ) -> None:
        self.config = config
        self.session_id = session_id or new_id()
        self.state = State.IDLE
        self.settings = ConversationSettings(
            instructions=config.instructions, on_disconnect=config.on_disconnect
        )
        self.turns: list[Message] = []
        self._new_id = new_id
        self._active: _Response | None = None
        self._responses: OrderedDict[str, _Response] = OrderedDict()

    # ---- entry point -------------------------------------------------------

    def handle(self, event: object, now: float) -> list[Action]:
        """Apply one event and return the actions it calls for, in order.

        Raises:
            IllegalTransition: the event is not allowed in the current state.
        """
        if self.state is State.CLOSED:
            raise IllegalTransition(self.state, event)
        handler = self._handlers().get(type(event))
        if handler is None:
            raise IllegalTransition(self.state, event)
        return handler(event, now)

    def _handlers(self) -> Mapping[type, Callable[[Any, float], list[Action]]]:
        return {
            pe.Ping: self._on_ping,
            pe.SessionUpdate: self._on_update,
            pe.ResponseCreate: self._on_create,
            pe.ResponseCancel: self._on_cancel,
            Submitted: self._on_submitted,
            SubmitFailed: self._on_submit_failed,
            Delivered: self._on_delivered,
            ResumedFrom: self._on_resumed_from,
            GenerationFinished: self._on_finished,
            Disconnected: self._on_disconnected,
            AddItem: self._on_add_item,
            DeleteItem: self._on_delete_item,
            RetrieveItem: self._on_retrieve_item,
            TruncateItem: self._on_truncate_item,
        }

    @property
    def active_stream_id(self) -> str | None:
        """Stream of the active response, if any."""
        return None if self._active is None else self._active.stream_id

    def knows_stream(self, stream_id: str) -> bool:
        """Whether ``stream_id`` is the active response's or a remembered one's."""
        return self._find(stream_id) is not None

    @property
    def active_response(self) -> tuple[str, str, str, int] | None:
        """``(response_id, stream_id, delivered text, number of input turns)`` of
        the active response (the input turns: what its ``response.create``
        appended, the last of ``turns``)."""
        active = self._active
        return (
            None
            if active is None
            else (active.response_id, active.stream_id, active.delivered, active.num_input_turns)
        )

    def restore(
        self,
        *,
        settings: ConversationSettings,
        turns: list[Message],
        active: tuple[str, str, str, int] | None,
    ) -> None:
        """Take over the conversation of an earlier connection (``session.resume``).

        ``active`` is :attr:`active_response` of a response still generating:
        the session waits in GENERATING for its :class:`GenerationFinished`.
        Only a fresh session may be restored.

        Raises:
            IllegalTransition: the session already has turns or a response.
        """
        if self.state is not State.IDLE or self.turns or self._responses:
            raise IllegalTransition(self.state, "restore")
        self.settings = settings
        self.turns = [t if t.item_id else replace(t, item_id=self._item_id()) for t in turns]
        if active is not None:
            response_id, stream_id, delivered, num_input_turns = active
            self._active = _Response(
                response_id=response_id,
                stream_id=stream_id,
                delivered=delivered,
                num_input_turns=num_input_turns,
            )
            self.state = State.GENERATING

    def retract(self, response_id: str, now: float) -> list[Action]:
        """Withdraw a response as if it had never been asked for: a voice turn
        answered speculatively at a pause, over which the user went on
        speaking. Its input turns (and its assistant turn, if it already
        finished) leave the conversation, and its request is aborted with
        nothing kept. A response that is neither active nor the last one
        is left as it is (nothing to undo).

        Raises:
            IllegalTransition: it is being submitted.
        """
        active = self._active
        if active is not None and active.response_id == response_id:
            if self.state is State.SUBMITTING:
                raise IllegalTransition(self.state, "retract")
            del self.turns[len(self.turns) - active.num_input_turns :]
            self._active = None
            self.state = State.IDLE
            return [
                Abort(
                    stream_id=active.stream_id, reason=FinishReason.CANCELLED, requested_at=now, kept_chars=0
                )
            ]
        done = self._responses.get(response_id)
        if done is not None and done.turn_index is not None and done.turn_index == len(self.turns) - 1:
            del self.turns[done.turn_index - done.num_input_turns :]
            del self._responses[response_id]
        return []

    def messages(self, instructions: str | None = None) -> tuple[Message, ...]:
        """The prompt's items: instructions (as a system turn) then the turns,
        every call answered (:func:`~bargein.session.conversation.tools.settled_calls`).

        ``instructions``: a response's own, in place of the session's.
        """
        system = self.settings.instructions if instructions is None else instructions
        head = (Message(role="system", content=system),) if system else ()
        return head + settled_calls(self.turns)

    def conversation_bytes(self, instructions: str | None = None) -> int:
        """UTF-8 bytes of the conversation's text: its instructions (``instructions``
        in place of the session's, when given) and every turn's content."""
        system = self.settings.instructions if instructions is None else instructions
        return text_bytes(system or "") + sum(text_bytes(t.content) for t in self.turns)

    def response_of_item(self, item_id: str) -> str | None:
        """The ``response_id`` whose assistant item is ``item_id``, if remembered."""
        response = self._response_of_item(item_id)
        return None if response is None else response.response_id

    # ---- client events -----------------------------------------------------

    def _on_ping(self, event: pe.Ping, now: float) -> list[Action]:
        return [Send(event=pe.Pong())]

    def _on_update(self, event: pe.SessionUpdate, now: float) -> list[Action]:
        update = event.session
        new = replace(self.settings, defaults=dict(self.settings.defaults))
        if update.instructions is not None:
            new.instructions = update.instructions or None  # "" clears them
        if update.defaults is not None:
            new.defaults = {
                k: getattr(update.defaults, k)
                for k in SAMPLING_FIELDS
                if getattr(update.defaults, k) is not None
            }
        if update.on_disconnect is not None:
            new.on_disconnect = update.on_disconnect
        if update.include_token_ids is not None:
            new.include_token_ids = update.include_token_ids
        if update.tool_choice is not None:
            new.tool_choice = update.tool_choice
        try:
            self._sampling(new.defaults)
            if update.tools is not None:
                new.tools = checked_tools(update.tools, "session.tools")
        except ValueError as exc:
            return [_error(pe.ErrorCode.INVALID_PARAMETER, str(exc), event)]
        if problem := choice_problem(new.tools, new.tool_choice, "session."):
            return [_error(pe.ErrorCode.INVALID_PARAMETER, problem, event)]
        if update.instructions and (
            problem := self._over_bytes(self.conversation_bytes(instructions=update.instructions))
        ):
            return [_error(pe.ErrorCode.INVALID_PARAMETER, problem, event)]
        self.settings = new
        return [Send(event=pe.SessionUpdated(session=new.to_event()))]

    def _on_create(self, event: pe.ResponseCreate, now: float) -> list[Action]:
        if self.state is State.SUBMITTING:
            raise IllegalTransition(self.state, event)
        actions: list[Action] = []
        if self._active is not None:
            if not event.interrupt_active:
                return [
                    _error(
                        pe.ErrorCode.CONFLICT,
                        "a response is already active; cancel it or set interrupt_active",
                        event,
                        event.response_id,
                    )
                ]
            actions += self._interrupt(None, now)
        problem, params, items = self._check_create(event)
        plan: ToolPlan | None = None
        if not problem:
            problem, plan = self._tool_plan(event)
        if problem:
            return actions + [_error(pe.ErrorCode.INVALID_PARAMETER, problem, event, event.response_id)]
        if plan is not None and plan.grammar is not None:
            params = replace(params, grammar=plan.grammar)
        tool_mode = None if plan is None else plan.mode
        stream_id = self._new_id()
        response_id = event.response_id or f"resp_{stream_id}"
        self.turns += items
        self._active = _Response(
            response_id=response_id,
            stream_id=stream_id,
            event_id=event.event_id,
            num_input_turns=len(items),
            instructions=event.instructions,
            tool_mode=tool_mode,
        )
        self.state = State.SUBMITTING
        messages = self.messages(event.instructions)
        if plan is not None:
            messages = with_system_text(messages, plan.prompt)
        return actions + [
            Submit(
                response_id=response_id,
                stream_id=stream_id,
                messages=messages,
                params=params,
                tool_mode=tool_mode,
            )
        ]

    def _tool_plan(self, event: pe.ResponseCreate) -> tuple[str | None, ToolPlan | None]:
        """``(problem or None, plan)`` of a ``response.create``'s tools: its own
        ``tools`` and ``tool_choice`` in place of the session's."""
        try:
            tools = self.settings.tools if event.tools is None else checked_tools(event.tools, "tools")
        except ValueError as exc:
            return str(exc), None
        choice = event.tool_choice or self.settings.tool_choice
        if problem := choice_problem(tools, choice, ""):
            return problem, None
        return None, plan_tools(tools, choice, parallel=event.parallel_tool_calls is not False)

    def _check_create(self, event: pe.ResponseCreate) -> tuple[str | None, SamplingParams, list[Message]]:
        """Validate a ``response.create``: (problem or None, params, new items)."""
        items = [_input_message(i, i.item_id or self._item_id()) for i in event.input or ()]
        overrides = {k: getattr(event, k) for k in SAMPLING_FIELDS if getattr(event, k, None) is not None}
        try:
            params = self._sampling({**self.settings.defaults, **overrides})
        except ValueError as exc:
            return str(exc), SamplingParams(), []
        if event.input is not None and not items:
            return "input must hold at least one item", params, []
        if len(items) > self.config.max_input_items:
            return f"input holds more than {self.config.max_input_items} items", params, []
        if items and (
            problem := self._over_bytes(self.conversation_bytes() + sum(text_bytes(i.content) for i in items))
        ):
            return problem, params, []
        if not self.turns and not items:
            return "the conversation is empty: send input", params, []
        ids = [i.item_id for i in items]
        if len(set(ids)) < len(ids) or any(self._index_of(i) is not None for i in ids if i):
            return "an input item_id is already in the conversation", params, []
        return None, params, items

    def _sampling(self, fields: Mapping[str, Any]) -> SamplingParams:
        """SamplingParams from wire fields, within the session's limits.

        Raises:
            ValueError: a value is out of range (message names the field).
        """
        max_tokens = fields.get("max_tokens", min(self.config.default_max_tokens, self.config.max_tokens))
        if max_tokens > self.config.max_tokens:
            raise ValueError(f"max_tokens={max_tokens} is above the limit {self.config.max_tokens}")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=fields.get("temperature", 1.0),
            top_p=fields.get("top_p", 1.0),
            top_k=fields.get("top_k", 0),
            seed=fields.get("seed"),
            stop=tuple(fields.get("stop") or ()),
        )

    def _on_cancel(self, event: pe.ResponseCancel, now: float) -> list[Action]:
        active = self._active
        if active is not None and event.response_id == active.response_id:
            return self._interrupt(event.heard_chars, now)
        known = self._responses.get(event.response_id)
        if known is None:
            return [_error(pe.ErrorCode.NOT_FOUND, "no such response", event, event.response_id)]
        self._cut_finished(known, event.heard_chars)
        return [StopDelivery(response_id=known.response_id, stream_id=known.stream_id)]

    def _interrupt(self, heard_chars: int | None, now: float) -> list[Action]:
        """Cancel the active response: cut its turn to what was heard, abort it."""
        active = self._active
        assert active is not None
        if self.state is State.SUBMITTING:
            raise IllegalTransition(self.state, "interrupt")
        heard = _clamp(heard_chars, len(active.delivered))
        self._finish_active(_kept_answer(active.delivered, heard, active.tool_mode, whole=False))
        return [
            Abort(
                stream_id=active.stream_id,
                reason=FinishReason.INTERRUPTED,
                requested_at=now,
                kept_chars=heard,
            )
        ]

    def _cut_finished(self, response: _Response, heard_chars: int | None) -> None:
        """Cut a finished response's turn, if no response started after it:
        only user turns follow it (the user's interruption, committed before
        the client's late cancel said what it played: docs/protocol.md 8.7)."""
        index = response.turn_index
        if index is None or self._active is not None:
            return
        if any(turn.role != "user" for turn in self.turns[index + 1 :]):
            return
        text = self.turns[index].content
        heard = _clamp(heard_chars, min(len(text), len(response.delivered)))
        kept = text if heard == len(text) else _kept_answer(text, heard, response.tool_mode, whole=False)
        self.turns[index] = replace(self.turns[index], content=kept)

    # ---- item events (OpenAI's conversation.item.*) --------------------------

    def _on_add_item(self, event: AddItem, now: float) -> list[Action]:
        if self._active is not None:
            return [_error(pe.ErrorCode.CONFLICT, "a response is active: add items once it is done", event)]
        item = event.item if event.item.item_id else replace(event.item, item_id=self._item_id())
        if self._index_of(item.item_id or "") is not None:
            return [
                _error(pe.ErrorCode.CONFLICT, f"item {item.item_id!r} is already in the conversation", event)
            ]
        previous = event.previous_item_id
        if previous is None:
            at = len(self.turns)
        elif previous == "root":
            at = 0
        elif (index := self._index_of(previous)) is not None:
            at = index + 1
        else:
            return [
                _error(
                    pe.ErrorCode.NOT_FOUND, f"previous_item_id {previous!r} is not in the conversation", event
                )
            ]
        if len(self.turns) >= self.config.max_conversation_items:
            limit = self.config.max_conversation_items
            return [
                _error(pe.ErrorCode.INVALID_PARAMETER, f"the conversation holds {limit} items already", event)
            ]
        if problem := self._over_bytes(self.conversation_bytes() + text_bytes(item.content)):
            return [_error(pe.ErrorCode.INVALID_PARAMETER, problem, event)]
        self._shift_turn_indexes(at, +1)
        self.turns.insert(at, item)
        before = self.turns[at - 1].item_id if at > 0 else None
        return [Send(event=ItemAdded(item=item, previous_item_id=before))]

    def _on_delete_item(self, event: DeleteItem, now: float) -> list[Action]:
        if self._active is not None:
            return [
                _error(pe.ErrorCode.CONFLICT, "a response is active: delete items once it is done", event)
            ]
        index = self._index_of(event.item_id)
        if index is None:
            return [
                _error(pe.ErrorCode.NOT_FOUND, f"item {event.item_id!r} is not in the conversation", event)
            ]
        del self.turns[index]
        for response in self._responses.values():
            if response.turn_index == index:
                response.turn_index = None  # its turn is gone: a late cancel cuts nothing
        self._shift_turn_indexes(index + 1, -1)
        return [Send(event=ItemDeleted(item_id=event.item_id))]

    def _on_retrieve_item(self, event: RetrieveItem, now: float) -> list[Action]:
        index = self._index_of(event.item_id)
        if index is None:
            return [
                _error(pe.ErrorCode.NOT_FOUND, f"item {event.item_id!r} is not in the conversation", event)
            ]
        return [Send(event=ItemRetrieved(item=self.turns[index]))]

    def _on_truncate_item(self, event: TruncateItem, now: float) -> list[Action]:
        active = self._active
        if active is not None and active.item_id == event.item_id:
            if self.state is State.SUBMITTING:
                raise IllegalTransition(self.state, event)
            actions = self._interrupt(event.heard_chars, now)
            kept = len(self.turns[-1].content)
            return actions + [
                Send(
                    event=ItemTruncated(
                        item_id=event.item_id, kept_chars=kept, audio_end_ms=event.audio_end_ms
                    )
                )
            ]
        index = self._index_of(event.item_id)
        if index is None:
            return [
                _error(pe.ErrorCode.NOT_FOUND, f"item {event.item_id!r} is not in the conversation", event)
            ]
        item = self.turns[index]
        if item.role != "assistant":
            return [_error(pe.ErrorCode.INVALID_PARAMETER, "only assistant items can be truncated", event)]
        response = self._response_of_item(event.item_id)
        # what the user can have heard: this connection's delivery when it
        # made the item, else (an item created with conversation.item.create) all of it
        delivered = len(item.content) if response is None else min(len(item.content), len(response.delivered))
        kept = _clamp(event.heard_chars, delivered)
        self.turns[index] = replace(item, content=item.content[:kept])
        return [
            Send(event=ItemTruncated(item_id=event.item_id, kept_chars=kept, audio_end_ms=event.audio_end_ms))
        ]

    def _over_bytes(self, num_bytes: int) -> str | None:
        """Why a conversation of ``num_bytes`` bytes of text is refused, or None
        when it is within ``max_conversation_bytes``."""
        limit = self.config.max_conversation_bytes
        if num_bytes <= limit:
            return None
        return (
            f"the conversation would hold {num_bytes} bytes of text, over its limit of {limit} "
            "(limits.max_conversation_bytes): delete items first"
        )

    def _index_of(self, item_id: str) -> int | None:
        return next((i for i, t in enumerate(self.turns) if t.item_id == item_id), None)

    def _response_of_item(self, item_id: str) -> _Response | None:
        if self._active is not None and self._active.item_id == item_id:
            return self._active
        return next((r for r in self._responses.values() if r.item_id == item_id), None)

    def _shift_turn_indexes(self, start: int, by: int) -> None:
        """Keep remembered responses pointing at their turns across an insert or delete."""
        for response in self._responses.values():
            if response.turn_index is not None and response.turn_index >= start:
                response.turn_index += by

    def _item_id(self) -> str:
        return f"item_{self._new_id()}"

    # ---- internal events ---------------------------------------------------

    def _on_submitted(self, event: Submitted, now: float) -> list[Action]:
        active = self._require_submitting(event)
        self.state = State.GENERATING
        created = pe.ResponseCreated(
            response_id=active.response_id,
            stream_id=active.stream_id,
            resume_token=event.resume_token,
            tool_mode=active.tool_mode,
        )
        return [
            Send(event=created),
            StartDelivery(
                response_id=active.response_id, stream_id=active.stream_id, tool_mode=active.tool_mode
            ),
        ]

    def _on_submit_failed(self, event: SubmitFailed, now: float) -> list[Action]:
        active = self._require_submitting(event)
        del self.turns[len(self.turns) - active.num_input_turns :]
        self._active = None
        self.state = State.IDLE
        error = _error(event.code, event.message, active, event.response_id)
        return [replace(error, event=replace(error.event, retry_after_ms=event.retry_after_ms))]

    def _require_submitting(self, event: Submitted | SubmitFailed) -> _Response:
        active = self._active
        if self.state is not State.SUBMITTING or active is None or active.response_id != event.response_id:
            raise IllegalTransition(self.state, event)
        return active

    def _on_delivered(self, event: Delivered, now: float) -> list[Action]:
        response = self._find(event.stream_id)
        if response is not None:
            response.delivered += event.text
        return []

    def _on_resumed_from(self, event: ResumedFrom, now: float) -> list[Action]:
        response = self._find(event.stream_id)
        if response is not None:
            response.delivered = event.text
        return []

    def _on_finished(self, event: GenerationFinished, now: float) -> list[Action]:
        active = self._active
        if active is None or active.stream_id != event.stream_id:
            return []  # already cut by a cancel, or a stream of an earlier connection
        if self.state is not State.GENERATING:
            raise IllegalTransition(self.state, event)
        if event.expired:
            # Dropped from the queue before its first token: as if refused at
            # submit, its input leaves the conversation so a retry resends it.
            # The client hears of it from the stream's delivery (``error``
            # ``overloaded``, then ``response.done``), in that order.
            del self.turns[len(self.turns) - active.num_input_turns :]
            self._active = None
            self.state = State.IDLE
            return []
        whole = event.finish_reason is FinishReason.STOP
        self._finish_active(_kept_answer(event.text, len(event.text), active.tool_mode, whole=whole))
        return []

    def _on_disconnected(self, event: Disconnected, now: float) -> list[Action]:
        active, self._active = self._active, None
        self.state = State.CLOSED
        if active is None or self.settings.on_disconnect != "cancel":
            return []
        return [Abort(stream_id=active.stream_id, reason=FinishReason.CANCELLED, requested_at=now)]

    # ---- bookkeeping -------------------------------------------------------

    def _finish_active(self, text: str) -> None:
        """End the active response, keeping ``text`` as its assistant turn."""
        active = self._active
        assert active is not None
        self.turns.append(Message(role="assistant", content=text, item_id=active.item_id))
        active.turn_index = len(self.turns) - 1
        self._responses[active.response_id] = active
        self._responses.move_to_end(active.response_id)
        while len(self._responses) > _REMEMBERED_RESPONSES:
            self._responses.popitem(last=False)
        self._active = None
        self.state = State.IDLE

    def _find(self, stream_id: str) -> _Response | None:
        if self._active is not None and self._active.stream_id == stream_id:
            return self._active
        return next((r for r in self._responses.values() if r.stream_id == stream_id), None)


def _input_message(item: pe.InputItem, item_id: str) -> Message:
    """The conversation item of a ``response.create`` input item: an assistant
    item's calls become the answer that makes them (the generic format)."""
    if item.tool_calls:
        content = calls_text([(c.name, c.arguments) for c in item.tool_calls])
        return Message(role="assistant", content=content, item_id=item_id)
    return Message(role=item.role, content=item.content, item_id=item_id, call_id=item.tool_call_id)


def _kept_answer(text: str, heard: int, tool_mode: pe.ToolMode | None, *, whole: bool) -> str:
    """The assistant turn of an answer of which the user heard ``heard``
    code points of ``text``. Read for calls (``tool_mode``), the answer is
    kept whole when it is whole calls: they were made, and the client runs
    them (a filler the user talked over cuts nothing of them); a call cut
    before it was whole (a barge-in, ``max_tokens``) is no call and no
    text, so the turn keeps none of it and no call dangles without its
    result. Text is cut at ``heard``; an answer that ended by itself
    (``whole``) is kept as it is."""
    if tool_mode is None:
        return text[:heard]
    if whole or calls_of(text) is not None:
        return text
    stripped = text.lstrip()
    if tool_mode == "forced" or (stripped and stripped[0] in "{["):
        return ""
    return text[:heard]


def _clamp(heard_chars: int | None, delivered: int) -> int:
    """``heard_chars`` within [0, delivered]; ``None`` means all delivered."""
    if heard_chars is None:
        return delivered
    return max(0, min(heard_chars, delivered))
