"""``bargein serve`` and ``bargein chat`` (console script ``bargein``; also ``python -m app``).

``serve`` checks its flags and the model path before anything heavy, so a bad
flag or a missing model ends with one clear line and exit status 2; then it
loads the model (with a progress bar) while uvicorn already answers
``/healthz``. ``chat`` is a command-line chat on :mod:`app.client` (no torch).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from app.settings import Settings, SettingsError, add_serve_arguments, settings_from_args

LOAD_STAGES = ("weights and KV cache", "engine thread", "ready")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bargein", description="Realtime LLM serving over WebSockets, with barge-in.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the model on /v1/realtime")
    add_serve_arguments(serve)
    chat = commands.add_parser("chat", help="chat with a running server")
    chat.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime",
                      help="the server's realtime endpoint")
    chat.add_argument("--instructions", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=256, help="per answer")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "chat":
        return asyncio.run(_chat(args))
    try:
        settings = settings_from_args(args)
        check_model(settings)
    except (SettingsError, FileNotFoundError) as exc:
        parser.exit(2, f"bargein serve: error: {exc}\n")
    serve(settings)
    return 0


def check_model(settings: Settings) -> None:
    """Raise ``FileNotFoundError`` naming the missing model, before loading."""
    path = settings.engine.model.path
    if path is None:
        from engine.model.loader import default_model_path

        default_model_path()  # raises with the pip command that installs it
    elif not os.path.exists(os.path.expanduser(path)):
        raise FileNotFoundError(f"model path {path!r} does not exist")


def serve(settings: Settings) -> None:
    """Run the server until interrupted (Ctrl-C); the model loads after startup."""
    import uvicorn
    from tqdm import tqdm

    from app.logging import configure_logging
    from app.server import create_app

    server = settings.server
    configure_logging(fmt=server.log_format, level=server.log_level,
                      log_prompts=server.log_prompts)
    bar = tqdm(total=len(LOAD_STAGES), desc="loading model", unit="step",
               file=sys.stderr, leave=True)

    def progress(stage: str) -> None:
        bar.set_postfix_str(stage)
        bar.update(1)
        if stage == LOAD_STAGES[-1]:
            bar.close()

    app = create_app(settings, progress=progress)
    # websockets' sans-I/O implementation: the legacy one is deprecated.
    uvicorn.run(app, host=settings.server.host, port=settings.server.port,
                log_level=settings.server.log_level, ws="websockets-sansio",
                ws_max_size=settings.session.max_frame_bytes,
                ws_ping_interval=settings.server.ws_ping_interval_s or None,
                ws_ping_timeout=settings.server.ws_ping_timeout_s or None,
                log_config=None)  # keep the structured logging set up above


async def _chat(args: argparse.Namespace) -> int:
    from app.client import RealtimeClient, ServerError

    async with RealtimeClient(args.url) as client:
        if args.instructions:
            await client.update(instructions=args.instructions)
        print(f"connected to {client.session.get('model')}; empty line or Ctrl-D quits",
              file=sys.stderr)
        while True:
            try:
                line = await asyncio.to_thread(input, "> ")
            except EOFError:
                return 0
            if not line.strip():
                return 0
            try:
                async for delta in client.respond(line, max_tokens=args.max_tokens,
                                                  temperature=args.temperature):
                    print(delta, end="", flush=True)
            except ServerError as exc:
                print(f"[{exc}]", file=sys.stderr)
            print()
