"""Server settings: command-line flags with ``BARGEIN_*`` environment defaults.

This module is the only place in bargein that reads the environment. Every
flag ``--some-name`` has the environment variable ``BARGEIN_SOME_NAME`` as its
default; an explicit flag wins. The result is one frozen :class:`Settings`
built from per-component configs (engine, session, server).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bargein.app.auth import default_allowed_hosts, normalize_host, normalize_origin
from bargein.app.logging import LogFormat
from bargein.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.streams.log.durability import parse_durability
from bargein.session.streams.log.redis_url import is_redis_url, parse_redis_url, redact_url
from bargein.session.voice_runtime.config import VoiceConfig

ENV_PREFIX = "BARGEIN_"

# The SLO-aware scheduling and admission of ``bargein serve`` (issue 21,
# docs/operating.md "Overload"). The engine and admission configs default to
# off (a library user's plans stay what the token limits say); serving turns
# them on. 200 ms per step keeps a stream's inter-token p95 within 0.5 s on
# the 2-core CPU box with the load generator beside it (docs/perf/saturation.md);
# on a GPU the budget rarely binds and the token limits decide.
SERVE_TARGET_ITL_MS = 200.0
SERVE_TARGET_TTFT_S = 1.5  # under a 2 s objective: the connect, the tokenizing and the estimate's error


def default_chat_url(env: Mapping[str, str] | None = None) -> str:
    """The endpoint ``bargein chat`` talks to: ``BARGEIN_URL``, else the local server."""
    env = os.environ if env is None else env
    return env.get(ENV_PREFIX + "URL", "ws://127.0.0.1:8000/v1/realtime")


# A node's default id: readable (the host name, the process) and unique even where
# every container has one host name and port (0.0.0.0:8000), thanks to the suffix.
PROCESS_NODE_ID = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"

LogBackend = Literal["memory", "redis"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """The HTTP/WebSocket side.

    Attributes:
        host: interface to bind.
        port: TCP port (0 picks a free one).
        token_log_backend: where token streams live: ``memory`` (embedded) or ``redis``.
        redis_url: Redis URL, required when ``token_log_backend == "redis"``.
        secret: key of resume and session tokens; ``None``: with a Redis log,
            the key every node on that Redis shares (created there once), with
            the memory log a random one per process (see ``bargein.app.server.token_secret``).
        debug_endpoints: serve ``GET /debug/engine`` (engine stats and recent
            prompts) for tests and operators; never enable on a public port.
        log_level: uvicorn and bargein log level.
        log_format: ``logfmt`` or ``json`` (one object a line); see ``app/logging.py``.
        log_prompts: put prompts and generated text in the logs (debugging
            only; off, they are never logged).
        metrics_multiproc_dir: prometheus-client's ``PROMETHEUS_MULTIPROC_DIR``
            when several worker processes serve; ``/metrics`` then sums them.
        api_keys: API keys: a file (one a line) or a comma list; ``None``: no
            key needed (see ``app/auth.py``). Never printed.
        allowed_hosts: ``Host`` names served (names, addresses, ``*.domain``,
            ``*``; no ports); empty: the default of :attr:`trusted_hosts`.
        allowed_origins: browser ``Origin`` values allowed (``scheme://host[:port]``,
            or ``self``: the origin the request was addressed to, see
            ``app/auth.py``); empty: those on an allowed host.
        public_metrics: with ``api_keys``, serve ``/metrics`` without a key
            (a scraper on a private network); off, it needs one like ``/v1``.
        ws_ping_interval_s: seconds between WebSocket pings (uvicorn's
            keepalive); ``ws_ping_timeout_s``: a pong later than this closes
            the connection (a vanished client), and the disconnect policy applies.
        slow_client_timeout_s: a client over its outgoing bound this long is
            closed with 4008 (0: never); see ``app/outgoing.py``.
        max_outgoing_bytes: bytes of frames one connection may have waiting
            for its socket.
        node_id: this node's name among several sharing one Redis (unique per
            node, checked at start; ``None``: :data:`PROCESS_NODE_ID`).
        lease_ttl_s: with Redis, a stream whose node stops renewing its lease
            this long is continued by the node a client resumes it on.
        token_log_durability: with Redis, when a log write waits for a replica:
            ``none``, ``wait-on-end`` or ``wait-every-ms:N`` (bargein.session.streams.log.durability).
        ssl_certfile, ssl_keyfile: PEM certificate (chain) and private key:
            serve ``https://`` and ``wss://`` (uvicorn's TLS); both or neither.
        forwarded_allow_ips: addresses or networks (``*``: any) of the reverse
            proxies whose ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are
            trusted (uvicorn's ``forwarded_allow_ips``, same default): from
            them the client address (logs, limits) and the scheme (the
            ``self`` origin) are the forwarded ones; from anyone else the
            headers are ignored.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    token_log_backend: LogBackend = "memory"
    redis_url: str | None = None
    secret: str | None = None
    debug_endpoints: bool = False
    log_level: str = "info"
    log_format: LogFormat = "logfmt"
    log_prompts: bool = False
    metrics_multiproc_dir: str | None = None
    api_keys: str | None = field(default=None, repr=False)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    public_metrics: bool = False
    ws_ping_interval_s: float = 20.0
    ws_ping_timeout_s: float = 20.0
    slow_client_timeout_s: float = 10.0
    max_outgoing_bytes: int = 1 << 20
    node_id: str | None = None
    lease_ttl_s: float = 5.0
    token_log_durability: str = "none"
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    forwarded_allow_ips: tuple[str, ...] = ("127.0.0.1", "::1")

    @property
    def node_name(self) -> str:
        """``node_id``, or this process's unique one when none was given
        (:data:`PROCESS_NODE_ID`)."""
        return self.node_id or PROCESS_NODE_ID

    @property
    def trusted_hosts(self) -> frozenset[str]:
        """``allowed_hosts`` normalized, or by default the loopback names and
        addresses when bound to loopback, else any (``app/auth.py``)."""
        if self.allowed_hosts:
            return frozenset(normalize_host(h) for h in self.allowed_hosts)
        return default_allowed_hosts(self.host)

    @property
    def scheme(self) -> str:
        """``https`` when serving TLS, else ``http``."""
        return "https" if self.ssl_certfile else "http"

    def __post_init__(self) -> None:
        for name in ("ws_ping_interval_s", "ws_ping_timeout_s", "slow_client_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        parse_durability(self.token_log_durability)  # raises ValueError for a bad one
        if self.lease_ttl_s < 0.2:
            raise ValueError(f"lease_ttl_s={self.lease_ttl_s} must be >= 0.2")
        if self.max_outgoing_bytes < 1024:
            raise ValueError(f"max_outgoing_bytes={self.max_outgoing_bytes} must be >= 1024")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} must be in [0, 65535]")
        # These two messages name the field as its flag does (--log-backend).
        if self.token_log_backend not in ("memory", "redis"):
            raise ValueError(f"log_backend={self.token_log_backend!r} must be 'memory' or 'redis'")
        if self.log_format not in ("logfmt", "json"):
            raise ValueError(f"log_format={self.log_format!r} must be 'logfmt' or 'json'")
        if self.token_log_backend == "redis" and not self.redis_url:
            raise ValueError("log_backend='redis' needs a redis_url")
        if self.redis_url:
            _check_redis_url(self.redis_url)
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                f"ssl_certfile={self.ssl_certfile!r} and ssl_keyfile={self.ssl_keyfile!r} go together: "
                "give both (--ssl-certfile and --ssl-keyfile) or neither"
            )
        _check_trusted_proxies(self.forwarded_allow_ips)
        for origin in self.allowed_origins:
            normalize_origin(origin)  # raises ValueError naming a malformed entry
        for host in self.allowed_hosts:
            normalize_host(host)  # raises ValueError naming a malformed entry


