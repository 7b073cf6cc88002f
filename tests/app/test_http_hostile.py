"""Hostile HTTP bodies, methods and paths against the live server: always a 4xx
with OpenAI's error body (``{"error": {"message", "type", "param", "code"}}``),
never a 5xx nor a traceback in the server's log, and the server goes on serving.

The fuzzing mirrors ``tests/protocol``'s for the WebSocket codec: random
bytes under every content type, deep nesting, numbers JSON allows but Python
chokes on, every field of a valid request replaced by a random JSON value,
and random methods on random ``/v1`` paths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.app.conftest import MAX_FRAME_BYTES, LiveServer
from tests.app.log_capture import Records, server_log

pytestmark = pytest.mark.slow

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
VALID = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "temperature": 0,
    },
    "/v1/completions": {"prompt": "Hi", "max_tokens": 1, "temperature": 0},
}
FIELDS = (
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "user",
    "echo",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "tools",
    "suffix",
    "best_of",
    "bargein_on_disconnect",
)
CONTENT_TYPES = (
    None,
    "application/json",
    "application/json; charset=utf-8",
    "APPLICATION/JSON",
    "application/vnd.api+json",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/octet-stream",
    "text/html; charset=latin-1",
    ";;=garbage",
)
FUZZ = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
# Numbers JSON's grammar allows that overflow a float or Python's int parsing.
huge_numbers = st.sampled_from(
    [
        b"1e400",
        b"-1e400",
        b"1e-400",
        b"9" * 5000,
        b"-" + b"9" * 5000,
        b"1" + b"0" * 4299,
        b"0.0000000000000000000001",
        b"-0",
    ]
)


@pytest.fixture
def http(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        yield http


def assert_openai_error(response: httpx.Response) -> dict[str, Any]:
    """A 4xx whose body is OpenAI's error object; returns it."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json"), response.text[:300]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    return dict(error)


def assert_no_server_fault(log: Records) -> None:
    """Nothing at ERROR or above, and no traceback, in the server's log."""
    faults = log.at_least(logging.ERROR) + log.with_traceback()
    assert not faults, [r.getMessage() for r in faults]


def assert_still_serving(live_server: LiveServer) -> None:
    """Health is fine and the official client still gets a completion."""
    assert httpx.get(live_server.http_url + "/healthz").status_code == 200
    with openai.OpenAI(base_url=live_server.http_url + "/v1", api_key="sk-any", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="bargein", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
        )
    assert answer.choices[0].finish_reason in ("stop", "length")


def post(
    http: httpx.Client, path: str, body: bytes, content_type: str | None = "application/json"
) -> httpx.Response:
    headers = {} if content_type is None else {"Content-Type": content_type}
    return http.post(path, content=body, headers=headers)


# ---- regressions, one case each ------------------------------------------------


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_deeply_nested_json_is_a_400_not_a_500(
    live_server: LiveServer, http: httpx.Client, path: str, opener: bytes, closer: bytes
) -> None:
    depth = 10_000  # under the body limit, far over Python's recursion limit
    body = opener * depth + b"1" + closer * depth
    assert len(body) < MAX_FRAME_BYTES
    with server_log() as log:
        error = assert_openai_error(post(http, path, body))
    assert error["code"] == "invalid_json" and "nested" in error["message"]
    assert_no_server_fault(log)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_role_or_field_of_the_wrong_json_type_is_a_400(http: httpx.Client, path: str) -> None:
    bad = {
        "/v1/chat/completions": {"messages": [{"role": ["user"], "content": "Hi"}]},
        "/v1/completions": {"prompt": {"text": "Hi"}},
    }[path]
    with server_log() as log:
        error = assert_openai_error(post(http, path, json.dumps(bad).encode()))
    assert error["param"] in ("messages[0].role", "prompt")
    assert_no_server_fault(log)


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"]
)
def test_a_body_that_is_not_declared_json_is_a_415(http: httpx.Client, content_type: str) -> None:
    # A browser page can send these cross-origin without a CORS preflight.
    body = json.dumps(VALID["/v1/chat/completions"]).encode()
    response = post(http, "/v1/chat/completions", body, content_type)
    assert response.status_code == 415
    assert assert_openai_error(response)["code"] == "unsupported_media_type"


def test_json_without_a_content_type_or_with_a_json_subtype_is_accepted(http: httpx.Client) -> None:
    body = json.dumps(VALID["/v1/chat/completions"]).encode()
    for content_type in (None, "application/json; charset=utf-8", "application/vnd.x+json"):
        assert post(http, "/v1/chat/completions", body, content_type).status_code == 200


