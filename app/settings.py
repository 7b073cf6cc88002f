"""Server settings: the configs of ``bargein serve``, and its flags derived from them.

Every flag and its ``BARGEIN_*`` environment variable come from a config
field (``app/flags.py``): ``--some-name`` has ``BARGEIN_SOME_NAME`` as its
default, and an explicit flag wins. :data:`SERVE_FLAG_RULES` holds what a
flag changes of its field. The result is one frozen :class:`Settings` built
from per-component configs (engine, session, server, admission, voice).
docs/operating.md ("Environment variables") lists the few variables read
elsewhere.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bargein.app.auth import default_allowed_hosts, normalize_host, normalize_origin
from bargein.app.flags import (
    ENV_PREFIX,
    Flag,
    FlagRule,
    HelpFormatter,
    add_flags,
    build,
    derive_flags,
    field_values,
)
from bargein.app.logging import LogFormat
from bargein.engine.config import EngineConfig
from bargein.session.conversation.config import SessionConfig
from bargein.session.runtime.admission import AdmissionConfig
from bargein.session.streams.log.durability import parse_durability
from bargein.session.streams.log.redis_url import is_redis_url, parse_redis_url, redact_url
from bargein.session.voice_runtime.config import VoiceConfig

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


def default_chat_api_key(env: Mapping[str, str] | None = None) -> str | None:
    """The key ``bargein chat`` sends: ``BARGEIN_API_KEY``, else none."""
    env = os.environ if env is None else env
    return env.get(ENV_PREFIX + "API_KEY")


def triton_interpreted(env: Mapping[str, str] | None = None) -> bool:
    """Whether Triton runs in its interpreter: ``TRITON_INTERPRET=1``, Triton's
    own variable (tests set it to run ``--backend triton`` without CUDA)."""
    env = os.environ if env is None else env
    return env.get("TRITON_INTERPRET") == "1"


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
        token_log_backend: where token streams live: ``memory`` (in this
            process) or ``redis`` (implied by ``redis_url``).
        redis_url: the token log's Redis (``redis://``, ``rediss://`` or
            ``unix://``; ``redis+cluster://h1,h2`` or
            ``redis+sentinel://s1/master``: docs/scaling.md), required when
            ``token_log_backend`` is ``redis``.
        secret: key of resume and session tokens; ``None``: with a Redis log,
            the key every node on that Redis shares (stored there once, as
            ``bargein:token-secret``), with the memory log a random one per process.
        debug_endpoints: serve ``GET /debug/engine`` (engine stats and recent
            prompts) for tests and operators; never enable on a public port.
        log_level: level of the server's logs (bargein's and uvicorn's):
            ``debug``, ``info``, ``warning`` or ``error``.
        log_format: the server's log lines: ``logfmt``, or ``json`` (one object
            a line); see ``app/logging.py``.
        log_prompts: put prompts and generated text in the logs (debugging
            only; off, they are never logged).
        metrics_multiproc_dir: prometheus-client's ``PROMETHEUS_MULTIPROC_DIR``
            when several worker processes serve; ``/metrics`` then sums them.
        api_keys: API keys: a file (one a line) or a comma list; ``None``: no
            key needed. With keys, everything under ``/v1``, ``/debug`` and
            ``/metrics`` needs one (never from a query string); ``/``,
            ``/healthz`` and ``/readyz`` stay open (``app/auth.py``). Never printed.
        allowed_hosts: ``Host`` names served (comma list of names, addresses,
            ``*.domain`` or ``*``; ports not compared); another ``Host`` gets
            400 ``host_not_allowed``. Empty: bound to loopback, the loopback
            names and addresses, else any (with a warning at start-up).
        allowed_origins: browser ``Origin`` values allowed (comma list of
            ``scheme://host[:port]``, or ``self``: the origin the request was
            addressed to, with the scheme a trusted proxy forwards; see
            ``app/auth.py``); empty: those on an allowed host.
        public_metrics: with ``api_keys``, serve ``/metrics`` without a key
            (a scraper on a private network); off, it needs one like ``/v1``.
        ws_ping_interval_s: seconds between WebSocket pings (uvicorn's
            keepalive; 0: none).
        ws_ping_timeout_s: seconds to wait for a pong: a later one closes the
            connection (a vanished client), and the disconnect policy applies.
        slow_client_timeout_s: a client over its outgoing bound this long, in
            seconds, is closed with 4008 (0: never); see ``app/outgoing.py``.
        max_outgoing_bytes: bytes of frames one connection may have waiting
            for its socket.
        node_id: this node's name among several sharing one Redis (unique: a
            start under an id a live node holds is refused); ``None``: this
            process's own, ``<hostname>-<pid>-<random>`` (:data:`PROCESS_NODE_ID`).
        lease_ttl_s: with Redis, a stream whose node stops renewing its lease
            this many seconds is continued by the node a client resumes it on.
        token_log_durability: with Redis replicas, when a log write waits for
            one: ``none``, ``wait-on-end`` (``WAIT 1`` when a stream ends) or
            ``wait-every-ms:N`` (session/streams/log/durability.py, docs/scaling.md).
        ssl_certfile: PEM certificate (chain): serve ``https://`` and
            ``wss://`` (uvicorn's TLS) with ``ssl_keyfile``; both or neither.
        ssl_keyfile: PEM private key of ``ssl_certfile``.
        forwarded_allow_ips: addresses or networks (comma list; ``*``: any) of
            the reverse proxies whose ``X-Forwarded-For`` and
            ``X-Forwarded-Proto`` are trusted (uvicorn's ``forwarded_allow_ips``,
            same default): from them the client address (logs, limits) and
            the scheme (the ``self`` origin) are the forwarded ones; from
            anyone else the headers are ignored.
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


def _ms_to_s(value: float) -> float:
    return value / 1000


def _none_if_empty(value: str | None) -> str | None:
    return value or None


# Where a flag of `bargein serve` departs from its field (app/flags.py derives
# the rest). The names are older than the fields' and stay as users know them.
SERVE_FLAG_RULES: Mapping[str, FlagRule] = {
    "engine.model.path": FlagRule(name="--model"),
    "engine.cache.memory_bytes": FlagRule(name="--kv-cache-bytes"),
    "engine.cache.dtype": FlagRule(name="--kv-cache-dtype"),
    "engine.scheduler.enable_prefix_caching": FlagRule(
        name="--prefix-caching", negation="--no-prefix-caching"
    ),
    "engine.scheduler.target_itl_s": FlagRule(
        name="--target-itl-ms", default=SERVE_TARGET_ITL_MS, to_field=_ms_to_s
    ),
    "session.abandon_grace_s": FlagRule(name="--abandon-grace"),
    "server.token_log_backend": FlagRule(name="--log-backend"),
    "server.token_log_durability": FlagRule(name="--log-durability"),
    "server.lease_ttl_s": FlagRule(name="--lease-ttl"),
    "server.ws_ping_interval_s": FlagRule(name="--ws-ping-interval"),
    "server.ws_ping_timeout_s": FlagRule(name="--ws-ping-timeout"),
    "server.slow_client_timeout_s": FlagRule(name="--slow-client-timeout"),
    "server.ssl_certfile": FlagRule(to_field=_none_if_empty),
    "server.ssl_keyfile": FlagRule(to_field=_none_if_empty),
    "admission.max_queue_time_s": FlagRule(name="--max-queue-time"),
    "admission.max_active_per_principal": FlagRule(name="--max-responses-per-key"),
    "admission.rate_limit_audio_s": FlagRule(name="--rate-limit-audio"),
    "admission.target_ttft_s": FlagRule(default=SERVE_TARGET_TTFT_S),
    "voice.mode": FlagRule(name="--voice"),
    "voice.max_turns": FlagRule(name="--max-voice-turns"),
    "voice.speculate": FlagRule(name="--voice-speculation"),
    "voice.prefill": FlagRule(name="--voice-prefill"),
    "voice.text_turn": FlagRule(name="--voice-text-turn"),
    "voice.echo_cancellation": FlagRule(name="--voice-echo-cancellation"),
    "voice.tool_filler": FlagRule(name="--voice-tool-filler"),
}

# Fields that are no flag: constants tuned with the code they pace (measured
# in docs/perf/), not an operator's choice; and prometheus-client's own
# variable, read under its name (add_serve_arguments).
NOT_SERVE_FLAGS = frozenset(
    {
        "engine.scheduler.min_prefill_tokens",
        "engine.scheduler.slow_headroom",
        "session.max_input_items",
        "session.max_conversation_items",
        "session.drain_timeout_s",
        "session.save_interval_s",
        "session.max_pending_log_steps",
        "server.metrics_multiproc_dir",
        "admission.burst_s",
        "admission.window_s",
        "voice.workers",
    }
)


@functools.cache
def serve_flags() -> tuple[Flag, ...]:
    """Every flag of ``bargein serve``, derived from :class:`Settings`' configs."""
    return derive_flags(Settings, SERVE_FLAG_RULES, NOT_SERVE_FLAGS)


def add_serve_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Declare the flags of ``bargein serve`` on ``parser``, their defaults
    from ``env`` (``os.environ`` when ``None``)."""
    env = os.environ if env is None else env
    parser.formatter_class = HelpFormatter
    add_flags(parser, serve_flags(), env)
    parser.set_defaults(metrics_multiproc_dir=env.get("PROMETHEUS_MULTIPROC_DIR") or None)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Build :class:`Settings` from parsed ``serve`` flags.

    Raises:
        SettingsError: a value is out of range or inconsistent (the config
            classes' own messages, which name the field).
    """
    values = field_values(serve_flags(), args)
    values["server.metrics_multiproc_dir"] = args.metrics_multiproc_dir
    if values["server.redis_url"]:  # a Redis URL means the Redis log
        values["server.token_log_backend"] = "redis"
    try:
        return build(Settings, values)
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
