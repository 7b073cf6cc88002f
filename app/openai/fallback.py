"""OpenAI-style answers for what no ``/v1`` route serves, and for a server fault.

Without these, a request under ``/v1`` that no route takes falls through to
the static files mount (the browser page), which answers plain-text 404s and
405s with its own ``Allow: GET, HEAD``. OpenAI's clients expect their error
object (``{"error": {"message", "type", "param", "code"}}``) for every
answer of the API, so :func:`fallback_routes` adds, after the API's routes:

- a path that names a route, with a method it does not take: 405 with the
  route's ``Allow`` header (``code: "method_not_allowed"``);
- ``/v1/realtime`` over plain HTTP: 426 with ``Upgrade: websocket``;
- any other ``/v1`` path: 404 (``code: "not_found"``).

:func:`internal_error` answers an unexpected exception (a bug) with a 500 in
the same shape under ``/v1``; the exception still reaches uvicorn's log.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Match, Route, WebSocketRoute
from starlette.types import Receive, Scope, Send

from bargein.app.openai.schema import error_body

API_PREFIX = "/v1"


def fallback_routes(routes: Sequence[BaseRoute]) -> list[Route]:
    """Catch-all routes for ``/v1`` and everything under it, any method; put them
    after ``routes`` (the API's own, which they consult for 405s) and before any mount."""
    not_routed = NotRouted(routes)
    return [Route(API_PREFIX, not_routed), Route(API_PREFIX + "/{rest:path}", not_routed)]


class NotRouted:
    """The ASGI app of the catch-all routes: 404, 405 or 426 (an ASGI app, not
    a function, so that starlette lets it take every method)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        self.http_routes = [r for r in routes if isinstance(r, Route) and r.path.startswith(API_PREFIX)]
        self.ws_paths = {r.path for r in routes if isinstance(r, WebSocketRoute)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        status, code, message, headers = self.answer(request)
        request.app.state.bargein.observer.http_error(status, code)
        response = JSONResponse(error_body(message, code=code), status_code=status, headers=headers)
        await response(scope, receive, send)

    def answer(self, request: Request) -> tuple[int, str, str, dict[str, str]]:
        """``(status, code, message, headers)`` for a request no API route took."""
        path = request.url.path
        allowed = sorted(
            {
                method
                for route in self.http_routes
                if route.matches(request.scope)[0] is Match.PARTIAL
                for method in route.methods or ()
            }
        )
        if allowed:
            return (
                405,
                "method_not_allowed",
                f"{request.method[:20]} is not allowed on {path}; allowed: {', '.join(allowed)}",
                {"Allow": ", ".join(allowed)},
            )
        if path in self.ws_paths:
            return (
                426,
                "upgrade_required",
                f"{path} is a WebSocket endpoint: upgrade the connection",
                {"Upgrade": "websocket"},
            )
        return 404, "not_found", f"no route {request.method[:20]} {path[:200]}", {}


async def internal_error(request: Request, exc: Exception) -> Response:
    """A 500 for an unexpected exception: OpenAI's error body under ``/v1``."""
    if not request.url.path.startswith(API_PREFIX):
        return PlainTextResponse("Internal Server Error", status_code=500)
    body = error_body("the server failed to answer this request", type_="server_error", code="internal_error")
    return JSONResponse(body, status_code=500)
