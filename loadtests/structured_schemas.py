"""JSON schemas for structured-output checks: a hypothesis strategy (shared by
tests/app/test_openai_structured.py and loadtests/structured_bench.py).

The schemas cover what issue 40 lists: nested objects, arrays, enums,
``anyOf``, ``$ref`` (through ``$defs``), ``pattern``, numbers with bounds,
required and optional keys. Every string, array and number is bounded
(``maxLength``, ``maxItems``, ``minimum``/``maximum``, a number's
fraction by ``multipleOf``), so a valid answer
fits in a few hundred tokens and a model cannot run to ``max_tokens``
inside a value; objects are closed (``additionalProperties: false``), as
OpenAI's strict mode requires.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]

KEYS = st.sampled_from(["id", "name", "city", "count", "tags", "kind", "price", "ok", "when", "note"])
WORDS = st.sampled_from(["red", "green", "blue", "north", "south", "yes", "no", "small", "large"])
PATTERNS = st.sampled_from([r"^[a-z]{2,6}$", r"^[A-Z]{3}-[0-9]{2}$", r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"])


def _integer() -> st.SearchStrategy[Schema]:
    return st.integers(-500, 500).flatmap(
        lambda low: st.integers(low, low + 1000).map(
            lambda high: {"type": "integer", "minimum": low, "maximum": high}
        )
    )


def _number() -> st.SearchStrategy[Schema]:
    # multipleOf bounds the fraction's digits: without it a model may write 1.1111... to max_tokens
    return st.integers(-100, 100).map(
        lambda low: {"type": "number", "minimum": low, "maximum": low + 50, "multipleOf": 0.25}
    )


LEAVES: st.SearchStrategy[Schema] = st.one_of(
    st.just({"type": "boolean"}),
    _integer(),
    _number(),
    st.lists(WORDS, min_size=1, max_size=4, unique=True).map(lambda words: {"enum": words}),
    PATTERNS.map(lambda p: {"type": "string", "pattern": p}),
    st.integers(1, 12).map(lambda n: {"type": "string", "maxLength": n}),
)


def _object(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    def close(properties: dict[str, Schema]) -> st.SearchStrategy[Schema]:
        keys = sorted(properties)
        return st.lists(st.sampled_from(keys), unique=True).map(
            lambda required: {
                "type": "object",
                "properties": properties,
                "required": sorted(required),
                "additionalProperties": False,
            }
        )

    return st.dictionaries(KEYS, children, min_size=1, max_size=3).flatmap(close)


def _nested(children: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    return st.one_of(
        _object(children),
        children.map(lambda item: {"type": "array", "items": item, "maxItems": 2}),
        st.lists(children, min_size=2, max_size=2).map(lambda options: {"anyOf": options}),
    )


def schemas() -> st.SearchStrategy[Schema]:
    """Top-level object schemas, nested up to three levels, some with a ``$ref``."""
    values = st.recursive(LEAVES, _nested, max_leaves=5)
    return st.tuples(_object(values), st.booleans()).map(lambda pair: _with_ref(*pair))


def _with_ref(schema: Schema, use_ref: bool) -> Schema:
    """Move the first property's schema to ``$defs`` and refer to it."""
    if not use_ref:
        return schema
    properties = dict(schema["properties"])
    first = next(iter(properties))
    defs = {"part": properties[first]}
    properties[first] = {"$ref": "#/$defs/part"}
    return {**schema, "properties": properties, "$defs": defs}


def prompt_for(schema: Schema) -> list[dict[str, str]]:
    """A chat asking for an instance (the schema itself is enforced, not prompted)."""
    keys = ", ".join(schema["properties"])
    return [{"role": "user", "content": f"Give me a JSON object with the keys {keys}."}]
