"""What a request's output must match (pure: no grammar library).

The engine compiles a :class:`GrammarSpec` with engine/grammar.py; the
session and the HTTP layer build specs (a tool call is a JSON schema) and
carry them in :class:`~bargein.engine.request.SamplingParams`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any


class GrammarKind(str, enum.Enum):
    """What kind of text a :class:`GrammarSpec` describes."""

    JSON_SCHEMA = "json_schema"  # JSON valid against a schema
    JSON_OBJECT = "json_object"  # any JSON object
    REGEX = "regex"  # text matching a regular expression (llguidance's Rust regex syntax)


@dataclass(frozen=True, slots=True, kw_only=True)
class GrammarSpec:
    """What a request's output must match; hashable, the compile cache's key.

    Attributes:
        kind: see :class:`GrammarKind`.
        source: the JSON schema as JSON text (its ``properties`` order is the
            order the output's keys come in), or the regex; ``""`` for
            ``json_object``.
    """

    kind: GrammarKind
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind is GrammarKind.JSON_OBJECT and self.source:
            raise ValueError(f"{self.source=} must be empty for json_object")
        if self.kind is not GrammarKind.JSON_OBJECT and not self.source:
            raise ValueError(f"{self.source=} must not be empty for {self.kind.value}")

    @classmethod
    def json_schema(cls, schema: Any) -> GrammarSpec:
        """A spec from a schema (a dict, or JSON text), keys in their order."""
        source = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
        return cls(kind=GrammarKind.JSON_SCHEMA, source=source)


# JSON Schema nesting past this costs the grammar compiler's (Rust) stack and serves
# no real schema (OpenAI's strict mode allows 5 levels): refused before compiling.
MAX_SCHEMA_DEPTH = 32


def nested_too_deep(schema: Any) -> bool:
    """Whether ``schema`` (a decoded JSON value) nests objects and arrays deeper
    than :data:`MAX_SCHEMA_DEPTH` levels (breadth first, so no recursion)."""
    level: list[Any] = [schema]
    for _ in range(MAX_SCHEMA_DEPTH):
        level = [
            child
            for value in level
            for child in (value.values() if isinstance(value, dict) else value)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True
