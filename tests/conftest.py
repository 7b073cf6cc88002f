"""Fixtures shared by every test folder (append only)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from loadtests.redis_cluster import RedisClusterServers, redis_cli_binary
from loadtests.redis_server import RedisServer, redis_server_binary
from tests.needs import missing


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    """URL of a real redis-server on a free loopback port, for the whole test session.

    Started empty (``--save '' --appendonly no``); tests keep apart by key
    prefix. Skips when redis-server is not installed (``make test`` installs it);
    fails instead in CI (``CI=true``: tests/needs.py).
    """
    if redis_server_binary() is None:
        missing("redis-server is not installed (make test installs Debian's redis-server)")
    server = RedisServer()
    server.start()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[str]:
    """``redis+cluster://`` URL of a real local Redis Cluster of three primaries (no
    replicas), for the whole test session; tests keep apart by key prefix.
    Skips (fails in CI) like :func:`redis_server` when redis-server or redis-cli is missing."""
    if redis_server_binary() is None or redis_cli_binary() is None:
        missing("redis-server and redis-cli are not installed (make test installs them)")
    servers = RedisClusterServers(primaries=3, replicas=0)
    servers.start()
    try:
        yield servers.url
    finally:
        servers.close()


# Without a GPU the Triton kernels run on Triton's CPU interpreter. triton reads
# TRITON_INTERPRET when triton.language is first imported, and importing
# transformers' models imports it, so it is set here, before any test folder's
# conftest imports them (tests/engine/kernels).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
