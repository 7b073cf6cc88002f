"""The seam between a node's service and the other nodes that share its streams.

The service (:mod:`bargein.session.runtime.service`) calls a :class:`Peers` at
each point where another node may matter:

- ``claim`` when it creates a stream, before the stream exists;
- ``fence`` before each step's log write: the writes this node may still make;
- ``lost`` when the log refused a write because another node took the stream;
- ``ended`` when generation of a stream written here ended;
- ``abort_elsewhere`` for a cancel of a stream this node does not generate;
- ``reader_started``/``reader_ended``/``read_elsewhere``: who reads a stream,
  so the abandon grace cuts only streams nobody reads on any node;
- ``follow`` when a client here reads a live stream (its node may have died).

A node alone runs :class:`NoPeers`, which does the local thing at each point
(every write is its own; there is nobody to forward a cancel to or to take a
stream over from). Several nodes on one Redis run
:class:`bargein.session.streams.cluster.Cluster`. Which one is chosen once,
where the service is built (``app/server.py``), so the service never asks.

The other way round, a cluster asks the node's service for what only the
generating node can do (abort a request, continue a stream taken over): the
:class:`LocalNode` protocol. It lives here, on the streams' side, so that the
streams never import the runtime.
"""

from __future__ import annotations

from typing import Any, Protocol

from bargein.engine.request import EngineRequest, FinishReason, RequestOutput, SamplingParams
from bargein.session.streams.log import StreamWrite
from bargein.session.supervise import TaskHealth


class StreamContinuation(Protocol):
    """A taken-over stream's continuation, as the node generating it sees it
    (:class:`bargein.session.streams.cluster.takeover.Continuation`)."""

    @property
    def offset(self) -> int:
        """The stream's logged tokens when the continuation began."""
        ...

    def translate(self, out: RequestOutput) -> RequestOutput:
        """The continuation request's output as the stream sees it (offsets, text)."""
        ...


class EngineControl(Protocol):
    """What a cluster uses of its node's engine runner."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (a takeover re-derives the stream's text with it)."""
        ...

    def abort(self, request_id: str, reason: FinishReason) -> None:
        """Stop a request at the engine's next step (its later outputs are not logged)."""
        ...


class LocalNode(Protocol):
    """What a cluster asks of the service of its own node."""

    @property
    def runner(self) -> EngineControl:
        """The node's engine runner."""
        ...

    @property
    def max_model_len(self) -> int:
        """Prompt plus output tokens of one sequence."""
        ...

    def clock(self) -> float:
        """Monotonic seconds (the service's clock)."""
        ...

    def is_generating(self, stream_id: str) -> bool:
        """Whether this node's engine generates ``stream_id`` now."""
        ...

    def abort(self, stream_id: str, reason: FinishReason, requested_at: float) -> None:
        """Cancel a stream generated here, as a client's cancel would."""
        ...

    def cache_salt(self, principal: str) -> str | None:
        """The prefix-cache salt of ``principal``'s requests."""
        ...

    def continue_stream(
        self, request: EngineRequest, *, response_id: str, continuation: StreamContinuation
    ) -> None:
        """Generate a taken-over stream here: ``request``'s outputs go to the
        stream through ``continuation``.

        Raises what the engine runner's ``submit`` raises (an ``EngineError``).
        """
        ...


class Peers(Protocol):
    """The other nodes, as one node's service sees them (see the module doc)."""

    @property
    def health(self) -> TaskHealth:
        """The peers' own long-lived tasks that crash now (``/readyz`` lists them)."""
        ...

    async def start(self, node: LocalNode) -> None:
        """Attach to this node's service and start working."""
        ...

    async def hand_over(self) -> None:
        """Before a graceful shutdown: let other nodes continue this node's streams."""
        ...

    async def stop(self) -> None:
        """Stop the peers' own tasks."""
        ...

    async def claim(self, stream_id: str, prompt_token_ids: tuple[int, ...], params: SamplingParams) -> None:
        """Make ``stream_id`` this node's before it is created.

        Raises TokenLogUnavailable when that cannot be done (the stream must
        not be created).
        """
        ...

    async def fence(self, writes: list[StreamWrite]) -> list[StreamWrite]:
        """The writes of ``writes`` this node may still make."""
        ...

    def lost(self, stream_id: str) -> None:
        """The log refused a write of ``stream_id``: another node took it over."""
        ...

    def ended(self, stream_id: str) -> None:
        """Generation of a stream written here ended."""
        ...

    def abort_elsewhere(self, stream_id: str, reason: FinishReason) -> None:
        """A cancel for a stream this node does not generate."""
        ...

    def reader_started(self, stream_id: str) -> None:
        """A connection here started delivering ``stream_id``."""
        ...

    def reader_ended(self, stream_id: str) -> None:
        """A delivery of ``stream_id`` here ended."""
        ...

    def read_elsewhere(self, stream_id: str) -> bool:
        """Whether a client on another node reads ``stream_id`` (generated here)."""
        ...

    async def follow(self, stream_id: str) -> None:
        """A client here reads ``stream_id``: continue it here if its node died."""
        ...


class NoPeers:
    """A node alone: every stream is its own and nobody else reads or cancels one.

    Each hook does the local thing: writes are all allowed, and a cancel of a
    stream this node does not generate has nowhere to go (it ended already).
    """

    def __init__(self) -> None:
        self.health = TaskHealth()  # no task of its own: never failing

    async def start(self, node: LocalNode) -> None:
        """Nothing to attach to."""

    async def hand_over(self) -> None:
        """Nobody to hand streams over to: the engine's shutdown ends them."""

    async def stop(self) -> None:
        """No task to stop."""

    async def claim(self, stream_id: str, prompt_token_ids: tuple[int, ...], params: SamplingParams) -> None:
        """Every stream created here is this node's already."""

    async def fence(self, writes: list[StreamWrite]) -> list[StreamWrite]:
        """Every write: no other node can have taken a stream over."""
        return writes

    def lost(self, stream_id: str) -> None:
        """Never called: only a cluster fences the log's writes."""

    def ended(self, stream_id: str) -> None:
        """No lease to release."""

    def abort_elsewhere(self, stream_id: str, reason: FinishReason) -> None:
        """No other node generates it: it ended already."""

    def reader_started(self, stream_id: str) -> None:
        """Nobody to tell: the service counts its own readers."""

    def reader_ended(self, stream_id: str) -> None:
        """Nobody to tell: the service counts its own readers."""

    def read_elsewhere(self, stream_id: str) -> bool:
        """False: there is nowhere else."""
        return False

    async def follow(self, stream_id: str) -> None:
        """The stream's node is this one: nothing to take over."""
