"""Resume under every kind of disconnect, over real sockets on the bundled model.

The torture test cuts one greedy answer at 50 points: a few while the answer
is still being generated (each its own stream, since a cut of a live stream
can happen once), the rest against the completed stream, replayed from the
log. Resume on the Redis backend runs on two more servers in this process
that share ``live_server``'s engine loop (no second model load): two nodes
on one redis-server.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings
from bargein.session.conversation.actions import Message
from bargein.session.conversation.chat import render_prompt
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.saved import SavedSession
from bargein.session.runtime.tokens import make_session_token
from bargein.session.streams.log.redis_format import Keys
from loadtests.bare_client import Conn, Received, assert_tiles
from tests.app.conftest import MAX_FRAME_BYTES, LiveServer
from tests.waiting import wait_until_async

pytestmark = pytest.mark.slow

# Greedy SmolLM2 answers this with Japanese script among English words: many
# of its tokens are pieces of a UTF-8 character (alone they decode to U+FFFD).
PROMPT = (
    "How do you say 'thank you' in Japanese? Give the Japanese script and romaji, "
    "then a short explanation in English."
)
N = 48  # tokens of the answer (live_server allows 64)
NUM_ROUNDS = 50
NUM_LIVE_ROUNDS = 6


async def _reference(live_server: LiveServer) -> tuple[dict[str, Any], Received]:
    """One uninterrupted greedy run: its response.created and all it received."""
    conn = await Conn.open(live_server.ws_url)
    await conn.send(type="session.update", session={"include_token_ids": True})
    await conn.expect("session.updated")
    created = await conn.create(PROMPT, temperature=0.0, max_tokens=N)
    received = await conn.read(Received())
    await conn.close()
    assert received.done is not None and received.done["end"] == N
    assert_tiles(received.deltas, 0, N)
    return created, received


def _cut_points(reference: Received, tokenizer: Any, rng: random.Random) -> list[int]:
    """Offsets a replay round starts from: the edge cases, then random boundaries."""
    boundaries = [0] + [d["end"] for d in reference.deltas]  # offsets a client can hold
    ids = [t for d in reference.deltas for t in d["token_ids"]]
    mid_char = [b for b in boundaries if 0 < b <= len(ids) and "\ufffd" in tokenizer.decode([ids[b - 1]])]
    assert len(mid_char) >= 3, "the answer should hold multi-token characters"
    edges = [0, N - 1, N, *rng.sample(mid_char, 3)]
    assert N - 1 in boundaries, "a delta should end right before the last token"
    rest = NUM_ROUNDS - NUM_LIVE_ROUNDS - len(edges)
    return edges + [rng.choice(boundaries) for _ in range(rest)]


def _prefix(reference: Received, offset: int) -> str:
    """Text of the reference's tokens ``[0, offset)`` (``offset`` a delta boundary)."""
    return "".join(d["text"] for d in reference.deltas if d["end"] <= offset)


async def _replay_round(
    url: str, created: dict[str, Any], reference: Received, start: int, num_before_drop: int
) -> int:
    """Read from ``start``, drop after ``num_before_drop`` deltas, resume from the
    last end received; check the joined text. Returns the cut offset."""
    first = await Conn.open(url)
    await first.resume(created["stream_id"], created["resume_token"], start)
    before = await first.read(Received(), max_deltas=num_before_drop)
    first.drop()
    cut = start if before.end is None else before.end
    if before.done is not None:  # it ended before the drop: nothing left but its end
        assert before.done["end"] == N and cut == N
    assert_tiles(before.deltas, start, cut)
    second = await Conn.open(url)
    resumed = await second.resume(created["stream_id"], created["resume_token"], cut)
    assert resumed["status"] == "complete" and resumed["from"] == cut
    after = await second.read(Received())
    await second.close()
    assert_tiles(after.deltas, cut, N)
    assert after.done is not None and after.done["end"] == N
    joined = _prefix(reference, start) + before.text + after.text
    assert joined.encode() == reference.text.encode(), (start, cut)
    return cut


