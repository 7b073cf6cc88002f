"""Command-line flags derived from frozen config dataclasses (after vLLM's ``EngineArgs``).

Every field of a config is one flag, and every part of the flag comes from
the field: the name is the field's with dashes (``max_num_seqs`` ->
``--max-num-seqs``), the environment variable ``BARGEIN_`` and that name in
capitals (``BARGEIN_MAX_NUM_SEQS``), the parser the field's type, the
default the field's default, and the help the field's entry in its class
docstring's ``Attributes:`` section. A field that holds a config (as
``EngineConfig.scheduler`` does) is a group of flags. What a flag changes
(another name, the command's own default, a unit, a ``--no-`` alias) is a
:class:`FlagRule`, kept in one table beside the command (``app/settings.py``).

The environment gives a flag's default and an explicit flag wins. A boolean
flag works as a switch (``--log-prompts``) and also takes a value
(``--log-prompts false``), like its environment variable.
"""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from bargein.app.flag_text import attribute_docs, plain, resolve, summary, value_text

ENV_PREFIX = "BARGEIN_"
FIELD_DEFAULT: Any = object()  # FlagRule.default: the field's own

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class FlagRule:
    """How one field's flag departs from what the field says.

    Attributes:
        name: the flag when it is not the field's name (``--kv-cache-bytes``
            for ``memory_bytes``).
        default: the command's default, in the flag's unit, when it is not
            the field's (``bargein serve`` turns on targets a library
            leaves off).
        to_field: the flag's value to the field's (a unit, ``""`` as unset);
            ``None``: as parsed.
        negation: a ``--no-...`` flag that sets the field false.
    """

    name: str | None = None
    default: Any = FIELD_DEFAULT
    to_field: Callable[[Any], Any] | None = None
    negation: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Flag:
    """One command-line flag and the config field it sets.

    Attributes:
        name: ``--max-num-seqs``.
        path: the field under the root config, ``engine.scheduler.max_num_seqs``.
        group: the config holding it, ``engine.scheduler`` (``""``: the root).
        group_doc: that config's one-line summary.
        env: ``BARGEIN_MAX_NUM_SEQS``.
        kind: argparse's ``type``: ``int``, ``float``, ``str`` or :func:`parse_bool`.
        default: before the environment, in the flag's unit (a list flag's
            is its comma-separated text).
        doc: the field's docstring entry in reST, its sibling fields named
            by their flags.
        to_field: the parsed value to the field's.
        negation: the ``--no-...`` alias, if any.
    """

    name: str
    path: str
    group: str
    group_doc: str
    env: str
    kind: Callable[[str], Any]
    default: Any
    doc: str
    to_field: Callable[[Any], Any]
    negation: str | None = None

    @property
    def dest(self) -> str:
        """The attribute of the parsed namespace: ``max_num_seqs``."""
        return self.name[2:].replace("-", "_")

    def help(self) -> str:
        """The ``--help`` text: the doc, the default and the variable."""
        default = value_text(self.default, is_bytes=self.path.endswith("_bytes"))
        return f"{plain(self.doc).rstrip('.')} (default: {default}; env {self.env})".replace("%", "%%")


def parse_bool(text: str | bool) -> bool:
    """A boolean flag or environment value: ``1 true yes on`` or ``0 false no off``
    and the empty string, in any case.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse names the flag).
    """
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean")


def comma_list(text: str | None) -> tuple[str, ...]:
    """``" a, b ,"`` -> ``("a", "b")``: a list flag's items, blanks dropped."""
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def _same(value: Any) -> Any:
    return value


def derive_flags(
    root: type, rules: Mapping[str, FlagRule], unflagged: frozenset[str] = frozenset()
) -> tuple[Flag, ...]:
    """Every flag of ``root``'s fields, nested configs included, in field order.

    Args:
        root: a dataclass whose fields are configs or values.
        rules: field path -> how its flag departs from the field.
        unflagged: field paths that are no flag.

    Raises:
        ValueError: a field has no docstring entry or a type no flag parses,
            or a rule names no field.
    """
    flags = tuple(_walk(root, "", rules, unflagged))
    known = {flag.path for flag in flags} | unflagged
    if stray := sorted(set(rules) - known | unflagged - set(_leaf_paths(root, ""))):
        raise ValueError(f"flag rules name no config field: {', '.join(stray)}")
    return flags


