"""Every answer under ``/v1`` is the API's: unknown routes and methods get
OpenAI's JSON error (404, 405 with ``Allow``), never the static page's plain
text, and the legacy ``POST /v1/completions`` (what ``vllm bench serve`` and
lm-eval drive by default) works with the official ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest

from tests.app.conftest import LiveServer
from tests.app.test_http_hostile import assert_openai_error

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture
async def client(live_server: LiveServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=live_server.http_url + "/v1", api_key="sk-any", max_retries=0
    ) as client:
        yield client


@pytest.fixture
async def http(live_server: LiveServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server.http_url, timeout=60) as http:
        yield http


# ---- unknown routes and methods ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET, HEAD"),
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("OPTIONS", "/v1/chat/completions", "POST"),
        ("GET", "/v1/streams/abc/cancel", "POST"),
        ("POST", "/v1/streams/abc/events", "GET, HEAD"),
    ],
)
async def test_a_wrong_method_is_a_json_405_with_allow(
    http: httpx.AsyncClient, method: str, path: str, allow: str
) -> None:
    response = await http.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert assert_openai_error(response)["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    "path",
    ["/v1", "/v1/", "/v1/nope", "/v1/chat", "/v1/models/", "/v1/chat/completions/extra", "/v1/embeddings"],
)
async def test_an_unknown_v1_path_is_a_json_404(http: httpx.AsyncClient, path: str) -> None:
    for method in ("GET", "POST"):
        response = await http.request(method, path, json={})
        assert response.status_code == 404, (method, path)
        assert assert_openai_error(response)["code"] == "not_found"


async def test_the_official_client_sees_not_found_for_an_unknown_model_route(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("no-such-model")
    assert caught.value.code == "not_found"


async def test_the_websocket_endpoint_over_plain_http_says_upgrade(http: httpx.AsyncClient) -> None:
    response = await http.get("/v1/realtime")
    assert response.status_code == 426 and response.headers["upgrade"] == "websocket"
    assert assert_openai_error(response)["code"] == "upgrade_required"


async def test_the_static_page_is_still_served(http: httpx.AsyncClient) -> None:
    response = await http.get("/")
    assert response.status_code == 200 and "text/html" in response.headers["content-type"]
    assert (await http.get("/no-such-file.js")).status_code == 404  # the mount's own 404


# ---- POST /v1/completions ----------------------------------------------------------


async def test_legacy_completion_streamed_equals_non_streamed(
    client: openai.AsyncOpenAI, live_server: LiveServer
) -> None:
    whole = await client.completions.create(model="bargein", prompt=PROMPT, max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert len(whole.choices) == 1 and whole.choices[0].finish_reason == "length"
    # The prompt went to the engine as is, without the chat template.
    prompt_ids = list(live_server.tokenizer.encode(PROMPT))
    assert list(live_server.recent_requests()[-1].prompt_token_ids) == prompt_ids
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(prompt_ids), 8)
    text = whole.choices[0].text
    assert text.strip()

    stream = await client.completions.create(
        model="bargein",
        prompt=[PROMPT],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert same_usage(chunks[-1].usage, whole.usage)


async def test_legacy_completion_honours_stop(client: openai.AsyncOpenAI) -> None:
    prompt = "1, 2, 3, 4, 5, 6,"
    full = await client.completions.create(model="bargein", prompt=prompt, max_tokens=12, temperature=0)
    text = full.choices[0].text
    stop = text.strip()[:1]
    assert stop, text
    cut = await client.completions.create(
        model="bargein", prompt=prompt, max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]


async def test_a_legacy_stream_resumes_in_its_own_shape(http: httpx.AsyncClient) -> None:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "stream": True}
    async with http.stream("POST", "/v1/completions", json=body) as live:
        stream_id = live.headers["x-bargein-stream-id"]
        live_text = await live.aread()
    replay = await http.get(f"/v1/streams/{stream_id}/events")
    assert replay.status_code == 200
    # The same answer: text, last id and closing events (a replay may group
    # tokens into bigger chunks than the live stream did).
    assert sse_answer(replay.content) == sse_answer(live_text)
    datas = [line[6:] for line in replay.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    assert all(json.loads(d)["object"] == "text_completion" for d in datas[:-1])


def sse_answer(body: bytes) -> tuple[str, str, list[str]]:
    """A legacy SSE body's text, last event id and last two data fields."""
    lines = body.decode().splitlines()
    datas = [line[6:] for line in lines if line.startswith("data: ")]
    ids = [line[4:] for line in lines if line.startswith("id: ")]
    text = "".join(json.loads(d)["choices"][0]["text"] for d in datas[:-1] if json.loads(d)["choices"])
    return text, ids[-1], datas[-2:]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True}, "echo"),
        ({"logprobs": 1}, "logprobs"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "!"}, "suffix"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": "word " * 600}, "prompt"),
    ],
)
async def test_legacy_requests_bargein_does_not_do_are_clear_400s(
    client: openai.AsyncOpenAI, fields: dict[str, object], param: str
) -> None:
    request = {"model": "bargein", "prompt": PROMPT, "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        await client.completions.create(**request)  # type: ignore[call-overload]
    assert caught.value.status_code == 400 and caught.value.param == param
    assert caught.value.type == "invalid_request_error"


def same_usage(again: Any, first: Any) -> bool:
    """The same counts, the second request reusing at least as much KV: it
    repeats the first's prompt, so its prefix is cached (whole blocks)."""
    cached = again.prompt_tokens_details.cached_tokens
    return (
        (again.prompt_tokens, again.completion_tokens, again.total_tokens)
        == (first.prompt_tokens, first.completion_tokens, first.total_tokens)
        and cached >= first.prompt_tokens_details.cached_tokens
        and cached < again.prompt_tokens
    )
