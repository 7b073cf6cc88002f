"""The submit path: admission, then the prompt's tokens, then the stream, then the engine.

A session's :class:`~bargein.session.conversation.state.Submit` becomes an
engine request in this order, each step able to refuse it before the next
costs anything:

1. admission (:mod:`bargein.session.runtime.admission`): rate buckets, caps,
   the waiting queue, and the engine's load when it has an ITL target;
2. text too long to fit the context is refused before any tokenizing
   (:func:`~bargein.session.conversation.chat.max_prompt_bytes`);
3. the chat template runs off the event loop (``asyncio.to_thread``), one
   render at a time per connection; then admission judges the load with the
   prompt's length and charges the rate tokens;
4. the stream is created in the log (the peers claim it first), the request
   goes to the engine runner, and the stream is live.

From ``runner.submit`` to the return there is no ``await``: the caller hands
``Submitted`` to its session before any engine output of the request can
reach the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from bargein.engine.engine import EngineStats
from bargein.engine.errors import EngineStoppedError, PromptTooLongError
from bargein.engine.request import EngineRequest, FinishReason
from bargein.protocol import events as pe
from bargein.session.conversation.chat import longest_token_bytes, max_prompt_bytes, prompt_bytes, prompt_ids
from bargein.session.conversation.state import Submit, SubmitFailed, Submitted
from bargein.session.errors import TokenLogUnavailable
from bargein.session.runtime.admission import Admission, Refusal
from bargein.session.runtime.engine_handle import EngineHandle
from bargein.session.runtime.live import LiveStream, LiveStreams, OnFinish
from bargein.session.runtime.observer import SessionObserver
from bargein.session.runtime.one_at_a_time import OneAtATime
from bargein.session.runtime.tokens import make_resume_token
from bargein.session.streams.log import StreamEnd, StreamInfo, StreamWrite, TokenLog
from bargein.session.streams.peers import Peers

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class Owner:
    """Who submits: the principal (for resume tokens) and their session.

    ``limit_key``: who admission's rate limits and caps count against
    (without API keys, the client's address: see app/auth.py); None: the
    principal. ``connection``: the client connection submitting, which has
    at most one prompt being tokenized at a time; None: the session (a
    WebSocket connection has one).
    """

    principal: str
    session_id: str
    on_finish: OnFinish | None = None
    limit_key: str | None = None
    connection: str | None = None  # one tokenization at a time each; None: session_id

    @property
    def admission_key(self) -> str:
        """The key of this owner's admission state."""
        return self.limit_key or self.principal

    @property
    def interactive(self) -> bool:
        """A realtime session's turn (it has a session id), which admission
        favours over a bulk HTTP request (none): session/runtime/admission.py."""
        return bool(self.session_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Prompt:
    """An admitted request's prompt, once tokenized and judged against the load."""

    ids: tuple[int, ...]
    queued: int  # prompt tokens admission counts as queued until the request starts
    admitted_at: float  # service clock when admission let it in
    predicted_ttft_s: float | None  # admission's model of its first token's time


class Submitter:
    """Turns a session's ``Submit`` into a live stream (see the module doc).

    Args:
        runner: the engine runner (``tokenizer``, ``max_model_len``, ``submit``,
            and ``stats`` when it has a step budget).
        log: where streams are created.
        peers: claim each stream before it is created.
        streams: where a submitted stream goes live.
        admission: refuses requests past the queue, rate limits and load.
        observer: told of submits and refusals.
        secret: the resume tokens' key.
        node_id: recorded as the owner of the streams created here.
        clock: monotonic seconds.
        cache_salt: the prefix-cache salt of a principal's requests.
        recent_requests: where each submitted request is kept (``/debug/engine``).
    """

    def __init__(
        self,
        runner: EngineHandle,
        log: TokenLog,
        peers: Peers,
        streams: LiveStreams,
        admission: Admission,
        observer: SessionObserver,
        *,
        secret: bytes,
        node_id: str,
        clock: Callable[[], float],
        cache_salt: Callable[[str], str | None],
        recent_requests: deque[EngineRequest],
    ) -> None:
        self._runner = runner
        self._log = log
        self._peers = peers
        self._streams = streams
        self._admission = admission
        self._observer = observer
        self._secret = secret
        self._node_id = node_id
        self._clock = clock
        self._cache_salt = cache_salt
        self._recent_requests = recent_requests
        self._tokenizing = OneAtATime()  # one tokenization in flight per connection
        self._max_prompt_bytes: int | None = None  # None: no bound before tokenizing

    @property
    def _max_model_len(self) -> int:
        return self._runner.max_model_len

    async def start(self) -> None:
        """Measure the tokenizer: the prompt text bound (session/conversation/chat.py)."""
        token_bytes = await asyncio.to_thread(longest_token_bytes, self._runner.tokenizer)
        if token_bytes is not None:
            self._max_prompt_bytes = max_prompt_bytes(token_bytes, self._max_model_len)

    async def submit(self, action: Submit, owner: Owner, now: float) -> Submitted | SubmitFailed:
        """Admit, render the prompt, create the stream, submit the request."""
        admitted_at = self._clock()
        refusal = self._admission.check_request(owner.admission_key, admitted_at)
        if refusal is not None:
            return self._refused(action, refusal)
        refusal = self._admission.precheck_load(
            self._engine_load(), interactive=owner.interactive, max_tokens=action.params.max_tokens
        )
        if refusal is not None:  # the load alone refuses it: no need to tokenize
            self._admission.cancelled(owner.admission_key)
            return self._refused(action, refusal)
        try:
            result = await self._submit_admitted(action, owner, now, admitted_at)
        except BaseException:
            self._admission.cancelled(owner.admission_key)
            raise
        if isinstance(result, SubmitFailed):
            self._admission.cancelled(owner.admission_key)
        return result

    def _refused(self, action: Submit, refusal: Refusal) -> SubmitFailed:
        self._observer.rejected(refusal.code.value, response_id=action.response_id)
        return SubmitFailed(
            response_id=action.response_id,
            code=refusal.code,
            message=refusal.message,
            retry_after_ms=refusal.retry_after_ms,
        )

    async def _submit_admitted(
        self, action: Submit, owner: Owner, now: float, admitted_at: float
    ) -> Submitted | SubmitFailed:
        num_bytes = prompt_bytes(action.messages, action.prompt)
        if self._max_prompt_bytes is not None and num_bytes > self._max_prompt_bytes:
            return self._too_long_text(action, num_bytes)  # no tokenizing: it cannot fit
        async with self._tokenizing.hold(owner.connection or owner.session_id):
            ids = await asyncio.to_thread(prompt_ids, self._runner.tokenizer, action.messages, action.prompt)
        if len(ids) >= self._max_model_len:
            return self._too_long(action, len(ids))
        load = self._engine_load()
        verdict = self._admission.judge_load(
            len(ids), load, interactive=owner.interactive, max_tokens=action.params.max_tokens
        )
        if verdict.refusal is not None:  # first: a request refused for the load costs no rate tokens
            return self._refused(action, verdict.refusal)
        queued = len(ids) if load is not None else 0  # what check_load counted as queued
        refusal = self._admission.charge_tokens(
            owner.admission_key, len(ids) + action.params.max_tokens, self._clock()
        )
        if refusal is not None:
            self._admission.release_load(queued)
            return self._refused(action, refusal)
        prompt = _Prompt(
            ids=ids, queued=queued, admitted_at=admitted_at, predicted_ttft_s=verdict.predicted_ttft_s
        )
        submitted = False
        try:
            result = await self._create_and_submit(action, owner, now, prompt)
            submitted = isinstance(result, Submitted)
            return result
        finally:
            if not submitted:  # it never reached the engine: not queued after all
                self._admission.release_load(queued)

    def _engine_load(self) -> EngineStats | None:
        """The runner's stats when they carry a step budget (the engine runs
        with an ITL target), for admission's model-based check; else None."""
        load = self._runner.stats()
        return load if load.step_budget is not None else None

    async def _create_and_submit(
        self, action: Submit, owner: Owner, now: float, prompt: _Prompt
    ) -> Submitted | SubmitFailed:
        """Create the stream in the log, submit the request, start its deadline."""
        ids = prompt.ids
        try:
            await self._peers.claim(action.stream_id, ids, action.params)  # before the stream exists
            await self._log.create_stream(
                StreamInfo(
                    stream_id=action.stream_id,
                    response_id=action.response_id,
                    principal=owner.principal,
                    session_id=owner.session_id,
                    owner_node=self._node_id,
                    status="live",
                    end=0,
                    finish=None,
                    tool_mode=action.tool_mode,
                )
            )
        except TokenLogUnavailable:  # nothing was generated: the client may retry
            logger.warning(
                "stream %s not created: the token log is unavailable", action.stream_id, exc_info=True
            )
            return SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the token log is unavailable; retry later",
            )
        request = EngineRequest(
            request_id=action.stream_id,
            prompt_token_ids=ids,
            params=action.params,
            arrival_time=now,
            cache_salt=self._cache_salt(owner.principal),
        )
        try:
            self._runner.submit(request)
        except PromptTooLongError:
            await self._end_unsubmitted(action.stream_id, len(ids))
            return self._too_long(action, len(ids))
        except EngineStoppedError:
            await self._end_unsubmitted(action.stream_id, len(ids))
            self._observer.rejected("engine_stopped", response_id=action.response_id)
            return SubmitFailed(
                response_id=action.response_id,
                code=pe.ErrorCode.INTERNAL_ERROR,
                message="the engine is not running",
            )
        live = LiveStream(
            response_id=action.response_id,
            on_finish=owner.on_finish,
            principal=owner.admission_key,
            num_prompt_tokens=len(ids),
            queued_tokens=prompt.queued,
            admitted_at=prompt.admitted_at,
            predicted_ttft_s=prompt.predicted_ttft_s,
        )
        self._streams.add(action.stream_id, live)
        self._streams.start_deadline(action.stream_id, live)
        self._recent_requests.append(request)
        self._observer.submitted(
            response_id=action.response_id,
            stream_id=action.stream_id,
            session_id=owner.session_id,
            num_prompt_tokens=len(ids),
            max_tokens=action.params.max_tokens,
            messages=action.messages,
        )
        return Submitted(
            response_id=action.response_id,
            resume_token=make_resume_token(self._secret, action.stream_id, owner.principal),
        )

    def _too_long(self, action: Submit, num_tokens: int) -> SubmitFailed:
        return self._prompt_too_long(
            action,
            f"the prompt has {num_tokens} tokens; the context holds "
            f"{self._max_model_len} (prompt plus at least one new token)",
        )

    def _too_long_text(self, action: Submit, num_bytes: int) -> SubmitFailed:
        return self._prompt_too_long(
            action,
            f"the prompt has {num_bytes} bytes of text: more than the context of "
            f"{self._max_model_len} tokens can hold",
        )

    def _prompt_too_long(self, action: Submit, message: str) -> SubmitFailed:
        self._observer.rejected(pe.ErrorCode.PROMPT_TOO_LONG.value, response_id=action.response_id)
        return SubmitFailed(
            response_id=action.response_id, code=pe.ErrorCode.PROMPT_TOO_LONG, message=message
        )

    async def _end_unsubmitted(self, stream_id: str, num_prompt_tokens: int) -> None:
        """Close a stream whose request the runner refused (readers must not hang)."""
        end = StreamEnd(
            end=0,
            finish_reason=FinishReason.ERROR.value,
            prompt_tokens=num_prompt_tokens,
            completion_tokens=0,
            cached_tokens=0,
        )
        await self._log.write_step([StreamWrite(stream_id=stream_id, entry=None, finish=end)])
        self._peers.ended(stream_id)