def _leaf_paths(cls: type, prefix: str) -> Iterator[str]:
    """Every value field of ``cls`` under ``prefix``, nested configs opened."""
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if _is_config(hints[field.name]):
            yield from _leaf_paths(hints[field.name], f"{prefix}{field.name}.")
        else:
            yield prefix + field.name


def _walk(cls: type, prefix: str, rules: Mapping[str, FlagRule], unflagged: frozenset[str]) -> Iterator[Flag]:
    """The flags of ``cls`` (its fields under ``prefix``), depth first."""
    hints = get_type_hints(cls)
    docs = attribute_docs(cls)
    names = {
        f.name: rules.get(prefix + f.name, FlagRule()).name or _flag_name(f.name)
        for f in dataclasses.fields(cls)
        if not _is_config(hints[f.name]) and prefix + f.name not in unflagged
    }
    for field in dataclasses.fields(cls):
        path = prefix + field.name
        if _is_config(hints[field.name]):
            yield from _walk(hints[field.name], path + ".", rules, unflagged)
        elif field.name in names:
            if field.name not in docs:
                raise ValueError(
                    f"{cls.__name__}.{field.name} has no entry in its docstring's Attributes: "
                    "section (it is the flag's help)"
                )
            # the doc names its sibling fields by their flags
            doc = resolve(docs[field.name], names)
            yield _flag(field, hints[field.name], path, names[field.name], doc, summary(cls), rules)


def _flag(
    field: dataclasses.Field[Any],
    hint: Any,
    path: str,
    name: str,
    doc: str,
    group_doc: str,
    rules: Mapping[str, FlagRule],
) -> Flag:
    """The flag ``name`` of ``field`` (its type ``hint``) at ``path``."""
    rule = rules.get(path, FlagRule())
    kind, is_list = _parser(hint, path)
    default = _field_default(field) if rule.default is FIELD_DEFAULT else rule.default
    return Flag(
        name=name,
        path=path,
        group=path.rpartition(".")[0],
        group_doc=group_doc,
        env=ENV_PREFIX + name[2:].replace("-", "_").upper(),
        kind=kind,
        default=",".join(default) if is_list else default,
        doc=doc,
        to_field=rule.to_field or (comma_list if is_list else _same),
        negation=rule.negation,
    )


def _is_config(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def _field_default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _parser(hint: Any, path: str) -> tuple[Callable[[str], Any], bool]:
    """argparse's ``type`` for a field's type, and whether it is a list
    (``tuple[str, ...]``: a comma-separated flag)."""
    if get_origin(hint) in (Union, types.UnionType):  # X | None: X, unset by default
        hint = next(arg for arg in get_args(hint) if arg is not type(None))
    if get_origin(hint) is Literal:
        hint = type(get_args(hint)[0])
    if hint is bool:
        return parse_bool, False
    if hint in (int, float, str):
        return hint, False
    if get_origin(hint) is tuple and get_args(hint) == (str, ...):
        return str, True
    raise ValueError(f"{path}: no flag parses a {hint!r}")


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped without breaking a flag's name at its dashes."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def add_flags(parser: argparse.ArgumentParser, flags: tuple[Flag, ...], env: Mapping[str, str]) -> None:
    """Declare ``flags`` on ``parser``, one argument group per config, each
    defaulting to its environment variable (a string, parsed like the flag)."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in flags:
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group or None, flag.group_doc)
        group = groups[flag.group]
        switch: dict[str, Any] = {"nargs": "?", "const": True} if flag.kind is parse_bool else {}
        group.add_argument(
            flag.name, type=flag.kind, default=env.get(flag.env, flag.default), help=flag.help(), **switch
        )
        if flag.negation:
            group.add_argument(
                flag.negation, dest=flag.dest, action="store_false", help=f"as {flag.name} false"
            )


def field_values(flags: tuple[Flag, ...], args: argparse.Namespace) -> dict[str, Any]:
    """Field path -> value, from the parsed flags."""
    return {flag.path: flag.to_field(getattr(args, flag.dest)) for flag in flags}


def build(cls: type[T], values: Mapping[str, Any], prefix: str = "") -> T:
    """An instance of the config ``cls`` with the ``values`` under ``prefix``
    (field path -> value), its nested configs built the same way, in field
    order; fields without a value keep their defaults.

    Raises:
        ValueError: a config's own check refuses a value (its message names it).
    """
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = prefix + field.name
        if _is_config(hints[field.name]):
            kwargs[field.name] = build(hints[field.name], values, path + ".")
        elif path in values:
            kwargs[field.name] = values[path]
    return cls(**kwargs)
