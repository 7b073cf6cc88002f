"""Without API keys, the limits are per client address, not per bearer string.

A server with no keys and a 1 request/s limit (burst: one request): a client
that sends a new ``Authorization: Bearer <x>`` with each request is still one
client, so its second request is refused, over HTTP (the official ``openai``
SDK) and over the WebSocket alike. The server runs on live_server's engine
runner (no second model load).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import openai
import pytest
from websockets.asyncio.client import connect

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from tests.app.conftest import LiveServer, node_on_engine

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def limited(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=8),
            server=ServerConfig(port=0, log_level="warning"),
            # A bucket of one request that refills in 100 s: the second is refused.
            admission=AdmissionConfig(rate_limit_requests=0.01, burst_s=1.0),
        ),
    ) as server:
        yield server


async def test_rotating_bearer_strings_share_one_rate_limit_over_http(limited: EmbeddedServer) -> None:
    outcomes = []
    for i in range(5):
        async with openai.AsyncOpenAI(
            base_url=limited.http_url + "/v1", api_key=f"sk-rotating-{i}", max_retries=0
        ) as client:
            try:
                await client.chat.completions.create(model="bargein", messages=HI, max_tokens=1)
                outcomes.append("ok")
            except openai.RateLimitError as exc:
                assert exc.response.headers["Retry-After"]
                outcomes.append("rate_limited")
    assert outcomes == ["ok"] + ["rate_limited"] * 4


async def test_rotating_bearer_strings_share_it_over_the_websocket_too(limited: EmbeddedServer) -> None:
    codes = []
    for i in range(3):
        headers = {"Authorization": f"Bearer ws-rotating-{i}"}
        async with connect(limited.ws_url, additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(
                json.dumps(
                    {"type": "response.create", "max_tokens": 1, "input": [{"role": "user", "content": "Hi"}]}
                )
            )
            event = json.loads(await ws.recv())
            codes.append(event.get("code", event["type"]))
    # The HTTP test above spent this address's only request.
    assert codes == ["rate_limited"] * 3


def test_the_admission_table_is_keyed_by_address_without_keys(limited: EmbeddedServer) -> None:
    assert limited.state.service is not None
    keys = set(limited.state.service.admission._principals)
    assert keys == {"addr:127.0.0.1"}
