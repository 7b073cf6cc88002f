"""``bargein serve`` and ``bargein chat`` (console script ``bargein``; also ``python -m bargein``).

``serve`` checks its flags and the model path before anything heavy, so a bad
flag or a missing model ends with one clear line and exit status 2; then it
loads the model (with a progress bar) while uvicorn already answers
``/healthz``. ``chat`` is a command-line chat on :mod:`bargein.client.realtime_client` (no torch);
Ctrl-C while an answer streams barges in (the conversation keeps what was
printed), Ctrl-C at the prompt quits. ``chat --voice FILE.wav`` speaks the
file as one voice turn instead (:mod:`bargein.client.voice_client`): it prints
what the server heard and the answer as it streams, writes the answer's
audio to a WAV file, and exits when the answer is done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from typing import Any

from bargein.app.settings import (
    Settings,
    SettingsError,
    add_serve_arguments,
    default_chat_api_key,
    default_chat_url,
    settings_from_args,
    triton_interpreted,
)
from bargein.session.cancel import cancel_and_wait

LOAD_STAGES = ("weights and KV cache", "engine thread", "ready")
# libgomp spin iterations before a waiting OpenMP thread sleeps (its default: 300,000)
SERVE_SPIN_COUNT = "30000"


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bargein", description="Realtime LLM serving over WebSockets, with barge-in."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the model on /v1/realtime")
    add_serve_arguments(serve)
    chat = commands.add_parser("chat", help="chat with a running server")
    chat.add_argument(
        "--url",
        default=default_chat_url(),
        help="the server's realtime endpoint (env BARGEIN_URL; default %(default)s)",
    )
    chat.add_argument(
        "--api-key",
        default=default_chat_api_key(),
        help="key for a server run with --api-keys (env BARGEIN_API_KEY)",
    )
    chat.add_argument("--instructions", default=None, help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=256, help="per answer")
    chat.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    chat.add_argument(
        "--voice",
        metavar="FILE.wav",
        default=None,
        help="speak this WAV file as one voice turn (server VAD), print the transcript and the "
        "answer, save the answer's audio, and exit",
    )
    chat.add_argument(
        "--voice-out",
        metavar="ANSWER.wav",
        default=None,
        help="with --voice: where the answer's audio goes (default: FILE.answer.wav beside "
        "FILE.wav, or a temporary file; the path is printed)",
    )
    chat.add_argument(
        "--fast",
        action="store_true",
        help="with --voice: send the file as fast as the socket takes it, not in real time",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "chat":
        # A chat started by a script with `&` inherits an ignored SIGINT (POSIX
        # shells do that to background jobs), and Python then never raises
        # KeyboardInterrupt: Ctrl-C at the prompt must quit all the same.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return asyncio.run(_chat(args))
        except KeyboardInterrupt:  # Ctrl-C: leave quietly, no traceback
            print(file=sys.stderr)
            return 130
    # Before torch loads OpenMP: libgomp's threads spin a bounded while after
    # each parallel region, then sleep. A decode step runs ~250 regions; woken
    # by futex each (OMP_WAIT_POLICY=PASSIVE) they made served decoding 1.6-1.9x
    # slower on 2 cores, and the bound lets them sleep soon after the engine
    # goes idle. The event loop kept its core: refusal p99 9-15 ms at 4x and 8x
    # the knee (docs/perf/wait-policy.md). A policy or spin count the user set is kept.
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ.setdefault("GOMP_SPINCOUNT", SERVE_SPIN_COUNT)
    from bargein.app.listen import check_tls

    try:
        settings = settings_from_args(args)
        check_tls(settings.server)
        check_model(settings)
    except (SettingsError, FileNotFoundError) as exc:
        parser.exit(2, f"bargein serve: error: {exc}\n")
    return serve(settings)


def check_model(settings: Settings) -> None:
    """Refuse, before anything loads, a model or device that cannot serve.

    Raises:
        FileNotFoundError: the model path (or the bundled model) is missing.
        SettingsError: the path is not a model (a ``.gguf`` file, a
            ``.safetensors`` file or a folder with ``config.json``), the
            device or backend is not available on this machine, or no
            kernel runs the linear format or KV cache dtype asked for.
    """
    model = settings.engine.model
    if model.path is None:
        from bargein.engine.model.loader import default_model_path

        default_model_path()  # raises with the pip command that installs it
    else:
        path = os.path.expanduser(model.path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"--model {model.path!r} does not exist")
        is_folder_model = os.path.isfile(os.path.join(path, "config.json"))
        if not (is_folder_model or path.endswith((".gguf", ".safetensors"))):
            raise SettingsError(
                f"--model {model.path!r} is not a model: give a .gguf file, "
                "a .safetensors file or a folder with config.json"
            )
    _check_device(model.device, model.backend)
    _check_formats(settings)


def _check_formats(settings: Settings) -> None:
    """Raise ``SettingsError`` for a linear format or KV dtype no kernel here runs
    (the same choices the model runner makes at load, made before it loads)."""
    from bargein.engine.model.linear import choose_linear_format
    from bargein.engine.model_runner import choose_kv_cache_dtype, placement

    model = settings.engine.model
    where, backend = placement(model)
    device = where.type
    try:
        linear_format, _ = choose_linear_format(
            model.quantization,
            model.linear_dtype,
            device_type=device,
            dtype=model.dtype,
            cache_dir=model.cache_dir,
        )
        choose_kv_cache_dtype(
            settings.engine.cache.dtype,
            device_type=device,
            backend=backend,
            model_dtype=model.dtype,
            linear_format=linear_format,
        )
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc


def _check_device(device: str, backend: str) -> None:
    """Raise ``SettingsError`` for a device or kernel backend this machine lacks."""
    import torch

    has_cuda = torch.cuda.is_available()
    if device == "cuda" and not has_cuda:
        raise SettingsError("--device cuda: no CUDA device is available here (use cpu or auto)")
    # Triton kernels run on the CPU only under the interpreter (tests).
    if backend == "triton" and not (has_cuda or triton_interpreted()):
        raise SettingsError("--backend triton needs a CUDA device (use torch or auto)")


def serve(settings: Settings) -> int:
    """Run the server until interrupted (Ctrl-C); the model loads after startup.

    Returns:
        0 after a clean shutdown; 1 when the start failed (the model did not load,
        or another live node holds this --node-id: the server
        stops rather than staying up unready forever).
    """
    import uvicorn
    from tqdm import tqdm

    from bargein.app.listen import uvicorn_config
    from bargein.app.logging import configure_logging
    from bargein.app.server import LOAD_FAILED, create_app

    config = settings.server
    configure_logging(fmt=config.log_format, level=config.log_level, log_prompts=config.log_prompts)
    bar = tqdm(total=len(LOAD_STAGES), desc="loading model", unit="step", file=sys.stderr, leave=True)
    # the stage under way (the first start of a machine converts the GGUF: ~1 min)
    bar.set_postfix_str(LOAD_STAGES[0])
    failed = False

    def progress(stage: str) -> None:
        nonlocal failed
        if stage == LOAD_FAILED:
            bar.close()
            failed = True
            print(
                "bargein serve: error: the server failed to start (the reason is in the log above)",
                file=sys.stderr,
            )
            server.should_exit = True
            return
        bar.update(1)
        if stage == LOAD_STAGES[-1]:
            bar.close()
            # /readyz also needs the token log (Redis) reachable: it says when
            print(
                f"bargein serve: model loaded; serving on {config.scheme}://{config.host}:{config.port}/ "
                "(GET /readyz says whether requests can be taken)",
                file=sys.stderr,
            )
            return
        bar.set_postfix_str(LOAD_STAGES[LOAD_STAGES.index(stage) + 1])

    app = create_app(settings, progress=progress)
    # log_config=None keeps the structured logging set up above
    server = uvicorn.Server(uvicorn_config(app, settings, log_config=None))
    server.run()
    return 1 if failed else 0


async def _chat(args: argparse.Namespace) -> int:
    from websockets.exceptions import InvalidStatus

    from bargein.client.console import ConsoleLines
    from bargein.client.realtime_client import RealtimeClient

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        if args.voice is not None:
            return await _voice_chat(args, headers)
        async with RealtimeClient(args.url, headers=headers) as client:
            if args.instructions:
                await client.update(instructions=args.instructions)
            print(
                f"connected to {client.session.get('model')}; Ctrl-C interrupts an answer; "
                "an empty line, Ctrl-D or Ctrl-C at the prompt quits",
                file=sys.stderr,
            )
            lines = ConsoleLines()
            while True:
                try:
                    line = await lines.readline("> ")
                except EOFError:
                    print(file=sys.stderr)
                    return 0
                if not line.strip():
                    return 0
                await _answer(client, line, args)
    except OSError as exc:
        print(
            f"bargein chat: cannot reach {args.url} ({exc.strerror or exc}); is `bargein serve` "
            "running? (--url or BARGEIN_URL)",
            file=sys.stderr,
        )
        return 1
    except InvalidStatus as exc:  # refused at the upgrade: a key, the origin
        status = exc.response.status_code
        hint = " (--api-key or BARGEIN_API_KEY)" if status == 401 else ""
        print(f"bargein chat: {args.url} refused the connection: HTTP {status}{hint}", file=sys.stderr)
        return 1


async def _voice_chat(args: argparse.Namespace, headers: dict[str, str]) -> int:
    """``chat --voice``: one spoken turn and its answer; returns the exit status.

    Raises:
        OSError, InvalidStatus: the server cannot be reached (reported by :func:`_chat`).
    """
    from bargein.client.pcm import WavSink, read_wav
    from bargein.client.realtime_client import INPUT_RATE, ServerError
    from bargein.client.voice_client import VoiceClient, voice_settings

    try:
        pcm = read_wav(args.voice, sample_rate=INPUT_RATE)
    except (OSError, ValueError) as exc:
        print(f"bargein chat: --voice {args.voice!r}: {exc}", file=sys.stderr)
        return 2
    out = args.voice_out or default_voice_out(args.voice)
    async with VoiceClient(args.url, headers=headers) as client:
        if not client.has_audio:
            print(
                f"bargein chat: {args.url} serves no audio (its session.created announces no "
                "limits.max_input_audio_ms)",
                file=sys.stderr,
            )
            return 1
        session: dict[str, Any] = {
            "audio": voice_settings(input_rate=INPUT_RATE),
            "defaults": {"max_tokens": args.max_tokens, "temperature": args.temperature},
        }
        if args.instructions:
            session["instructions"] = args.instructions
        try:
            await client.update(**session)
            with WavSink(out, client.output_rate) as sink:
                turn = await client.talk(
                    pcm,
                    realtime=not args.fast,
                    on_transcript=_print_final_transcript,
                    on_text=lambda text: print(text, end="", flush=True),
                    on_audio=sink,
                )
        except (ServerError, TimeoutError) as exc:
            print(f"bargein chat: {exc}", file=sys.stderr)
            return 1
    print()
    done = turn.response.done if turn.response is not None else None
    reason = done["finish_reason"] if done else "none"
    print(f"answer audio: {out} ({sink.duration_ms / 1000:.1f} s; {reason})", file=sys.stderr)
    return 0


def _print_final_transcript(text: str, final: bool) -> None:
    if final:  # partial transcripts would interleave with the answer
        print(f"> {text}", flush=True)


def default_voice_out(voice: str) -> str:
    """Where ``chat --voice FILE.wav`` writes the answer: ``FILE.answer.wav`` beside
    the question when that folder is writable, else a new temporary file."""
    stem, _ = os.path.splitext(voice)
    if os.access(os.path.dirname(os.path.abspath(voice)), os.W_OK):
        return stem + ".answer.wav"
    handle, path = tempfile.mkstemp(prefix="bargein-answer-", suffix=".wav")
    os.close(handle)
    return path


async def _answer(client: Any, line: str, args: argparse.Namespace) -> None:
    """Stream one answer to stdout; Ctrl-C (SIGINT) meanwhile barges in.

    Printing stops at once, also before the first token: the client sends
    ``response.cancel`` with ``heard_chars`` = the code points printed, so the
    conversation keeps exactly what the user saw. A second Ctrl-C, while the
    server confirms, quits as at the prompt.
    """
    from bargein.client.realtime_client import ServerError

    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    at_prompt = signal.getsignal(signal.SIGINT)  # asyncio.run's: Ctrl-C there quits

    def barge_in() -> None:
        interrupted.set()
        _restore_sigint(loop, at_prompt)

    with contextlib.suppress(NotImplementedError):  # no loop signal handlers on Windows
        loop.add_signal_handler(signal.SIGINT, barge_in)
    printed = 0
    try:
        async with contextlib.aclosing(
            client.respond(line, max_tokens=args.max_tokens, temperature=args.temperature)
        ) as deltas:
            async for delta in _until(deltas, interrupted):
                print(delta, end="", flush=True)
                printed += len(delta)
        if interrupted.is_set() and client.current.done is None:
            await client.cancel(heard_chars=printed)
            print(" [interrupted]", end="", file=sys.stderr, flush=True)
    except ServerError as exc:
        print(f"[{exc}]", file=sys.stderr)
    finally:
        _restore_sigint(loop, at_prompt)
    print()


def _restore_sigint(loop: asyncio.AbstractEventLoop, handler: Any) -> None:
    with contextlib.suppress(NotImplementedError):
        if loop.remove_signal_handler(signal.SIGINT):
            signal.signal(signal.SIGINT, handler)


async def _until(items: AsyncIterator[str], stop: asyncio.Event) -> AsyncIterator[str]:
    """``items`` until they end or ``stop`` is set, whichever comes first (the
    pending ``__anext__`` is cancelled: the client's receive is safe to cancel)."""
    stopped = asyncio.create_task(stop.wait())
    try:
        while True:
            item = asyncio.create_task(_next(items))
            await asyncio.wait({item, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not item.done():
                await cancel_and_wait([item])
                return
            value = item.result()
            if value is None:
                return
            yield value
    finally:
        stopped.cancel()


async def _next(items: AsyncIterator[str]) -> str | None:
    return await anext(items, None)
