"""What the node runtime uses of its engine: :class:`EngineHandle`.

The engine runs on a thread of its own (:class:`bargein.engine.loop.EngineLoop`);
the service, its submitter, live streams, step queue and log writer reach it
only through the methods below, so that a test can step a scripted engine
(``tests/session/test_service.py``) and the runtime's modules name their one
dependency by type instead of ``Any``.
"""

from __future__ import annotations

from typing import Any, Protocol

from bargein.engine.engine import EngineStats
from bargein.engine.loop import StepListener
from bargein.engine.request import EngineRequest, FinishReason


class EngineHandle(Protocol):
    """The engine loop as the node runtime sees it (a started
    :class:`bargein.engine.loop.EngineLoop` is one)."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (transformers' ``PreTrainedTokenizerBase``):
        chat templates, prompt lengths and a takeover's text use it."""
        ...

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        ...

    @property
    def model_name(self) -> str:
        """The served model's display name."""
        ...

    def submit(self, request: EngineRequest) -> None:
        """Queue ``request`` for the engine's next step.

        Raises:
            PromptTooLongError, EngineStoppedError: as the engine loop does.
        """
        ...

    def abort(
        self,
        request_id: str,
        reason: FinishReason = FinishReason.INTERRUPTED,
        *,
        only_if_waiting: bool = False,
        keep_tokens: int | None = None,
    ) -> None:
        """End a request at the start of the engine's next step; no-op if not live."""
        ...

    def add_step_listener(self, fn: StepListener) -> None:
        """Call ``fn(outputs)`` on the engine thread once per step with outputs."""
        ...

    def remove_step_listener(self, fn: StepListener) -> None:
        """Stop calling ``fn``; no-op if absent."""
        ...

    def stats(self) -> EngineStats:
        """The engine's counters as of the end of its last step."""
        ...
