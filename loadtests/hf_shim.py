"""transformers' ``generate`` behind a minimal OpenAI-compatible streaming endpoint (benchmark peer).

``peer_bench.py`` drives every peer through the same streaming client; this
puts transformers on that footing. ``POST /v1/chat/completions`` (``stream:
true`` only, greedy only: ``temperature`` 0; ``max_tokens``, ``ignore_eos``,
``stream_options.include_usage``) and ``GET /health``.

Batching is static, as ``generate`` is: requests that arrive within
``--batch-window`` seconds of the first one waiting (and ask for the same
``max_tokens`` and ``ignore_eos``) run as one left-padded ``generate`` call;
requests arriving meanwhile wait for the next call. A wave of N concurrent
requests is therefore one batch of N, which is how a transformers user
would serve them. Tokens reach the client as ``generate`` produces them (a
streamer that receives the batch's new column each step), one chunk per
token. ``ignore_eos``: ``eos_token_id=None``, so every row generates
``max_tokens`` tokens.

The weights are bargein's: the bundled GGUF dequantized to a transformers
folder by ``bargein.engine.model.loader.transformers_folder`` (the same fp32
values llama.cpp reads as Q4_1), fp32, the tokenizer's chat template.

Usage: ``python loadtests/hf_shim.py --port 8031`` (started by peer_bench.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.streamers import BaseStreamer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from bargein.engine.config import ModelConfig  # noqa: E402
from bargein.engine.model.loader import transformers_folder  # noqa: E402

_DONE = object()  # end of one row's tokens


@dataclass(slots=True, kw_only=True)
class Pending:
    """One request waiting for, then in, a batch; tokens arrive on ``queue``."""

    messages: list[dict[str, str]]
    max_tokens: int
    ignore_eos: bool
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    prompt_tokens: int = 0


class RowStreamer(BaseStreamer):
    """``generate``'s streamer: the first ``put`` is the prompt (skipped), each
    later one the ``[B]`` (or ``[B, 1]``) new tokens of the step; ``emit(row,
    token_id)`` per row, then ``emit(row, None)`` for every row at the end."""

    def __init__(self, num_rows: int, emit: Callable[[int, int | None], None]) -> None:
        self.num_rows = num_rows
        self.emit = emit
        self.seen_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self.seen_prompt:
            self.seen_prompt = True
            return
        for row, token_id in enumerate(value.reshape(self.num_rows, -1)[:, -1].tolist()):
            self.emit(row, int(token_id))

    def end(self) -> None:
        for row in range(self.num_rows):
            self.emit(row, None)


class Generator:
    """Owns the model; runs batches of :class:`Pending` on one worker thread."""

    def __init__(self, batch_window_s: float, max_batch: int) -> None:
        torch.set_num_threads(os.cpu_count() or 1)  # as bargein's ModelRunner on the CPU
        folder = transformers_folder(ModelConfig())
        self.tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.eos_ids = set(_as_list(self.model.generation_config.eos_token_id))
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self.waiting: asyncio.Queue[Pending] = asyncio.Queue()

    async def serve(self) -> None:
        """Forever: take the first waiting request, gather the batch, generate."""
        loop = asyncio.get_running_loop()
        while True:
            first = await self.waiting.get()
            await asyncio.sleep(self.batch_window_s)
            batch, later = [first], []
            while not self.waiting.empty():
                item = self.waiting.get_nowait()
                same = (item.max_tokens, item.ignore_eos) == (first.max_tokens, first.ignore_eos)
                (batch if same and len(batch) < self.max_batch else later).append(item)
            for item in later:
                self.waiting.put_nowait(item)
            await asyncio.to_thread(self._generate, batch, loop)

    def _generate(self, batch: list[Pending], loop: asyncio.AbstractEventLoop) -> None:
        inputs = self.tokenizer.apply_chat_template(
            [p.messages for p in batch],
            add_generation_prompt=True,
            padding=True,
            return_tensors="pt",
            return_dict=True,
        )
        for pending, mask in zip(batch, inputs["attention_mask"]):
            pending.prompt_tokens = int(mask.sum())

        def emit(row: int, token_id: int | None) -> None:
            loop.call_soon_threadsafe(batch[row].queue.put_nowait, _DONE if token_id is None else token_id)

        config = GenerationConfig.from_dict(self.model.generation_config.to_dict())
        config.pad_token_id = self.tokenizer.pad_token_id
        if batch[0].ignore_eos:
            config.eos_token_id = None
        with torch.inference_mode():
            self.model.generate(
                **inputs,
                generation_config=config,
                max_new_tokens=batch[0].max_tokens,
                do_sample=False,
                streamer=RowStreamer(len(batch), emit),
            )


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def make_app(gen: Generator) -> Starlette:
    """The shim's routes over ``gen`` (its batch loop starts with the app)."""

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def chat(request: Request) -> Response:
        body = await request.json()
        if not body.get("stream") or body.get("temperature", 1) != 0:
            return JSONResponse(
                {"error": {"message": "stream: true and temperature: 0 only"}}, status_code=400
            )
        pending = Pending(
            messages=body["messages"],
            max_tokens=int(body.get("max_tokens") or 16),
            ignore_eos=bool(body.get("ignore_eos")),
        )
        await gen.waiting.put(pending)
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(_events(gen, pending, usage), media_type="text/event-stream")

    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(gen.serve())
        yield
        task.cancel()

    return Starlette(
        routes=[Route("/health", health), Route("/v1/chat/completions", chat, methods=["POST"])],
        lifespan=lifespan,  # type: ignore[arg-type]
    )


async def _events(gen: Generator, pending: Pending, include_usage: bool) -> AsyncIterator[str]:
    """SSE chunks of one row: a chunk per token with text, the finish, usage, [DONE]."""
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }

    def chunk(delta: dict[str, str], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    ids: list[int] = []
    sent = ""
    finish = "length"
    while len(ids) < pending.max_tokens:
        token_id = await pending.queue.get()
        if token_id is _DONE:
            break
        ids.append(token_id)
        if not pending.ignore_eos and token_id in gen.eos_ids:
            finish = "stop"
            break
        text = gen.tokenizer.decode(ids, skip_special_tokens=True)
        if len(text) > len(sent) and not text.endswith("\ufffd"):
            yield chunk({"content": text[len(sent) :]})
            sent = text
    yield chunk({}, finish)
    if include_usage:
        usage = {
            "prompt_tokens": pending.prompt_tokens,
            "completion_tokens": len(ids),
            "total_tokens": pending.prompt_tokens + len(ids),
        }
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8031)
    p.add_argument("--batch-window", type=float, default=0.05, help="seconds to gather a batch")
    p.add_argument("--max-batch", type=int, default=64)
    args = p.parse_args()
    gen = Generator(args.batch_window, args.max_batch)
    uvicorn.run(make_app(gen), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
