"""The chat template: conversation items to prompt token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from session.session import Message


class ChatTokenizer(Protocol):
    """The part of a transformers tokenizer the chat template needs."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object
                            ) -> object: ...


def render_prompt(tokenizer: ChatTokenizer, messages: Sequence[Message]) -> tuple[int, ...]:
    """Token ids of ``messages`` under the model's chat template, ending with
    the assistant's generation prompt.

    Uses ``tokenizer.apply_chat_template(..., add_generation_prompt=True,
    tokenize=True)``; transformers 5 returns a ``BatchEncoding`` there, older
    versions a plain list. CPU-bound for long conversations: call it off the
    event loop.
    """
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True,
                                            tokenize=True)
    ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(
        encoded, "keys") else encoded
    return tuple(int(i) for i in ids)  # type: ignore[union-attr]


class TextTokenizer(Protocol):
    """The part of a transformers tokenizer a plain text prompt needs."""

    def encode(self, text: str, **kwargs: object) -> list[int]: ...


def render_text(tokenizer: TextTokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a plain text prompt, without the chat template (the
    tokenizer's own special tokens added, as vLLM's completions do)."""
    return tuple(int(i) for i in tokenizer.encode(text))


def prompt_ids(tokenizer: object, messages: Sequence[Message], text: str | None
               ) -> tuple[int, ...]:
    """``text`` as is when given, else ``messages`` under the chat template."""
    if text is not None:
        return render_text(tokenizer, text)  # type: ignore[arg-type]
    return render_prompt(tokenizer, messages)  # type: ignore[arg-type]
