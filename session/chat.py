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
