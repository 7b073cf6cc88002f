"""Lines typed at the terminal, awaited without holding up the exit (``bargein chat``).

``asyncio.to_thread(input)`` parks a pool thread in ``input()``; ``asyncio.run``
joins the pool when it ends, so a Ctrl-C at the prompt would not quit until
the user also pressed Enter. Here one daemon thread reads the raw descriptor
(``os.read``, no lock of ``sys.stdin`` held, which would trip the interpreter's
shutdown) and hands chunks to the event loop; the process exits whatever
that thread is blocked on.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import sys
import threading


class ConsoleLines:
    """Lines of a file descriptor (default: stdin), read by a daemon thread.

    Args:
        fd: the descriptor to read (bytes, decoded as UTF-8 with replacement).
    """

    def __init__(self, fd: int | None = None) -> None:
        self._fd = sys.stdin.fileno() if fd is None else fd
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._eof = False
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, args=(loop,), name="console-lines", daemon=True).start()

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 4096)
            except OSError:
                chunk = b""
            try:
                loop.call_soon_threadsafe(self._chunks.put_nowait, chunk)
            except RuntimeError:  # the loop is closed: nobody reads any more
                return
            if not chunk:
                return

    async def readline(self, prompt: str = "") -> str:
        """The next line, without its line break; ``prompt`` is written to
        stdout first, as ``input`` does.

        Raises:
            EOFError: the input ended with no more lines (Ctrl-D).
        """
        if prompt:
            print(prompt, end="", flush=True)
        while "\n" not in self._pending:
            if self._eof:
                line, self._pending = self._pending, ""
                if not line:
                    raise EOFError
                return line
            chunk = await self._chunks.get()
            self._eof = not chunk
            self._pending += self._decoder.decode(chunk, final=self._eof)
        line, _, self._pending = self._pending.partition("\n")
        return line.removesuffix("\r")
