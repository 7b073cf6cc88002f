"""Resume and session tokens: HMAC-SHA256 over (purpose, id, principal) with a server secret.

A token proves that whoever holds it was given it by a server with the same
secret for that stream (or session) and that principal: any node of a cluster
sharing the secret can check it without a lookup. Tokens do not expire on
their own; the stream's (session's) retention bounds their use.

Format: the unpadded URL-safe base64 of the 32-byte HMAC-SHA256 (RFC 2104) of
``purpose NUL len(id) ":" id NUL len(principal) ":" principal`` (UTF-8);
the length prefixes keep ``("a\\0b", "c")`` and ``("a", "b\\0c")`` apart and the
purpose keeps a resume token from passing as a session token.
Comparison is constant-time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def _mac(secret: bytes, purpose: str, object_id: str, principal: str) -> str:
    if not secret:
        raise ValueError("the token secret must not be empty")
    message = f"{purpose}\0{len(object_id)}:{object_id}\0{len(principal)}:{principal}"
    digest = hmac.new(secret, message.encode("utf-8"), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _check(secret: bytes, purpose: str, object_id: str, principal: str, token: str) -> bool:
    expected = _mac(secret, purpose, object_id, principal)
    # compare_digest on str requires ASCII; a non-ASCII token is simply wrong.
    return hmac.compare_digest(expected.encode("ascii"), token.encode("utf-8", "replace"))


def make_resume_token(secret: bytes, stream_id: str, principal: str) -> str:
    """The ``resume_token`` of ``response.created``: 43 URL-safe base64 characters.

    Raises ValueError for an empty secret.
    """
    return _mac(secret, "bargein.resume.v1", stream_id, principal)


def check_resume_token(secret: bytes, stream_id: str, principal: str, token: str) -> bool:
    """True when ``token`` was made for this stream and principal with ``secret``."""
    return _check(secret, "bargein.resume.v1", stream_id, principal, token)


def make_session_token(secret: bytes, session_id: str, principal: str) -> str:
    """The ``session_token`` of ``session.created``: 43 URL-safe base64 characters.

    Raises ValueError for an empty secret.
    """
    return _mac(secret, "bargein.session.v1", session_id, principal)


def check_session_token(secret: bytes, session_id: str, principal: str, token: str) -> bool:
    """True when ``token`` was made for this session and principal with ``secret``."""
    return _check(secret, "bargein.session.v1", session_id, principal, token)
