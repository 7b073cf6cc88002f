"""Start ``bargein serve`` in a subprocess on a free loopback port (for the experiments).

The load generator then runs in its own process, so the server's engine and
event loop do not share a GIL with the clients that measure them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def served(
    flags: Sequence[str],
    *,
    timeout_s: float = 300.0,
    pythonpath: Path | None = None,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Iterator[str]:
    """Run ``bargein serve --debug-endpoints true <flags>``; yield its HTTP base URL
    once ``/readyz`` is 200; stop it (SIGTERM) at exit. ``pythonpath`` puts
    another build of ``bargein`` first on the server's import path (a baseline).

    Raises:
        RuntimeError: the server exited or was not ready within ``timeout_s``.
    """
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "bargein",
        "serve",
        "--port",
        str(port),
        "--debug-endpoints",
        "true",
        "--log-level",
        "warning",
        *flags,
    ]
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": str(pythonpath)}
    # `python -m` puts its working folder first on the path: the baseline's own
    with serving(
        cmd,
        f"http://127.0.0.1:{port}",
        "/readyz",
        timeout_s=timeout_s,
        env=env,
        cwd=pythonpath or ROOT,
        on_start=on_start,
    ) as url:
        yield url


@contextlib.contextmanager
def serving(
    cmd: Sequence[str],
    url: str,
    ready_path: str,
    *,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    on_start: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> Iterator[str]:
    """Run any server command; yield ``url`` once ``GET url + ready_path`` is 200;
    stop it (SIGTERM, then SIGKILL after 30 s) at exit. ``on_start`` gets the
    process as soon as it runs (to sample its memory, say).

    Raises:
        RuntimeError: the server exited (its stderr's tail in the message) or
            was not ready within ``timeout_s``.
    """
    # stderr to a file, not a pipe nobody reads (a full pipe would stall the server)
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(cmd), cwd=cwd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        if on_start is not None:
            on_start(proc)
        try:
            _wait_ready(proc, url + ready_path, timeout_s, err)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_ready(proc: subprocess.Popen[bytes], ready_url: str, timeout_s: float, err: IO[bytes]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"the server exited ({proc.returncode}): {tail}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(ready_url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready within {timeout_s} s")


async def engine_stats(http: httpx.AsyncClient) -> dict[str, Any]:
    """The engine's stats from ``GET /debug/engine``."""
    return (await http.get("/debug/engine")).json()["stats"]  # type: ignore[no-any-return]


def load_average() -> str:
    """``/proc/loadavg``'s 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