async def _live_round(live_server: LiveServer, target: int) -> tuple[int, str, Received]:
    """A new greedy response of its own, dropped once ``target`` tokens came
    (while it generates), resumed on a new connection. Returns the cut offset,
    the stream's status at the resume, and all received on both connections."""
    first = await Conn.open(live_server.ws_url)
    created = await first.create(PROMPT, temperature=0.0, max_tokens=N)
    before = Received()
    while (before.end or 0) < target:
        await first.read(before, max_deltas=1)
    first.drop()
    cut = before.end or 0
    second = await Conn.open(live_server.ws_url)
    resumed = await second.resume(created["stream_id"], created["resume_token"], cut)
    after = await second.read(Received())
    await second.close()
    assert_tiles(before.deltas, 0, cut)
    assert_tiles(after.deltas, cut, N)
    return cut, resumed["status"], Received(deltas=before.deltas + after.deltas, done=after.done)


async def test_resume_torture(live_server: LiveServer) -> None:
    """50 cuts of one greedy answer: joined text byte-exact, offsets tile, no
    token generated twice."""
    rng = random.Random(20261129)
    await live_server.wait_idle()
    tokens_at_start = live_server.stats().num_generated_tokens
    # The reference and the live rounds generate at once (one batch, greedy
    # output does not depend on it): drop before the first token, right
    # before the end, and in between.
    targets = (0, N - 1, *(rng.randrange(1, N - 1) for _ in range(NUM_LIVE_ROUNDS - 2)))
    (created, reference), *live = await asyncio.gather(
        _reference(live_server), *(_live_round(live_server, t) for t in targets)
    )
    assert any(ord(c) > 127 for c in reference.text)
    cuts = []
    for cut, _, received in live:
        assert received.text.encode() == reference.text.encode(), cut
        cuts.append(cut)
    assert sum(status == "live" for _, status, _ in live) >= NUM_LIVE_ROUNDS // 2
    await live_server.wait_idle()
    tokens_after_live = live_server.stats().num_generated_tokens
    assert tokens_after_live - tokens_at_start == (1 + NUM_LIVE_ROUNDS) * N
    for start in _cut_points(reference, live_server.tokenizer, rng):
        cuts.append(
            await _replay_round(
                live_server.ws_url, created, reference, start, num_before_drop=rng.choice((0, 0, 1, 2))
            )
        )
    assert len(cuts) == NUM_ROUNDS and {0, N - 1, N} <= set(cuts)
    # Once from an earlier offset than the last end received: the log still has it.
    earlier = reference.deltas[6]["end"]
    conn = await Conn.open(live_server.ws_url)
    await conn.resume(created["stream_id"], created["resume_token"], earlier)
    again = await conn.read(Received())
    await conn.close()
    assert_tiles(again.deltas, earlier, N)
    assert (_prefix(reference, earlier) + again.text).encode() == reference.text.encode()
    assert live_server.stats().num_generated_tokens == tokens_after_live, "a replay must not generate"


# ---- session.resume -------------------------------------------------------------

TURNS = ("My name is Alice. Say hello to me.", "Now count from one to twenty in words.", "What is my name?")


def _twin(
    live_server: LiveServer, *, node_id: str, redis_url: str | None = None, abandon_grace_s: float = 30.0
) -> EmbeddedServer:
    """Another server in this process on ``live_server``'s engine loop."""
    server = EmbeddedServer(
        Settings(
            session=SessionConfig(
                max_tokens=64,
                default_max_tokens=32,
                max_frame_bytes=MAX_FRAME_BYTES,
                abandon_grace_s=abandon_grace_s,
            ),
            server=ServerConfig(
                port=0,
                debug_endpoints=True,
                log_level="warning",
                redis_url=redis_url,
                token_log_backend="redis" if redis_url else "memory",
                node_id=node_id,
                secret="test-resume-secret",
            ),
        ),
        runner=live_server.state.runner,
    )
    server.start()
    return server


