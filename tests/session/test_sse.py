"""SSE framing and stream-position event ids."""

from __future__ import annotations

import pytest

from bargein.app.openai.sse import event_id, format_event, parse_event_id


def test_an_event_is_id_then_data_then_a_blank_line() -> None:
    assert format_event('{"a":1}', event_id="s1:4") == b'id: s1:4\ndata: {"a":1}\n\n'
    assert format_event("[DONE]") == b"data: [DONE]\n\n"


def test_line_breaks_split_data_lines_and_nothing_else() -> None:
    assert format_event("a\nb\r\nc") == b"data: a\ndata: b\ndata: c\n\n"
    # U+2028 is a line break for str.splitlines, not for SSE.
    assert format_event("x\u2028y") == "data: x\u2028y\n\n".encode()
    assert format_event("") == b"data: \n\n"


def test_an_id_with_a_line_break_is_refused() -> None:
    with pytest.raises(ValueError):
        format_event("x", event_id="a\nid: b:1")


def test_event_ids_round_trip() -> None:
    assert parse_event_id(event_id("abc", 12)) == ("abc", 12)
    assert parse_event_id(" a:b:3 ") == ("a:b", 3)  # the offset is after the last colon


@pytest.mark.parametrize("bad", ["", "abc", ":3", "abc:", "abc:-1", "abc:1.5", "abc:٣", "x" * 129 + ":1"])
def test_malformed_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_event_id(bad)


@pytest.mark.parametrize("end", ["9" * 5000, str(2**64), str(2**31)])
def test_ids_past_the_largest_offset_are_refused_without_parsing_them(end: str) -> None:
    with pytest.raises(ValueError, match="at most"):
        parse_event_id(f"abc:{end}")
    assert parse_event_id(f"abc:{2**31 - 1}") == ("abc", 2**31 - 1)
