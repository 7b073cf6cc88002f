"""End of turn by the words: whether a transcript reads as a finished message.

A pause after "I'd like to book a table for" is not the end of a turn,
whatever the voice does; after "What is the capital of France" it is. Smart
Turn (``end_of_turn.py``) judges from the audio alone, and synthetic or flat
speech fools it (docs/perf/end-of-turn.md: it scored 45% of the
mid-sentence-pause set's cut-off sentences complete). The words judge
better: a causal language model reading the user's message so far gives
the probability that the message ends here, the mass of its next token on
sentence-final punctuation and the end-of-message token (the idea of
LiveKit's turn detector, a small LM over the transcript). On the set's own
text this scores none of the 30 cut-off sentences complete (all below 0.04)
and 29 of 30 whole ones (docs/perf/end-of-turn.md).

The model is the bundled SmolLM2-135M-Instruct, whatever model is served
(``app/server.py``: a 7B served model would not fit a second time in fp32),
loaded with transformers in fp32 from its converted folder: a forward pass
over a 20-token message is about 0.1 s on two cores.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

# Whisper ends any pause with a full stop: the words decide, not its punctuation.
_TRAILING = re.compile(r"[\s.,!?;:\u2026\-\u2013\u2014\"']+$")
_FINAL_PUNCTUATION = (".", "?", "!")


class TextEndOfTurnModel:
    """P(the user's message is complete | its words), from a chat model.

    Thread-safe: one forward pass at a time (the model is shared by every
    connection; a pass is short).

    Args:
        folder: the chat model's transformers folder (config, weights, the
            tokenizer with its chat template).
        num_threads: torch threads of one forward pass.

    Raises:
        OSError: the folder holds no model transformers can load.
        ValueError: the tokenizer has no chat template or no token for the
            end of a message.
    """

    def __init__(self, folder: Path, num_threads: int = 1) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        self._num_threads = num_threads
        self._lock = threading.Lock()
        self._tokenizer: Any = AutoTokenizer.from_pretrained(folder)
        self._model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self._prefix, end_of_message = self._template_parts()
        ids = [self._single_token(p) for p in _FINAL_PUNCTUATION]
        self._endings = [i for i in ids if i is not None] + [end_of_message]

    def probability(self, text: str) -> float:
        """The probability, in [0, 1], that a user message ``text`` is complete.

        Trailing punctuation and spaces are dropped first (a transcriber adds a
        full stop at any pause). Empty text scores 0.
        """
        words = _TRAILING.sub("", text.strip())
        if not words:
            return 0.0
        ids = self._tokenizer(self._prefix + words, return_tensors="pt", add_special_tokens=False).input_ids
        torch = self._torch
        with self._lock, torch.inference_mode():
            threads = torch.get_num_threads()
            torch.set_num_threads(self._num_threads)
            try:
                logits = self._model(ids).logits[0, -1].float()
            finally:
                torch.set_num_threads(threads)
        return float(torch.softmax(logits, -1)[self._endings].sum())

    def _template_parts(self) -> tuple[str, int]:
        """The chat template's text before a user message's content, and the
        token that follows the content (the end of the message).

        Raises:
            ValueError: no chat template, or the content is not followed by a token.
        """
        marker = "\u2063bargein\u2063"
        try:
            rendered = self._tokenizer.apply_chat_template(
                [{"role": "user", "content": marker}], tokenize=False, add_generation_prompt=False
            )
        except ValueError as exc:
            raise ValueError(f"the model has no chat template: {exc}") from exc
        prefix, _, suffix = rendered.partition(marker)
        # the template may put the system prompt before the user's message: keep it
        tail = self._tokenizer(suffix, add_special_tokens=False).input_ids
        if not tail:
            raise ValueError("the chat template puts nothing after a user message")
        return prefix, int(tail[0])

    def _single_token(self, text: str) -> int | None:
        ids = self._tokenizer(text, add_special_tokens=False).input_ids
        return int(ids[0]) if len(ids) == 1 else None
