"""API keys, ownership, origins, rate limits, admission and liveness, end to end.

One server of its own for this module (the bundled model loaded a second
time in the suite): API keys, an Origin allow-list, a request rate limit of
1/s per key (bursts of 2), at most two responses generating per key, pings
every 4 s with a 1 s pong timeout, a 0.5 s slow-client timeout and a small
kernel send buffer (so a client that stops reading fills it fast). Each test
uses its own keys, so the per-key limits of one test never touch another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bargein.app import outgoing
from bargein.app.client import RealtimeClient, ServerError
from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.engine.config import EngineConfig, SchedulerConfig
from bargein.session.conversation.chat import prompt_ids
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime import service as service_module
from bargein.session.runtime.admission import AdmissionConfig
from tests.app.log_capture import server_log
from tests.app.rawws import masked_text, raw_upgrade

pytestmark = pytest.mark.slow

KEYS = (
    "k-alice",
    "k-bob",
    "k-sub",
    "k-origin",
    "k-rate",
    "k-http",
    "k-cap",
    "k-busy",
    "k-gone",
    "k-logs",
    "k-slow",
    "k-late",
    "k-late-http",
    "k-late-busy",
    "k-chat",
    "k-stall",
)
SLOW_CLIENT_S = 0.5
GOOD_ORIGIN = "http://chat.example"
PING_INTERVAL_S = 4.0
PING_TIMEOUT_S = 1.0
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def guarded() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer(
        Settings(
            engine=EngineConfig(scheduler=SchedulerConfig(max_model_len=512)),
            session=SessionConfig(max_tokens=64, default_max_tokens=16),
            server=ServerConfig(
                port=0,
                debug_endpoints=True,
                log_level="warning",
                api_keys=",".join(KEYS),
                allowed_origins=(GOOD_ORIGIN,),
                ws_ping_interval_s=PING_INTERVAL_S,
                ws_ping_timeout_s=PING_TIMEOUT_S,
                slow_client_timeout_s=SLOW_CLIENT_S,
            ),
            admission=AdmissionConfig(
                max_waiting=64, rate_limit_requests=1.0, burst_s=2.0, max_active_per_principal=2
            ),
        ),
        sndbuf=8192,
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def until(predicate: Any, what: str, guard_s: float = 30.0) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` after ``guard_s``
    seconds (a hang guard, not a bound)."""
    deadline = time.monotonic() + guard_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def engine_idle(server: EmbeddedServer) -> None:
    """Wait until nothing runs or waits in ``server``'s engine.

    Answers of earlier tests may still be generating (a closed connection
    does not stop its generation); on a loaded machine that can take long,
    hence the wide hang guard.
    """
    stats = server.stats
    await until(
        lambda: stats().num_running == stats().num_waiting == 0,
        "the engine is busy with another test's answers",
        guard_s=180.0,
    )


# ---- API keys ------------------------------------------------------------------


def _series(server: EmbeddedServer, series: str) -> float:
    """The value of one series (name and labels as exposed) in /metrics; 0 if absent."""
    metrics = httpx.get(server.http_url + "/metrics", headers=bearer("k-alice"))
    for line in metrics.text.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return 0.0


def _refusals(server: EmbeddedServer, reason: str) -> float:
    return _series(server, f'bargein_auth_refusals_total{{reason="{reason}"}}')


async def test_missing_or_wrong_key_is_refused_with_401_before_the_upgrade(guarded: EmbeddedServer) -> None:
    missing, invalid = _refusals(guarded, "missing_api_key"), _refusals(guarded, "invalid_api_key")
    for headers in ({}, bearer("not-a-key")):
        with pytest.raises(InvalidStatus) as refused:
            await connect(guarded.ws_url, additional_headers=headers)
        response = refused.value.response
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
    async with httpx.AsyncClient(base_url=guarded.http_url) as http:
        assert (await http.get("/v1/models")).status_code == 401
        assert (await http.get("/v1/models", headers=bearer("nope"))).status_code == 401
        assert (await http.get("/v1/models", headers=bearer("k-alice"))).status_code == 200
        assert (await http.get("/healthz")).status_code == 200  # probes need no key
    # counted, WebSocket and HTTP alike (/metrics needs a key too: no --public-metrics)
    assert _refusals(guarded, "missing_api_key") == missing + 2
    assert _refusals(guarded, "invalid_api_key") == invalid + 2


