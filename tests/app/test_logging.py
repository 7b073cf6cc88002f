"""Structured logs: one JSON object or logfmt line a record, ids on request lines,
no conversation text unless asked, never a key, and a client's faults as one
quiet line per connection, never a traceback."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import socket
import sys
from collections.abc import Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bargein.app.logging import REDACTED, StructuredFormatter, bind, configure_logging, set_ids
from bargein.client.realtime_client import RealtimeClient
from tests.app.conftest import LiveServer
from tests.app.log_capture import server_log
from tests.waiting import wait_until


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.makeLogRecord(
        {"name": "bargein.test", "levelno": logging.INFO, "levelname": "INFO", "msg": msg, "args": args}
    )
    rec.__dict__.update(extra)
    return rec


def parse_logfmt(line: str) -> dict[str, str]:
    """A logfmt line back into its fields (quoted values are JSON strings)."""
    pairs = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)', line)
    return {key: json.loads(value) if value.startswith('"') else value for key, value in pairs}


def test_json_line_has_time_level_ids_and_extras() -> None:
    formatter = StructuredFormatter("json")
    with bind(request_id="resp_1", session_id="sess_1", stream_id="str_1"):
        line = formatter.format(record("response %s", "finished", finish_reason="stop", completion_tokens=12))
    assert "\n" not in line
    fields = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", fields.pop("ts"))
    assert fields == {
        "level": "info",
        "logger": "bargein.test",
        "msg": "response finished",
        "request_id": "resp_1",
        "session_id": "sess_1",
        "stream_id": "str_1",
        "finish_reason": "stop",
        "completion_tokens": 12,
    }


def test_logfmt_quotes_only_what_needs_quoting() -> None:
    formatter = StructuredFormatter("logfmt")
    with bind(session_id="sess_1"):
        line = formatter.format(
            record('two words and "quotes"\nand a newline', ratio=0.5, flag=True, empty="")
        )
    assert "\n" not in line
    assert " session_id=sess_1 " in line and " ratio=0.5 " in line and " flag=true " in line
    fields = parse_logfmt(line)
    assert fields["msg"] == 'two words and "quotes"\nand a newline'
    assert fields["empty"] == "" and fields["level"] == "info"


def test_ids_stay_inside_their_block_and_their_task() -> None:
    formatter = StructuredFormatter("json")
    with bind(request_id="inner"):
        pass
    assert "request_id" not in json.loads(formatter.format(record("after")))

    async def connection(session_id: str) -> dict[str, str]:
        set_ids(session_id=session_id)
        await asyncio.sleep(0)  # let the other connection set its id too
        return dict(json.loads(formatter.format(record("line"))))

    async def both() -> list[dict[str, str]]:
        return list(await asyncio.gather(connection("a"), connection("b")))

    assert [f["session_id"] for f in asyncio.run(both())] == ["a", "b"]
    assert "session_id" not in json.loads(formatter.format(record("outside")))


def test_conversation_text_only_with_the_debug_flag() -> None:
    rec = record(
        "response submitted",
        messages=[{"role": "user", "content": "my secret plan"}],
        text="the answer",
        prompt_tokens=7,
    )
    quiet = json.loads(StructuredFormatter("json").format(rec))
    assert quiet["messages"] == quiet["text"] == REDACTED and quiet["prompt_tokens"] == 7
    assert "secret plan" not in json.dumps(quiet)
    loud = json.loads(StructuredFormatter("json", log_prompts=True).format(rec))
    assert loud["messages"][0]["content"] == "my secret plan" and loud["text"] == "the answer"


@pytest.mark.parametrize("fmt", ["json", "logfmt"])
def test_keys_are_never_logged_even_with_the_debug_flag(fmt: str) -> None:
    formatter = StructuredFormatter(fmt, log_prompts=True)  # type: ignore[arg-type]
    line = formatter.format(
        record(
            "upgrade with Authorization: Bearer sk-live-123 and subprotocol bearer.sk-live-456",
            api_key="sk-live-789",
            resume_token="rt-1",
            authorization="Bearer sk-live-000",
        )
    )
    assert "sk-live" not in line and "rt-1" not in line
    assert "Bearer [redacted]" in line and "bearer.[redacted]" in line


def test_configure_logging_sends_uvicorn_through_one_handler() -> None:
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    out = io.StringIO()
    try:
        configure_logging(fmt="json", level="info", stream=out)
        logging.getLogger("uvicorn.error").info("Started server process [%d]", 42)
        logging.getLogger("bargein.test").debug("below the level")
    finally:  # give pytest and the live server their logging back
        for lg, (handlers, level, propagate) in zip(loggers, saved):
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate
    lines = out.getvalue().splitlines()
    assert [json.loads(line)["msg"] for line in lines] == ["Started server process [42]"]


@pytest.fixture
def request_log() -> Iterator[io.StringIO]:
    """Lines of the ``bargein`` loggers at INFO, as the server would write them (JSON)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(StructuredFormatter("json"))
    logger = logging.getLogger("bargein")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.slow
