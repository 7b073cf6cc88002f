"""The chat template: conversation items to prompt token ids, and the bounds
that keep tokenizing cheap.

Tokenizing is CPU-bound (about 0.6 s for 1 MiB of text), so two things are
decided before it runs (see :meth:`bargein.session.runtime.service.Service.submit`):

- text too long to fit the context whatever its tokens are is refused on its
  length alone (:func:`max_prompt_bytes`, :func:`prompt_bytes`);
- one connection has at most one tokenization in flight
  (:class:`OneAtATime`), so a client cannot queue up many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from bargein.session.conversation.state import Message


class ChatTokenizer(Protocol):
    """The part of a transformers tokenizer the chat template needs."""

    def apply_chat_template(
        self, conversation: list[dict[str, str]], **kwargs: object
    ) -> Mapping[str, Sequence[int]] | Sequence[int]: ...


def render_prompt(tokenizer: ChatTokenizer, messages: Sequence[Message]) -> tuple[int, ...]:
    """Token ids of ``messages`` under the model's chat template, ending with
    the assistant's generation prompt.

    Uses ``tokenizer.apply_chat_template(..., add_generation_prompt=True,
    tokenize=True)``; transformers 5 returns a ``BatchEncoding`` there, older
    versions a plain list. CPU-bound for long conversations: call it off the
    event loop.
    """
    conversation = [{"role": m.role, "content": m.content} for m in messages]
    encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    ids = encoded["input_ids"] if isinstance(encoded, Mapping) else encoded  # BatchEncoding: a Mapping
    return tuple(int(i) for i in ids)


class TextTokenizer(Protocol):
    """The part of a transformers tokenizer a plain text prompt needs."""

    def encode(self, text: str, **kwargs: object) -> list[int]: ...


def render_text(tokenizer: TextTokenizer, text: str) -> tuple[int, ...]:
    """Token ids of a plain text prompt, without the chat template (the
    tokenizer's own special tokens added, as vLLM's completions do)."""
    return tuple(int(i) for i in tokenizer.encode(text))


def prompt_ids(tokenizer: object, messages: Sequence[Message], text: str | None) -> tuple[int, ...]:
    """``text`` as is when given, else ``messages`` under the chat template."""
    if text is not None:
        return render_text(tokenizer, text)  # type: ignore[arg-type]
    return render_prompt(tokenizer, messages)  # type: ignore[arg-type]


# ---- bounds -------------------------------------------------------------------


def longest_token_bytes(tokenizer: Any) -> int | None:
    """UTF-8 bytes of the longest text one token stands for, plus one; None
    when the tokenizer cannot say it safely.

    Why it bounds the text: a tokenizer cuts its input into pieces, each
    becoming one token, so a text of ``B`` bytes has at least ``B / L``
    tokens when no token stands for more than ``L`` bytes. A token's decoded
    text is at least as long as the bytes it matches: a piece of a UTF-8
    character decodes to U+FFFD (3 bytes), never fewer bytes than the piece
    (at most 3). The extra byte covers decoders that drop the space a
    SentencePiece word starts with (``"▁hello"`` decodes to ``"hello"``).
    Special tokens (``<|im_start|>``) are counted too: text that spells one
    becomes it. A normalizer (lowercasing, NFKC, accent stripping) may
    shorten the text before it is cut, which breaks the argument: no bound
    then. Decoding every id takes about a second for a 50k vocabulary: call
    it once, off the event loop.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decode = getattr(tokenizer, "batch_decode", None)
    if backend is None or decode is None or backend.normalizer is not None:
        return None
    texts = decode([[i] for i in range(len(tokenizer))])
    return 1 + max(len(t.encode("utf-8", "surrogatepass")) for t in texts)


def max_prompt_bytes(token_bytes: int, max_model_len: int) -> int:
    """Most bytes of text a prompt may have and still fit: its tokens must
    leave room for one new token, so at most ``max_model_len - 1`` of them,
    each standing for at most ``token_bytes`` bytes."""
    return (max_model_len - 1) * token_bytes


def prompt_bytes(messages: Sequence[Message], text: str | None) -> int:
    """UTF-8 bytes of the text a prompt is made of: ``text``, or the messages'
    contents without surrounding whitespace (a template may trim it). The
    template only adds to them, so the prompt has at least this many."""
    if text is not None:
        return len(text.encode("utf-8", "surrogatepass"))
    return sum(len(m.content.strip().encode("utf-8", "surrogatepass")) for m in messages)