def test_chat_command_takes_a_key_and_says_when_it_is_missing(guarded: EmbeddedServer) -> None:
    chat = [sys.executable, "-m", "bargein", "chat", "--url", guarded.ws_url, "--max-tokens", "2"]
    env = {k: v for k, v in os.environ.items() if k != "BARGEIN_API_KEY"}
    refused = subprocess.run(chat, input="Hi\n\n", capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "HTTP 401" in refused.stderr and "--api-key" in refused.stderr
    keyed = subprocess.run(
        chat,
        input="Hi\n\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env | {"BARGEIN_API_KEY": "k-chat"},
    )
    assert keyed.returncode == 0, keyed.stderr
    assert keyed.stderr.startswith("connected to")


async def test_good_key_in_header_or_subprotocol_opens_a_session(guarded: EmbeddedServer) -> None:
    async with RealtimeClient(guarded.ws_url, headers=bearer("k-sub")) as client:
        assert client.session["type"] == "session.created"
    async with connect(guarded.ws_url, subprotocols=["bargein.v1.json", "bearer.k-sub"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "bargein.v1.json"
        echoed = ws.response.headers.get_all("Sec-WebSocket-Protocol")
        assert echoed == ["bargein.v1.json"]  # the key is never echoed
        assert '"session.created"' in str(await ws.recv())
    with pytest.raises(InvalidStatus) as refused:
        await connect(guarded.ws_url, subprotocols=["bearer.wrong"])  # type: ignore[list-item]
    assert refused.value.response.status_code == 401


async def test_keys_never_reach_the_logs(guarded: EmbeddedServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with RealtimeClient(guarded.ws_url, headers=bearer("k-logs")) as client:
        await client.chat("Hi", max_tokens=2, **GREEDY)
    with pytest.raises(InvalidStatus):
        await connect(guarded.ws_url, subprotocols=["bearer.k-wrong-secret"])  # type: ignore[list-item]
    lines = [
        r.getMessage() + str(r.__dict__)
        for r in caplog.records  # the server's lines
        if r.name.startswith(("bargein", "uvicorn"))
    ]
    assert any("request refused" in line for line in lines)
    assert not any("k-logs" in line or "k-wrong-secret" in line for line in lines)


# ---- ownership -----------------------------------------------------------------


async def test_another_key_cannot_resume_or_cancel_a_stream(guarded: EmbeddedServer) -> None:
    async with RealtimeClient(guarded.ws_url, headers=bearer("k-alice")) as alice:
        await alice.send(
            {
                "type": "response.create",
                "response_id": "mine",
                "max_tokens": 48,
                "input": [{"role": "user", "content": "Count to twenty."}],
            }
        )
        created = await alice._expect("response.created")
        async with RealtimeClient(guarded.ws_url, headers=bearer("k-bob")) as bob:
            await bob.send(
                {
                    "type": "stream.resume",
                    "stream_id": created["stream_id"],
                    "resume_token": created["resume_token"],
                    "from": 0,
                }
            )
            with pytest.raises(ServerError) as resumed:
                await bob._expect("stream.resumed")
            assert resumed.value.code == "forbidden"
            await bob.send({"type": "response.cancel", "response_id": "mine"})
            with pytest.raises(ServerError) as cancelled:
                await bob._expect("response.done")
            assert cancelled.value.code == "not_found"
        async with httpx.AsyncClient(base_url=guarded.http_url, headers=bearer("k-bob")) as http:
            stream = f"/v1/streams/{created['stream_id']}"
            assert (await http.get(stream + "/events")).status_code == 404
            assert (await http.post(stream + "/cancel")).status_code == 404
        # The owner still can, from another connection.
        async with RealtimeClient(guarded.ws_url, headers=bearer("k-alice")) as again:
            await again.send(
                {
                    "type": "stream.resume",
                    "stream_id": created["stream_id"],
                    "resume_token": created["resume_token"],
                    "from": 0,
                }
            )
            assert (await again._expect("stream.resumed"))["stream_id"] == created["stream_id"]
            assert (await again._expect("response.done"))["finish_reason"] in ("stop", "length")


# ---- origin --------------------------------------------------------------------


async def test_origin_outside_the_allow_list_gets_403(guarded: EmbeddedServer) -> None:
    before = _refusals(guarded, "origin_not_allowed")
    with pytest.raises(InvalidStatus) as refused:
        await connect(
            guarded.ws_url,
            origin="http://evil.example",  # type: ignore[arg-type]
            additional_headers=bearer("k-origin"),
        )
    assert refused.value.response.status_code == 403
    assert _refusals(guarded, "origin_not_allowed") == before + 1
    async with connect(
        guarded.ws_url,
        origin=GOOD_ORIGIN,  # type: ignore[arg-type]
        additional_headers=bearer("k-origin"),
    ) as ws:
        assert '"session.created"' in str(await ws.recv())


# ---- rate limits and admission ---------------------------------------------------


async def test_request_rate_limit_answers_rate_limited_with_retry_after(guarded: EmbeddedServer) -> None:
    clients = [RealtimeClient(guarded.ws_url, headers=bearer("k-rate")) for _ in range(3)]
    for client in clients:
        await client.connect()
    try:  # three at once on a bucket of two: one is refused
        answers = await asyncio.gather(
            *(c.chat("Hi", max_tokens=1, **GREEDY) for c in clients), return_exceptions=True
        )
    finally:
        for client in clients:
            await client.close()
    refused = [a for a in answers if isinstance(a, ServerError)]
    assert len(refused) == 1, answers
    error = refused[0].event
    assert error["code"] == "rate_limited" and "request rate" in error["message"]
    assert error["retryable"] is True and 0 < error["retry_after_ms"] <= 1000


async def test_http_rate_limit_is_a_429_with_retry_after(guarded: EmbeddedServer) -> None:
    body = {"model": "m", "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}]}
    async with httpx.AsyncClient(base_url=guarded.http_url, headers=bearer("k-http"), timeout=120) as http:
        answers = await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for _ in range(4)))
    limited = [a for a in answers if a.status_code == 429]
    assert limited, [a.status_code for a in answers]
    assert limited[0].json()["error"]["code"] == "rate_limited"
    assert int(limited[0].headers["Retry-After"]) >= 1


async def test_cap_on_responses_generating_per_key(guarded: EmbeddedServer) -> None:
    """The third request of a key with two responses generating is refused by
    the cap, not by the request rate.

    "Still generating" holds by construction, not by the answers being long
    enough for this machine: the engine thread is held after its first step
    until the refusal came, so neither answer can finish meanwhile (the
    admission slot of a response is given back when its generation ends).
    """
    service = guarded.state.service
    assert service is not None
    held, release = threading.Event(), threading.Event()

    def hold(_outputs: object) -> None:
        held.set()
        release.wait(60)  # a hang guard: never hold the engine for good

    def num_finished() -> int:
        return sum(guarded.stats().num_finished_by_reason.values())

    clients = [RealtimeClient(guarded.ws_url, headers=bearer("k-cap")) for _ in range(3)]
    for client in clients:
        await client.connect()
    finished_before = num_finished()
    service.runner.add_step_listener(hold)
    response_ids: list[tuple[RealtimeClient, str]] = []
    try:
        for client in clients[:2]:  # two answers generating
            await client.send(
                {
                    "type": "response.create",
                    "max_tokens": 64,
                    **GREEDY,
                    "input": [{"role": "user", "content": "Tell me a long story."}],
                }
            )
            created = await client._expect("response.created")
            response_ids.append((client, created["response_id"]))
        # The engine stepped (the first answer is generating) and is held there.
        assert await asyncio.to_thread(held.wait, 60)  # a hang guard, not a bound
        # The request bucket (1/s, bursts of 2) refills: only the cap is left.
        # A lower bound only: a longer sleep changes nothing while the engine is held.
        await asyncio.sleep(1.2)
        with pytest.raises(ServerError) as refused:
            await clients[2].chat("Hi", max_tokens=1)
        assert num_finished() == finished_before, "an answer ended before the refusal"
    finally:
        release.set()
        service.runner.remove_step_listener(hold)
        for client, response_id in response_ids:  # the next tests want an idle engine
            await client.send({"type": "response.cancel", "response_id": response_id})
            await client._expect("response.done")
        for client in clients:
            await client.close()
    assert refused.value.code == "rate_limited"
    assert "at once" in refused.value.event["message"]


async def test_full_queue_answers_overloaded_and_1013_at_connect(
    guarded: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real requests fill the queue, and it empties again when they run.

    A server of its own with a queue of two, on this module's engine runner
    (no second model load). The engine is held in the hand-off of its first
    step, the first token of a first answer, so the two requests that follow
    stay queued (admitted, no first token) by construction, not by the
    machine being slow: the queue is full until the test lets the engine go.
    """
    queued = EmbeddedServer(
        Settings(
            session=SessionConfig(max_tokens=64, default_max_tokens=16),
            server=ServerConfig(port=0, debug_endpoints=True, log_level="warning", api_keys=",".join(KEYS)),
            admission=AdmissionConfig(max_waiting=2),
        ),
        runner=guarded.state.runner,
    )
    await asyncio.to_thread(queued.start)
    service = queued.state.service
    assert service is not None
    admission = service.admission
    held, release = threading.Event(), threading.Event()

    def hold(_outputs: object) -> None:
        held.set()
        release.wait(60)  # a hang guard: never hold the engine for good

    clients = [RealtimeClient(queued.ws_url, headers=bearer("k-busy")) for _ in range(4)]
    try:
        for client in clients:
            await client.connect()
        await engine_idle(guarded)
        rejected_before = _overloaded_count(queued)
        service.runner.add_step_listener(hold)
        try:
            await clients[0].send(
                {
                    "type": "response.create",
                    "max_tokens": 4,
                    **GREEDY,
                    "input": [{"role": "user", "content": "Hi"}],
                }
            )
            await clients[0]._expect("response.created")
            assert await asyncio.to_thread(held.wait, 60)  # its first token: engine held
            await until(lambda: admission.num_waiting == 0, "the first answer never started")
            for client in clients[1:3]:  # two more fill the queue: never scheduled while held
                await client.send(
                    {
                        "type": "response.create",
                        "max_tokens": 4,
                        **GREEDY,
                        "input": [{"role": "user", "content": "Hello"}],
                    }
                )
                await client._expect("response.created")
            assert admission.num_waiting == admission.config.max_waiting == 2
            # "Refused before any work" is seen as work not done (no prompt
            # rendered, nothing submitted), not as a short wall-clock time.
            rendered: list[object] = []

            def counting_render(*args: Any, **kwargs: Any) -> Any:
                rendered.append(args)
                return prompt_ids(*args, **kwargs)

            monkeypatch.setattr(service_module, "prompt_ids", counting_render)
            submitted_before = list(service.recent_requests)
            with pytest.raises(ServerError) as refused:
                await clients[3].chat("Hi", max_tokens=1)
            ws = await connect(queued.ws_url, additional_headers=bearer("k-busy"))
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
            async with httpx.AsyncClient(base_url=queued.http_url, headers=bearer("k-busy")) as http:
                answer = await http.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
                )
            assert rendered == [] and list(service.recent_requests) == submitted_before
        finally:
            release.set()
            service.runner.remove_step_listener(hold)
        assert refused.value.code == "overloaded" and refused.value.event["retry_after_ms"] >= 100
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "overloaded"
        assert int(answer.headers["Retry-After"]) >= 1
        assert _overloaded_count(queued) == rejected_before + 3  # counted in /metrics
        for client in clients[:3]:  # the engine goes on: the queued answers run to their end
            await asyncio.wait_for(client._expect("response.done"), 60)  # a hang guard
        assert admission.num_waiting == 0 and not admission.saturated()
        async with RealtimeClient(queued.ws_url, headers=bearer("k-busy")) as again:
            await again.chat("Hi", max_tokens=1, **GREEDY)  # connects and is served
            assert again.current is not None and again.current.done is not None
    finally:
        for client in clients:
            await client.close()
        await asyncio.to_thread(queued.stop)


async def test_request_still_queued_at_its_deadline_is_dropped_with_overloaded(
    guarded: EmbeddedServer,
) -> None:
    """The up-front estimate is a mean; the deadline holds for each request.

    The engine is held in the hand-off of a long answer's step, so the three
    requests that follow (realtime, HTTP, HTTP streamed) stay queued past their
    1 ms deadline by construction, not by the machine being slow: the test lets
    the engine go only once every deadline has fired.
    """
    service = guarded.state.service  # type: ignore[union-attr]
    runner = guarded.state.runner
    admission = service.admission
    rejected_before = _overloaded_count(guarded)
    saved = admission.config
    held, release = threading.Event(), threading.Event()

    def hold(_outputs: object) -> None:
        held.set()
        release.wait(60)  # a hang guard: never hold the engine for good

    await engine_idle(guarded)
    busy = RealtimeClient(guarded.ws_url, headers=bearer("k-late-busy"))
    await busy.connect()

    async def long_answer() -> None:
        async for _ in busy.respond(
            "Write a long, detailed story about a river and a stone.", max_tokens=64, **GREEDY
        ):
            pass

    runner.add_step_listener(hold)
    background = asyncio.create_task(long_answer())
    assert await asyncio.to_thread(held.wait, 60)  # a step of the long answer: engine held
    # A deadline of 1 ms, and no departure history, so the up-front estimate
    # admits and only the deadline can refuse.
    admission.config = replace(saved, max_queue_time_s=0.001, window_s=0.001)
    try:
        async with RealtimeClient(guarded.ws_url, headers=bearer("k-late")) as client:
            chat = asyncio.create_task(client.chat("Name a plum variety.", max_tokens=4))
            async with httpx.AsyncClient(
                base_url=guarded.http_url,  # a burst of 2 per key
                headers=bearer("k-late-http"),
            ) as http:
                body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
                answering = asyncio.create_task(http.post("/v1/chat/completions", json=body))
                streaming = asyncio.create_task(
                    http.post("/v1/chat/completions", json={**body, "stream": True})
                )
                await until(
                    lambda: sum(live.expired is not None for live in service._live.values()) == 3,
                    "three requests never passed their deadline in the queue",
                )
                runner.remove_step_listener(hold)
                release.set()
                with pytest.raises(ServerError) as dropped:
                    await chat
                answer, streamed = await answering, await streaming
            assert client.current is not None
            stream_id, token = client.current.stream_id, client.current.resume_token
            admission.config = saved
            # nothing of the dropped request stayed in the conversation: the
            # retry's prompt holds the question once
            assert await client.chat("Name a plum variety.", max_tokens=2, **GREEDY)
        # A later reader of the dropped stream (a resume, here or on any other
        # node) hears why from the log, not from this node's memory.
        async with RealtimeClient(guarded.ws_url, headers=bearer("k-late")) as again:
            await again.send(
                {"type": "stream.resume", "stream_id": stream_id, "resume_token": token, "from": 0}
            )
            assert (await again._expect("stream.resumed"))["stream_id"] == stream_id
            with pytest.raises(ServerError) as resumed:
                await again._expect("response.done")
            assert (await again._expect("response.done"))["finish_reason"] == "cancelled"
    finally:
        runner.remove_step_listener(hold)
        release.set()
        admission.config = saved
        await background
        await busy.close()
    event = dropped.value.event
    assert event["code"] == "overloaded" and "still queued after" in event["message"]
    assert event["retry_after_ms"] >= 100 and event["retryable"] is True
    assert resumed.value.event == event
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "overloaded"
    assert int(answer.headers["Retry-After"]) >= 1
    assert streamed.status_code == 200
    assert '"code":"overloaded"' in streamed.text.replace(" ", "")
    assert "[DONE]" not in streamed.text
    prompt = service.runner.tokenizer.decode(service.recent_requests[-1].prompt_token_ids)
    assert prompt.count("Name a plum variety.") == 1
    assert admission.num_waiting == 0  # the dropped ones left the queue
    assert _overloaded_count(guarded) == rejected_before + 3  # counted in /metrics


def _overloaded_count(server: EmbeddedServer) -> float:
    text = httpx.get(server.http_url + "/metrics", headers=bearer("k-alice")).text
    match = re.search(
        r'^bargein_admission_rejections_total\{reason="overloaded"\} (\S+)$', text, re.MULTILINE
    )
    assert match is not None
    return float(match.group(1))


# ---- liveness --------------------------------------------------------------------


def _connected(server: EmbeddedServer) -> float:
    text = httpx.get(server.http_url + "/metrics", headers=bearer("k-alice")).text
    match = re.search(r"^bargein_sessions_connected (\S+)$", text, re.MULTILINE)
    assert match is not None
    return float(match.group(1))


async def test_silently_vanished_client_is_closed_by_its_first_unanswered_ping(
    guarded: EmbeddedServer,
) -> None:
    """A client that went silent (no pongs, no close frame) is dropped by the
    keepalive, and the session's disconnect policy ends its response.

    The mechanism, not a stopwatch (a shared, loaded box stretches any wall-clock
    bound): the server's one ping goes unanswered, uvicorn fails the connection
    with 1011 "keepalive ping timeout" without sending a second ping (so it was
    noticed within one interval plus one timeout, by the server's own clock),
    the response was still generating then, and ``on_disconnect: cancel`` ended it.

    The socket reads what the server sends (to see the ping and the close frame)
    but never answers: to the server that is the same as a client that vanished,
    since the kernel acknowledges the bytes either way.
    """
    service = guarded.state.service
    assert service is not None
    before_cancelled = guarded.stats().num_finished_by_reason.get("cancelled", 0)
    active_disconnects = 'bargein_disconnects_total{active_response="true"}'
    disconnects_before = _series(guarded, active_disconnects)
    baseline = _connected(guarded)
    # Hold the engine thread after its first step until the close was seen, so
    # the answer is still generating when the keepalive fires however fast the
    # machine is (64 tokens can take less than interval + timeout). Aborts
    # queue meanwhile and are applied at the next step, after the release.
    held, release = threading.Event(), threading.Event()

    def hold(_outputs: object) -> None:
        held.set()
        release.wait(60)  # a hang guard: never hold the engine for good

    service.runner.add_step_listener(hold)
    sock = raw_upgrade(guarded.port, key="k-gone")
    try:
        update = b'{"type":"session.update","session":{"on_disconnect":"cancel"}}'
        create = (
            b'{"type":"response.create","max_tokens":64,'
            b'"input":[{"role":"user","content":"Write a long poem."}]}'
        )
        sock.sendall(masked_text(update) + masked_text(create))
        sock.settimeout(60)  # a hang guard ("never closed"), not a bound on when
        frames = _frames_until_close(sock)
        was_held = held.is_set()
    finally:
        release.set()
        service.runner.remove_step_listener(hold)
        sock.close()
    stats = await _wait_cancelled(guarded, before_cancelled)
    await _wait_connected(guarded, baseline)
    assert was_held  # the engine had stepped this response and not finished it
    opcodes = [opcode for opcode, _ in frames]
    assert opcodes.count(_PING) == 1, opcodes  # closed at the first unanswered ping
    assert opcodes.index(_PING) < len(opcodes) - 1 and opcodes[-1] == _CLOSE
    close = frames[-1][1]
    assert int.from_bytes(close[:2], "big") == 1011  # the keepalive's close, not 4008
    assert close[2:] == b"keepalive ping timeout"
    texts = [json.loads(payload) for opcode, payload in frames if opcode == _TEXT]
    kinds = [event["type"] for event in texts]
    assert "response.created" in kinds
    # Still generating when the keepalive closed: the policy had something to end.
    assert "response.done" not in kinds, "the answer ended before the ping; nothing to cancel"
    assert _series(guarded, active_disconnects) == disconnects_before + 1
    assert stats.num_finished_by_reason["cancelled"] == before_cancelled + 1


async def _wait_connected(server: EmbeddedServer, count: float) -> None:
    """The closed connection's handler ended: ``sessions_connected`` is back to
    ``count`` (a hang guard only)."""
    deadline = time.monotonic() + 30
    while _connected(server) != count:
        assert time.monotonic() < deadline, "the vanished client's session never ended"
        await asyncio.sleep(0.05)


async def _wait_cancelled(server: EmbeddedServer, before: int) -> Any:
    """The disconnect policy (cancel) ended the silent client's response."""
    deadline = time.monotonic() + 60  # a hang guard only
    while server.stats().num_finished_by_reason.get("cancelled", 0) <= before:
        assert time.monotonic() < deadline, server.stats()
        await asyncio.sleep(0.05)
    return server.stats()


# ---- slow clients ------------------------------------------------------------------


def _flood_of_updates(sock: socket.socket) -> None:
    """Send ``session.update`` frames until the server stops reading them: each
    is answered with the 4 KB of instructions it set, the client reads none of
    it, so the server's read loop ends up blocked writing an answer."""
    update = json.dumps({"type": "session.update", "session": {"instructions": "x" * 4000}}).encode()
    flood = masked_text(update) * 100
    sock.setblocking(False)
    sent = 0
    while sent < len(flood):
        try:
            sent += sock.send(flood[sent:])
        except BlockingIOError:
            break  # the server stopped reading: it is stuck writing to us
    sock.setblocking(True)


def _long_answer_then_one_big_update(sock: socket.socket) -> None:
    """A long answer, then one ``session.update`` whose answer (its 256 KB of
    instructions echoed) fills the server's buffers: the read loop gets its
    frame on the wire and goes back to waiting for the client, while the
    answer's next delta waits for a client that reads nothing."""
    create = json.dumps(
        {
            "type": "response.create",
            "max_tokens": 64,
            "input": [{"role": "user", "content": "Write a long poem about the sea."}],
        }
    ).encode()
    update = json.dumps({"type": "session.update", "session": {"instructions": "x" * (256 * 1024)}}).encode()
    sock.sendall(masked_text(create) + masked_text(update))


@pytest.mark.parametrize(
    ("key", "stop_reading"),
    [("k-slow", _flood_of_updates), ("k-stall", _long_answer_then_one_big_update)],
    ids=["read_loop_blocked", "read_loop_idle"],
)
async def test_client_that_stops_reading_is_closed_with_4008(
    guarded: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, key: str, stop_reading: Any
) -> None:
    """A client over its outgoing bound for ``slow_client_timeout_s`` is closed
    with 4008 (it may reconnect and ``stream.resume``), counted as a
    disconnect, without a traceback: whether the read loop was itself stuck
    writing to it, or idle, waiting for its next frame, while a delivery was."""
    # The 4008 close frame queues behind the unread backlog: give it time to wait
    # for this test to read (a hang guard; the server's default is 5 s).
    monkeypatch.setattr(outgoing, "CLOSE_TIMEOUT_S", 60.0)
    baseline = _connected(guarded)
    disconnects = sum(
        _series(guarded, f'bargein_disconnects_total{{active_response="{a}"}}') for a in ("true", "false")
    )
    with server_log("bargein") as log:
        sock = raw_upgrade(guarded.port, key=key, rcvbuf=4096)
        try:
            await _wait_connected(guarded, baseline + 1)
            stop_reading(sock)
            # Over its bound from now on. The handler gives the connection up
            # (well before the first ping, 4 s, goes unanswered) ...
            await _wait_connected(guarded, baseline)
            sock.settimeout(30)  # a hang guard
            code = _close_code(sock)  # ... and the client reads again: the backlog, the close
        finally:
            sock.close()
    assert code == 4008
    assert (
        sum(
            _series(guarded, f'bargein_disconnects_total{{active_response="{a}"}}') for a in ("true", "false")
        )
        == disconnects + 1
    )
    assert not log.with_traceback(), [r.getMessage() for r in log.with_traceback()]


_TEXT, _CLOSE, _PING = 0x1, 0x8, 0x9


def _frames_until_close(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Read server frames (unmasked, unfragmented) up to and including the
    close frame: ``(opcode, payload)`` each; stops early at EOF."""
    frames: list[tuple[int, bytes]] = []
    buf = b""
    while True:
        while len(buf) >= 2:
            opcode, length, start = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if length >= 126:
                start = 4 if length == 126 else 10
                if len(buf) < start:
                    break
                length = int.from_bytes(buf[2:start], "big")
            if len(buf) < start + length:
                break
            frames.append((opcode, buf[start : start + length]))
            buf = buf[start + length :]
            if opcode == _CLOSE:
                return frames
        chunk = sock.recv(65536)
        if not chunk:
            return frames
        buf += chunk


def _close_code(sock: socket.socket) -> int | None:
    """Read server frames until a close frame; return its code (None at EOF)."""
    frames = _frames_until_close(sock)
    if not frames or frames[-1][0] != _CLOSE:
        return None
    return int.from_bytes(frames[-1][1][:2], "big")