def _check_redis_url(url: str) -> None:
    """Refuse a malformed ``--redis-url`` before anything starts; the message
    shows it without its password (session/streams/log/redis_url.py ``redact_url``)."""
    if not is_redis_url(url):
        raise ValueError(
            f"redis_url={redact_url(url)!r} must start with redis://, rediss://, unix://, "
            "redis+cluster://, rediss+cluster://, redis+sentinel:// or rediss+sentinel://"
        )
    parse_redis_url(url)  # raises ValueError naming what is wrong


def _check_trusted_proxies(addresses: tuple[str, ...]) -> None:
    """Refuse ``forwarded_allow_ips`` that uvicorn would read otherwise than they
    say: it takes an entry that is not an address or a network (host bits
    unset) as a literal name matching nothing, and ``*`` only alone."""
    if addresses == ("*",):
        return
    for address in addresses:
        try:
            ipaddress.ip_network(address)
        except ValueError:
            raise ValueError(
                f"forwarded_allow_ips entry {address!r} must be an IP address or a network "
                "(10.0.0.0/8), or the list just * (any peer)"
            ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """Everything ``bargein serve`` is built from."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    voice: VoiceConfig = field(default_factory=VoiceConfig)


class SettingsError(ValueError):
    """A flag or environment variable has a bad value (message names it)."""


def _env_default(env: Mapping[str, str], flag: str, default: Any) -> Any:
    """The ``BARGEIN_*`` value for ``--flag``, else ``default`` (strings only)."""
    return env.get(ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper(), default)


def _add(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    flag: str,
    default: Any,
    kind: Callable[[str], Any],
    help_text: str,
) -> None:
    """Add one flag whose default comes from the environment.

    A boolean flag works as a switch (``--log-prompts``) and also takes a
    value (``--log-prompts false``), like its environment variable.
    """
    switch: dict[str, Any] = {"nargs": "?", "const": True} if kind is _bool else {}
    parser.add_argument(
        flag,
        type=kind,
        default=_env_default(env, flag, default),
        help=f"{help_text} (env {ENV_PREFIX}{flag.lstrip('-').replace('-', '_').upper()})",
        **switch,
    )


def _bool(text: str | bool) -> bool:
    """Parse a boolean flag or environment value."""
    if isinstance(text, bool):
        return text
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean")


def add_serve_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Declare the flags of ``bargein serve`` on ``parser``."""
    env = os.environ if env is None else env
    s, e = ServerConfig(), SessionConfig()
    _add(parser, env, "--host", s.host, str, "interface to bind")
    _add(parser, env, "--port", s.port, int, "TCP port")
    _add_engine_arguments(parser, env)
    _add(parser, env, "--log-backend", s.token_log_backend, str, "token log: memory or redis")
    _add(parser, env, "--redis-url", s.redis_url, str, "Redis URL (implies --log-backend redis)")
    _add(
        parser,
        env,
        "--secret",
        s.secret,
        str,
        "resume and session token key (default: with --redis-url, one shared by the "
        "nodes through Redis; without, random per process)",
    )
    _add(parser, env, "--max-tokens", e.max_tokens, int, "most tokens of one response")
    _add_session_and_log_arguments(parser, env)
    _add_limit_arguments(parser, env)
    _add_transport_arguments(parser, env)
    _add(
        parser,
        env,
        "--node-id",
        None,
        str,
        "this node's unique name among nodes sharing one Redis; a start whose id a live node "
        "holds is refused (default: hostname-pid-random, unique)",
    )
    _add(
        parser,
        env,
        "--lease-ttl",
        s.lease_ttl_s,
        float,
        "seconds before a dead node's streams may be taken over by another node",
    )
    _add(
        parser,
        env,
        "--log-durability",
        s.token_log_durability,
        str,
        "with Redis replicas: none, wait-on-end (WAIT 1 when a stream ends) or wait-every-ms:N",
    )
    # prometheus-client reads this variable itself, under its own name.
    parser.set_defaults(metrics_multiproc_dir=env.get("PROMETHEUS_MULTIPROC_DIR") or None)


def _add_engine_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Flags of the model, the scheduler and the KV cache."""
    c, m = SchedulerConfig(), ModelConfig()
    _add(
        parser,
        env,
        "--model",
        m.path,
        str,
        "model path: HF folder or .gguf (default: the bundled SmolLM2-135M-Instruct)",
    )
    _add(parser, env, "--device", m.device, str, "auto, cpu or cuda")
    _add(parser, env, "--dtype", m.dtype, str, "float32, bfloat16 or float16")
    _add(
        parser,
        env,
        "--quantization",
        m.quantization,
        str,
        "linears on the CPU: auto (int8 with avx512_vnni, else bf16 if the CPU has it, else int4), "
        "none, int8 or int4",
    )
    _add(
        parser,
        env,
        "--linear-dtype",
        m.linear_dtype,
        str,
        "non-int8 linears: auto (bf16 if the CPU has it), float32 or bfloat16",
    )
    _add(parser, env, "--backend", m.backend, str, "kernels: auto, torch or triton")
    _add(parser, env, "--cache-dir", m.cache_dir, str, "converted-weights cache")
    _add(parser, env, "--max-num-seqs", c.max_num_seqs, int, "most sequences per step (a cap)")
    _add(
        parser,
        env,
        "--target-itl-ms",
        SERVE_TARGET_ITL_MS,
        float,
        "inter-token latency target: each step is filled (decodes first, then prefill) only up "
        "to what the learned step-time model says fits it, and the running batch and admission "
        "follow it (0: off, the token limits alone)",
    )
    _add(parser, env, "--max-num-batched-tokens", c.max_num_batched_tokens, int, "tokens per step")
    _add(parser, env, "--max-model-len", c.max_model_len, int, "prompt + output tokens of one sequence")
    _add(
        parser,
        env,
        "--prefill-chunk-size",
        c.prefill_chunk_size,
        int,
        "most prompt tokens of one sequence per step",
    )
    _add(parser, env, "--block-size", CacheConfig().block_size, int, "tokens per KV block")
    _add(parser, env, "--num-blocks", None, int, "KV blocks (default: from --kv-cache-bytes)")
    _add(parser, env, "--kv-cache-bytes", CacheConfig().memory_bytes, int, "KV cache budget")
    _add(
        parser,
        env,
        "--kv-cache-dtype",
        CacheConfig().dtype,
        str,
        "K/V dtype: auto (bfloat16 on the CPU under int8, int4 or bf16 linears, else the model dtype), "
        "float32, bfloat16 or float16",
    )
    _add(
        parser,
        env,
        "--prefix-caching",
        c.enable_prefix_caching,
        _bool,
        "reuse the KV of cached prompt prefixes across requests and turns",
    )
    parser.add_argument(
        "--no-prefix-caching",
        dest="prefix_caching",
        action="store_false",
        help="turn prefix caching off (as --prefix-caching false)",
    )


def _add_session_and_log_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Flags of the session defaults, debugging and logging."""
    s, e = ServerConfig(), SessionConfig()
    _add(
        parser,
        env,
        "--default-max-tokens",
        e.default_max_tokens,
        int,
        "max_tokens when a response.create names none",
    )
    _add(parser, env, "--max-frame-bytes", e.max_frame_bytes, int, "largest client frame")
    _add(
        parser,
        env,
        "--max-conversation-bytes",
        e.max_conversation_bytes,
        int,
        "most UTF-8 bytes of text (instructions and items) one conversation holds",
    )
    _add(parser, env, "--instructions", e.instructions, str, "default system prompt")
    _add(
        parser,
        env,
        "--on-disconnect",
        e.on_disconnect,
        str,
        "a generating response whose client disconnects: continue or cancel",
    )
    _add(
        parser,
        env,
        "--abandon-grace",
        e.abandon_grace_s,
        float,
        "seconds a generating response nobody reads may run on before it is cancelled (0: never)",
    )
    _add(
        parser,
        env,
        "--shared-prefix-cache",
        e.shared_prefix_cache,
        _bool,
        "share cached prefixes between API keys (default: each key reuses only its own)",
    )
    v = VoiceConfig()
    _add(
        parser,
        env,
        "--voice",
        v.mode,
        str,
        "server voice (VAD, speech-to-text, text-to-speech): auto (when installed), on, off",
    )
    _add(
        parser,
        env,
        "--max-input-audio-ms",
        v.max_input_audio_ms,
        int,
        "most uncommitted input audio one session may hold (ms)",
    )
    _add(
        parser,
        env,
        "--max-voice-turns",
        v.max_turns,
        int,
        "voice turns one connection may have transcribed at once (its share of the voice threads); "
        "a turn past it is refused with rate_limited",
    )
    _add(
        parser,
        env,
        "--max-input-audio-speed",
        v.max_input_audio_speed,
        float,
        "input audio one connection may send, as a multiple of real time (beyond its burst); "
        "faster appends are refused with rate_limited (0: no bound)",
    )
    _add(
        parser,
        env,
        "--input-audio-burst-ms",
        v.input_audio_burst_ms,
        int,
        "input audio one connection may send ahead of --max-input-audio-speed at once (ms)",
    )
    _add(
        parser,
        env,
        "--voice-speculation",
        v.speculate,
        _bool,
        "answer a voice turn at its first short pause, dropping the answer if the user goes on",
    )
    _add(parser, env, "--debug-endpoints", s.debug_endpoints, _bool, "serve GET /debug/engine (tests only)")
    _add(parser, env, "--log-level", s.log_level, str, "debug, info, warning, error")
    _add(parser, env, "--log-format", s.log_format, str, "logfmt or json (one object a line)")
    _add(
        parser, env, "--log-prompts", s.log_prompts, _bool, "log prompts and generated text (debugging only)"
    )


def _add_limit_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Flags of keys, liveness, backpressure and admission (issue 7)."""
    s, a = ServerConfig(), AdmissionConfig()
    _add(
        parser,
        env,
        "--api-keys",
        None,
        str,
        "API keys: a file (one key a line) or a comma list; unset: no key needed",
    )
    _add(
        parser,
        env,
        "--allowed-hosts",
        "",
        str,
        "Host header names served (comma list of names, addresses, *.domain or *; ports not "
        "compared); default: bound to loopback, localhost, 127.0.0.1 and [::1]; else any, with a warning",
    )
    _add(
        parser,
        env,
        "--allowed-origins",
        "",
        str,
        "browser Origins allowed (comma list of scheme://host[:port]; self: the origin the "
        "request was addressed to, with the scheme a trusted proxy forwards); default: "
        "those whose host is an allowed host",
    )
    _add(
        parser,
        env,
        "--public-metrics",
        s.public_metrics,
        _bool,
        "with --api-keys, serve /metrics without a key (default: it needs one)",
    )
    _add(
        parser,
        env,
        "--ws-ping-interval",
        s.ws_ping_interval_s,
        float,
        "seconds between WebSocket pings (0: none)",
    )
    _add(
        parser,
        env,
        "--ws-ping-timeout",
        s.ws_ping_timeout_s,
        float,
        "seconds to wait for a pong before dropping the client",
    )
    _add(
        parser,
        env,
        "--slow-client-timeout",
        s.slow_client_timeout_s,
        float,
        "seconds a client may stay over its outgoing bound before close 4008 (0: never)",
    )
    _add(
        parser,
        env,
        "--max-outgoing-bytes",
        s.max_outgoing_bytes,
        int,
        "bytes of frames one connection may have waiting",
    )
    _add(
        parser,
        env,
        "--max-waiting",
        a.max_waiting,
        int,
        "requests admitted without a first token yet; past it: overloaded (0: no bound)",
    )
    _add(
        parser,
        env,
        "--max-queue-time",
        a.max_queue_time_s,
        float,
        "seconds a request may wait in the queue for the engine to schedule it: refused "
        "up front when the expected wait is longer, dropped from the queue (overloaded, "
        "nothing generated) when it passes; a prefill under way is never dropped (0: no "
        "bound)",
    )
    _add(
        parser,
        env,
        "--max-responses-per-key",
        a.max_active_per_principal,
        int,
        "responses one API key (without keys: one client address) has generating at once (0: no cap)",
    )
    _add(
        parser,
        env,
        "--rate-limit-requests",
        a.rate_limit_requests,
        float,
        "requests per second per API key, or per client address without keys (0: off)",
    )
    _add(
        parser,
        env,
        "--rate-limit-tokens",
        a.rate_limit_tokens,
        float,
        "prompt + max_tokens per second per API key, or per client address without keys (0: off)",
    )
    _add(
        parser,
        env,
        "--rate-limit-audio",
        a.rate_limit_audio_s,
        float,
        "seconds of audio per second per API key, or per client address without keys: input audio "
        "transcribed, and speech a resume with audio_from_ms synthesizes again (0: off)",
    )
    _add(
        parser,
        env,
        "--target-ttft-s",
        SERVE_TARGET_TTFT_S,
        float,
        "time-to-first-token target: with --target-itl-ms, a request whose predicted TTFT (the "
        "prompt tokens queued ahead and its own, at the step budget) is over it is refused "
        "(overloaded) at once (0: off)",
    )
    _add(
        parser,
        env,
        "--bulk-share",
        a.bulk_share,
        float,
        "share of the inter-token budget HTTP API requests may fill; WebSocket sessions may fill all of it",
    )


def _add_transport_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """Flags of TLS and of the reverse proxies in front."""
    _add(
        parser,
        env,
        "--ssl-certfile",
        None,
        str,
        "PEM certificate (chain): serve https:// and wss:// (with --ssl-keyfile)",
    )
    _add(parser, env, "--ssl-keyfile", None, str, "PEM private key of --ssl-certfile")
    _add(
        parser,
        env,
        "--forwarded-allow-ips",
        ",".join(ServerConfig().forwarded_allow_ips),
        str,
        "reverse proxies (comma list of addresses or networks, * for any) whose "
        "X-Forwarded-For/-Proto are trusted",
    )


def _comma_list(text: str | None) -> tuple[str, ...]:
    return tuple(item.strip() for item in (text or "").split(",") if item.strip())


def _limits_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``ServerConfig`` fields of the flags of :func:`_add_limit_arguments`
    and :func:`_add_transport_arguments`."""
    return {
        "api_keys": args.api_keys,
        "allowed_hosts": _comma_list(args.allowed_hosts),
        "allowed_origins": _comma_list(args.allowed_origins),
        "public_metrics": args.public_metrics,
        "ws_ping_interval_s": args.ws_ping_interval,
        "ws_ping_timeout_s": args.ws_ping_timeout,
        "slow_client_timeout_s": args.slow_client_timeout,
        "max_outgoing_bytes": args.max_outgoing_bytes,
        "ssl_certfile": args.ssl_certfile or None,
        "ssl_keyfile": args.ssl_keyfile or None,
        "forwarded_allow_ips": _comma_list(args.forwarded_allow_ips),
    }


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Build :class:`Settings` from parsed ``serve`` flags.

    Raises:
        SettingsError: a value is out of range or inconsistent (the config
            classes' own messages, which name the field).
    """
    try:
        return Settings(
            engine=EngineConfig(
                model=ModelConfig(
                    path=args.model,
                    dtype=args.dtype,
                    device=args.device,
                    backend=args.backend,
                    cache_dir=args.cache_dir,
                    quantization=args.quantization,
                    linear_dtype=args.linear_dtype,
                ),
                cache=CacheConfig(
                    block_size=args.block_size,
                    num_blocks=args.num_blocks,
                    memory_bytes=args.kv_cache_bytes,
                    dtype=args.kv_cache_dtype,
                ),
                scheduler=SchedulerConfig(
                    max_num_seqs=args.max_num_seqs,
                    max_num_batched_tokens=args.max_num_batched_tokens,
                    max_model_len=args.max_model_len,
                    prefill_chunk_size=args.prefill_chunk_size,
                    enable_prefix_caching=args.prefix_caching,
                    target_itl_s=args.target_itl_ms / 1000,
                ),
            ),
            session=SessionConfig(
                max_tokens=args.max_tokens,
                default_max_tokens=args.default_max_tokens,
                max_frame_bytes=args.max_frame_bytes,
                max_conversation_bytes=args.max_conversation_bytes,
                instructions=args.instructions,
                on_disconnect=args.on_disconnect,
                abandon_grace_s=args.abandon_grace,
                shared_prefix_cache=args.shared_prefix_cache,
            ),
            server=ServerConfig(
                host=args.host,
                port=args.port,
                secret=args.secret,
                token_log_backend="redis" if args.redis_url else args.log_backend,
                redis_url=args.redis_url,
                debug_endpoints=args.debug_endpoints,
                log_level=args.log_level,
                log_format=args.log_format,
                log_prompts=args.log_prompts,
                metrics_multiproc_dir=args.metrics_multiproc_dir,
                node_id=args.node_id,
                lease_ttl_s=args.lease_ttl,
                token_log_durability=args.log_durability,
                **_limits_from_args(args),
            ),
            admission=AdmissionConfig(
                max_waiting=args.max_waiting,
                max_queue_time_s=args.max_queue_time,
                max_active_per_principal=args.max_responses_per_key,
                rate_limit_requests=args.rate_limit_requests,
                rate_limit_tokens=args.rate_limit_tokens,
                rate_limit_audio_s=args.rate_limit_audio,
                target_ttft_s=args.target_ttft_s,
                bulk_share=args.bulk_share,
            ),
            voice=VoiceConfig(
                mode=args.voice,
                max_input_audio_ms=args.max_input_audio_ms,
                max_turns=args.max_voice_turns,
                speculate=args.voice_speculation,
                max_input_audio_speed=args.max_input_audio_speed,
                input_audio_burst_ms=args.input_audio_burst_ms,
            ),
        )
    except ValueError as exc:
        raise SettingsError(str(exc)) from exc


def parse_serve_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """Parse ``bargein serve`` flags (without the subcommand) into :class:`Settings`.

    Raises:
        SystemExit: argparse's exit on an unknown flag or a mistyped value.
        SettingsError: a value argparse accepted but a config refuses.
    """
    parser = argparse.ArgumentParser(prog="bargein serve")
    add_serve_arguments(parser, env)
    return settings_from_args(parser.parse_args(list(argv)))
