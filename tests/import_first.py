"""Run as ``python -m tests.import_first [MODULE ...]``: import each module first,
in a process of its own, and report the ones that fail.

A cycle that only some import orders trip (``a`` imports ``b`` imports ``a``
at module level: fine when ``a`` comes first, an ImportError of a
half-initialized module when ``b`` does) shows only when that module is the
first of bargein that a process imports. A fresh interpreter per module would
import torch a hundred times over; instead this process imports the
third-party packages that bargein imports (and nothing of bargein), then forks
one child per module, which imports it and exits. Without MODULE arguments
the modules are every one of bargein's but ``bargein.__main__`` (importing it
runs the CLI); with them, those, and nothing is imported before the fork.

Prints one JSON object: ``{"modules": N, "failed": {module: traceback}}``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import traceback
from collections.abc import Sequence

from tests.import_graph import Import, find_modules, tree_imports, within_package

PACKAGE = "bargein"
# forked children at a time
PARALLEL = os.cpu_count() or 1
# the most of a child's traceback sent back (a pipe holds 64 KiB before the child would block)
MAX_TRACEBACK = 8000


def third_party(imports: Sequence[Import]) -> list[str]:
    """The modules outside bargein that its modules import, sorted."""
    return sorted(
        {
            imp.imported
            for imp in imports
            if within_package(imp.importer, PACKAGE) and not within_package(imp.imported, PACKAGE)
        }
    )


def own_modules() -> list[str]:
    """bargein's modules, but ``bargein.__main__``, sorted."""
    return sorted(
        name for name in find_modules() if within_package(name, PACKAGE) and name != f"{PACKAGE}.__main__"
    )


def preload(names: Sequence[str]) -> None:
    """Import ``names``, skipping one that does not import here (an optional
    package): a bargein module that needs it fails in its child all the same."""
    for name in names:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def import_in_child(module: str) -> tuple[int, int]:
    """Fork a child that imports ``module`` and exits: ``(pid, read end of its error pipe)``.

    The child exits with status 1, its traceback written to the pipe, when the import raises.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: import, report, leave without running the parent's cleanup
        os.close(read)
        status = 0
        try:
            importlib.import_module(module)
        except BaseException:
            os.write(write, traceback.format_exc()[-MAX_TRACEBACK:].encode())
            status = 1
        os._exit(status)
    os.close(write)
    return pid, read


def import_each_first(modules: Sequence[str]) -> dict[str, str]:
    """module -> its traceback, for each of ``modules`` that fails to import in its child."""
    failed: dict[str, str] = {}
    running: dict[int, tuple[str, int]] = {}
    pending = list(reversed(modules))
    while pending or running:
        while pending and len(running) < PARALLEL:
            module = pending.pop()
            pid, read = import_in_child(module)
            running[pid] = (module, read)
        pid, status = os.wait()
        module, read = running.pop(pid)
        with os.fdopen(read, "rb") as pipe:
            error = pipe.read().decode(errors="replace")
        if status != 0:
            failed[module] = error or f"exit status {status}"
    return failed


def main(argv: Sequence[str]) -> int:
    """Import the modules of ``argv`` (or all of bargein's) each first; print the JSON report."""
    modules = list(argv)
    if not modules:
        modules = own_modules()
        preload(third_party(tree_imports()))
    loaded = sorted(name for name in sys.modules if within_package(name, PACKAGE))
    assert not loaded, f"imported before the fork: {loaded}"
    print(json.dumps({"modules": len(modules), "failed": import_each_first(modules)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
