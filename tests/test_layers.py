"""Who may import whom: the layers of docs/design.md, checked on the source.

The picture (docs/design.md, "Layers", draws the same), top layer first; each
line says all that the folder may import of bargein outside itself::

    app                    all of the below
    client                 nothing
    session.voice_runtime  the session's other modules, voice, engine, protocol
    session.runtime        conversation, streams, shared modules, engine, protocol
    session.streams        shared modules, engine, protocol (and log never cluster)
    session.conversation   shared modules, engine, protocol; and no asyncio, no redis (pure)
    session.errors, .supervise, .cancel (the shared modules)   engine, protocol
    voice                  nothing
    engine                 nothing (inside: kernels only engine.host, below the model)
    protocol               nothing
    loadtests              anything but tests

Each :class:`Rule` in :data:`RULES` says what one folder must not import and
why. Every ``import`` counts: at module level, inside functions and under
``TYPE_CHECKING`` (tests/import_graph.py), so a lazy import cannot hide an
arrow pointing back.

Rules that today's code still breaks list their edges in
:data:`KNOWN_VIOLATIONS`: the test asserts that the violations found are
exactly that set, so it fails on a new violation and also when one is fixed
without the set being updated (then delete the edge from it).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.import_graph import Import, Module, describe, parse_imports, tree_imports, within_package


@dataclass(frozen=True, slots=True)
class Rule:
    """What the modules under ``importer`` must not import.

    Attributes:
        importer: a package (or module); the rule holds for it and everything under it.
        forbidden: packages or modules (of bargein or not: ``asyncio``) it must
            not import, nor anything under them.
        only: where set, the only parts of ``bargein`` it may import; every
            other ``bargein`` module is forbidden.
        why: the reason, shown when the rule fails.
    """

    importer: str
    why: str
    forbidden: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None

    def breaks(self, imp: Import) -> bool:
        """``imp`` points against this rule."""
        if not within_package(imp.importer, self.importer):
            return False
        if any(within_package(imp.imported, banned) for banned in self.forbidden):
            return True
        return (
            self.only is not None
            and within_package(imp.imported, "bargein")
            and not any(within_package(imp.imported, allowed) for allowed in self.only)
        )


RULES: tuple[Rule, ...] = (
    Rule(
        "bargein.engine",
        forbidden=(
            "bargein.protocol",
            "bargein.session",
            "bargein.app",
            "bargein.voice",
            "bargein.client",
        ),
        why="the engine is a library of its own: it knows no wire format, session, socket or speech, "
        "and is tested by stepping it alone",
    ),
    Rule(
        "bargein.engine.kernels",
        only=("bargein.engine.kernels", "bargein.engine.host"),
        why="kernels are ops over tensors that the model is built on, not the other way: "
        "a kernel importing the model made a cycle (model.linear <-> kernels.cpu_qblock)",
    ),
    Rule(
        "bargein.protocol",
        only=("bargein.protocol",),
        why="the wire contract is sans-I/O and stands alone: any server or client could use it",
    ),
    Rule(
        "bargein.voice",
        only=("bargein.voice",),
        why="the speech models know audio and text only; the session's voice runtime drives them",
    ),
    Rule(
        "bargein.session",
        forbidden=("bargein.app", "bargein.client"),
        why="the session never touches a socket or the web framework: the app hands it a send "
        "coroutine and a SessionObserver",
    ),
    Rule(
        "bargein.session.conversation",
        forbidden=(
            "bargein.session.streams",
            "bargein.session.runtime",
            "bargein.session.voice_runtime",
            "bargein.voice",
            "asyncio",
            "redis",
        ),
        why="the conversation is a pure state machine (handle(event, now) -> actions): time is an "
        "argument, it does no I/O, and its tests need no event loop, Redis or voice",
    ),
    Rule(
        "bargein.session.streams",
        forbidden=(
            "bargein.session.conversation",
            "bargein.session.runtime",
            "bargein.session.voice_runtime",
            "bargein.voice",
        ),
        why="a stream outlives the connection that started it: the token log and the cluster "
        "carry tokens and know no conversation, connection, service or voice",
    ),
    Rule(
        "bargein.session.streams.log",
        forbidden=("bargein.session.streams.cluster",),
        why="the cluster takes leases and streams over through the log; the log only checks a "
        "Fence (session/streams/log/fence.py)",
    ),
    Rule(
        "bargein.session.runtime",
        forbidden=("bargein.session.voice_runtime", "bargein.voice"),
        why="voice is a feature plugged into a connection by its owner; the node's runtime works "
        "the same without it",
    ),
    *(
        Rule(
            shared,
            forbidden=(
                "bargein.session.conversation",
                "bargein.session.streams",
                "bargein.session.runtime",
                "bargein.session.voice_runtime",
                "bargein.voice",
            ),
            why="shared by the session's four folders, so it imports none of them (nor voice)",
        )
        for shared in ("bargein.session.errors", "bargein.session.supervise", "bargein.session.cancel")
    ),
    Rule(
        "bargein.client",
        only=("bargein.client",),
        why="the Python client runs without the server's dependencies (only websockets) and "
        "shares nothing with it but the wire contract of docs/protocol.md",
    ),
    Rule(
        "loadtests",
        forbidden=("tests",),
        why="tests are not a library: a benchmark must run without the test suite's helpers",
    ),
)

# (importer, imported) edges that break a rule today, each to be removed from
# here when its import is.
KNOWN_VIOLATIONS: frozenset[tuple[str, str]] = frozenset()


def violations(imports: Iterable[Import], rules: Iterable[Rule] = RULES) -> dict[tuple[str, str], Rule]:
    """(importer, imported) -> the first rule the edge breaks, for every edge that breaks one."""
    ordered = tuple(rules)
    found: dict[tuple[str, str], Rule] = {}
    for imp in imports:
        for rule in ordered:
            if rule.breaks(imp):
                found.setdefault((imp.importer, imp.imported), rule)
                break
    return found


def test_the_tree_keeps_the_layers() -> None:
    imports = tree_imports()
    assert len({imp.importer for imp in imports}) > 200  # the walk found the packages
    found = violations(imports)
    new = {edge: rule for edge, rule in found.items() if edge not in KNOWN_VIOLATIONS}
    fixed = KNOWN_VIOLATIONS - found.keys()
    message = [f"{a} -> {b}: {rule.why}" for (a, b), rule in sorted(new.items())]
    message += [
        f"{a} -> {b} no longer breaks a rule: delete it from KNOWN_VIOLATIONS" for a, b in sorted(fixed)
    ]
    message += describe(imp for imp in imports if (imp.importer, imp.imported) in new)
    assert not new and not fixed, "\n".join(message)


def test_every_rule_names_a_package_of_the_tree() -> None:
    """A rule about a package that was moved or renamed would pass on nothing."""
    names = {imp.importer for imp in tree_imports()}
    for rule in RULES:
        assert any(within_package(name, rule.importer) for name in names), rule.importer
        for target in (*rule.forbidden, *(rule.only or ())):
            if within_package(target, "bargein"):
                assert any(within_package(name, target) for name in names), target


def test_the_conversation_loads_nothing_it_must_not_import() -> None:
    """The pure rule at run time: importing every module of the conversation,
    and through them whatever they import (package faces included), loads no
    module its rule forbids, in a fresh interpreter."""
    (rule,) = (rule for rule in RULES if rule.importer == "bargein.session.conversation")
    modules = sorted({imp.importer for imp in tree_imports() if within_package(imp.importer, rule.importer)})
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint(*sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert [m for m in loaded if any(within_package(m, banned) for banned in rule.forbidden)] == []


def _imports(module: str, source: str) -> list[Import]:
    return parse_imports(source, Module(name=module, path=Path(f"{module}.py"), is_package=False))


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("bargein.engine.engine", "from bargein.session.runtime import service", "bargein.session.runtime"),
        ("bargein.engine.x", "def f():\n    import bargein.app.server\n", "bargein.app.server"),
        (
            "bargein.engine.x",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bargein.protocol import Format\n",
            "bargein.protocol",
        ),
        (
            "bargein.engine.kernels.k",
            "from bargein.engine.model.linear import cpu_flags",
            "bargein.engine.model.linear",
        ),
        (
            "bargein.protocol.codec",
            "from bargein.engine.request import FinishReason",
            "bargein.engine.request",
        ),
        ("bargein.session.conversation.state", "import asyncio", "asyncio"),
        ("bargein.session.conversation.chat", "from redis.asyncio import Redis", "redis.asyncio"),
        (
            "bargein.session.streams.log.memory",
            "from ..cluster import lease",
            "bargein.session.streams.cluster",
        ),
        (
            "bargein.session.streams.cluster.x",
            "from bargein.session.runtime.delivery import D",
            "bargein.session.runtime.delivery",
        ),
        (
            "bargein.session.runtime.connection",
            "from bargein.session.voice_runtime import channel",
            "bargein.session.voice_runtime",
        ),
        ("bargein.session.voice_runtime.channel", "from bargein.app import server", "bargein.app"),
        (
            "bargein.session.errors",
            "from bargein.session.streams.log import fence",
            "bargein.session.streams.log",
        ),
        ("bargein.client.voice_client", "from bargein.protocol import Format", "bargein.protocol"),
        ("bargein.voice.tts", "from bargein.protocol import events", "bargein.protocol"),
        ("loadtests.chaos", "from tests.redis_server import RedisServer", "tests.redis_server"),
    ],
)
def test_an_arrow_pointing_back_fails(module: str, source: str, expected: str) -> None:
    assert list(violations(_imports(module, source))) == [(module, expected)]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("bargein.app.server", "from bargein.session.runtime.service import Service"),
        ("bargein.app.cli", "from bargein.client.client import RealtimeClient"),
        ("bargein.session.runtime.service", "from bargein.engine.request import SamplingParams"),
        ("bargein.session.conversation.state", "from bargein.engine.request import SamplingParams"),
        ("bargein.session.conversation.state", "from bargein.session.errors import SessionError"),
        ("bargein.session.streams.cluster.lease", "from bargein.session.streams.log.fence import Fence"),
        ("bargein.session.streams.log.redis_streams", "from bargein.session.errors import StreamFenced"),
        ("bargein.session.voice_runtime.channel", "from bargein.session.runtime.delivery import Delivery"),
        ("bargein.engine.kernels.cpu_qblock", "from bargein.engine.host import cpu_flags"),
        ("bargein.client.client", "from bargein.client.pcm import ms_to_bytes"),
        ("bargein.client.client", "import websockets"),
        ("loadtests.saturation", "from loadtests.loadgen import run_load"),
        ("bargein.sessionx.y", "from bargein.app import cli"),  # a prefix is a whole name
    ],
)
def test_arrows_that_point_down_pass(module: str, source: str) -> None:
    assert violations(_imports(module, source)) == {}


def test_each_import_says_where_it_is() -> None:
    source = (
        "import asyncio\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from . import state\nelse:\n    import redis\n"
        "def f():\n    from ..streams import log\n"
        "async def g():\n    import websockets\n"
    )
    package = Module(name="bargein.session.conversation", path=Path("__init__.py"), is_package=True)
    known = {"bargein.session.conversation.state", "bargein.session.streams.log"}
    found = {(imp.imported, imp.lazy, imp.type_checking) for imp in parse_imports(source, package, known)}
    assert found == {
        ("asyncio", False, False),
        ("typing", False, False),
        ("bargein.session.conversation.state", False, True),
        ("redis", False, False),
        ("bargein.session.streams.log", True, False),
        ("websockets", True, False),
    }
