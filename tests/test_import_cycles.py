"""No import cycle in bargein: none in the graph read from the source, and
none that some order of first imports trips.

A cycle hidden in a function-local import still ties the two modules
together (each needs the other to be whole), and it breaks as soon as
someone moves the import to the top; so the graph counts every import
(tests/import_graph.py). The fresh-process check covers what the source does
not show (an import by a computed name, a package face that changes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.import_graph import ROOT, describe, find_cycle, find_modules, graph, tree_imports, within_package


def test_the_import_graph_has_no_cycle() -> None:
    imports = tree_imports()
    edges = graph(imports, "bargein")
    assert len(edges) > 100  # the walk found the package
    cycle = find_cycle(edges)
    if cycle is not None:
        steps = set(zip(cycle, cycle[1:]))
        lines = describe(imp for imp in imports if (imp.importer, imp.imported) in steps)
        pytest.fail("import cycle: " + " -> ".join(cycle) + "\n" + "\n".join(lines))


def test_every_import_of_bargein_names_one_of_its_modules() -> None:
    """A module moved or renamed leaves no import behind, in a function
    (which only fails when it runs) or a test file (which fails at collection)."""
    modules = find_modules()
    stale = [
        imp
        for imp in tree_imports()
        if within_package(imp.imported, "bargein") and imp.imported not in modules
    ]
    assert stale == [], "\n".join(describe(stale))


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, None),  # a diamond is no cycle
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"x": {"a"}, "a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": set(), "c": {"d"}, "d": {"c"}}, ["c", "d", "c"]),  # not reachable from the first
    ],
)
def test_find_cycle_names_one_cycle(edges: dict[str, set[str]], expected: list[str] | None) -> None:
    assert find_cycle(edges) == expected


def _import_first(*modules: str) -> tuple[int, dict[str, str]]:
    """``(modules imported, {module: traceback} of those that failed)``, from tests/import_first.py."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.import_first", *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    return int(report["modules"]), {str(k): str(v) for k, v in report["failed"].items()}


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_process() -> None:
    """20-60 s on 2 busy cores: the third-party packages load once, and each
    module is imported first in a child forked from there (tests/import_first.py)."""
    num_modules, failed = _import_first()
    assert num_modules > 100
    assert failed == {}, "\n\n".join(f"{module}:\n{error}" for module, error in failed.items())


def test_a_module_that_fails_to_import_first_is_reported() -> None:
    num_modules, failed = _import_first("bargein.protocol", "bargein.no_such_module")
    assert num_modules == 2
    assert list(failed) == ["bargein.no_such_module"]
    assert "ModuleNotFoundError" in failed["bargein.no_such_module"]
