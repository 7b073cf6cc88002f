"""IncrementalDetokenizer against the bundled model's real tokenizer.

The oracle is ``tokenizer.decode(all output ids, skip_special_tokens=True)``:
whatever the chunking, the concatenated deltas must equal it (cut before the
stop string that completes first when stop strings are given), less the
U+FFFD that ends it when the ids stop inside a character.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from bargein.engine.detokenizer import IncrementalDetokenizer

Tokenizer = PreTrainedTokenizerBase

TEXTS = [
    "Hello, world! The answer is 42.",
    "family 👨\u200d👩\u200d👧\u200d👦 and flag 🏳\ufe0f\u200d🌈, thumbs 👍🏽, Japan 🇯🇵 🎉",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "café naïve résumé Ångström São Paulo Zürich",
    "combining: e\u0301 a\u0308 n\u0303 Tie\u0323\u0302ng Vie\u0323\u0302t, Z\u0351\u0307a\u0352lgo",
    "mixed: Ελληνικά русский العربية עברית हिन्दी 🤖✨ end",
]


@pytest.fixture(scope="session")
def tokenizer(hf_tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The bundled model's tokenizer (``bargein.engine.model.loader.load_tokenizer``), shared per session."""
    return hf_tokenizer


@pytest.fixture(scope="session")
def prompt_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """A chat-template prompt ending where the assistant's answer begins."""
    return tokenizer.encode("<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


def _feed(detok: IncrementalDetokenizer, ids: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """Feed ``ids`` in chunks of the given sizes (cycled), then flush; return all deltas."""
    deltas: list[str] = []
    i = k = 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        deltas.append(detok.add(ids[i : i + n]))
        i, k = i + n, k + 1
    deltas.append(detok.flush())
    return deltas


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_deltas_concatenate_to_full_decode(
    tokenizer: Tokenizer, prompt_ids: list[int], text: str, chunk: int
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    deltas = _feed(detok, ids, [chunk])
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == text
    assert detok.text == text
    assert not detok.stopped


@pytest.mark.slow
def test_no_delta_splits_a_character(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    # Emoji and CJK take several byte-level tokens per character: no delta may
    # hold a replacement char, and each ZWJ sequence may only arrive whole or
    # cut at its joiners, never inside a code point.
    text = TEXTS[1] + TEXTS[2]
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # really split across tokens
    deltas = _feed(IncrementalDetokenizer(tokenizer, prompt_ids), ids, [1])
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


@pytest.mark.slow
def test_special_tokens_are_skipped(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("Sure.<|im_end|>\n<|im_start|>assistant\nOk", add_special_tokens=False)
    deltas = _feed(IncrementalDetokenizer(tokenizer, prompt_ids), ids, [1])
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == "Sure.\nassistant\nOk"


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(TEXTS) | st.text(max_size=40), data=st.data())
def test_random_chunkings(
    tokenizer: Tokenizer, prompt_ids: list[int], text: str, data: st.DataObject
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=8))
    deltas = _feed(IncrementalDetokenizer(tokenizer, prompt_ids), ids, sizes)
    # Characters the byte-level vocabulary cannot give back (U+40000 decodes
    # to U+FFFD) end no stream either.
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_token_ids(tokenizer: Tokenizer, prompt_ids: list[int], data: st.DataObject) -> None:
    # Arbitrary ids (stray byte tokens, specials) as a sampling model may emit them.
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=30))
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    deltas = _feed(IncrementalDetokenizer(tokenizer, prompt_ids), ids, sizes)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")


@pytest.mark.slow
@pytest.mark.parametrize("text", TEXTS[1:3])
def test_a_sequence_cut_inside_a_character_drops_its_bytes(
    tokenizer: Tokenizer, prompt_ids: list[int], text: str
) -> None:
    # max_tokens, a stop token or an interrupt can end the output between the
    # byte tokens of one character: no delta, and so no stream text, may end
    # in U+FFFD; the text is everything up to the last whole character.
    ids = tokenizer.encode(text, add_special_tokens=False)
    cuts = [
        k
        for k in range(1, len(ids))
        if tokenizer.decode(ids[:k], skip_special_tokens=True).endswith("\ufffd")
    ]
    assert cuts, "the text must hold characters split over several tokens"
    for k in cuts:
        deltas = _feed(IncrementalDetokenizer(tokenizer, prompt_ids), ids[:k], [1])
        assert all("\ufffd" not in d for d in deltas)
        whole = tokenizer.decode(ids[:k], skip_special_tokens=True).rstrip("\ufffd")
        assert "".join(deltas) == whole and text.startswith(whole)


def _pieces(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


@pytest.mark.slow
@pytest.mark.parametrize("span", [2, 3])
def test_stop_string_spanning_tokens(tokenizer: Tokenizer, prompt_ids: list[int], span: int) -> None:
    text = "The quick brown fox jumps over the lazy dog and runs away."
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces = _pieces(tokenizer, ids)
    i = 3  # stop starts inside token i and ends inside token i + span - 1
    stop = pieces[i][1:] + "".join(pieces[i + 1 : i + span - 1]) + pieces[i + span - 1][:2]
    assert stop in text and text.find(stop) < len("".join(pieces[: i + 1]))
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=[stop])
    deltas = [detok.add([t]) for t in ids[: i + span]]
    assert detok.stopped
    assert "".join(deltas) == detok.text == text[: text.find(stop)]
    assert detok.add(ids[i + span :]) == "" and detok.flush() == ""


@pytest.mark.slow
def test_stop_string_over_multibyte_characters(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    text = "before 日本語 after 🎉 tail"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["本語 af"])
    deltas = _feed(detok, ids, [1])
    assert detok.stopped and "".join(deltas) == "before 日"


@pytest.mark.slow
def test_held_back_text_released_when_not_a_stop(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("hello world war", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["world peace"])
    out = [detok.add([t]) for t in ids]
    assert _pieces(tokenizer, ids) == ["hello", " world", " war"]
    assert out == ["hello", " ", "world war"]
    assert detok.flush() == "" and not detok.stopped


@pytest.mark.slow
def test_flush_releases_partial_stop_at_finish(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("see you tom", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["tomorrow"])
    held = "".join(detok.add([t]) for t in ids)
    assert held == "see you "
    assert detok.flush() == "tom"
    assert detok.text == "see you tom" and not detok.stopped
    assert detok.flush() == ""


@pytest.mark.slow
def test_stop_string_at_the_very_start(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("User: what next?", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["User:"])
    deltas = _feed(detok, ids, [1])
    assert detok.stopped and deltas == [""] * len(deltas) and detok.text == ""


@pytest.mark.slow
def test_first_completed_of_several_stop_strings_wins(tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
    ids = tokenizer.encode("alpha beta gamma delta", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, stop=["delta", "ta gam", "beta gamma delta!"])
    deltas = _feed(detok, ids, [4])
    assert detok.stopped and "".join(deltas) == "alpha be"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abc ", max_size=30),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
    data=st.data(),
)
def test_stop_matching_on_any_chunking(text: str, stops: list[str], data: st.DataObject) -> None:
    # A one-char-per-token tokenizer isolates the stop logic from the BPE.
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    detok = IncrementalDetokenizer(_CharTokenizer(), [], stop=stops)
    out = "".join(_feed(detok, [ord(c) for c in text], sizes))
    cut = _char_by_char_cut(text, stops)
    assert out == (text if cut is None else text[:cut])
    assert detok.stopped == (cut is not None)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc ", max_size=30),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3),
    min_tokens=st.integers(0, 12),
    data=st.data(),
)
@example(text="ab", stops=["a"], min_tokens=1, data=None).via("a chunk across the boundary")
def test_no_stop_string_ends_within_min_tokens(
    text: str, stops: list[str], min_tokens: int, data: st.DataObject | None
) -> None:
    # One token per character: a stop string counts only where it ends after
    # the first min_tokens characters (it may begin before), whatever the chunking.
    sizes = [2] if data is None else data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=5))
    detok = IncrementalDetokenizer(_CharTokenizer(), [], stop=stops, min_tokens=min_tokens)
    out = "".join(_feed(detok, [ord(c) for c in text], sizes))
    cut = _char_by_char_cut(text, stops, first=min_tokens + 1)
    assert out == (text if cut is None else text[:cut])
    assert detok.stopped == (cut is not None)


def _char_by_char_cut(text: str, stops: Sequence[str], first: int = 1) -> int | None:
    """Where a generator fed one character at a time would cut, checking stop
    strings from the ``first``-th character on, or None."""
    for k in range(first, len(text) + 1):
        ending = [s for s in stops if text[:k].endswith(s)]
        if ending:
            return k - max(map(len, ending))
    return None


def test_empty_stop_string_and_negative_min_tokens_are_refused() -> None:
    with pytest.raises(ValueError):
        IncrementalDetokenizer(_CharTokenizer(), [], stop=[""])
    with pytest.raises(ValueError):
        IncrementalDetokenizer(_CharTokenizer(), [], stop=["a"], min_tokens=-1)


class _CharTokenizer:
    """Token id = code point; enough of a tokenizer for ``decode``."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))
