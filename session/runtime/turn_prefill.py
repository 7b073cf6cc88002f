"""A voice turn's prompt prefilled while the user still speaks.

At a pause the voice side knows the turn's words so far (a partial
transcript). The prompt the turn's response will have starts with the
conversation plus that user text under the chat template; :class:`TurnPrefill`
renders exactly that (the conversation's messages and the partial user item,
as :func:`~bargein.session.conversation.chat.render_prompt` renders the
real request, generation prompt included) and submits it to the engine as a
prefill-only request (``EngineRequest.prefill_only``: the lowest priority,
no token sampled, its full blocks left in the prefix cache). When the turn
ends, the real request's admission hits the blocks up to where the final
transcript departs from the partial one; only the rest is prefilled then.

Why the whole rendered prompt, and not only up to the partial text's end:
when the turn ends at this pause (the final transcript equals the partial
one) every full block of the real prompt is then cached; when it does not,
the few template tokens after the text fall in blocks that miss anyway.

One connection has at most one prefill-only request: a newer pause's
replaces it (the blocks the older one filled stay cached and are hit by the
newer one), and the connection's end drops it. The render runs off the event
loop and never holds the connection's tokenization slot, so it never delays
the tokenizing of a real request; a render already in flight skips the next.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bargein.engine.errors import EngineStoppedError, PromptTooLongError
from bargein.engine.request import EngineRequest, FinishReason
from bargein.session.conversation.actions import Message
from bargein.session.conversation.chat import render_prompt

logger = logging.getLogger(__name__)


class TurnPrefill:
    """One connection's speculative prefill (see the module doc).

    Args:
        runner: the engine runner (``tokenizer``, ``max_model_len``,
            ``submit``, ``abort``).
        cache_salt: the connection's prefix-cache salt (the real requests' own).
        clock: monotonic seconds (the request's arrival time).

    Attributes:
        num_submitted: prefill-only requests submitted by this connection.
    """

    def __init__(self, runner: Any, cache_salt: str | None, clock: Callable[[], float]) -> None:
        self._runner = runner
        self._cache_salt = cache_salt
        self._clock = clock
        self._request_id: str | None = None  # the one submitted last, maybe ended since
        self._rendering = False
        self.num_submitted = 0

    async def prefill(self, messages: Sequence[Message]) -> bool:
        """Prefill ``messages`` (the conversation, then the partial user item),
        replacing this connection's previous prefill.

        Returns:
            whether a request was submitted: not while a render is in flight,
            not for a prompt that cannot fit the context, and not when the
            engine refuses it (stopped, or without prefix caching).
        """
        if self._rendering:
            return False
        self._rendering = True
        try:
            ids = await asyncio.to_thread(render_prompt, self._runner.tokenizer, messages)
        finally:
            self._rendering = False
        self.drop()
        request = EngineRequest(
            request_id=f"prefill_{uuid.uuid4().hex}",
            prompt_token_ids=ids,
            arrival_time=self._clock(),
            cache_salt=self._cache_salt,
            prefill_only=True,
        )
        try:
            self._runner.submit(request)
        except (PromptTooLongError, EngineStoppedError, ValueError) as exc:
            logger.debug("speculative prefill not submitted: %s", exc)
            return False
        self._request_id = request.request_id
        self.num_submitted += 1
        return True

    def drop(self) -> None:
        """Abort the prefill submitted last, if it still runs (the blocks it
        filled stay in the prefix cache)."""
        if self._request_id is not None:
            self._runner.abort(self._request_id, FinishReason.CANCELLED)
            self._request_id = None
