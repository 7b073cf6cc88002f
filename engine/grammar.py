"""Constrained decoding: what a request's output must match, and the token masks that hold it to it.

A request may carry a :class:`GrammarSpec` (a JSON schema, any JSON object,
or a regex; a tool call is a JSON schema the session builds). The grammar
library is llguidance (Microsoft's, the Rust core of Guidance; vLLM's
second backend), chosen over xgrammar because it refuses a JSON schema
keyword it cannot enforce instead of ignoring it, and compiles a schema in
about a millisecond instead of tens; its masks take 15-30 us a token on the
bundled tokenizer, xgrammar's 3-6, both far below a step
(docs/perf/structured.md has the measurements).

- :func:`check_grammar` (pure, no tokenizer) refuses a spec the library
  cannot enforce, naming the keyword, before anything is scheduled.
- :class:`GrammarCompiler` wraps the model's tokenizer once and keeps the
  compiled grammars in an LRU cache keyed by spec; each sequence gets a
  copy of the compiled matcher (:meth:`GrammarCompiler.matcher`).
- :func:`fill_bitmask` writes the allowed tokens of several matchers into an
  ``int32`` bitmask (one bit per token id, llguidance's and xgrammar's
  layout); :func:`apply_bitmask` puts ``-inf`` on the logits of the tokens a
  row's bit forbids. The logits themselves are computed as for any row:
  masking is a step after them, so a constrained row's arithmetic is the
  unconstrained one's ("exact by default").

Whitespace outside strings is never free: JSON is compiled with
``whitespace_flexible`` off, so the output is compact (``,`` and ``:``
without spaces) and a model cannot loop on blanks to ``max_tokens``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from bargein.engine.errors import GrammarError
from bargein.engine.grammar_spec import GrammarKind, GrammarSpec

# whitespace_flexible off: compact JSON (llguidance's default separators "," and ":")
_JSON_OPTIONS: Any = {"whitespace_flexible": False}
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")
_KEYWORD = re.compile(r'"([^"]+)"')


def llguidance_grammar(spec: GrammarSpec) -> str:
    """The grammar as llguidance takes it (its JSON grammar format).

    Raises:
        GrammarError: a ``source`` that is not a JSON object (json_schema).
    """
    if spec.kind is GrammarKind.REGEX:
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    schema = spec.source if spec.kind is GrammarKind.JSON_SCHEMA else '{"type":"object"}'
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except ValueError as exc:
        raise GrammarError(f"the JSON schema is not a JSON object: {exc}") from exc


def check_grammar(spec: GrammarSpec) -> None:
    """Refuse a spec the library cannot enforce (pure: no tokenizer needed).

    Raises:
        GrammarError: with ``keyword`` set to the first schema keyword
            llguidance does not implement (``uniqueItems``, ``if``, ...), or
            ``None`` for another fault (a bad regex, an unresolvable
            ``$ref``, a schema no value satisfies); its message is
            llguidance's, shortened.
    """
    error = llguidance.LLMatcher.validate_grammar(llguidance_grammar(spec), None)
    if error:
        raise GrammarError(_shorten(error), keyword=unimplemented_keyword(error))


def unimplemented_keyword(error: str) -> str | None:
    """The first keyword an llguidance error says it does not implement, or None."""
    if "Unknown format" in error:  # a "format" value it does not know
        return "format"
    found = _UNIMPLEMENTED.search(error)
    if found is None:
        return None
    keyword = _KEYWORD.search(found.group(1))
    return keyword.group(1) if keyword else found.group(1).strip() or None


def _shorten(error: str) -> str:
    """The first line of an llguidance error, at most 300 characters."""
    return error.strip().splitlines()[0][:300] if error.strip() else "invalid grammar"


@dataclass(frozen=True, slots=True, kw_only=True)
class GrammarStats:
    """The compiler's counters.

    Attributes:
        num_compiled: grammars compiled (cache misses).
        num_cache_hits: matchers handed out from a cached grammar.
        compile_s: total seconds spent compiling (``time.perf_counter``).
        tokenizer_s: seconds spent wrapping the tokenizer (once).
    """

    num_compiled: int
    num_cache_hits: int
    compile_s: float
    tokenizer_s: float


class GrammarCompiler:
    """Compiles specs for one tokenizer; an LRU cache of compiled matchers.

    Args:
        tokenizer: a transformers fast tokenizer (wrapped at the first
            compile: about 1 s for the bundled 49,152-token vocabulary).
        vocab_size: the logits' width (may exceed the tokenizer's ids; the
            extra ids are never allowed).
        eos_token_ids: the tokens that end a sequence: the grammar allows them
            where its text may end.
        cache_size: compiled grammars kept.

    Thread-safe (the engine thread compiles; tests may share one).
    """

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int], cache_size: int = 256
    ) -> None:
        assert cache_size >= 1, cache_size
        self.vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self._lltok: Any = None
        self._cache: OrderedDict[GrammarSpec, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._num_compiled = 0
        self._num_hits = 0
        self._compile_s = 0.0
        self._tokenizer_s = 0.0

    @property
    def num_words(self) -> int:
        """``int32`` words of one row's bitmask: ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    def matcher(self, spec: GrammarSpec) -> Any:
        """A fresh ``llguidance.LLMatcher`` for ``spec``, at its start.

        Raises:
            GrammarError: the spec does not compile (see :func:`check_grammar`).
        """
        with self._lock:
            compiled = self._cache.get(spec)
            if compiled is not None:
                self._cache.move_to_end(spec)
                self._num_hits += 1
                return compiled.deep_copy()
            lltok = self._llguidance_tokenizer()
            t0 = time.perf_counter()
            compiled = llguidance.LLMatcher(lltok, llguidance_grammar(spec), log_level=0)
            self._compile_s += time.perf_counter() - t0
            self._num_compiled += 1
            if compiled.is_error():
                error = compiled.get_error()
                raise GrammarError(_shorten(error), keyword=unimplemented_keyword(error))
            self._cache[spec] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return compiled.deep_copy()

    def stats(self) -> GrammarStats:
        """A snapshot of the counters."""
        with self._lock:
            return GrammarStats(
                num_compiled=self._num_compiled,
                num_cache_hits=self._num_hits,
                compile_s=self._compile_s,
                tokenizer_s=self._tokenizer_s,
            )

    def _llguidance_tokenizer(self) -> Any:
        if self._lltok is None:
            t0 = time.perf_counter()
            self._lltok = llguidance.hf.from_tokenizer(
                self._tokenizer, n_vocab=self.vocab_size, eos_token=self._eos
            )
            self._tokenizer_s = time.perf_counter() - t0
        return self._lltok