async def test_a_request_logs_its_ids_and_no_text(live_server: LiveServer, request_log: io.StringIO) -> None:
    question = "Please describe the zebra named Quintessa-Marigold in one sentence."
    async with RealtimeClient(live_server.ws_url) as client:
        answer = await client.chat(question, max_tokens=12, temperature=0)
        response = client.current
        assert response is not None and response.done is not None
        session_id = client.session["session_id"]
    await live_server.wait_idle()

    def lines() -> list[dict[str, str]]:
        return [json.loads(line) for line in request_log.getvalue().splitlines()]

    def disconnected() -> bool:  # the disconnect line comes after the client left
        return any(f["msg"] == "client disconnected" and f.get("session_id") == session_id for f in lines())

    def finished() -> bool:
        return any(
            f["msg"] == "response finished" and f.get("stream_id") == response.stream_id for f in lines()
        )

    await wait_until(
        lambda: disconnected() and finished(), "the disconnect and the finish logged", poll_s=0.05
    )
    text = request_log.getvalue()
    mine = [f for f in lines() if f.get("stream_id") == response.stream_id]
    assert [f["msg"] for f in mine] == ["response submitted", "response finished"]
    for fields in mine:
        assert (fields["request_id"], fields["session_id"]) == (response.response_id, session_id)
    assert mine[1]["finish_reason"] == response.done["finish_reason"]
    assert mine[1]["completion_tokens"] == response.done["end"]
    assert "Quintessa" not in text
    assert answer.strip() and answer.strip() not in text


# ---- faults of one client: one quiet line, never a traceback ---------------------


def test_a_password_in_a_url_is_scrubbed_from_messages_and_tracebacks() -> None:
    try:
        raise ValueError("redis url 'redis+sentinel://:s3cr3t@h:26379' needs the Sentinel master name")
    except ValueError:
        rec = record("lifespan failed for %s", "rediss://admin:p@ss:w0rd@h:6380/0")
        rec.exc_info = sys.exc_info()
    line = StructuredFormatter("json").format(rec)
    assert "s3cr3t" not in line and "w0rd" not in line
    assert "rediss://admin:[redacted]@h:6380/0" in line and "redis+sentinel://:[redacted]@h" in line
    assert "http://127.0.0.1:8000/v1/models" in _scrub_line("http://127.0.0.1:8000/v1/models")


def _scrub_line(text: str) -> str:
    return StructuredFormatter("logfmt").fields(record("%s", text))["msg"]


def test_a_key_in_a_query_string_is_scrubbed_from_access_lines() -> None:
    rec = record(
        '%s - "%s %s HTTP/%s" %d',
        "127.0.0.1:5",
        "GET",
        "/v1/models?x=1&api_key=sk-live-1&token=rt-2&Key=sk-live-3",
        "1.1",
        401,
    )
    line = StructuredFormatter("logfmt").format(rec)
    assert "sk-live" not in line and "rt-2" not in line
    assert "x=1&api_key=[redacted]&token=[redacted]&Key=[redacted]" in line


@pytest.mark.slow
async def test_invalid_utf8_frames_log_one_info_line_per_connection_no_traceback(
    live_server: LiveServer, request_log: io.StringIO
) -> None:
    num_connections = 4
    with server_log("uvicorn.error", "bargein") as log:
        for _ in range(num_connections):
            async with connect(live_server.ws_url) as ws:
                await ws.recv()  # session.created
                # One bad frame: the server closes at the first, and frames
                # sent after it could make its TCP stack reset the connection
                # before the client reads the close frame.
                await ws.send(b'{"type": "ping", "x": "\xff\xfe"}', text=True)
                with pytest.raises(ConnectionClosed) as closed:
                    await ws.recv()
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
        await live_server.wait_idle()
        await wait_until(
            lambda: len(_utf8_lines(request_log)) >= num_connections, "a line per connection", poll_s=0.05
        )
    assert not log.with_traceback() and not log.at_least(logging.WARNING), log.messages()
    lines = _utf8_lines(request_log)
    assert len(lines) == num_connections
    assert all(f["level"] == "info" and f["logger"] == "bargein.client" for f in lines)
    assert len({f["session_id"] for f in lines}) == num_connections  # one per connection


@pytest.mark.slow
async def test_a_client_that_leaves_mid_body_leaves_no_traceback(live_server: LiveServer) -> None:
    with server_log("uvicorn.error", "bargein") as log:
        with socket.create_connection((live_server.host, live_server.port)) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                b'{"messages"'
            )
        await wait_until(
            lambda: any("whole request body" in m for m in log.messages()) or bool(log.with_traceback()),
            "the half-sent body's line",
            poll_s=0.05,
        )
    assert not log.with_traceback() and not log.at_least(logging.WARNING), log.messages()


def _utf8_lines(out: io.StringIO) -> list[dict[str, str]]:
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    return [f for f in lines if "invalid UTF-8" in f["msg"]]
