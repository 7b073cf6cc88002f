"""Chromium pages on the bargein client for the browser tests (Debian's chromium, playwright).

:func:`launch` starts headless Debian chromium (never a downloaded browser);
:class:`Page` is one page on the client that records console errors and the
WebSocket frames it sends and receives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.needs import missing, playwright_sync_api

CHROMIUM = Path("/usr/bin/chromium")
ANSWER = ".msg.assistant:last-of-type"


@contextmanager
def launch(args: Sequence[str] = ()) -> Iterator[Any]:
    """Headless Debian chromium with extra command-line ``args``.

    Without chromium or playwright the calling test skips, or fails in CI
    (``CI=true``: tests/needs.py).
    """
    if not CHROMIUM.exists():
        missing(f"Debian's chromium is missing ({CHROMIUM}): `make system-deps` installs it")
    sync_api = playwright_sync_api()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=list(args))
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A fresh page on the bargein client that records console errors and frames
    (JSON frames, parsed: the page speaks JSON)."""

    def __init__(self, browser: Any, base_url: str, query: str, init_script: str | None) -> None:
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        if init_script:
            self.context.add_init_script(init_script)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.sockets = 0
        self.page.on("console", self._on_console)
        self.page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        self.page.on("websocket", self._on_websocket)
        self.page.goto(f"{base_url}/?{query}")
        self.page.wait_for_selector('#conn[data-state="open"]', timeout=30_000)

    def _on_console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def _on_websocket(self, socket: Any) -> None:
        self.sockets += 1
        socket.on("framesent", lambda frame: self.sent.append(json.loads(frame)))
        socket.on("framereceived", lambda frame: self.received.append(json.loads(frame)))

    def ask(self, text: str) -> None:
        self.page.fill("#prompt", text)
        self.page.press("#prompt", "Enter")

    def answer_text(self) -> str:
        return self.page.inner_text(f"{ANSWER} .text")

    def wait_for_streaming_text(self, min_chars: int) -> None:
        """Waits until the answer shows text and is still arriving."""
        self.page.wait_for_function(
            """(min) => {
                const answer = document.querySelector('.msg.assistant:last-of-type');
                return answer && answer.dataset.status === 'streaming'
                    && answer.querySelector('.text').textContent.length >= min;
            }""",
            arg=min_chars,
            timeout=60_000,
            polling=10,
        )

    def wait_for_end(self) -> str:
        """Waits until the answer has ended; returns its finish status."""
        self.page.wait_for_function(
            "() => !['streaming', 'stopping'].includes("
            "document.querySelector('.msg.assistant:last-of-type').dataset.status)",
            timeout=120_000,
        )
        return self.page.get_attribute(ANSWER, "data-status")

    def of_type(self, frames: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
        return [frame for frame in frames if frame.get("type") == kind]


@contextmanager
def pages_on(browser: Any, base_url: str) -> Iterator[Callable[..., Page]]:
    """``open_(query, init_script=None) -> Page`` opening pages on ``base_url``;
    at the end, closes them and fails on any console or page error they saw."""
    pages: list[Page] = []

    def open_(query: str = "max_tokens=48&temperature=0", init_script: str | None = None) -> Page:
        pages.append(Page(browser, base_url, query, init_script))
        return pages[-1]

    yield open_
    errors = [error for page in pages for error in page.errors]
    for page in pages:
        page.context.close()
    assert errors == []
