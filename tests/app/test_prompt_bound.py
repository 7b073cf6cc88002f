"""Text that cannot fit the context is refused before it is tokenized.

A 1 MiB ``response.create`` or chat body is refused as too long without the
chat template being rendered (each render is counted): the refusal costs the
length of the text, not a tokenization. Text that might fit is tokenized and
judged by its tokens, as before. The server runs on live_server's engine
runner (max_model_len 512) with frames up to 2 MiB, so 1 MiB gets through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from websockets.asyncio.client import connect

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.chat import prompt_ids
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime import service as service_module
from tests.app.conftest import LiveServer, node_on_engine

pytestmark = pytest.mark.slow

HUGE = "hello world " * ((1 << 20) // 12)  # 1 MiB of text, ~175k tokens
PLAUSIBLE = "hello " * 700  # 4 KiB: small enough to tokenize, 700 tokens: too long


@pytest.fixture(scope="module")
def roomy(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    with node_on_engine(
        live_server,
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=8, max_frame_bytes=2 << 20),
            server=ServerConfig(port=0, log_level="warning"),
        ),
    ) as server:
        yield server


@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every prompt rendering (chat template or plain text) the service does."""
    rendered: list[Any] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        rendered.append(args)
        return prompt_ids(*args, **kwargs)

    monkeypatch.setattr(service_module, "prompt_ids", counting)
    return rendered


async def test_a_huge_chat_body_is_refused_without_rendering(
    roomy: EmbeddedServer, renders: list[Any]
) -> None:
    async with openai.AsyncOpenAI(
        base_url=roomy.http_url + "/v1", api_key="sk-huge", max_retries=0
    ) as client:
        with pytest.raises(openai.BadRequestError) as chat:
            await client.chat.completions.create(
                model="bargein", messages=[{"role": "user", "content": HUGE}], max_tokens=1
            )
        with pytest.raises(openai.BadRequestError) as legacy:
            await client.completions.create(model="bargein", prompt=HUGE, max_tokens=1)
    assert chat.value.code == legacy.value.code == "context_length_exceeded"
    assert renders == []  # refused on its length alone
    with pytest.raises(openai.BadRequestError) as plausible:
        async with openai.AsyncOpenAI(
            base_url=roomy.http_url + "/v1", api_key="sk-huge", max_retries=0
        ) as client:
            await client.chat.completions.create(
                model="bargein", messages=[{"role": "user", "content": PLAUSIBLE}], max_tokens=1
            )
    assert plausible.value.code == "context_length_exceeded"
    assert len(renders) == 1  # it might have fitted: its tokens were counted


async def test_a_huge_response_create_is_refused_without_rendering(
    roomy: EmbeddedServer, renders: list[Any]
) -> None:
    async with connect(roomy.ws_url, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        for content in (HUGE, PLAUSIBLE):
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "max_tokens": 1,
                        "input": [{"role": "user", "content": content}],
                    }
                )
            )
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and error["code"] == "prompt_too_long", error
            if content is HUGE:
                assert renders == []
        await ws.send(json.dumps({"type": "ping"}))
        assert json.loads(await ws.recv())["type"] == "pong"
    assert len(renders) == 1  # only the plausible one was tokenized
