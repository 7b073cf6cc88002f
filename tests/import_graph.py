"""The tree's imports, read from the source with :mod:`ast` (nothing is imported).

Every ``import`` counts wherever it is: at module level, inside a function
(a lazy import still runs, only later) and under ``if TYPE_CHECKING:`` (it
ties the two modules' types together, and a type checker follows it). Each
:class:`Import` says which of those it is, so that a check can tell them
apart.

Module names are the installed ones: the folders map to ``bargein.*`` through
``pyproject.toml``'s ``package-dir``; ``tests`` and ``loadtests`` keep their own
names (they run from the checkout).
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# folders run from the checkout, not installed
CHECKOUT_FOLDERS = ("tests", "loadtests")


@dataclass(frozen=True, slots=True)
class Module:
    """One Python file of the tree.

    Attributes:
        name: its import name (``bargein.session.streams.log`` for that
            folder's ``__init__.py``).
        path: the file.
        is_package: the file is an ``__init__.py`` (its relative imports
            resolve against itself, not its parent).
    """

    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True, slots=True, order=True)
class Import:
    """One imported name, resolved to the module it loads.

    Attributes:
        importer: the importing module's name.
        imported: the module loaded: ``from a.b import c`` is ``a.b.c`` where
            that is a module of the tree, else ``a.b``; a module outside the
            tree keeps the dotted name written (``redis.asyncio``).
        line: the line of the ``import`` statement.
        lazy: the statement is inside a function (it runs when that is called).
        type_checking: the statement is under ``if TYPE_CHECKING:`` (it never
            runs; only a type checker follows it).
    """

    importer: str
    imported: str
    line: int
    lazy: bool
    type_checking: bool


def folders(root: Path = ROOT) -> dict[str, str]:
    """folder (relative to ``root``) -> the package name its files install as.

    Read from ``pyproject.toml`` (``[tool.setuptools.package-dir]``), so a new
    top-level folder is walked as soon as it is installed; ``tests`` and
    ``loadtests`` are added under their own names.
    """
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = {folder: package for package, folder in setuptools["package-dir"].items()}
    mapping.update({folder: folder for folder in CHECKOUT_FOLDERS})
    return mapping


def find_modules(root: Path = ROOT) -> dict[str, Module]:
    """Import name -> :class:`Module` for every ``.py`` file of the tree's folders."""
    modules = {}
    for folder, package in folders(root).items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            name = ".".join([package, *parts])
            modules[name] = Module(name=name, path=path, is_package=is_package)
    return modules


def parse_imports(source: str, module: Module, known: Iterable[str] = ()) -> list[Import]:
    """The imports of ``source``, the code of ``module``.

    Args:
        source: the module's Python source.
        module: whose source it is (its name resolves relative imports).
        known: names of the tree's modules: ``from pkg import name`` is an
            import of ``pkg.name`` when that is one of them.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    visitor = _ImportVisitor(module, frozenset(known))
    visitor.visit(_parse(source, str(module.path)))
    return visitor.found


def _parse(source: str, filename: str) -> ast.Module:
    """``ast.parse``, once more after CPython 3.11's ``SystemError: AST
    constructor recursion depth mismatch``: a ``sys.setrecursionlimit`` in
    another thread while it runs (hypothesis sets the limit around its
    tests) moves the depth it checks; the source is not at fault."""
    try:
        return ast.parse(source, filename=filename)
    except SystemError:
        return ast.parse(source, filename=filename)


@functools.cache
def tree_imports(root: Path = ROOT) -> tuple[Import, ...]:
    """Every import of every module under ``root``'s folders, in module order
    (parsed once per process: the tree does not change under a test run)."""
    modules = find_modules(root)
    found: list[Import] = []
    for module in modules.values():
        found.extend(parse_imports(module.path.read_text(), module, modules))
    return tuple(found)


def graph(imports: Iterable[Import], within: str) -> dict[str, set[str]]:
    """importer -> the modules it imports, both under the package ``within``.

    Only the named module is an edge: ``import a.b.c`` runs ``a`` and ``a.b``
    first too, but a package's face importing its own modules is the usual
    shape and would make every package a cycle with its modules.
    """
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if within_package(imp.importer, within):
            edges.setdefault(imp.importer, set())
            if within_package(imp.imported, within) and imp.imported != imp.importer:
                edges[imp.importer].add(imp.imported)
    return edges


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of ``edges`` as ``[a, b, ..., a]``, or None when there is none.

    Iterative depth-first search (the graph has hundreds of modules; no
    recursion limit to meet), visiting modules and their imports in sorted
    order so that the cycle reported is the same on every run.
    """
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        path = [start]
        on_path = {start}
        pending = [iter(sorted(edges.get(start, ())))]
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                pending.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                pending.append(iter(sorted(edges.get(nxt, ()))))
    return None


def within_package(name: str, package: str) -> bool:
    """``name`` is ``package`` or one of its modules (a prefix is a whole name:
    ``bargein.sessionx`` is not in ``bargein.session``)."""
    return name == package or name.startswith(package + ".")


class _ImportVisitor(ast.NodeVisitor):
    """Collects :class:`Import` records, knowing the function and ``TYPE_CHECKING`` depth."""

    def __init__(self, module: Module, known: frozenset[str]) -> None:
        self.module = module
        self.known = known
        self.found: list[Import] = []
        self._functions = 0
        self._type_checking = 0

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._type_checking += 1
            for child in node.body:
                self.visit(child)
            self._type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node)
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            self._add(submodule if submodule in self.known else base, node)

    def _absolute(self, node: ast.ImportFrom) -> str:
        """The module ``node`` imports from, relative imports resolved."""
        if not node.level:
            return node.module or ""
        package = self.module.name if self.module.is_package else self.module.name.rpartition(".")[0]
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - (node.level - 1)])
        return f"{base}.{node.module}" if node.module else base

    def _add(self, imported: str, node: ast.stmt) -> None:
        self.found.append(
            Import(
                importer=self.module.name,
                imported=imported,
                line=node.lineno,
                lazy=self._functions > 0,
                type_checking=self._type_checking > 0,
            )
        )


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def describe(imports: Iterable[Import]) -> Iterator[str]:
    """One line per import statement, for a failure message: ``importer:line -> imported (lazy)``."""
    for imp in sorted(set(imports)):
        kind = " (TYPE_CHECKING)" if imp.type_checking else " (in a function)" if imp.lazy else ""
        yield f"{imp.importer}:{imp.line} -> {imp.imported}{kind}"
