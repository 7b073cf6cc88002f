"""Whether the grammar library can enforce a client's function schemas (I/O-free, but not pure).

The conversation (session/conversation) is a pure state machine and loads no
grammar library, so the tools of a ``session.update`` or ``response.create``
are checked here, before the conversation sees the event: a JSON schema
keyword llguidance cannot enforce is refused naming the keyword, never
ignored (the HTTP API's rule, app/openai/schema.py).
"""

from __future__ import annotations

from bargein.engine.errors import GrammarError
from bargein.engine.grammar import check_grammar
from bargein.engine.grammar_spec import GrammarSpec
from bargein.protocol import events as pe
from bargein.session.conversation.tool_plan import NO_ARGUMENTS, depth_problem


def tools_problem(event: object) -> str | None:
    """Why the tools of ``event`` (a ``session.update`` or ``response.create``)
    cannot be enforced, or None (also for any other event)."""
    if isinstance(event, pe.SessionUpdate):
        return schema_problem(event.session.tools or (), "session.tools")
    if isinstance(event, pe.ResponseCreate):
        return schema_problem(event.tools or (), "tools")
    return None


def schema_problem(tools: tuple[pe.FunctionTool, ...], path: str) -> str | None:
    """Why one of ``tools``' parameters schemas cannot be enforced: nested too
    deep, or refused by the grammar library (naming the keyword when that
    is why); None when all can be."""
    for i, tool in enumerate(tools):
        parameters = tool.parameters or NO_ARGUMENTS
        where = f"{path}[{i}].parameters"
        if problem := depth_problem(parameters, where):
            return problem
        try:
            check_grammar(GrammarSpec.json_schema(parameters))
        except GrammarError as exc:
            if exc.keyword is not None:
                return (
                    f"'{where}': the JSON schema keyword '{exc.keyword}' is not supported by bargein's "
                    "grammar engine (llguidance); remove it or use another keyword"
                )
            return f"'{where}': the JSON schema cannot be enforced: {exc}"
    return None
