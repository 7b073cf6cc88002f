"""A real bargein server for end-to-end tests, shared by the whole test session.

``live_server`` starts uvicorn (websockets sans-I/O implementation) on a free
loopback port, in a thread of the test process, with the real bundled model
loaded ONCE per test session. Tests talk to it over real sockets
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

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from app.server import AppState, create_app
from app.settings import ServerConfig, Settings
from engine.config import EngineConfig, SchedulerConfig
from engine.request import EngineRequest
from session.config import SessionConfig

MAX_MODEL_LEN = 512
MAX_FRAME_BYTES = 64 * 1024
LOAD_TIMEOUT_S = 300.0


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

    async def wait_idle(self, timeout_s: float = 30.0) -> Any:
        """Wait until the engine runs nothing; return its stats then."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if stats.num_running == 0 and stats.num_waiting == 0:
                return stats
            assert time.monotonic() < deadline, f"engine still busy: {stats}"
            await asyncio.sleep(0.02)


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _wait_ready(url: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while time.monotonic() < deadline:
        assert thread.is_alive(), "the server thread died while starting"
        try:
            response = httpx.get(url + "/readyz", timeout=2)
            if response.status_code == 200:
                return
            assert response.json()["error"] is None, response.json()["error"]
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError("the server did not become ready")


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """The bundled model behind a real uvicorn server on a free loopback port."""
    settings = Settings(
        engine=EngineConfig(scheduler=SchedulerConfig(max_model_len=MAX_MODEL_LEN)),
        session=SessionConfig(max_tokens=64, default_max_tokens=32,
                              max_frame_bytes=MAX_FRAME_BYTES),
        server=ServerConfig(port=0, debug_endpoints=True, log_level="warning"))
    app = create_app(settings)
    config = uvicorn.Config(app, ws="websockets-sansio", log_level="warning",
                            ws_max_size=MAX_FRAME_BYTES, lifespan="on")
    server = uvicorn.Server(config)
    sock = _free_socket()
    host, port = sock.getsockname()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name="live-server", daemon=True)
    thread.start()
    live = LiveServer(host=host, port=port, state=app.state.bargein)
    try:
        _wait_ready(live.http_url, thread)
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
