"""Flags, environment variables and the ``bargein`` command line (no model loaded)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bargein.app.cli import SERVE_SPIN_COUNT, main
from bargein.app.settings import SettingsError, parse_serve_args
from tests.app.conftest import LiveServer


def test_defaults_serve_the_bundled_model_on_loopback() -> None:
    settings = parse_serve_args([], env={})
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8000)
    assert settings.engine.model.path is None
    assert settings.server.token_log_backend == "memory"


def test_flags_reach_every_component() -> None:
    settings = parse_serve_args(
        [
            "--port",
            "9001",
            "--model",
            "/models/x.gguf",
            "--max-num-seqs",
            "8",
            "--max-model-len",
            "1024",
            "--num-blocks",
            "300",
            "--max-tokens",
            "128",
            "--default-max-tokens",
            "64",
            "--redis-url",
            "redis://localhost:6379/0",
            "--debug-endpoints",
            "true",
            "--kv-cache-dtype",
            "float32",
        ],
        env={},
    )
    assert settings.server.port == 9001
    assert settings.engine.model.path == "/models/x.gguf"
    assert settings.engine.scheduler.max_num_seqs == 8
    assert settings.engine.scheduler.max_model_len == 1024
    assert settings.engine.cache.num_blocks == 300
    assert settings.engine.cache.dtype == "float32"
    assert (settings.session.max_tokens, settings.session.default_max_tokens) == (128, 64)
    assert settings.server.token_log_backend == "redis"  # a Redis URL implies the backend
    assert settings.server.debug_endpoints is True


def test_environment_gives_defaults_and_flags_win() -> None:
    env = {"BARGEIN_PORT": "7000", "BARGEIN_HOST": "0.0.0.0", "BARGEIN_MAX_TOKENS": "99"}
    settings = parse_serve_args(["--port", "7001"], env=env)
    assert (settings.server.host, settings.server.port) == ("0.0.0.0", 7001)
    assert settings.session.max_tokens == 99


@pytest.mark.parametrize(
    "argv",
    [["--port", "70000"], ["--max-num-seqs", "0"], ["--log-backend", "redis"], ["--kv-cache-dtype", "fp8"]],
)
def test_out_of_range_values_are_refused_with_the_field_named(argv: list[str]) -> None:
    with pytest.raises(SettingsError) as refused:
        parse_serve_args(argv, env={})
    name = argv[0].lstrip("-").replace("-", "_")
    assert any(n in str(refused.value) for n in (name, "redis_url", "dtype="))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bargein", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_serve_refuses_a_bad_flag_and_a_missing_model_clearly() -> None:
    bad_flag = run_cli("serve", "--max-tokens", "lots")
    assert bad_flag.returncode == 2 and "--max-tokens" in bad_flag.stderr
    missing = run_cli("serve", "--model", "/no/such/model.gguf")
    assert missing.returncode == 2
    assert "--model '/no/such/model.gguf' does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr + bad_flag.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--device", "tpu"], "device='tpu' must be one of auto, cpu, cuda"),
        (["--dtype", "float13"], "dtype='float13' must be one of"),
        (["--model", "README.md"], "is not a model"),
        (["--model", "/tmp"], "is not a model"),
        (["--kv-cache-dtype", "float16"], "kv_cache_dtype='float16' cannot run with a float32 model on cpu"),
    ],
)
def test_serve_refuses_what_cannot_serve_before_starting(argv: list[str], message: str) -> None:
    out = run_cli("serve", "--port", "1", *argv)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr


def test_serve_refuses_a_malformed_redis_url_without_showing_its_password() -> None:
    for url in ("redis+sentinel://:s3cr3t-pa55@127.0.0.1:26379", "redis+sentinal://:s3cr3t-pa55@h/m"):
        out = run_cli("serve", "--port", "1", "--redis-url", url)
        assert out.returncode == 2 and "redis" in out.stderr and "[redacted]@" in out.stderr
        assert "s3cr3t" not in out.stdout + out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({}, {"GOMP_SPINCOUNT": SERVE_SPIN_COUNT, "OMP_WAIT_POLICY": None}),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": None, "OMP_WAIT_POLICY": "PASSIVE"}),
        ({"GOMP_SPINCOUNT": "1000"}, {"GOMP_SPINCOUNT": "1000", "OMP_WAIT_POLICY": None}),
    ],
)
def test_serve_bounds_the_openmp_spin_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], expected: dict[str, str | None]
) -> None:
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as refused:  # stops at the model check, before serving
        main(["serve", "--model", "/no/such/model.gguf"])
    assert refused.value.code == 2
    assert {name: os.environ.get(name) for name in expected} == expected


def test_chat_says_when_the_server_is_not_there() -> None:
    out = run_cli("chat", "--url", "ws://127.0.0.1:9/v1/realtime")
    assert out.returncode == 1
    assert "cannot reach ws://127.0.0.1:9/v1/realtime" in out.stderr
    assert "Traceback" not in out.stderr


def test_clients_import_without_torch_or_the_engine() -> None:
    code = (
        "import sys, bargein.client; "
        "bad = [m for m in ('torch', 'engine', 'transformers') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_chat_command_talks_to_a_live_server(live_server: LiveServer) -> None:
    chat = subprocess.run(
        [sys.executable, "-m", "bargein", "chat", "--url", live_server.ws_url, "--max-tokens", "16"],
        input="Name the capital of France.\n\n",  # int4 answers "What is ...?" in French
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert chat.returncode == 0, chat.stderr
    assert "Paris" in chat.stdout


@pytest.mark.slow
def test_ctrl_c_in_chat_barges_in_and_the_conversation_keeps_what_was_printed(
    live_server: LiveServer,
) -> None:
    interrupted_before = live_server.stats().num_finished_by_reason.get("interrupted", 0)
    with subprocess.Popen(
        [sys.executable, "-m", "bargein", "chat", "--url", live_server.ws_url, "--max-tokens", "64"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as chat:
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write(b"Count from one to one hundred, in words.\n")
        chat.stdin.flush()
        printed = b""
        while len(printed) < len(b"> ") + 8:  # the prompt, then the answer has started
            chunk = os.read(chat.stdout.fileno(), 1 << 16)
            assert chunk, "chat ended before answering"
            printed += chunk
        chat.send_signal(signal.SIGINT)
        out, err = chat.communicate(b"Say hi.\n\n", timeout=120)
    assert chat.returncode == 0, err
    assert b"[interrupted]" in err and b"Traceback" not in err
    assert live_server.stats().num_finished_by_reason.get("interrupted", 0) == interrupted_before + 1
    # The second question's prompt holds the first answer as printed, cut there.
    prompt = live_server.tokenizer.decode(live_server.recent_requests()[-1].prompt_token_ids)
    assert "Say hi." in prompt
    kept = prompt.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert kept and (printed + out).decode().startswith(f"> {kept}\n> ")


@pytest.mark.slow
def test_ctrl_c_at_the_prompt_quits_at_once(live_server: LiveServer) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "bargein", "chat", "--url", live_server.ws_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as chat:
        assert chat.stderr is not None and chat.stdout is not None
        assert chat.stderr.readline().startswith(b"connected to")
        assert chat.stdout.read(2) == b"> "  # now at the prompt
        chat.send_signal(signal.SIGINT)
        # with stdin still open: nothing typed, no Enter needed; the exit code
        # says SIGINT ended it (the bound only guards against a hang: on a
        # loaded box the socket's close handshake can take seconds)
        assert chat.wait(timeout=60) == 130
