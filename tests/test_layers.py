"""The dependency arrows of the design: app -> session -> engine and voice, all but
voice may use protocol.

Inside the session layer the token log is below the cluster: the cluster
takes leases and takes streams over through the log, and the log knows
nothing of either (it only checks a :class:`~bargein.session.streams.log.fence.Fence`).

The rules are checked on the source (every ``import``, at any depth, also the
lazy ones inside functions), so a violation fails here before anything runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("app", "engine", "session", "protocol", "voice")

# module prefix -> module prefixes it must never import
FORBIDDEN: Mapping[str, tuple[str, ...]] = {
    "bargein.protocol": ("bargein.engine", "bargein.session", "bargein.app"),
    "bargein.engine": ("bargein.session", "bargein.app"),
    "bargein.session": ("bargein.app",),
    # voice knows audio and text only: the session drives it
    "bargein.voice": ("bargein.engine", "bargein.session", "bargein.app", "bargein.protocol"),
    "bargein.session.streams.log": (
        "bargein.session.streams.cluster",
        "bargein.session.runtime.service",
        "bargein.session.runtime.connection",
        "bargein.session.runtime.delivery",
        "bargein.session.conversation.state",
    ),
}


def module_name(path: Path, root: Path) -> str:
    """``session/streams/log/memory.py`` -> ``bargein.session.streams.log.memory``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["bargein", *parts])


def imported(source: str, module: str) -> Iterator[str]:
    """Every module name that ``source`` (the code of ``module``) imports."""
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                yield f"{base}.{node.module}" if node.module else base
            elif node.module:
                yield node.module


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(sources: Mapping[str, str]) -> list[str]:
    """``"importer -> imported"`` for each import that points against the arrows.

    Args:
        sources: module name -> its source code.
    """
    found = []
    for module, source in sorted(sources.items()):
        for layer, banned in FORBIDDEN.items():
            if not _within(module, layer):
                continue
            for name in imported(source, module):
                if any(_within(name, b) for b in banned):
                    found.append(f"{module} -> {name}")
    return found


def tree_sources(root: Path) -> dict[str, str]:
    """module name -> source of every module under the project's folders."""
    return {
        module_name(path, root): path.read_text()
        for folder in FOLDERS
        for path in (root / folder).rglob("*.py")
    }


def test_the_tree_keeps_the_arrows() -> None:
    sources = tree_sources(ROOT)
    assert len(sources) > 50  # the walk found the packages
    assert violations(sources) == []


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        (
            "bargein.engine.engine",
            "from bargein.session.runtime.service import Service",
            "bargein.session.runtime.service",
        ),
        ("bargein.engine.x", "def f():\n    import bargein.app.server\n", "bargein.app.server"),
        ("bargein.session.runtime.service", "from bargein.app import cli", "bargein.app"),
        (
            "bargein.protocol.codec",
            "from bargein.engine.request import FinishReason",
            "bargein.engine.request",
        ),
        (
            "bargein.session.streams.log.memory",
            "from ..cluster import lease",
            "bargein.session.streams.cluster",
        ),
        (
            "bargein.session.streams.log.redis_tail",
            "from bargein.session.streams.cluster.lease import Leases",
            "bargein.session.streams.cluster.lease",
        ),
    ],
)
def test_an_arrow_pointing_back_fails(module: str, source: str, expected: str) -> None:
    assert violations({module: source}) == [f"{module} -> {expected}"]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("bargein.app.server", "from bargein.session.runtime.service import Service"),
        ("bargein.session.runtime.service", "from bargein.engine.request import SamplingParams"),
        ("bargein.engine.engine", "import bargein.protocol"),
        ("bargein.session.streams.cluster.lease", "from bargein.session.streams.log.fence import Fence"),
        ("bargein.session.streams.log.redis_streams", "from bargein.session.errors import StreamFenced"),
        ("bargein.sessionx.y", "from bargein.app import cli"),  # a prefix is a whole name
    ],
)
def test_arrows_that_point_down_pass(module: str, source: str) -> None:
    assert violations({module: source}) == []
