"""Limits and defaults of one realtime session."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """What a session allows and what it assumes when the client says nothing.

    Attributes:
        max_tokens: most tokens of one response (announced in
            ``session.created``); a request asking for more is refused
            (``invalid_parameter``; 400 over HTTP).
        default_max_tokens: the token limit of a response whose
            ``response.create`` names none (capped at ``max_tokens``).
        max_frame_bytes: largest client frame; bigger ones close with 1009.
        instructions: default system prompt of a new session (``None``: none).
        max_input_items: most conversation items one ``response.create`` adds.
        max_conversation_items: most items one conversation holds before an
            item event adds one (OpenAI's ``conversation.item.create``; the
            prompt's token limit bounds the rest).
        max_conversation_bytes: most UTF-8 bytes of text one conversation
            holds (its instructions and the text of its items; announced in
            ``session.created``'s limits): an item, a ``response.create``'s
            input or new instructions past it are refused when they are
            added. Answers the model generates count but are never refused
            (``max_tokens`` bounds each). It also bounds what a saved
            session keeps for ``session.resume``.
        on_disconnect: what happens to a response still generating when its
            client disconnects, unless the client chose: ``"continue"`` (it
            runs to the end into the log, for a resume) or ``"cancel"``
            (aborted, its KV blocks freed).
        abandon_grace_s: a response still generating that no connection
            delivers (its own connection closed, nobody resumed it on this
            node) this many seconds is aborted with ``finish_reason``
            ``"cancelled"`` (0: never; it runs to the end into the log).
        drain_timeout_s: how long a new response's ``response.created`` waits
            for the deliveries of the connection's earlier responses to send
            their ``response.done`` (events of one response never follow the
            next one's ``response.created``); past it they are stopped and
            can be resumed.
        save_interval_s: least time between two saves of one session's
            conversation (for ``session.resume``): the saves of a burst of
            turn changes are coalesced into one per interval; a closing
            connection saves at once.
        max_pending_log_steps: most engine steps handed over and not yet
            written to the token log; past it the engine waits for the log
            writer (backpressure), so a slow log bounds memory and delivery
            lag (64 steps: a second or two of decoding) instead of letting
            them grow.
        shared_prefix_cache: whether cached prompt prefixes are shared
            between principals (API keys). Off (the default), each principal's
            requests reuse only KV its own requests computed, so no tenant
            can learn another's prompts from ``cached_tokens`` or from timing;
            on, a system prompt common to every tenant is computed once.
    """

    max_tokens: int = 1024
    default_max_tokens: int = 256
    max_frame_bytes: int = 1 << 20
    instructions: str | None = None
    max_input_items: int = 256
    max_conversation_items: int = 4096
    max_conversation_bytes: int = 4 << 20
    on_disconnect: str = "continue"
    abandon_grace_s: float = 30.0
    drain_timeout_s: float = 10.0
    save_interval_s: float = 0.1
    max_pending_log_steps: int = 64
    shared_prefix_cache: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 1")
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens={self.default_max_tokens} must be >= 1")
        if self.max_frame_bytes < 1024:
            raise ValueError(f"max_frame_bytes={self.max_frame_bytes} must be >= 1024")
        if self.max_input_items < 1:
            raise ValueError(f"max_input_items={self.max_input_items} must be >= 1")
        if self.max_conversation_items < 1:
            raise ValueError(f"max_conversation_items={self.max_conversation_items} must be >= 1")
        if self.max_conversation_bytes < 1024:
            raise ValueError(f"max_conversation_bytes={self.max_conversation_bytes} must be >= 1024")
        if self.abandon_grace_s < 0:
            raise ValueError(f"abandon_grace_s={self.abandon_grace_s} must be >= 0")
        if self.drain_timeout_s <= 0:
            raise ValueError(f"drain_timeout_s={self.drain_timeout_s} must be > 0")
        if self.save_interval_s < 0:
            raise ValueError(f"save_interval_s={self.save_interval_s} must be >= 0")
        if self.max_pending_log_steps < 1:
            raise ValueError(f"max_pending_log_steps={self.max_pending_log_steps} must be >= 1")
        if self.on_disconnect not in ("continue", "cancel"):
            raise ValueError(f"on_disconnect={self.on_disconnect!r} must be 'continue' or 'cancel'")
