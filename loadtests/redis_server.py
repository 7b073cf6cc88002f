"""A real ``redis-server`` process on a free loopback port, for tests and benchmarks.

Debian's binary (``make test`` installs it), started with no persistence so
every start is empty. Fault tests stop, kill, pause and restart it on the SAME
port, so clients reconnect to the address they were given.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_server_binary() -> str | None:
    """Path of ``redis-server``, or None if it is not installed."""
    return shutil.which("redis-server")


class RedisServer:
    """Owns one redis-server process.

    Args:
        port: port to listen on (a free one by default); kept across restarts.
        extra_args: more ``redis-server`` options, e.g. ``("--appendonly", "yes")``.
    """

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = ()) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("redis-server is not installed (make test installs Debian's redis-server)")
        self._binary = binary
        self.port = port or free_port()
        self._extra_args = tuple(extra_args)
        self._dir = tempfile.TemporaryDirectory(prefix="bargein-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def folder(self) -> str:
        """The server's working folder (removed by :meth:`close`)."""
        return self._dir.name

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start the server and wait until it answers PING."""
        assert self._proc is None, "already running"
        self._proc = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *self._extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                self._proc = None
                raise RuntimeError(f"redis-server exited at start: {err}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)

    def start_sentinel(self, config_file: str, timeout_s: float = 10.0) -> None:
        """Start a Sentinel (``redis-server <config_file> --sentinel``) on this port."""
        assert self._proc is None, "already running"
        self._proc = subprocess.Popen(
            [self._binary, config_file, "--sentinel", "--port", str(self.port), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout_s
        while not self.ping():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis sentinel did not start on port {self.port}")
            time.sleep(0.02)

    def ping(self) -> bool:
        """True when something on the port answers ``+PONG``."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM and wait (no save: nothing persists)."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the abrupt death of the server."""
        self._end(signal.SIGKILL)

    def restart(self) -> None:
        """Stop, then start again on the same port (empty: no persistence)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: a hung server (connections open, nothing answers)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Kill the server if running and remove its folder."""
        if self._proc is not None:
            self.kill()
        self._dir.cleanup()

    def _end(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
