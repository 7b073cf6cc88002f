"""Admission control: say no early and clearly, before any KV block is allocated.

:class:`Admission` is consulted by :meth:`bargein.session.runtime.service.Service.submit`
(the one path of both the WebSocket and the HTTP API) before a request
reaches the engine. In the order checked:

1. per-principal token buckets (``rate_limited``): requests per second, and
   tokens per second (prompt tokens plus ``max_tokens``, charged once the
   prompt is rendered). A bucket holds ``burst_s`` seconds of its rate;
   a third, of audio seconds per second, is charged by the voice side
   for each turn it transcribes (:meth:`Admission.charge_audio`) and for the
   speech a resume synthesizes again (:class:`AudioBudget`), not here;
2. a cap on the responses one principal has generating at once
   (``rate_limited``: it is that caller's own load);
3. a bounded waiting queue (``overloaded``): requests admitted that have not
   produced their first token yet (waiting in the engine, in prefill, or
   being submitted) may not exceed ``max_waiting``;
4. a queue-time deadline, enforced *up front by estimate* (``overloaded``):
   the queue is first in, first out, so a new request leaves it (gets its
   first token) one departure after the ``L`` requests waiting ahead of it
   have left: after ``L + 1`` times the engine's *service gap*, the time
   between two departures while the queue was never empty. A gap counts only if the
   request that left was already admitted when the one before it left, so
   idle time between arrivals never counts: the estimate measures what the
   engine can do, not how fast requests happen to arrive (with the
   departure rate, an underloaded server would estimate the arrival gap and
   refuse requests it could serve at once). The mean of the gaps of the last
   ``window_s`` seconds is used; a request whose estimate is over
   ``max_queue_time_s`` is refused now rather than timed out later. With
   fewer than ``MIN_GAPS_TO_ESTIMATE`` recent gaps (the queue has not been
   busy lately), only the bound of 3. applies.

The estimate is a mean; the service enforces the same deadline on each
admitted request too (``Service``: a request the engine has not scheduled
after ``max_queue_time_s`` is dropped from the queue with ``overloaded``; one
whose prefill has begun goes on), so the admitted never wait in the queue
past it. Such drops are not departures.

5. against the engine's step-time model (``overloaded``), when the engine
   runs with an inter-token latency target (``--target-itl-ms``; its stats
   then carry a :class:`~bargein.engine.step_budget.StepBudget`): once the
   prompt is tokenized (:meth:`Admission.check_load`), and before, with an
   empty prompt (:meth:`Admission.precheck_load`: a request the load alone
   refuses is refused without tokenizing):

   - *the running streams' ITL*: the request joins the decoding batch once
     its prompt is in, with every request admitted ahead of it; the step of
     that batch, with the minimum prefill, must fit the target. Otherwise
     it waits in the engine's queue (the scheduler lets it join only when
     the batch fits) until the batch has shrunk by the excess: the running
     streams' remaining ``max_tokens``, ascending, then rounds of the
     waiting ones ahead (each taken as long as its own ``max_tokens``), at
     the predicted step of a full batch. It is queued,
     as vLLM and llama-server queue a burst, when that wait and its prefill
     meet ``target_ttft_s``; else refused with ``retry_after_ms`` the wait
     (without a TTFT target it is refused at once, as before);
   - *its TTFT* (``target_ttft_s``): the prompt tokens admitted ahead of it
     and its own go in at the prefill tokens per step the budget leaves
     after the decodes; the predicted time of those steps must meet the
     target. Otherwise ``retry_after_ms`` is the excess
     (the queue ahead drains by then). A request with nobody ahead of it is
     never refused for its TTFT: its own prompt's time is not overload, and
     retrying would not help.

   Prompt tokens are counted whole (a prefix-cache hit is known only once
   the engine schedules the request): the estimate errs towards refusing.
   Each admitted request carries its predicted TTFT
   (:class:`LoadVerdict`); the service reports it against the measured one
   (``bargein_admission_ttft_error_ratio``), so the model is checked
   against what then happens. The step-time model itself learns from the
   low quantile of recent steps of each shape (engine/step_cost_fit.py): a
   noisy neighbour slowing some steps does not make it refuse.

   Priority: interactive sessions (a WebSocket session's turns, voice or
   text; :attr:`bargein.session.runtime.service.Owner.interactive`) may fill the
   whole ITL budget; bulk requests (the HTTP API) only ``bulk_share`` of
   it, so under overload the HTTP traffic is refused first and a
   conversation's next turn still finds room. Both share one FIFO queue in
   the engine (a request admitted is never overtaken).

Every refusal carries ``retry_after_ms``: when the bucket refills, or when
the queue is expected to be short enough again. Sans-I/O: time is an argument.

Principals come and go (without API keys, one per client address), so the
per-principal table is pruned: a principal with nothing generating whose
buckets have refilled is in the state a new one would start in, and is
dropped (:meth:`Admission._evict_idle`). The table holds the principals
active now or seen within their buckets' refill time, no more.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from bargein.engine.step_budget import StepBudget
from bargein.protocol import events as pe

MIN_RETRY_MS = 100
MAX_RETRY_MS = 30_000
MIN_GAPS_TO_ESTIMATE = 4
MIN_PRINCIPALS_TO_SWEEP = 1024  # the table is swept of idle principals past this size


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """Limits of admission (0 turns a limit off).

    Attributes:
        max_waiting: requests admitted but without a first token yet; past
            it, ``overloaded`` (0: no bound).
        max_queue_time_s: seconds a request may wait in the queue for the
            engine to schedule it: refused up front when the expected wait is
            longer, dropped from the queue (``overloaded``, nothing
            generated) when it passes; a prefill under way is never dropped.
            0: no bound, the default (the estimate needs a load it can learn
            from; set it for production, e.g. to the TTFT target).
        max_active_per_principal: responses one principal (an API key;
            without API keys, a client address: IPv4, or IPv6 /64) has
            generating at once (0: no cap).
        rate_limit_requests: requests per second per principal (0: off).
        rate_limit_tokens: prompt + max_tokens per second per principal (0: off).
        rate_limit_audio_s: seconds of audio per second per principal (0:
            off): input audio transcribed (a voice turn's audio is charged
            when the turn ends), and speech a resume with ``audio_from_ms``
            synthesizes again (charged per segment).
        burst_s: seconds of its rate a bucket holds (its size).
        window_s: seconds of recent queue departures the wait estimate uses.
        target_ttft_s: the time-to-first-token target, seconds: with the
            engine's inter-token target, a request whose predicted TTFT (the
            prompt tokens queued ahead and its own, at the step budget) is
            over it is refused (``overloaded``) at once; 0: off (the library
            default; ``bargein serve`` turns it on). The inter-token part of
            the check needs only the engine's target.
        bulk_share: the share of the inter-token budget bulk (HTTP API)
            requests may fill; interactive (WebSocket) sessions may fill all of it.
    """

    max_waiting: int = 64
    max_queue_time_s: float = 0.0
    max_active_per_principal: int = 0
    rate_limit_requests: float = 0.0
    rate_limit_tokens: float = 0.0
    rate_limit_audio_s: float = 0.0
    burst_s: float = 2.0
    window_s: float = 20.0
    target_ttft_s: float = 0.0
    bulk_share: float = 0.8

    def __post_init__(self) -> None:
        for name in ("max_waiting", "max_active_per_principal"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if not 0 < self.bulk_share <= 1:
            raise ValueError(f"bulk_share={self.bulk_share} must be in (0, 1]")
        for name in (
            "max_queue_time_s",
            "rate_limit_requests",
            "rate_limit_tokens",
            "rate_limit_audio_s",
            "target_ttft_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.burst_s <= 0 or self.window_s <= 0:
            raise ValueError(f"burst_s={self.burst_s} and window_s={self.window_s} must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """Why a request is refused: the ``error`` event's code, message, retry hint."""

    code: pe.ErrorCode
    message: str
    retry_after_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadVerdict:
    """What :meth:`Admission.judge_load` says of a request.

    Attributes:
        refusal: why it is refused; None: admitted.
        predicted_ttft_s: the model's time to its first token, seconds (the
            queue ahead, a wait for room in the batch, its prefill); None
            without a step-time model. Checked against the measured TTFT by
            the ``bargein_admission_ttft_error_ratio`` metric.
    """

    refusal: Refusal | None
    predicted_ttft_s: float | None


