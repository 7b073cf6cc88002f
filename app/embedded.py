"""A bargein server on a thread of the current process (tests and benchmarks).

uvicorn serves on a free loopback port from its own thread and event loop;
the caller keeps in-process access to the app's state (engine loop, service)
to read the engine's stats and the requests it received.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import httpx
import uvicorn

from bargein.app.listen import uvicorn_config
from bargein.app.server import AppState, create_app
from bargein.app.settings import Settings


class EmbeddedServer:
    """Serve ``settings`` on ``127.0.0.1`` (a free port) until :meth:`stop`.

    Args:
        settings: the server's settings (``server.host``/``port`` are ignored).
        sndbuf: ``SO_SNDBUF`` of the listening socket, inherited by every
            connection (tests of slow clients: a small kernel buffer fills fast).
        runner: a started engine loop to serve (e.g. another server's, to
            skip loading the model again); it keeps running after :meth:`stop`.
        voice: loaded voice models (a :class:`bargein.session.voice_runtime.runtime.VoiceRuntime`)
            to use instead of loading them; they stay usable after :meth:`stop`.
    """

    def __init__(
        self, settings: Settings, *, sndbuf: int | None = None, runner: Any = None, voice: Any = None
    ) -> None:
        self.settings = settings
        self.app = create_app(settings, runner=runner, voice=voice)
        self.state: AppState = self.app.state.bargein
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if sndbuf is not None:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self._sock.bind(("127.0.0.1", 0))
        self.host, self.port = self._sock.getsockname()
        config = uvicorn_config(self.app, settings, lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, name="bargein-server", daemon=True
        )

    @property
    def ws_url(self) -> str:
        """The realtime endpoint (``wss://`` when the settings give a certificate)."""
        scheme = "wss" if self.settings.server.ssl_certfile else "ws"
        return f"{scheme}://{self.host}:{self.port}/v1/realtime"

    @property
    def http_url(self) -> str:
        """The HTTP base URL (``https://`` with a certificate)."""
        return f"{self.settings.server.scheme}://{self.host}:{self.port}"

    def start(self, timeout_s: float = 300.0) -> None:
        """Start serving and wait until ``/readyz`` says the model is loaded.

        Raises:
            RuntimeError: loading failed, or the server thread died.
            TimeoutError: not ready within ``timeout_s``.
        """
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread died while starting")
            try:
                # our own socket: the certificate (made for a name, maybe self-signed) is not in question
                response = httpx.get(self.http_url + "/readyz", timeout=2, verify=False)
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code == 200:
                return
            if response is not None and response.json().get("error"):
                raise RuntimeError(f"loading failed: {response.json()['error']}")
            time.sleep(0.2)
        raise TimeoutError(f"the server was not ready within {timeout_s} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut down (engine thread included) and release the port."""
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)
        self._sock.close()

    def stats(self) -> Any:
        """The engine's ``EngineStats`` now (a frozen snapshot)."""
        return self.state.runner.stats()
