"""Service.submit against the engine's step budget: refusals at once, the queue's tokens released.

The engine stand-in reports the stats a real engine with ``--target-itl-ms``
would (a step budget, decoding streams); its prompts are 3 tokens. The cost
model allows 18 decoding streams a step (tests/session/test_admission_load.py
has the arithmetic).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from bargein.engine.request import SamplingParams
from bargein.engine.step_budget import StepBudget, StepCostCoefficients
from bargein.protocol import events as pe
from bargein.session.conversation.config import SessionConfig
from bargein.session.conversation.state import Message, Submit, SubmitFailed, Submitted
from bargein.session.runtime.admission import Admission, AdmissionConfig
from bargein.session.runtime.service import Owner, Service
from bargein.session.streams.log import MemoryTokenLog
from tests.session.test_service import ThreadedEngine, out
from tests.waiting import HANG_GUARD_S, wait_until

COST = StepCostCoefficients(
    base_s=0.010, per_decode_s=0.002, per_prefill_token_s=0.0005, per_context_token_s=0.0
)


@dataclass
class BudgetStats:
    num_decoding: int
    num_decoding_tokens: int = 0
    running_remaining_tokens: tuple[int, ...] = (4,)
    step_budget: StepBudget | None = StepBudget(
        target_s=0.05, cost=COST, max_tokens=512, min_prefill_tokens=8
    )
    last_step_s: float = 0.001


class CountingTemplate:
    def __init__(self) -> None:
        self.calls = 0

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> list[int]:
        self.calls += 1
        return [1, 2, 3]


class BusyEngine(ThreadedEngine):
    def __init__(self, num_decoding: int) -> None:
        super().__init__()
        self.load = BudgetStats(num_decoding=num_decoding)
        self.tokenizer = CountingTemplate()  # type: ignore[assignment]

    def stats(self) -> BudgetStats:  # type: ignore[override]
        return self.load


def submit(stream_id: str) -> Submit:
    return Submit(
        response_id=f"r-{stream_id}",
        stream_id=stream_id,
        messages=(Message(role="user", content="hi"),),
        params=SamplingParams(max_tokens=4),
    )


async def test_a_full_budget_refuses_at_once_and_a_first_token_makes_room() -> None:
    engine = BusyEngine(num_decoding=16)
    service = Service(
        engine, MemoryTokenLog(), SessionConfig(), secret=b"k", admission=Admission(AdmissionConfig())
    )
    await service.start()
    session = Owner(principal="p", session_id="sess")
    assert isinstance(await service.submit(submit("a"), session, 0.0), Submitted)
    assert isinstance(await service.submit(submit("b"), session, 0.0), Submitted)
    # at once: no step runs meanwhile, so a submit that waited for room would hang here
    refused = await asyncio.wait_for(service.submit(submit("c"), session, 0.0), HANG_GUARD_S)
    assert isinstance(refused, SubmitFailed) and refused.code is pe.ErrorCode.OVERLOADED
    assert abs(refused.retry_after_ms - 184) <= 1  # the soonest stream's 4 tokens, 46 ms a full step
    assert [r.request_id for r in engine.requests] == ["a", "b"]  # c never reached the engine
    assert engine.tokenizer.calls == 2  # nor the tokenizer: the load alone refused it
    assert service.admission.num_waiting == 2
    assert service.admission.num_queued_tokens == 6
    # a's first token: it decodes now (the engine counts it), its prompt leaves the queue
    engine.run_steps([[out("a", 0, "Hi")]])
    await wait_until(lambda: service.admission.num_queued_tokens == 3, "a's prompt to leave the queue")
    engine.load.num_decoding = 17
    assert isinstance(await service.submit(submit("c"), session, 0.0), SubmitFailed)  # still 19
    engine.load.num_decoding = 16  # one stream ended
    assert isinstance(await service.submit(submit("c"), session, 0.0), Submitted)
    await service.stop()


async def test_http_requests_are_refused_before_session_turns() -> None:
    """14 streams decode: a 15th fits the target but not the 80% HTTP share."""
    service = Service(BusyEngine(num_decoding=14), MemoryTokenLog(), SessionConfig(), secret=b"k")
    await service.start()
    http = Owner(principal="p", session_id="", connection="conn-1")
    refused = await service.submit(submit("h"), http, 0.0)
    assert isinstance(refused, SubmitFailed) and refused.code is pe.ErrorCode.OVERLOADED
    assert service.admission.num_queued_tokens == 0
    assert isinstance(
        await service.submit(submit("s"), Owner(principal="p", session_id="sess"), 0.0), Submitted
    )
    await service.stop()
