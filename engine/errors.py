"""Exceptions of the engine package."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class PromptTooLongError(EngineError):
    """The prompt leaves no room for a token within the context.

    Raised before any KV block is allocated.
    """

    def __init__(self, num_prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt has {num_prompt_tokens} tokens; the context holds "
            f"{max_model_len} (prompt plus at least one new token)"
        )
        self.num_prompt_tokens = num_prompt_tokens
        self.max_model_len = max_model_len


class DuplicateRequestError(EngineError):
    """A request id is already live in this engine."""


class EngineStoppedError(EngineError):
    """The runner is shut down (or its thread died) and takes no requests."""


class GrammarError(EngineError, ValueError):
    """A request's grammar cannot be enforced (engine/grammar.py).

    Attributes:
        keyword: the JSON schema keyword the grammar library does not
            implement, when that is the reason; else ``None``.
    """

    def __init__(self, message: str, *, keyword: str | None = None) -> None:
        super().__init__(message)
        self.keyword = keyword
