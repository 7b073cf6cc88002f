"""A client's voice work kept to its share on a real server (issue 36, p04):
input audio sent faster than its pace is left unread, so it costs the event
loop nothing the other connections need."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from bargein.app.embedded import EmbeddedServer
from bargein.session.voice_runtime.config import VoiceConfig
from loadtests.bare_client import Conn
from loadtests.speech import noise_pcm16
from tests.app.conftest import LiveServer
from tests.app.voice_helpers import voice_server

pytestmark = pytest.mark.slow

RATE = 16000
SPEED = 4.0  # --max-input-audio-speed of the server below, with no burst
FLOOD_FRAMES = 40  # appends of 1 s, back to back: ten times what the pace takes in that time


@pytest.fixture(scope="module")
def paced_server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """live_server's engine and voice models, input audio paced at 4x real
    time with no burst (one 1 s append is due every 250 ms)."""
    with voice_server(
        live_server, VoiceConfig(speculate=False, max_input_audio_speed=SPEED, input_audio_burst_ms=0)
    ) as server:
        yield server


def url(server: EmbeddedServer) -> str:
    return f"ws://{server.host}:{server.port}/v1/realtime"


async def text_input(conn: Conn) -> None:
    """Input at RATE without turn detection (the client commits or clears)."""
    await conn.send(
        type="session.update", session={"audio": {"input": {"sample_rate": RATE, "turn_detection": None}}}
    )
    await conn.expect("session.updated")


async def collect(conn: Conn, into: list[dict[str, Any]]) -> None:
    """Read every event of ``conn`` into ``into`` until its pong."""
    while True:
        event = json.loads(await conn.ws.recv())
        into.append(event)
        if event["type"] == "pong":
            return


async def pings(conn: Conn, stop: asyncio.Event) -> int:
    """``ping``s one after the other until ``stop``; how many were answered."""
    answered = 0
    while not stop.is_set():
        await conn.send(type="ping")
        await conn.expect("pong")
        answered += 1
        await asyncio.sleep(0.02)  # the client's own pace of pings: not a wait for a state
    return answered


async def test_appends_past_the_pace_are_left_unread_while_the_others_are_served(
    paced_server: EmbeddedServer,
) -> None:
    """A client that streams appends back to back without waiting is not
    answered a refusal per frame (a decode and an error each, on the loop):
    after each refusal its frames stay unread until the pace takes audio
    again, so the next append is taken and at most every other one is
    refused; another connection is answered all along."""
    second = base64.b64encode(noise_pcm16(1000, RATE, dbfs=-50)).decode()
    flooder, other = await Conn.open(url(paced_server)), await Conn.open(url(paced_server))
    try:
        await text_input(flooder)
        events: list[dict[str, Any]] = []
        reader = asyncio.create_task(collect(flooder, events))
        stop = asyncio.Event()
        pinger = asyncio.create_task(pings(other, stop))
        for n in range(FLOOD_FRAMES):
            await flooder.send(type="input_audio.append", audio=second, event_id=f"a{n}")
            await flooder.send(type="input_audio.clear")  # the audio taken never fills the buffer
        await flooder.send(type="ping")
        await asyncio.wait_for(reader, 120)
        stop.set()
        assert await asyncio.wait_for(pinger, 60) > 0
        async with httpx.AsyncClient() as client:
            health = await client.get(f"http://{paced_server.host}:{paced_server.port}/healthz")
        assert health.status_code == 200

        refused = [e for e in events if e["type"] == "error"]
        assert {e["code"] for e in refused} <= {"rate_limited"}, refused
        assert all(e["retry_after_ms"] <= 1000 / SPEED for e in refused), refused
        # Every refusal is followed by the reader's pause, after which the
        # next append is due: never two refusals in a row. Without the pause
        # the 40 appends, sent in far less than 10 s, were nearly all refused.
        numbers = [int(e["event_id"][1:]) for e in refused]
        assert all(b > a + 1 for a, b in zip(numbers, numbers[1:], strict=False)), numbers
        assert len(refused) <= FLOOD_FRAMES // 2
    finally:
        await flooder.ws.close()
        await other.ws.close()
