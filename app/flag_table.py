"""The README's table of ``bargein serve`` flags, generated from the configs.

The table sits between two marker lines in README.md and is never edited by
hand: a flag's row is its config field's docstring entry (``app/flags.py``),
so the docstring, ``--help`` and the README say the same thing.
``tests/app/test_flags.py`` fails when the README's table differs from
what this module makes of the code.

    python -m bargein.app.flag_table                    # print the table
    python -m bargein.app.flag_table --write README.md  # put it in the README
    python -m bargein.app.flag_table --check README.md  # exit 1 if it differs
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

from bargein.app.flag_text import markdown, value_text
from bargein.app.flags import Flag
from bargein.app.settings import serve_flags

BEGIN = "<!-- flags: generated from the config dataclasses by `python -m bargein.app.flag_table --write README.md` -->"
END = "<!-- /flags -->"


def markdown_table(flags: Sequence[Flag]) -> str:
    """One Markdown table per config of ``flags``, each under its summary,
    between the :data:`BEGIN` and :data:`END` markers."""
    parts = [BEGIN]
    for group, members in groupby(flags, key=lambda flag: flag.group):
        rows = list(members)
        parts += ["", f"**{group}**: {rows[0].group_doc[:1].lower()}{rows[0].group_doc[1:]}.", ""]
        parts += ["| flag | default | meaning |", "| --- | --- | --- |"]
        parts += [_row(flag) for flag in rows]
    return "\n".join([*parts, "", END])


def _row(flag: Flag) -> str:
    names = " / ".join(f"`{name}`" for name in (flag.name, flag.negation) if name)
    default = value_text(flag.default, is_bytes=flag.path.endswith("_bytes"))
    if isinstance(flag.default, str) and flag.default:
        default = f"`{default}`"
    return f"| {names} | {default} | {markdown(flag.doc)} |"


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text from :data:`BEGIN` to :data:`END` replaced by ``table``.

    Raises:
        ValueError: the README lacks one of the markers.
    """
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN!r} ... {END!r} block")
    return readme[:start] + table + readme[end + len(END) :]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table, or write or check it in a README; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m bargein.app.flag_table", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="README", help="replace the README's table")
    mode.add_argument("--check", metavar="README", help="exit 1 if the README's table is not current")
    args = parser.parse_args(argv)
    table = markdown_table(serve_flags())
    if args.write or args.check:
        path = Path(args.write or args.check)
        readme = path.read_text()
        current = with_table(readme, table)
        if args.check:
            if current != readme:
                print(f"{path}: the flags table is stale; run {parser.prog} --write {path}", file=sys.stderr)
                return 1
            return 0
        path.write_text(current)
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
