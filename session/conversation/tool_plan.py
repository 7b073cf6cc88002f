"""Tools on bargein's own protocol: the session's functions, and what one
response does with them (pure).

:func:`checked_tools` turns the wire's tools (``session.update``,
``response.create``) into :class:`~bargein.session.conversation.tools.Tool`
values; whether the grammar library can enforce their schemas is checked
before the conversation sees them (session/runtime/tool_check.py: this
package loads no grammar library). :func:`plan_tools` decides, for one
response, how its answer is read (``tool_mode``), the system text that lists
the functions, and the grammar of a forced call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from bargein.engine.grammar_spec import MAX_SCHEMA_DEPTH, GrammarSpec, nested_too_deep
from bargein.protocol import events as pe
from bargein.session.conversation.tools import Tool, tool_call_schema, tools_prompt

NO_ARGUMENTS = '{"type":"object","properties":{}}'


def depth_problem(parameters: str, where: str) -> str | None:
    """Why a parameters schema (JSON text) is refused before any compile: nested
    deeper than :data:`MAX_SCHEMA_DEPTH`; None when it is not."""
    if nested_too_deep(json.loads(parameters)):
        return f"'{where}': the JSON schema is nested deeper than {MAX_SCHEMA_DEPTH} levels"
    return None


def checked_tools(tools: Sequence[pe.FunctionTool], path: str) -> tuple[Tool, ...]:
    """The functions of ``tools`` (names and object schemas already checked by
    the protocol's rules; what the grammar library can enforce, by
    session/runtime/tool_check.py before the conversation sees them).

    Raises:
        ValueError: a schema nested deeper than :data:`MAX_SCHEMA_DEPTH`.
    """
    out = []
    for i, tool in enumerate(tools):
        parameters = tool.parameters or NO_ARGUMENTS
        if problem := depth_problem(parameters, f"{path}[{i}].parameters"):
            raise ValueError(problem)
        out.append(Tool(name=tool.name, description=tool.description or "", parameters=parameters))
    return tuple(out)


def choice_problem(tools: Sequence[Tool], choice: pe.ToolChoice, path: str) -> str | None:
    """Why ``choice`` cannot apply to ``tools`` (a named function that is not
    among them; ``required`` with none), or None."""
    if isinstance(choice, pe.NamedToolChoice) and choice.name not in {t.name for t in tools}:
        return f"'{path}tool_choice' names {choice.name!r}, which is not among the tools in force"
    if choice == "required" and not tools:
        return f"'{path}tool_choice' is 'required' but there are no tools"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPlan:
    """What one response does with the tools in force.

    Attributes:
        mode: how its answer is read: ``forced`` (a grammar makes it calls),
            ``auto`` (calls or text, the model's choice).
        prompt: the system text that lists the functions and the call format.
        grammar: the forced call's grammar (None for ``auto``).
    """

    mode: pe.ToolMode
    prompt: str
    grammar: GrammarSpec | None


def plan_tools(tools: Sequence[Tool], choice: pe.ToolChoice, *, parallel: bool) -> ToolPlan | None:
    """The plan of a response with ``tools`` in force and ``choice``; None when
    the model is not to call (no tools, or ``none``: the prompt does not list them)."""
    if not tools or choice == "none":
        return None
    if choice == "auto":
        return ToolPlan(mode="auto", prompt=tools_prompt(tools), grammar=None)
    called = [t for t in tools if t.name == choice.name] if isinstance(choice, pe.NamedToolChoice) else tools
    return ToolPlan(
        mode="forced", prompt=tools_prompt(tools), grammar=tool_call_schema(called, parallel=parallel)
    )