async def _second_turn_dropped(url: str) -> tuple[Conn, Received, dict[str, Any], Received]:
    """Turn one in full, turn two dropped after two deltas: (the dropped
    connection, turn one, turn two's response.created, what came of it)."""
    conn = await Conn.open(url)
    await conn.create(TURNS[0], temperature=0.0, max_tokens=12)
    first = await conn.read(Received())
    created = await conn.create(TURNS[1], temperature=0.0, max_tokens=40)
    before = await conn.read(Received(), max_deltas=2)
    conn.drop()
    assert before.done is None
    return conn, first, created, before


async def _resume_second_turn(url: str, dropped: Conn, created: dict[str, Any], before: Received) -> str:
    """On a new connection: session.resume, stream.resume from the last end,
    then turn three. Returns turn two's whole text."""
    conn = await Conn.open(url)
    await conn.send(
        type="session.resume",
        session_id=dropped.created["session_id"],
        session_token=dropped.created["session_token"],
    )
    resumed = await conn.expect("session.resumed")
    active = resumed["active"]
    assert resumed["session_id"] == dropped.created["session_id"]
    assert resumed["turns"] in (3, 4)  # turn two's answer counts once it has ended
    assert active["stream_id"] == created["stream_id"]
    assert active["response_id"] == created["response_id"] and active["end"] >= before.end
    await conn.resume(active["stream_id"], active["resume_token"], before.end)
    after = await conn.read(Received())
    assert after.done is not None
    assert_tiles(before.deltas + after.deltas, 0, after.done["end"])
    await conn.create(TURNS[2], temperature=0.0, max_tokens=4)
    await conn.read(Received())
    await conn.close()
    return before.text + after.text


def _assert_third_prompt(tokenizer: Any, prompt_ids: tuple[int, ...], first: str, second: str) -> None:
    """Turn three's prompt is the whole conversation, each turn exactly once."""
    expected = render_prompt(
        tokenizer,
        (
            Message(role="user", content=TURNS[0]),
            Message(role="assistant", content=first),
            Message(role="user", content=TURNS[1]),
            Message(role="assistant", content=second),
            Message(role="user", content=TURNS[2]),
        ),
    )
    assert tuple(prompt_ids) == expected
    text = tokenizer.decode(prompt_ids)
    assert text.count(first) == 1 and text.count(second) == 1


async def test_drop_in_second_turn_then_session_resume(live_server: LiveServer) -> None:
    dropped, first, created, before = await _second_turn_dropped(live_server.ws_url)
    second = await _resume_second_turn(live_server.ws_url, dropped, created, before)
    _assert_third_prompt(
        live_server.tokenizer, live_server.recent_requests()[-1].prompt_token_ids, first.text, second
    )


async def wait_saved_at_close(
    load: Callable[[str], Awaitable[bytes | None]], session_id: str, before: Received
) -> None:
    """Wait until the node saved the dropped connection's end: its active
    response counts at least the deltas the client read (``before``).

    Until the node notices the drop, the last save may be older than the
    turn (saves come at most every ``save_interval_s``), and the node may
    have written deltas past those the client read before the socket went:
    the close's save counts what reached the socket, a prefix-extension of
    what the client read.
    """

    async def saved() -> bool:
        data = await load(session_id)
        active = None if data is None else SavedSession.from_bytes(data).active
        return active is not None and active.delivered.startswith(before.text)

    await wait_until_async(saved, "the dropped connection's state to be saved")