@dataclass(slots=True, kw_only=True)
class TokenBucket:
    """A token bucket: ``rate`` per second, holding at most ``capacity``."""

    rate: float
    capacity: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def is_full_at(self, now: float) -> bool:
        """Whether it will have refilled to ``capacity`` by ``now`` (a fresh one's level)."""
        return self.level + (now - self.updated) * self.rate >= self.capacity

    def wait_s(self, amount: float) -> float:
        """Seconds until ``amount`` may be taken (0: now). More than the bucket
        holds may be taken from a full bucket (its level goes below zero)."""
        need = min(amount, self.capacity)
        return 0.0 if need <= self.level else (need - self.level) / self.rate


class EngineLoad(Protocol):
    """What :meth:`Admission.check_load` reads of the engine
    (:class:`bargein.engine.engine.EngineStats` has it).

    Attributes:
        step_budget: the engine's step budget; None: no ITL target (the
            model-based check is off).
        num_decoding: running sequences whose prompt is in.
        num_decoding_tokens: their prompt plus output tokens.
        running_remaining_tokens: per running sequence, the most tokens it
            may still generate, ascending.
    """

    @property
    def step_budget(self) -> StepBudget | None: ...
    @property
    def num_decoding(self) -> int: ...
    @property
    def num_decoding_tokens(self) -> int: ...
    @property
    def running_remaining_tokens(self) -> tuple[int, ...]: ...