def fill_bitmask(matchers: Sequence[Any], num_words: int) -> torch.Tensor:
    """The allowed next tokens of each matcher, as bits.

    Args:
        matchers: ``R`` llguidance matchers, each at the state after its
            sequence's tokens so far.
        num_words: ``ceil(V / 32)``.

    Returns:
        ``[R, num_words]`` int32 on the CPU: bit ``t % 32`` of word ``t // 32``
        of a row is set when token ``t`` is allowed. llguidance drops the GIL
        while it computes, so this can run beside the forward pass.
    """
    bitmask = torch.empty(len(matchers), num_words, dtype=torch.int32)
    row_bytes = num_words * 4
    for row, matcher in enumerate(matchers):
        matcher.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), row_bytes)
    return bitmask


def apply_bitmask(logits: torch.Tensor, rows: Sequence[int], bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` with ``-inf`` where a row's bitmask forbids the token.

    Args:
        logits: ``[B, V]`` float32; not mutated.
        rows: ``R`` row indices into ``logits``, one per bitmask row.
        bitmask: ``[R, ceil(V / 32)]`` int32 (see :func:`fill_bitmask`).

    Returns:
        ``[B, V]``: a copy with the masked rows changed (other rows' values
        are the same numbers), or ``logits`` itself when ``rows`` is empty.
    """
    if not rows:
        return logits
    vocab = logits.shape[-1]
    # little-endian bits of each word: bit i of word w is token 32 * w + i
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    if logits.device.type != "cpu":
        allowed = torch.from_numpy(bits).to(logits.device).bool()
        index = torch.tensor(list(rows), device=logits.device)
        out = logits.clone()
        out[index] = torch.where(allowed, logits[index], float("-inf"))
        return out
    # on the CPU in numpy: torch's indexed writes cost ~10x more here (measured on the 2-core box)
    out_np = logits.numpy().copy()
    for i, row in enumerate(rows):
        np.copyto(out_np[row], -np.inf, where=bits[i] == 0)
    return torch.from_numpy(out_np)


class MaskFiller:
    """One worker thread that fills a step's bitmasks while its forward pass runs.

    The masks of step t depend only on the tokens sampled up to step t - 1,
    so they are known before step t's forward pass starts; filling them on
    this thread (llguidance drops the GIL) hides their cost behind the
    model. Unconstrained rows are never touched.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bargein-grammar")

    def start(self, matchers: Sequence[Any], num_words: int) -> Future[torch.Tensor]:
        """Start filling ``[len(matchers), num_words]`` (see :func:`fill_bitmask`)."""
        return self._pool.submit(fill_bitmask, list(matchers), num_words)

    def close(self) -> None:
        """Stop the worker (waits for a fill in flight)."""
        self._pool.shutdown(wait=True)
