"""The text of a flag, read from its config field's docstring entry.

A config dataclass documents each field in its docstring's ``Attributes:``
section (Google style); that entry is the flag's help in ``bargein serve
--help`` and its row in the README. The entries are written in the
docstrings' reST markup (````code````, ``:attr:`name```), which this module
turns into plain text for the terminal or into Markdown for the README.
Pure text: no argparse, no configs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

# ``name: text`` one level into the section; continuation lines sit deeper.
_ENTRY = re.compile(r"^    (\w+): (.*)$")
_CONTINUATION = re.compile(r"^        +(\S.*)$")
_LITERAL = re.compile(r"``(.+?)``")
_ROLE = re.compile(r":\w+:`(~?)([^`]+)`")
# Python's values read as the words an operator types.
_WORDS = {"None": "unset", "True": "true", "False": "false"}
_UNITS = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def attribute_docs(cls: type) -> dict[str, str]:
    """Each field's entry in ``cls``'s ``Attributes:`` docstring section.

    Returns:
        field name -> its text, continuation lines joined by single spaces.
    """
    docs: dict[str, str] = {}
    name = None
    lines = (inspect.getdoc(cls) or "").splitlines()
    start = lines.index("Attributes:") + 1 if "Attributes:" in lines else len(lines)
    for line in lines[start:]:
        if entry := _ENTRY.match(line):
            name = entry[1]
            docs[name] = entry[2].strip()
        elif name is not None and (more := _CONTINUATION.match(line)):
            docs[name] += " " + more[1].strip()
        elif line.strip() or name is None:
            break  # the section ended (a blank line inside it is allowed)
    return docs


def summary(cls: type) -> str:
    """The first line of ``cls``'s docstring, without its final period."""
    return (inspect.getdoc(cls) or "").partition("\n")[0].rstrip(".")


def resolve(doc: str, names: Mapping[str, str]) -> str:
    """``doc`` with each literal ````field```` that ``names`` maps renamed
    (a field's flag) and ````None````, ````True````, ````False```` as the words
    an operator types (``unset``, ``true``, ``false``), without markup."""

    def literal(match: re.Match[str]) -> str:
        text = match[1]
        if text in _WORDS:
            return _WORDS[text]
        return f"``{names.get(text, text)}``"

    return _LITERAL.sub(literal, doc)


def plain(doc: str) -> str:
    """``doc`` without reST markup, for a terminal."""
    return _LITERAL.sub(r"\1", _ROLE.sub(_role_target, doc))


def markdown(doc: str) -> str:
    """``doc`` in Markdown, safe inside a table cell (``|`` escaped)."""
    text = _LITERAL.sub(r"`\1`", _ROLE.sub(lambda m: f"`{_role_target(m)}`", doc))
    return text.replace("|", r"\|")


def _role_target(match: re.Match[str]) -> str:
    """``:data:`~a.b.NAME``` -> ``NAME``; without ``~`` the whole target."""
    tilde, target = match[1], match[2]
    return target.rsplit(".", 1)[-1] if tilde else target


def value_text(value: object, *, is_bytes: bool = False) -> str:
    """A default as an operator reads it: ``unset`` for nothing, booleans in
    lower case, floats without a trailing ``.0``, lists comma-separated, and a
    byte count with its binary unit beside it (``1048576 (1 MiB)``)."""
    if value is None or value in ("", ()):
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    if is_bytes and isinstance(value, int):
        for size, unit in _UNITS:
            if value >= size and value % size == 0:
                return f"{value} ({value // size} {unit})"
    return str(value)
