"""Resume and session tokens: accepted only for the same secret, id, principal and purpose."""

from __future__ import annotations

import pytest

from bargein.session.runtime.tokens import (
    check_resume_token,
    check_session_token,
    make_resume_token,
    make_session_token,
)

SECRET = b"server-secret"


def test_resume_token_round_trip_and_is_url_safe() -> None:
    token = make_resume_token(SECRET, "stream-1", "alice")
    assert len(token) == 43 and token.replace("-", "a").replace("_", "a").isalnum()
    assert check_resume_token(SECRET, "stream-1", "alice", token)


@pytest.mark.parametrize(
    ("secret", "stream_id", "principal"),
    [(b"other-secret", "stream-1", "alice"), (SECRET, "stream-2", "alice"), (SECRET, "stream-1", "bob")],
    ids=["secret", "stream", "principal"],
)
def test_resume_token_rejected_when_anything_differs(secret: bytes, stream_id: str, principal: str) -> None:
    token = make_resume_token(SECRET, "stream-1", "alice")
    assert not check_resume_token(secret, stream_id, principal, token)


def test_field_boundaries_cannot_be_shifted() -> None:
    token = make_resume_token(SECRET, "a\0b", "c")
    assert not check_resume_token(SECRET, "a", "b\0c", token)


def test_resume_and_session_tokens_are_not_interchangeable() -> None:
    token = make_resume_token(SECRET, "x", "alice")
    assert not check_session_token(SECRET, "x", "alice", token)
    session = make_session_token(SECRET, "x", "alice")
    assert check_session_token(SECRET, "x", "alice", session)
    assert not check_resume_token(SECRET, "x", "alice", session)


@pytest.mark.parametrize("garbage", ["", "not-a-token", "é" * 43, "A" * 43])
def test_garbage_tokens_are_rejected(garbage: str) -> None:
    assert not check_resume_token(SECRET, "stream-1", "alice", garbage)


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError):
        make_resume_token(b"", "s", "p")
