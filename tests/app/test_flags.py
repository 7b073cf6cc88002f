"""The flags of ``bargein serve``, derived from the config dataclasses: every
flag's name, variable, field and parsing, ``--help``, and the README's table."""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bargein.app.flag_table import markdown_table, with_table
from bargein.app.flag_text import attribute_docs, markdown, plain, resolve, value_text
from bargein.app.flags import FlagRule, derive_flags
from bargein.app.settings import (
    Settings,
    add_serve_arguments,
    default_chat_api_key,
    parse_serve_args,
    serve_flags,
    triton_interpreted,
)
from bargein.engine.config import EngineConfig, SchedulerConfig
from bargein.session.runtime.admission import AdmissionConfig

README = Path(__file__).resolve().parents[2] / "README.md"

# Every flag users know: the config field it sets, a value given, the value
# the field gets. The names and fields must never change under them.
CASES: dict[str, tuple[str, str, Any]] = {
    "--model": ("engine.model.path", "/m.gguf", "/m.gguf"),
    "--dtype": ("engine.model.dtype", "bfloat16", "bfloat16"),
    "--device": ("engine.model.device", "cpu", "cpu"),
    "--backend": ("engine.model.backend", "torch", "torch"),
    "--cache-dir": ("engine.model.cache_dir", "/c", "/c"),
    "--quantization": ("engine.model.quantization", "int8", "int8"),
    "--linear-dtype": ("engine.model.linear_dtype", "float32", "float32"),
    "--block-size": ("engine.cache.block_size", "32", 32),
    "--num-blocks": ("engine.cache.num_blocks", "300", 300),
    "--kv-cache-bytes": ("engine.cache.memory_bytes", "1048576", 1 << 20),
    "--kv-cache-dtype": ("engine.cache.dtype", "float32", "float32"),
    "--max-num-seqs": ("engine.scheduler.max_num_seqs", "8", 8),
    "--max-num-batched-tokens": ("engine.scheduler.max_num_batched_tokens", "1024", 1024),
    "--max-model-len": ("engine.scheduler.max_model_len", "1024", 1024),
    "--prefill-chunk-size": ("engine.scheduler.prefill_chunk_size", "128", 128),
    "--prefix-caching": ("engine.scheduler.enable_prefix_caching", "false", False),
    "--target-itl-ms": ("engine.scheduler.target_itl_s", "80", 0.08),
    "--max-tokens": ("session.max_tokens", "128", 128),
    "--default-max-tokens": ("session.default_max_tokens", "64", 64),
    "--max-frame-bytes": ("session.max_frame_bytes", "2048", 2048),
    "--max-conversation-bytes": ("session.max_conversation_bytes", "4096", 4096),
    "--instructions": ("session.instructions", "Be brief.", "Be brief."),
    "--on-disconnect": ("session.on_disconnect", "cancel", "cancel"),
    "--abandon-grace": ("session.abandon_grace_s", "5", 5.0),
    "--shared-prefix-cache": ("session.shared_prefix_cache", "true", True),
    "--host": ("server.host", "0.0.0.0", "0.0.0.0"),
    "--port": ("server.port", "9001", 9001),
    "--log-backend": ("server.token_log_backend", "memory", "memory"),
    "--redis-url": ("server.redis_url", "redis://h:6379/0", "redis://h:6379/0"),
    "--secret": ("server.secret", "s3", "s3"),
    "--debug-endpoints": ("server.debug_endpoints", "true", True),
    "--log-level": ("server.log_level", "warning", "warning"),
    "--log-format": ("server.log_format", "json", "json"),
    "--log-prompts": ("server.log_prompts", "yes", True),
    "--api-keys": ("server.api_keys", "k1,k2", "k1,k2"),
    "--allowed-hosts": ("server.allowed_hosts", "a.example, *.b.example", ("a.example", "*.b.example")),
    "--allowed-origins": ("server.allowed_origins", "https://a.example,self", ("https://a.example", "self")),
    "--public-metrics": ("server.public_metrics", "on", True),
    "--ws-ping-interval": ("server.ws_ping_interval_s", "0", 0.0),
    "--ws-ping-timeout": ("server.ws_ping_timeout_s", "7.5", 7.5),
    "--slow-client-timeout": ("server.slow_client_timeout_s", "3", 3.0),
    "--max-outgoing-bytes": ("server.max_outgoing_bytes", "4096", 4096),
    "--node-id": ("server.node_id", "n1", "n1"),
    "--lease-ttl": ("server.lease_ttl_s", "2", 2.0),
    "--log-durability": ("server.token_log_durability", "wait-on-end", "wait-on-end"),
    "--ssl-certfile": ("server.ssl_certfile", "", None),
    "--ssl-keyfile": ("server.ssl_keyfile", "", None),
    "--forwarded-allow-ips": ("server.forwarded_allow_ips", "10.0.0.0/8", ("10.0.0.0/8",)),
    "--max-waiting": ("admission.max_waiting", "0", 0),
    "--max-queue-time": ("admission.max_queue_time_s", "1.5", 1.5),
    "--max-responses-per-key": ("admission.max_active_per_principal", "3", 3),
    "--rate-limit-requests": ("admission.rate_limit_requests", "2", 2.0),
    "--rate-limit-tokens": ("admission.rate_limit_tokens", "500", 500.0),
    "--rate-limit-audio": ("admission.rate_limit_audio_s", "1", 1.0),
    "--target-ttft-s": ("admission.target_ttft_s", "0", 0.0),
    "--bulk-share": ("admission.bulk_share", "0.5", 0.5),
    "--voice": ("voice.mode", "off", "off"),
    "--max-input-audio-ms": ("voice.max_input_audio_ms", "2000", 2000),
    "--max-voice-turns": ("voice.max_turns", "1", 1),
    "--voice-speculation": ("voice.speculate", "false", False),
    "--voice-prefill": ("voice.prefill", "false", False),
    "--voice-text-turn": ("voice.text_turn", "false", False),
    "--voice-echo-cancellation": ("voice.echo_cancellation", "false", False),
    "--voice-tool-filler": ("voice.tool_filler", "One moment.", "One moment."),
    "--max-input-audio-speed": ("voice.max_input_audio_speed", "0", 0.0),
    "--input-audio-burst-ms": ("voice.input_audio_burst_ms", "0", 0),
}