def _retry_ms(seconds: float) -> int:
    return int(min(MAX_RETRY_MS, max(MIN_RETRY_MS, math.ceil(seconds * 1000))))


@dataclass(slots=True)
class _Principal:
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None
    audio: TokenBucket | None = None  # audio seconds (turns transcribed, resumes synthesized)
    active: int = 0

    def is_idle(self, now: float) -> bool:
        """Nothing generating and full buckets: the same as a new principal."""
        return self.active == 0 and all(
            b is None or b.is_full_at(now) for b in (self.requests, self.tokens, self.audio)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioBudget:
    """One principal's audio rate limit (``--rate-limit-audio``), charged
    after the fact by audio made piece by piece: a resume's synthesized
    speech. A piece may start while the bucket holds anything, and its
    seconds are then taken whole, so the principal overshoots by at most
    one piece; turns and resumes are refused until the bucket refills.

    Attributes:
        admission: the service's admission state.
        principal: the admission key charged.
    """

    admission: Admission
    principal: str

    def refusal(self, now: float) -> Refusal | None:
        """``rate_limited`` (with the wait) while the bucket is empty; None:
        audio may be made, or there is no audio limit.

        Args:
            now: monotonic seconds.
        """
        return self.admission.audio_refusal(self.principal, now)

    def spend(self, seconds: float, now: float) -> None:
        """Charge ``seconds`` of audio made (at ``now``, monotonic seconds)."""
        self.admission.spend_audio(self.principal, seconds, now)


class Admission:
    """Admission state of one service (its principals, its queue).

    Call :meth:`check_request` before rendering the prompt, :meth:`charge_tokens`
    and :meth:`check_load` after (then :meth:`release_load` once its first
    token came or it ended or failed), :meth:`started` when a request produced its first token (or
    ended before), :meth:`ended` when its generation ended, or
    :meth:`cancelled` when it was refused after :meth:`check_request` passed.
    """

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.num_waiting = 0
        self.num_active = 0  # admitted by check_request, not ended: waiting or generating
        self.num_queued_tokens = 0  # prompt tokens admitted by check_load, not started yet
        # (when, seconds) of the recent service gaps, oldest first
        self._gaps: deque[tuple[float, float]] = deque()
        self._last_departure: float | None = None
        self._principals: dict[str, _Principal] = {}
        self._sweep_at = MIN_PRINCIPALS_TO_SWEEP  # table size of the next sweep

    def saturated(self) -> bool:
        """The queue is full: a new connection is answered with close 1013."""
        return 0 < self.config.max_waiting <= self.num_waiting

    def check_request(self, principal: str, now: float) -> Refusal | None:
        """Admit a request (counted as waiting and active), or say why not."""
        state = self._principal(principal, now)
        refusal = self._rate_limited(state, now) or self._over_cap(state) or self._overloaded(now)
        if refusal is None:
            if state.requests is not None:
                state.requests.level -= 1
            state.active += 1
            self.num_active += 1
            self.num_waiting += 1
        return refusal

    def charge_tokens(self, principal: str, num_tokens: int, now: float) -> Refusal | None:
        """Take ``num_tokens`` from the principal's token bucket, or refuse
        (then :meth:`cancelled` must follow)."""
        bucket = self._principal(principal, now).tokens
        if bucket is None:
            return None
        bucket.refill(now)
        wait = bucket.wait_s(num_tokens)
        if wait > 0:
            return Refusal(
                code=pe.ErrorCode.RATE_LIMITED,
                retry_after_ms=_retry_ms(wait),
                message=f"token rate limit: {self.config.rate_limit_tokens:g} "
                "tokens/s (prompt plus max_tokens)",
            )
        bucket.level -= num_tokens
        return None

    def charge_audio(self, principal: str, seconds: float, now: float) -> Refusal | None:
        """Take ``seconds`` of input audio (a voice turn about to be
        transcribed) from the principal's audio bucket, or refuse
        (``rate_limited``; nothing is taken). A turn longer than the bucket
        holds may be taken from a full bucket, as a large request may."""
        bucket = self._principal(principal, now).audio
        if bucket is None:
            return None
        bucket.refill(now)
        wait = bucket.wait_s(seconds)
        if wait > 0:
            return self._audio_limited(wait)
        bucket.level -= seconds
        return None

    def audio_budget(self, principal: str) -> AudioBudget:
        """The principal's audio bucket, for audio charged as it is made
        (a resume's speech, synthesized segment by segment)."""
        return AudioBudget(admission=self, principal=principal)

    def audio_refusal(self, principal: str, now: float) -> Refusal | None:
        """``rate_limited`` while the principal's audio bucket is empty."""
        bucket = self._principal(principal, now).audio
        if bucket is None:
            return None
        bucket.refill(now)
        return None if bucket.level > 0 else self._audio_limited(-bucket.level / bucket.rate)

    def spend_audio(self, principal: str, seconds: float, now: float) -> None:
        """Take ``seconds`` already made from the principal's audio bucket
        (its level may go below zero: later audio waits until it refills)."""
        bucket = self._principal(principal, now).audio
        if bucket is not None:
            bucket.refill(now)
            bucket.level -= seconds

    def _audio_limited(self, wait_s: float) -> Refusal:
        return Refusal(
            code=pe.ErrorCode.RATE_LIMITED,
            retry_after_ms=_retry_ms(wait_s),
            message=f"audio rate limit: {self.config.rate_limit_audio_s:g} s of audio per second "
            "(voice turns transcribed, resumed speech synthesized)",
        )

    def check_load(
        self,
        num_prompt_tokens: int,
        load: EngineLoad | None,
        *,
        interactive: bool = True,
        max_tokens: int = 0,
    ) -> Refusal | None:
        """:meth:`judge_load`'s refusal, or None when admitted."""
        return self.judge_load(
            num_prompt_tokens, load, interactive=interactive, max_tokens=max_tokens
        ).refusal

    def judge_load(
        self,
        num_prompt_tokens: int,
        load: EngineLoad | None,
        *,
        interactive: bool = True,
        max_tokens: int = 0,
    ) -> LoadVerdict:
        """Admit a request against the engine's step-time model (5. in the
        module doc), or say why not; on admission its prompt tokens count
        as queued until :meth:`release_load`.

        Args:
            num_prompt_tokens: its prompt's tokens.
            load: the engine's stats now; None, or one without a
                ``step_budget``, admits (no model to judge by).
            interactive: a session's turn (the whole budget) or a bulk
                request (``bulk_share`` of it).
            max_tokens: the most tokens it may generate (a queue ahead of
                it that is not running yet is taken to be as long).

        Returns the refusal (None: admitted) and the predicted time to its
        first token, seconds (None without a model). Call after
        :meth:`check_request` passed (the request is among ``num_waiting``).
        """
        verdict = self._judge_load(num_prompt_tokens, load, interactive, max_tokens)
        if verdict.refusal is None and load is not None and load.step_budget is not None:
            self.num_queued_tokens += num_prompt_tokens
        return verdict

    def precheck_load(
        self, load: EngineLoad | None, *, interactive: bool = True, max_tokens: int = 0
    ) -> Refusal | None:
        """:meth:`check_load` for an empty prompt, counting nothing: a request
        the load alone refuses is refused before its prompt is tokenized
        (a thread hop that waits for the engine's GIL), so at once."""
        return self._judge_load(0, load, interactive, max_tokens).refusal

    def _judge_load(
        self, num_prompt_tokens: int, load: EngineLoad | None, interactive: bool, max_tokens: int
    ) -> LoadVerdict:
        budget = None if load is None else load.step_budget
        if load is None or budget is None:
            return LoadVerdict(refusal=None, predicted_ttft_s=None)
        share = 1.0 if interactive else self.config.bulk_share
        # Its own among the waiting. The engine's stats date from its last step: a request
        # that got its first token since is no longer waiting, yet not decoding in them either.
        decoders = max(load.num_decoding + max(1, self.num_waiting), self.num_active)
        context = load.num_decoding_tokens + self.num_queued_tokens + num_prompt_tokens
        if decoders <= 1 or budget.fits(decoders, context, share):
            ttft = self._prefill_s(budget, load, self.num_queued_tokens + num_prompt_tokens)
            return LoadVerdict(refusal=self._over_ttft(ttft), predicted_ttft_s=ttft)
        # Past the batch the ITL target allows: it waits in the engine's queue until
        # enough running streams end (the scheduler admits it then), then prefills.
        capacity = budget.max_decode_seqs(context / decoders, share)
        excess = max(1, decoders - capacity)
        wait_s = self._join_wait_s(budget, load, excess, capacity, max_tokens, context / decoders)
        ttft = wait_s + self._prefill_s(budget, load, num_prompt_tokens)
        target = self.config.target_ttft_s
        if target and ttft <= target:
            return LoadVerdict(refusal=None, predicted_ttft_s=ttft)  # queued within the TTFT target
        who = "" if share == 1.0 else f" ({share:.0%} of it for HTTP requests)"
        refusal = Refusal(
            code=pe.ErrorCode.OVERLOADED,
            retry_after_ms=_retry_ms(wait_s),
            message=f"the server is overloaded: {decoders} streams would share each step, "
            f"past the {1000 * budget.target_s:.0f} ms inter-token target{who}"
            + (f", and waiting for room would take its first token to {ttft:.1f} s" if target else "")
            + "; retry later",
        )
        return LoadVerdict(refusal=refusal, predicted_ttft_s=ttft)

    def release_load(self, num_prompt_tokens: int) -> None:
        """A request admitted by :meth:`check_load` left the queue (its first
        token came, it ended, or it never reached the engine)."""
        self.num_queued_tokens = max(0, self.num_queued_tokens - num_prompt_tokens)

    @staticmethod
    def _join_wait_s(
        budget: StepBudget,
        load: EngineLoad,
        excess: int,
        capacity: int,
        max_tokens: int,
        context_per_seq: float,
    ) -> float:
        """Seconds until ``excess`` streams ahead of it have ended: the running
        ones' remaining tokens, ascending; past those, the waiting ones ahead
        run in rounds of ``capacity``, each taken to be ``max_tokens`` long.
        Steps meanwhile take what the model predicts for a full batch (one
        stream when even one breaks the target: it runs anyway, slower)."""
        remaining = load.running_remaining_tokens
        if excess <= len(remaining):
            steps = remaining[excess - 1]
        else:
            rounds = math.ceil((excess - len(remaining)) / max(1, capacity))
            steps = (remaining[-1] if remaining else 0) + rounds * max(1, max_tokens)
        batch = max(1, capacity)
        return steps * budget.cost.predict(batch, 0, int(batch * context_per_seq))

    @staticmethod
    def _prefill_s(budget: StepBudget, load: EngineLoad, num_tokens: int) -> float:
        """Seconds to prefill ``num_tokens`` at the prefill rate the current
        decodes leave (it falls as the queue's prompts become decodes; the
        ITL check bounds that)."""
        per_step = budget.prefill_tokens(load.num_decoding, load.num_decoding_tokens)
        if per_step <= 0 or num_tokens <= 0:
            return 0.0
        full, rest = divmod(num_tokens, per_step)
        cost, decodes, context = budget.cost, load.num_decoding, load.num_decoding_tokens
        return full * cost.predict(decodes, per_step, context) + (
            cost.predict(decodes, rest, context) if rest else 0.0
        )

    def _over_ttft(self, ttft: float) -> Refusal | None:
        """The refusal of a request whose queue ahead and prompt take past the
        TTFT target (``ttft``, seconds). A request with nobody ahead of it is
        never refused: its own prompt's time is no overload."""
        target = self.config.target_ttft_s
        if not target or self.num_queued_tokens == 0 or ttft <= target:
            return None
        return Refusal(
            code=pe.ErrorCode.OVERLOADED,
            retry_after_ms=_retry_ms(ttft - target),
            message=f"the server is overloaded: the expected time to the first token "
            f"({ttft:.1f} s) is over {target:g} s; retry later",
        )

    def started(self, now: float, *, admitted_at: float, served: bool = True) -> None:
        """An admitted request (admitted at ``admitted_at``) left the queue: its
        first token came, or it ended first (``served=False``: it was dropped
        at its deadline, which says nothing of how fast the engine serves)."""
        self.num_waiting = max(0, self.num_waiting - 1)
        if not served:
            return
        last = self._last_departure
        if last is not None and admitted_at <= last:  # it waited through the whole gap
            self._gaps.append((now, now - last))
        self._last_departure = now

    def drain_retry_ms(self, now: float) -> int:
        """``retry_after_ms`` for a request dropped from the queue: the time the
        requests waiting now need to leave it, at the recent service gap."""
        gap = self._service_gap(now)
        return _retry_ms(self.num_waiting * gap if gap is not None else 1.0)

    def ended(self, principal: str) -> None:
        """An admitted request's generation ended."""
        self.num_active = max(0, self.num_active - 1)
        state = self._principals.get(principal)
        if state is not None:
            state.active = max(0, state.active - 1)

    def cancelled(self, principal: str) -> None:
        """An admitted request was refused later (never reached the engine)."""
        self.num_waiting = max(0, self.num_waiting - 1)
        self.ended(principal)

    def expected_wait_s(self, now: float) -> float | None:
        """Expected queue wait of a new request (``L + 1`` service gaps), or
        None without enough recent gaps."""
        return self._wait_for(self._service_gap(now))

    def _wait_for(self, gap: float | None) -> float | None:
        """``L + 1`` service gaps (None without a gap)."""
        return None if gap is None else (self.num_waiting + 1) * gap

    def _service_gap(self, now: float) -> float | None:
        """Mean seconds between departures of a busy queue over the last
        ``window_s`` seconds, or None with fewer than MIN_GAPS_TO_ESTIMATE."""
        while self._gaps and self._gaps[0][0] < now - self.config.window_s:
            self._gaps.popleft()
        if len(self._gaps) < MIN_GAPS_TO_ESTIMATE:
            return None
        return sum(gap for _, gap in self._gaps) / len(self._gaps)

    # ---- the checks ------------------------------------------------------------

    def _principal(self, principal: str, now: float) -> _Principal:
        state = self._principals.get(principal)
        if state is None:
            if len(self._principals) >= self._sweep_at:
                self._evict_idle(now)
            cfg = self.config
            state = self._principals[principal] = _Principal(
                requests=_bucket(cfg.rate_limit_requests, cfg.burst_s, now, minimum=1.0),
                tokens=_bucket(cfg.rate_limit_tokens, cfg.burst_s, now, minimum=0.0),
                audio=_bucket(cfg.rate_limit_audio_s, cfg.burst_s, now, minimum=0.0),
            )
        return state

    def _evict_idle(self, now: float) -> None:
        """Drop the idle principals (:meth:`_Principal.is_idle`): losing them
        changes no answer, since a new one starts the same way.

        The next sweep waits until the table has doubled, so sweeping costs
        O(1) per new principal, amortized, and the table stays within twice
        the principals active or recently seen (at least the sweep size).
        """
        idle = [name for name, state in self._principals.items() if state.is_idle(now)]
        for name in idle:
            del self._principals[name]
        self._sweep_at = max(MIN_PRINCIPALS_TO_SWEEP, 2 * len(self._principals))

    def _rate_limited(self, state: _Principal, now: float) -> Refusal | None:
        if state.requests is None:
            return None
        state.requests.refill(now)
        wait = state.requests.wait_s(1.0)
        if wait <= 0:
            return None
        return Refusal(
            code=pe.ErrorCode.RATE_LIMITED,
            retry_after_ms=_retry_ms(wait),
            message=f"request rate limit: {self.config.rate_limit_requests:g}/s",
        )

    def _over_cap(self, state: _Principal) -> Refusal | None:
        cap = self.config.max_active_per_principal
        if not cap or state.active < cap:
            return None
        return Refusal(
            code=pe.ErrorCode.RATE_LIMITED,
            retry_after_ms=1000,
            message=f"at most {cap} responses generating at once per API key",
        )

    def _overloaded(self, now: float) -> Refusal | None:
        cfg = self.config
        gap = self._service_gap(now)
        wait = self._wait_for(gap)
        if cfg.max_waiting and self.num_waiting >= cfg.max_waiting:
            excess = self.num_waiting - cfg.max_waiting + 1
            return Refusal(
                code=pe.ErrorCode.OVERLOADED,
                retry_after_ms=_retry_ms(excess * gap if gap is not None else 1.0),
                message=f"the server is overloaded: {self.num_waiting} requests are waiting; retry later",
            )
        if cfg.max_queue_time_s and wait is not None and wait > cfg.max_queue_time_s:
            return Refusal(
                code=pe.ErrorCode.OVERLOADED,
                retry_after_ms=_retry_ms(wait - cfg.max_queue_time_s),
                message=f"the server is overloaded: the expected wait "
                f"({wait:.1f} s) is over {cfg.max_queue_time_s:g} s",
            )
        return None


def _bucket(rate: float, burst_s: float, now: float, *, minimum: float) -> TokenBucket | None:
    if not rate:
        return None
    capacity = max(minimum, rate * burst_s)
    return TokenBucket(rate=rate, capacity=capacity, level=capacity, updated=now)


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitLevel:
    """Where one of a principal's rate limits stands (OpenAI's ``rate_limits.updated``).

    Attributes:
        name: ``"requests"`` or ``"tokens"``.
        limit: what its bucket holds when full (``burst_s`` seconds of its rate).
        remaining: what it holds now (may be below 0 after a large request).
        reset_seconds: until it is full again, seconds.
    """

    name: str
    limit: int
    remaining: int
    reset_seconds: float


def rate_limit_levels(admission: Admission, principal: str, now: float) -> tuple[RateLimitLevel, ...]:
    """The levels of ``principal``'s request and token buckets now (none when
    the server runs without rate limits); reads, never charges."""
    state = admission._principals.get(principal)  # noqa: SLF001 - same module's own table
    cfg = admission.config
    levels = []
    for name, rate, minimum, bucket in (
        ("requests", cfg.rate_limit_requests, 1.0, None if state is None else state.requests),
        ("tokens", cfg.rate_limit_tokens, 0.0, None if state is None else state.tokens),
    ):
        if not rate:
            continue
        capacity = max(minimum, rate * cfg.burst_s) if bucket is None else bucket.capacity
        level = (
            capacity if bucket is None else min(capacity, bucket.level + (now - bucket.updated) * bucket.rate)
        )
        levels.append(
            RateLimitLevel(
                name=name,
                limit=int(capacity),
                remaining=math.floor(level),
                reset_seconds=round(max(0.0, capacity - level) / rate, 3),
            )
        )
    return tuple(levels)
