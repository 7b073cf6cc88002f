"""What the tests need from the machine, and what happens when it is missing.

On a developer's machine a missing redis-server, chromium or playwright skips
the tests that need it. In CI (``CI=true``, as CI services and ``.ci/run``
set it) it fails them instead: a run that silently skipped every Redis and
browser test would otherwise go green. Only tests read the environment for
this; the app reads it in ``app/settings.py`` alone.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True when ``CI`` is set to a true value (``true``, ``1``, ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(what: str) -> NoReturn:
    """Skip the calling test (or fixture) because ``what`` is missing; fail it in CI."""
    if in_ci():
        pytest.fail(f"{what} (CI=true: a missing dependency fails the run, it is not skipped)", pytrace=False)
    pytest.skip(what)


def playwright_sync_api() -> ModuleType:
    """``playwright.sync_api``, or :func:`missing` if it cannot be imported."""
    try:
        from playwright import sync_api
    except ImportError as exc:
        missing(f"playwright is not installed ({exc}): `make install-dev` installs it")
    return sync_api


def voice_stack() -> None:
    """:func:`missing` unless the voice stack is installed (``bargein.voice.models.voice_stack_status``)."""
    from bargein.voice.models import voice_stack_status

    reason = voice_stack_status()
    if reason is not None:
        missing(reason)
