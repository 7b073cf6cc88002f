"""Which output tokens' KV a barge-in keeps: those whose text lies within the heard text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bargein.session.runtime.live import kept_output_tokens

# One entry per engine step: " Paris" is one token, "é" took two (its first byte shows no text).
TEXTS = ["Once", " upon", "", "é", " a", " time"]
ENDS = [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("kept_chars", "tokens"),
    [
        (None, 6),  # all of it (a cancel that keeps every logged token)
        (0, 0),  # nothing heard
        (4, 1),  # "Once": a cut at a token boundary
        (6, 1),  # inside " upon": the token crosses the cut, so it is recomputed
        (9, 2),  # "Once upon"
        (10, 4),  # "Once uponé": the empty entry counts with the one that completes it
        (16, 5),  # inside " time"
        (17, 6),  # the full text
        (10_000, 6),  # more than was logged
    ],
)
def test_kept_tokens_stop_at_the_last_whole_token_inside_the_cut(kept_chars: int | None, tokens: int) -> None:
    assert kept_output_tokens(TEXTS, ENDS, kept_chars) == tokens


def test_nothing_logged_keeps_nothing() -> None:
    assert kept_output_tokens([], [], None) == 0
    assert kept_output_tokens([], [], 5) == 0


@given(
    texts=st.lists(st.text(alphabet="ab é", max_size=3), min_size=1, max_size=12),
    cut=st.integers(min_value=0, max_value=40),
)
def test_the_kept_tokens_text_is_a_prefix_of_the_heard_text(texts: list[str], cut: int) -> None:
    ends = list(range(1, len(texts) + 1))
    kept = kept_output_tokens(texts, ends, cut)
    heard = "".join(texts)[:cut]
    kept_text = "".join(texts[:kept])
    assert heard.startswith(kept_text)
    # and maximal: the next entry with text would cross the cut
    rest = [t for t in texts[kept:] if t]
    assert not rest or len(kept_text) + len(rest[0]) > cut