async def test_barge_in_after_a_resume_from_before_the_delivered_end(live_server: LiveServer) -> None:
    """The kept turn is what the client holds. Resumed from 0, the replay
    repeats what the dropped connection had delivered; it is not counted twice."""
    # A long answer (greedy, it runs to max_tokens), so the cancel finds it
    # live: a short one ("One hundred.", 4 tokens) could end first, and a
    # cancel of an ended response is answered with its response.done again.
    question = "Write a long story about a dragon."
    dropped = await Conn.open(live_server.ws_url)
    created = await dropped.create(question, temperature=0.0, max_tokens=64)
    before = await dropped.read(Received(), max_deltas=2)
    dropped.drop()
    service = live_server.state.service  # type: ignore[union-attr]
    await wait_saved_at_close(service.log.load_session, dropped.created["session_id"], before)
    conn = await Conn.open(live_server.ws_url)
    await conn.send(
        type="session.resume",
        session_id=dropped.created["session_id"],
        session_token=dropped.created["session_token"],
    )
    active = (await conn.expect("session.resumed"))["active"]
    assert active is not None and active["stream_id"] == created["stream_id"]
    resumed = await conn.resume(active["stream_id"], active["resume_token"], 0)
    assert resumed["status"] == "live"  # the barge-in below cuts a live answer
    held = Received()
    while len(held.text) <= len(before.text):  # the replay, then past what was saved
        await conn.read(held, max_deltas=1)
    heard = held.text
    assert heard.startswith(before.text) and held.done is None
    await conn.send(type="response.cancel", response_id=created["response_id"], heard_chars=len(heard))
    await conn.read(Received())  # to response.done
    await conn.create("Say hi.", temperature=0.0, max_tokens=2)
    await conn.read(Received())
    await conn.close()
    expected = render_prompt(
        live_server.tokenizer,
        (
            Message(role="user", content=question),
            Message(role="assistant", content=heard),
            Message(role="user", content="Say hi."),
        ),
    )
    assert tuple(live_server.recent_requests()[-1].prompt_token_ids) == expected


async def test_session_resume_refusals(live_server: LiveServer) -> None:
    conn = await Conn.open(live_server.ws_url)
    session_id = conn.created["session_id"]
    await conn.send(type="session.resume", session_id=session_id, session_token="x" * 43)
    assert (await conn.expect("error"))["code"] == "forbidden"
    secret = live_server.state.service.secret  # type: ignore[union-attr]
    unknown = "no-such-session"
    await conn.send(
        type="session.resume",
        session_id=unknown,
        session_token=make_session_token(secret, unknown, "anonymous"),
    )
    assert (await conn.expect("error"))["code"] == "not_found"
    await conn.create("Hi", max_tokens=2)
    await conn.read(Received())
    await conn.send(type="session.resume", session_id=session_id, session_token=conn.created["session_token"])
    assert (await conn.expect("error"))["code"] == "conflict"
    await conn.close()


NUM_UPDATES = 400