def test_a_body_over_the_limit_is_a_413(http: httpx.Client) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "x" * MAX_FRAME_BYTES}]})
    for path in ENDPOINTS:
        response = post(http, path, body.encode())
        assert response.status_code == 413
        assert assert_openai_error(response)["code"] == "request_too_large"


def test_non_utf8_json_is_a_400(http: httpx.Client) -> None:
    body = b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}'
    for path in ENDPOINTS:
        assert assert_openai_error(post(http, path, body))["code"] == "invalid_json"


# ---- fuzzing ---------------------------------------------------------------------


@FUZZ
@given(
    path=st.sampled_from(ENDPOINTS), body=st.binary(max_size=300), content_type=st.sampled_from(CONTENT_TYPES)
)
def test_random_bytes_under_any_content_type_are_4xx(
    live_server: LiveServer, path: str, body: bytes, content_type: str | None
) -> None:
    with server_log() as log, httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        assert_openai_error(post(http, path, body, content_type))
    assert_no_server_fault(log)


@FUZZ
@given(
    path=st.sampled_from(ENDPOINTS),
    depth=st.integers(1, 70_000),
    kinds=st.lists(
        st.sampled_from([(b"[", b"]"), (b'{"k":', b"}"), (b'{"messages":', b"}")]), min_size=1, max_size=3
    ),
    leaf=st.sampled_from([b"1", b'"x"', b"null", b"", b"1e400"]),
)
def test_nesting_at_any_depth_is_never_a_5xx(
    live_server: LiveServer, path: str, depth: int, kinds: list[tuple[bytes, bytes]], leaf: bytes
) -> None:
    opened = [kinds[i % len(kinds)] for i in range(depth)]
    body = b"".join(o for o, _ in opened) + leaf + b"".join(c for _, c in reversed(opened))
    with server_log() as log, httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        assert_openai_error(post(http, path, body))
    assert_no_server_fault(log)


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), field=st.sampled_from(FIELDS), number=huge_numbers)
def test_huge_numbers_in_any_field_are_never_a_5xx(
    live_server: LiveServer, path: str, field: str, number: bytes
) -> None:
    body = json.dumps({k: v for k, v in VALID[path].items() if k != field})[:-1].encode()
    body += b', "' + field.encode() + b'": ' + number + b"}"
    with server_log() as log, httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        response = post(http, path, body)
    if response.status_code != 200:  # "temperature": -0, "top_p": 1e-400 are fine
        assert_openai_error(response)
    assert_no_server_fault(log)


@FUZZ
@given(
    path=st.sampled_from(ENDPOINTS),
    field=st.sampled_from(FIELDS + ("messages[0]", "messages[0].role", "messages[0].content")),
    value=json_values,
)
def test_any_field_of_any_json_type_is_answered_without_a_5xx(
    live_server: LiveServer, path: str, field: str, value: Any
) -> None:
    body: dict[str, Any] = json.loads(json.dumps(VALID[path]))
    if field.startswith("messages[0]"):
        body["messages"] = [{"role": "user", "content": "Hi"}]
        if field == "messages[0]":
            body["messages"][0] = value
        else:
            body["messages"][0][field.rpartition(".")[2]] = value
    else:
        body[field] = value
    with server_log() as log, httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        response = post(http, path, json.dumps(body).encode())
        text = response.text  # a stream is read to its end
    if response.status_code != 200:
        assert_openai_error(response)
    else:
        assert text
    assert_no_server_fault(log)


SEGMENTS = (
    "chat",
    "completions",
    "models",
    "streams",
    "events",
    "cancel",
    "realtime",
    "x",
    "",
    ".",
    "..",
    "%00",
    "%2F",
    "é",
    "v1",
    "0" * 300,
)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PURGE")


@FUZZ
@given(
    method=st.sampled_from(METHODS),
    segments=st.lists(st.sampled_from(SEGMENTS), max_size=4),
    body=st.binary(max_size=64),
)
def test_any_method_on_any_v1_path_is_answered_in_openai_shape(
    live_server: LiveServer, method: str, segments: list[str], body: bytes
) -> None:
    path = "/v1/" + "/".join(segments)
    with server_log() as log, httpx.Client(base_url=live_server.http_url, timeout=60) as http:
        response = http.request(method, path, content=body)
    under_v1 = response.request.url.path.startswith("/v1")  # httpx resolves "/v1/../x"
    if response.status_code >= 300 and under_v1:
        error = assert_openai_error(response)
        if response.status_code == 405:
            assert response.headers["allow"], error
    assert_no_server_fault(log)


def test_the_server_is_still_serving_after_the_fuzzing(live_server: LiveServer) -> None:
    assert_still_serving(live_server)
