"""Issue 37's acceptance test at the engine: a request's tokens never depend on its neighbours.

One request, greedy and seeded (temperature 0.8), runs alone, then again
among 1 to 64 other sequences of random lengths arriving at random steps,
under random prefill chunk sizes and step budgets
(``max_num_batched_tokens``), in the DEFAULT format (``quantization`` and
``linear_dtype`` ``auto``: int4 on the block kernels on x86, not exact
fp32). Its tokens must be identical: every layer computes a row the same
way whatever the step's row count (linear layers and head:
``kernels/cpu_qblock``; attention: fixed-order reductions), and a seeded
row's noise is keyed by (seed, position) (``engine/sampler.py``).

The linear/head/sampling part and the attention part of issue 37 are
fixed by two engineers in parallel; this file is the acceptance test of
both. The engines share one model runner (its KV pool is overwritten
before it is read); the reference runs alone at the default step limits.
Besides the tokens, the request's logits are compared bit for bit: a
last-bit difference rarely flips a 12-token argmax (exact fp32, whose
oneDNN GEMMs are not row-invariant, passes on tokens alone).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from bargein.engine.config import CacheConfig, ModelConfig, SchedulerConfig
from bargein.engine.engine import LLMEngine
from bargein.engine.model_runner import ModelRunner
from bargein.engine.request import EngineRequest, SamplingParams
from bargein.engine.sampler import Sampler

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
MAX_MODEL_LEN = 512
PROMPT = "Write a short poem about the sea at night, with a moon and a small boat in it."
MODES = {
    "greedy": SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
    "seeded": SamplingParams(temperature=0.8, seed=1234, max_tokens=MAX_TOKENS, ignore_eos=True),
}


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    """The default model in the default format (auto), on the CPU's torch kernels."""
    config = ModelConfig(device="cpu", backend="torch", dtype="float32")
    return ModelRunner(config, CacheConfig(num_blocks=8 * MAX_MODEL_LEN // 16, block_size=16), MAX_MODEL_LEN)


class Recorder(Sampler):
    """The sampler, keeping the logits row of every draw of the request whose
    params are ``mine`` (by identity), by the position of the token drawn."""

    def __init__(self, mine: SamplingParams) -> None:
        super().__init__()
        self.mine = mine
        self.logits: dict[int, torch.Tensor] = {}

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        positions: Sequence[int],
        banned: Sequence[Collection[int]] | None = None,
        allowed: tuple[Sequence[int], torch.Tensor] | None = None,
    ) -> list[int]:
        for row, (p, position) in enumerate(zip(params, positions, strict=True)):
            if p is self.mine:
                self.logits[position] = logits[row].clone()
        return super().__call__(logits, params, positions, banned, allowed)


class SmallPool:
    """``runner`` seen with only its first ``num_blocks`` KV blocks, so that a
    crowded engine preempts and recomputes."""

    def __init__(self, runner: ModelRunner, num_blocks: int) -> None:
        self.runner = runner
        self.num_blocks = num_blocks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


def run(
    runner: ModelRunner | SmallPool,
    config: SchedulerConfig,
    arrivals: dict[int, list[EngineRequest]],
    mine: SamplingParams,
) -> tuple[list[int], torch.Tensor, int]:
    """Step an engine over ``runner`` until idle, adding ``arrivals[step]``
    before each step. Returns the output tokens of request ``"me"`` (whose
    params are ``mine``), its logits ``[MAX_TOKENS, vocab]`` and the
    engine's preemptions."""
    engine = LLMEngine(runner, config)  # type: ignore[arg-type]
    recorder = engine.sampler = Recorder(mine)
    tokens: list[int] = []
    step = 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for request in arrivals.get(step, []):
            engine.add_request(request)
        for out in engine.step():
            if out.request_id == "me":
                tokens.extend(out.new_token_ids)
        step += 1
        assert step < 3000
    logits = torch.stack([recorder.logits[p] for p in sorted(recorder.logits)])
    return tokens, logits, engine.stats().num_preemptions


@pytest.fixture(scope="module")
def prompt(runner: ModelRunner) -> tuple[int, ...]:
    return tuple(runner.tokenizer(PROMPT)["input_ids"])


@pytest.fixture(scope="module")
def alone(runner: ModelRunner, prompt: tuple[int, ...]) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Each mode's tokens and logits for the request alone, at the default step limits."""
    config = SchedulerConfig(max_model_len=MAX_MODEL_LEN)
    refs = {}
    for mode, params in MODES.items():
        me = EngineRequest(request_id="me", prompt_token_ids=prompt, params=params)
        tokens, logits, _ = run(runner, config, {0: [me]}, params)
        refs[mode] = tokens, logits
    return refs


def test_the_reference_really_samples(alone: dict[str, tuple[list[int], torch.Tensor]]) -> None:
    assert len(alone["greedy"][0]) == len(alone["seeded"][0]) == MAX_TOKENS
    assert alone["greedy"][0] != alone["seeded"][0]
    assert alone["greedy"][1].shape[0] == MAX_TOKENS


others_strategy = st.lists(
    st.tuples(
        st.integers(1, 120),  # prompt length
        st.integers(0, 6),  # arrival step
        st.integers(1, 10),  # max tokens
        st.integers(0, 2**31 - 1),  # prompt content and seed
    ),
    min_size=1,
    max_size=64,
)


# no shrinking: one example is a whole engine run (10-60 s here); a failure is
# reported as drawn, with its preemption count
@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    others=others_strategy,
    mode=st.sampled_from(sorted(MODES)),
    arrival=st.integers(0, 4),
    budget=st.sampled_from([16, 48, 128, 512, 1024]),
    chunk=st.sampled_from([1, 7, 16, 33, 256, 512]),
    small_pool=st.booleans(),
)
def test_a_requests_tokens_do_not_depend_on_its_neighbours_or_chunking(
    runner: ModelRunner,
    prompt: tuple[int, ...],
    alone: dict[str, tuple[list[int], torch.Tensor]],
    others: list[tuple[int, int, int, int]],
    mode: str,
    arrival: int,
    budget: int,
    chunk: int,
    small_pool: bool,
) -> None:
    """Its tokens, and its logits bit for bit, equal the alone run's,
    whatever shares its steps, the chunking, and preemptions (a pool of just
    over one max_model_len sequence)."""
    seqs = max(17, len(others) + 1)  # room for every neighbour in one step
    budget = max(budget, seqs)  # at least max_num_seqs
    config = SchedulerConfig(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        prefill_chunk_size=min(chunk, budget),
        max_model_len=MAX_MODEL_LEN,
    )
    vocab = runner.vocab_size
    arrivals: dict[int, list[EngineRequest]] = defaultdict(list)
    for i, (length, step, max_tokens, seed) in enumerate(others):
        ids = tuple((seed * 7919 + j * 104729) % (vocab - 1) + 1 for j in range(length))
        params = SamplingParams(temperature=0.8 if seed % 2 else 0, seed=seed, max_tokens=max_tokens)
        arrivals[step].append(EngineRequest(request_id=f"o{i}", prompt_token_ids=ids, params=params))
    mine = MODES[mode]
    arrivals[arrival].append(EngineRequest(request_id="me", prompt_token_ids=prompt, params=mine))
    where = SmallPool(runner, MAX_MODEL_LEN // 16 + 4) if small_pool else runner
    tokens, logits, preemptions = run(where, config, arrivals, mine)
    note(f"{preemptions} preemptions")
    want_tokens, want_logits = alone[mode]
    assert tokens == want_tokens
    differ = (logits != want_logits).any(dim=-1).nonzero().flatten().tolist()
    assert not differ, f"logits differ at output tokens {differ}"
