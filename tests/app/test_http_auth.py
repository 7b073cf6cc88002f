"""With API keys, no spelling of a protected route answers without a key.

Requests go out as raw bytes over a socket (httpx would normalise ``/./``
and some slashes before sending): trailing and repeated slashes, case,
percent escapes, dot segments, ``HEAD``/``OPTIONS`` and keys in the query
string. Open without a key: ``/healthz``, ``/readyz`` and the static page;
``/metrics`` only with ``--public-metrics``. A refused request reaches
nothing: no session, no admission state, no engine request.

The servers here run on the session's engine loop (no second model load).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bargein.app.auth import principal_for
from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer

pytestmark = pytest.mark.slow

KEY = "k-variant"
BEARER = {"Authorization": f"Bearer {KEY}"}


def _keyed(live_server: LiveServer, *, public_metrics: bool) -> EmbeddedServer:
    return EmbeddedServer(
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=8, max_frame_bytes=MAX_FRAME_BYTES),
            server=ServerConfig(
                port=0,
                debug_endpoints=True,
                log_level="warning",
                api_keys=KEY,
                **({"public_metrics": True} if public_metrics else {}),
            ),
        ),
        runner=live_server.state.runner,
    )


@pytest.fixture(scope="module")
def keyed(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    server = _keyed(live_server, public_metrics=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True, slots=True)
class Raw:
    """A response read off the socket."""

    status: int
    headers: dict[str, str]
    body: bytes


def raw_request(
    server: EmbeddedServer, method: str, target: str, headers: dict[str, str] | None = None
) -> Raw:
    """Send ``method target`` exactly as written; read the whole response."""
    lines = [
        f"{method} {target} HTTP/1.1",
        f"Host: {server.host}:{server.port}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    with socket.create_connection((server.host, server.port), timeout=30) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = dict(line.split(": ", 1) for line in header_lines)
    return Raw(int(status_line.split()[1]), {k.lower(): v for k, v in fields.items()}, body)


PROTECTED = [
    "/v1/models",
    "/v1/models/",
    "//v1/models",
    "/v1//models",
    "///v1///models",
    "/V1/models",
    "/v1/MODELS",
    "/%76%31/models",
    "/v1%2Fmodels",
    "/v1/./models",
    "/./v1/models",
    "/v1/x/../models",
    "/v1/models?api_key=" + KEY,
    "/v1/models?key=" + KEY,
    "/v1",
    "/v1/",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/streams/s/events",
    "/v1/realtime",
    "/debug/engine",
    "/DEBUG/engine/",
    "//debug//engine",
    "/metrics",
    "/metrics/",
    "//metrics",
    "/METRICS",
    "/metrics?x=1",
    "/%6Detrics",
]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST"])
def test_no_spelling_of_a_protected_route_answers_without_a_key(keyed: EmbeddedServer, method: str) -> None:
    for target in PROTECTED:
        response = raw_request(keyed, method, target, {"Content-Length": "0"})
        assert response.status == 401, (method, target, response.status, response.body[:200])
        assert response.headers["www-authenticate"] == "Bearer"
        if method != "HEAD":
            error = json.loads(response.body)["error"]
            assert error["code"] == "missing_api_key", (target, error)


def test_a_key_in_the_query_string_is_refused_with_a_hint(keyed: EmbeddedServer) -> None:
    response = raw_request(keyed, "GET", f"/v1/models?api_key={KEY}")
    assert response.status == 401
    assert "query string" in json.loads(response.body)["error"]["message"]


def test_probes_and_the_page_stay_open_and_a_key_opens_the_rest(keyed: EmbeddedServer) -> None:
    for path in ("/healthz", "/readyz", "/"):
        assert raw_request(keyed, "GET", path).status == 200, path
    for path in ("/v1/models", "/metrics", "/debug/engine"):
        assert raw_request(keyed, "GET", path, BEARER).status == 200, path
    wrong = raw_request(keyed, "GET", "/metrics", {"Authorization": "Bearer nope"})
    assert wrong.status == 401


def test_public_metrics_opens_metrics_alone(live_server: LiveServer) -> None:
    server = _keyed(live_server, public_metrics=True)
    server.start()
    try:
        metrics = raw_request(server, "GET", "/metrics")
        assert metrics.status == 200 and b"bargein_" in metrics.body
        assert raw_request(server, "GET", "/v1/models").status == 401
        assert raw_request(server, "GET", "/debug/engine").status == 401
    finally:
        server.stop()


@pytest.mark.parametrize(
    "path", ["/v1/realtime", "/v1/realtime/", "//v1/realtime", "/V1/realtime", "/v1/realtime?api_key=" + KEY]
)
async def test_no_websocket_variant_opens_a_session_without_a_key(keyed: EmbeddedServer, path: str) -> None:
    with pytest.raises(InvalidStatus) as refused:
        await connect(f"ws://{keyed.host}:{keyed.port}{path}")
    assert refused.value.response.status_code == 401


def _sessions_connected(server: EmbeddedServer) -> float:
    text = httpx.get(server.http_url + "/metrics", headers=BEARER).text
    values = [
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("bargein_sessions_connected")
    ]
    return sum(values)


async def test_refused_requests_allocate_nothing(keyed: EmbeddedServer) -> None:
    service = keyed.state.service
    assert service is not None
    sessions = _sessions_connected(keyed)
    requests = len(service.recent_requests)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=keyed.http_url, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            for _ in range(10):
                assert (
                    await http.post("/v1/chat/completions", json=body, headers=headers)
                ).status_code == 401
                assert (
                    await http.post("/v1/completions", json={"prompt": "Hi"}, headers=headers)
                ).status_code == 401
                with pytest.raises(InvalidStatus):
                    await connect(keyed.ws_url, additional_headers=headers)
    assert len(service.recent_requests) == requests  # nothing reached the engine
    assert _sessions_connected(keyed) == sessions
    refused = {principal_for(None), principal_for("wrong")}
    assert refused.isdisjoint(service.admission._principals)  # no admission state either