async def test_a_burst_of_session_updates_is_saved_once_per_interval(
    live_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each session.update used to save (re-encode) the whole conversation and
    push one more expiry item in the memory log. Saves are coalesced: over a
    burst, at most one per ``save_interval_s`` (a bound that only widens on a
    slow machine), and the last state is saved when the connection closes."""
    service = live_server.state.service
    assert service is not None
    log = service.log
    saves: list[str] = []
    real_save = log.save_session

    async def counting_save(session_id: str, state: bytes) -> None:
        saves.append(session_id)
        await real_save(session_id, state)

    monkeypatch.setattr(log, "save_session", counting_save)
    conn = await Conn.open(live_server.ws_url)
    session_id = conn.created["session_id"]
    heap_before = log.num_expiry_entries  # type: ignore[attr-defined]
    started = time.monotonic()
    for i in range(NUM_UPDATES):
        await conn.send(type="session.update", session={"instructions": f"Be brief, {i}."})
        await conn.expect("session.updated")
    elapsed = time.monotonic() - started
    num_saves = saves.count(session_id)
    assert num_saves <= elapsed / service.config.save_interval_s + 2, (num_saves, elapsed)
    assert log.num_expiry_entries - heap_before <= num_saves + 64  # type: ignore[attr-defined]
    await conn.close()

    async def last_saved() -> bool:
        data = await log.load_session(session_id)
        return (
            data is not None
            and SavedSession.from_bytes(data).settings.instructions == f"Be brief, {NUM_UPDATES - 1}."
        )

    await wait_until_async(last_saved, "the last state to be saved (at close)")


@pytest.fixture(scope="module")
def redis_nodes(
    live_server: LiveServer, redis_server: str
) -> Iterator[tuple[EmbeddedServer, EmbeddedServer]]:
    """Two nodes on one redis-server, both on live_server's engine loop."""
    first = _twin(live_server, node_id="resume-a", redis_url=redis_server)
    try:
        second = _twin(live_server, node_id="resume-b", redis_url=redis_server)
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


@pytest.mark.redis
async def test_session_resume_on_another_node_over_redis(
    live_server: LiveServer, redis_nodes: tuple[EmbeddedServer, EmbeddedServer], redis_server: str
) -> None:
    node_a, node_b = redis_nodes
    dropped, first, created, before = await _second_turn_dropped(node_a.ws_url)
    # a client that resumes on node b before node a saved turn two resumes turn one
    raw = Redis.from_url(redis_server)
    try:
        await wait_saved_at_close(
            lambda session_id: raw.get(Keys("bargein:").session(session_id)),
            dropped.created["session_id"],
            before,
        )
    finally:
        await raw.aclose()
    second = await _resume_second_turn(node_b.ws_url, dropped, created, before)
    assert node_b.state.service is not None
    prompt_ids = node_b.state.service.recent_requests[-1].prompt_token_ids
    _assert_third_prompt(live_server.tokenizer, prompt_ids, first.text, second)


# ---- what a slow or vanished client holds ------------------------------------------


async def test_slow_reader_holds_no_kv_blocks(live_server: LiveServer) -> None:
    """The blocks are free once generation ended, while the client is still
    reading: it reads one delta, then nothing until the engine is idle (so
    "still reading" holds by construction, however fast the engine is)."""
    idle = await live_server.wait_idle()
    assert idle.num_free_blocks == idle.num_total_blocks
    conn = await Conn.open(live_server.ws_url)
    await conn.create(PROMPT, temperature=0.0, max_tokens=16)
    received = Received()
    await conn.read(received, max_deltas=1)
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert received.done is None, "still reading"
    await conn.read(received)
    await conn.close()
    assert received.done is not None and received.done["end"] == 16
    assert_tiles(received.deltas, 0, 16)


@pytest.fixture(scope="module")
def short_grace(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """A server on live_server's runner that cancels streams abandoned 0.5 s."""
    server = _twin(live_server, node_id="grace", abandon_grace_s=0.5)
    try:
        yield server
    finally:
        server.stop()


async def test_abandoned_stream_is_cancelled_after_the_grace_time(
    live_server: LiveServer, short_grace: EmbeddedServer
) -> None:
    url = short_grace.ws_url
    max_tokens = 64  # generating them outlasts the 0.5 s grace even on a quiet machine
    # Resumed within the grace time: it runs to the end.
    first = await Conn.open(url)
    second = await Conn.open(url)  # open before the drop: the resume comes at once
    created = await first.create(PROMPT, temperature=0.0, max_tokens=max_tokens)
    before = await first.read(Received(), max_deltas=1)
    first.drop()
    await second.resume(created["stream_id"], created["resume_token"], before.end or 0)
    kept = await second.read(Received())
    await second.close()
    assert kept.done is not None and kept.done["finish_reason"] == "length"
    # Nobody resumes it: cancelled, its blocks freed before the answer's end.
    third = await Conn.open(url)
    created = await third.create(PROMPT, temperature=0.0, max_tokens=max_tokens)
    await third.read(Received(), max_deltas=1)
    third.drop()
    stats = await live_server.wait_idle()
    assert stats.num_free_blocks == stats.num_total_blocks
    late = await Conn.open(url)
    await late.resume(created["stream_id"], created["resume_token"], 0)
    ended = await late.read(Received())
    await late.close()
    assert ended.done is not None and ended.done["finish_reason"] == "cancelled"
    assert ended.done["end"] < max_tokens