def field(settings: Settings, path: str) -> Any:
    return functools.reduce(getattr, path.split("."), settings)


def test_every_flag_has_a_case_and_nothing_else_became_a_flag() -> None:
    assert {flag.name: flag.path for flag in serve_flags()} == {name: case[0] for name, case in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_a_flag_and_its_variable_set_its_field(name: str) -> None:
    path, given, expected = CASES[name]
    variable = "BARGEIN_" + name[2:].replace("-", "_").upper()
    by_flag = field(parse_serve_args([name, given], env={}), path)
    by_env = field(parse_serve_args([], env={variable: given}), path)
    assert by_flag == expected and type(by_flag) is type(expected)
    assert by_env == expected and type(by_env) is type(expected)


def test_defaults_are_the_configs_but_the_serve_targets() -> None:
    expected = Settings(
        engine=EngineConfig(scheduler=SchedulerConfig(target_itl_s=0.2)),
        admission=AdmissionConfig(target_ttft_s=1.5),
    )
    assert parse_serve_args([], env={}) == expected


def test_switches_the_negated_flag_and_the_prometheus_variable() -> None:
    assert parse_serve_args(["--log-prompts"], env={}).server.log_prompts is True
    env = {"BARGEIN_PREFIX_CACHING": "true", "PROMETHEUS_MULTIPROC_DIR": "/tmp/prom"}
    settings = parse_serve_args(["--no-prefix-caching"], env=env)
    assert settings.engine.scheduler.enable_prefix_caching is False
    assert settings.server.metrics_multiproc_dir == "/tmp/prom"
    assert parse_serve_args([], env={"PROMETHEUS_MULTIPROC_DIR": ""}).server.metrics_multiproc_dir is None


def test_a_bad_boolean_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve_args(["--log-prompts", "maybe"], env={})
    assert "argument --log-prompts: 'maybe' is not a boolean" in capsys.readouterr().err


def test_help_lists_every_flag_with_its_variable_and_text() -> None:
    parser = argparse.ArgumentParser(prog="bargein serve")
    add_serve_arguments(parser, env={"BARGEIN_API_KEYS": "never-shown"})
    text = " ".join(parser.format_help().split())
    for flag in serve_flags():
        assert f"{flag.name} " in text and f"env {flag.env})" in text
        assert len(flag.help()) > len(f" (default: unset; env {flag.env})") + 10
    assert "--no-prefix-caching as --prefix-caching false" in text
    assert "never-shown" not in text  # the help shows the field's default, never the environment's


def test_the_readme_table_is_the_generated_one() -> None:
    readme = README.read_text()
    assert with_table(readme, markdown_table(serve_flags())) == readme, (
        "README.md's flags table is stale: python -m bargein.app.flag_table --write README.md"
    )


def test_the_chat_and_triton_variables_are_read_through_the_settings() -> None:
    assert default_chat_api_key({"BARGEIN_API_KEY": "k"}) == "k" and default_chat_api_key({}) is None
    assert triton_interpreted({"TRITON_INTERPRET": "1"}) and not triton_interpreted({})


@dataclass(frozen=True, slots=True, kw_only=True)
class _Inner:
    """Inner part.

    Attributes:
        size_bytes: how big, see ``name``;
            ``None``: the default.
        speed_s: how fast.
    """

    size_bytes: int | None = None
    speed_s: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Root:
    """Root.

    Attributes:
        name: a name (``True`` or :data:`~a.b.NAME`).
    """

    name: str = "x"
    inner: _Inner = _Inner()


def test_docstring_entries_and_their_markup() -> None:
    assert attribute_docs(_Inner) == {
        "size_bytes": "how big, see ``name``; ``None``: the default.",
        "speed_s": "how fast.",
    }
    doc = resolve(attribute_docs(_Inner)["size_bytes"], {"name": "--the-name"})
    assert plain(doc) == "how big, see --the-name; unset: the default."
    assert markdown(resolve("a | ``x``", {})) == r"a \| `x`"
    name = attribute_docs(_Root)["name"]
    assert (plain(name), plain(resolve(name, {}))) == ("a name (True or NAME).", "a name (true or NAME).")
    assert (value_text(None), value_text(0.5), value_text(200.0), value_text(("a", "b"))) == (
        "unset",
        "0.5",
        "200",
        "a,b",
    )
    assert (
        value_text(1 << 20, is_bytes=True) == "1048576 (1 MiB)" and value_text(1000, is_bytes=True) == "1000"
    )


def test_derivation_follows_the_fields_and_refuses_what_it_cannot_derive() -> None:
    flags = derive_flags(_Root, {"inner.speed_s": FlagRule(name="--speed")})
    assert [(f.name, f.path, f.group, f.env) for f in flags] == [
        ("--name", "name", "", "BARGEIN_NAME"),
        ("--size-bytes", "inner.size_bytes", "inner", "BARGEIN_SIZE_BYTES"),
        ("--speed", "inner.speed_s", "inner", "BARGEIN_SPEED"),
    ]
    with pytest.raises(ValueError, match="no config field: inner.nope"):
        derive_flags(_Root, {"inner.nope": FlagRule()})

    @dataclass(frozen=True)
    class Undocumented:
        """No attributes section."""

        size: int = 1

    with pytest.raises(ValueError, match="Undocumented.size has no entry"):
        derive_flags(Undocumented, {})
