"""A real bargein server for end-to-end tests, shared by the whole test session.

``live_server`` starts an :class:`bargein.app.embedded.EmbeddedServer`: uvicorn
(websockets sans-I/O implementation) on a free loopback port, in a thread of
the test process, with the real bundled model loaded ONCE per test session
(a test that needs other settings builds its own ``EmbeddedServer``, at the
cost of another model load), in the default format (``--quantization
auto``: int4 on x86, not exact fp32: the exactness promises of issue 37 are
tested in the arithmetic users run; no test here compares with
transformers). Tests talk to it over real sockets
(``live_server.ws_url``, ``live_server.http_url``) and, since it runs in the
same process, read the engine's state directly:

- ``live_server.stats()``: the runner's ``EngineStats`` (free blocks,
  generated-token counter, finished requests by reason, ...);
- ``live_server.recent_requests()``: the ``EngineRequest`` objects the engine
  received, newest last (the prompts it was given, as token ids);
- ``live_server.tokenizer``: to decode those prompts;
- ``await live_server.wait_idle()``: until no request is running or waiting.

The same data is served over HTTP at ``GET /debug/engine`` (the server runs
with ``debug_endpoints=True``). Limits are small to keep tests fast:
``max_model_len=512`` (so a too-long prompt is cheap to build), ``max_tokens``
at most 64 per response, frames up to 64 KiB.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.app.server import AppState
from bargein.app.settings import ServerConfig, Settings
from bargein.engine.config import EngineConfig, SchedulerConfig
from bargein.engine.request import EngineRequest
from bargein.session.conversation.config import SessionConfig
from tests.waiting import wait_until

MAX_MODEL_LEN = 512
MAX_FRAME_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveServer:
    """A running server and in-process access to its engine."""

    host: str
    port: int
    state: AppState

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/realtime"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def tokenizer(self) -> Any:
        return self.state.runner.tokenizer

    def stats(self) -> Any:
        """The engine's stats now (a frozen snapshot, safe from any thread)."""
        return self.state.runner.stats()

    def recent_requests(self) -> list[EngineRequest]:
        """Requests the engine received, newest last."""
        assert self.state.service is not None
        return list(self.state.service.recent_requests)

    async def wait_idle(self, timeout_s: float = 180.0) -> Any:
        """Wait until the engine runs nothing; return its stats then.

        ``timeout_s`` is a hang guard, not a bound: other tests' answers
        still generating on a loaded machine can take long to end.
        """

        def idle() -> Any:
            stats = self.stats()
            return stats if stats.num_running == 0 and stats.num_waiting == 0 else None

        return await wait_until(idle, "the engine to run nothing", guard_s=timeout_s, poll_s=0.02)


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """The bundled model behind a real uvicorn server on a free loopback port."""
    server = EmbeddedServer(
        Settings(
            # the default format (issue 37): exactness promises (resume, retry,
            # prefix cache, seeds) hold in the arithmetic users run
            engine=EngineConfig(scheduler=SchedulerConfig(max_model_len=MAX_MODEL_LEN)),
            session=SessionConfig(max_tokens=64, default_max_tokens=32, max_frame_bytes=MAX_FRAME_BYTES),
            server=ServerConfig(port=0, debug_endpoints=True, log_level="warning"),
        )
    )
    try:
        server.start()
        yield LiveServer(host=server.host, port=server.port, state=server.state)
    finally:
        server.stop()


@pytest.fixture
def voice_server(live_server: LiveServer) -> LiveServer:
    """``live_server``, which must serve audio (its voice stack installed)."""
    if live_server.state.voice is None:
        from tests.needs import missing

        missing("the server serves no audio: the voice stack is not installed (make install)")
    return live_server


@contextlib.contextmanager
def node_on_engine(
    live_server: LiveServer, settings: Settings, *, sndbuf: int | None = None
) -> Iterator[EmbeddedServer]:
    """Another server with its own ``settings`` on ``live_server``'s engine
    (no second model load), on a free port; stopped at exit.

    ``sndbuf``: the kernel send buffer of its sockets, in bytes (None: the
    system's default), for tests whose buffers must fill at a known size.
    """
    server = EmbeddedServer(
        settings, sndbuf=sndbuf, runner=live_server.state.runner, voice=live_server.state.voice
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def redis_node_on_engine(live_server: LiveServer, redis_url: str, node_id: str) -> Iterator[EmbeddedServer]:
    """A node on ``live_server``'s engine whose token log is the Redis at
    ``redis_url``, with ``live_server``'s session limits; stopped at exit."""
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=32, max_frame_bytes=MAX_FRAME_BYTES),
            server=ServerConfig(
                port=0, log_level="warning", redis_url=redis_url, token_log_backend="redis", node_id=node_id
            ),
        ),
    ) as server:
        yield server
