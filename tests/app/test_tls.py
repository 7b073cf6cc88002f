"""TLS (``--ssl-certfile``/``--ssl-keyfile``) and the reverse proxies bargein trusts
(``--forwarded-allow-ips``), on real sockets.

The certificate is self-signed, made for each test module by Debian's
``openssl``; the servers run on live_server's engine (no second model load).
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidMessage

from bargein.app.embedded import EmbeddedServer
from bargein.app.listen import check_tls
from bargein.app.settings import ServerConfig, Settings, SettingsError, parse_serve_args
from bargein.client.realtime_client import RealtimeClient
from bargein.session.conversation.config import SessionConfig
from tests.app.browser import launch
from tests.app.conftest import LiveServer, node_on_engine
from tests.app.log_capture import server_log
from tests.needs import missing

PUBLIC_ORIGIN = "https://chat.example.com"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """``(cert.pem, key.pem)``: self-signed, for ``localhost`` and 127.0.0.1, valid one day."""
    if shutil.which("openssl") is None:
        missing("openssl is not installed (Debian's openssl package)")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-days", "1"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def server_settings(**server: object) -> Settings:
    return Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=8),
        server=ServerConfig(port=0, log_level="warning", **server),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def tls_server(live_server: LiveServer, certificate: tuple[Path, Path]) -> Iterator[EmbeddedServer]:
    cert, key = certificate
    with node_on_engine(live_server, server_settings(ssl_certfile=str(cert), ssl_keyfile=str(key))) as server:
        yield server


def trusting(cert: Path) -> ssl.SSLContext:
    """A client context that trusts exactly the test's self-signed certificate."""
    return ssl.create_default_context(cafile=str(cert))


# ---- flags ---------------------------------------------------------------------


def test_tls_flags_and_their_environment_variables() -> None:
    settings = parse_serve_args(["--ssl-keyfile", "/k.pem"], env={"BARGEIN_SSL_CERTFILE": "/c.pem"})
    assert (settings.server.ssl_certfile, settings.server.ssl_keyfile) == ("/c.pem", "/k.pem")
    assert settings.server.scheme == "https"
    assert parse_serve_args([], env={}).server.scheme == "http"


@pytest.mark.parametrize("argv", [["--ssl-certfile", "/c.pem"], ["--ssl-keyfile", "/k.pem"]])
def test_a_certificate_without_its_key_or_the_reverse_is_refused_naming_both(argv: list[str]) -> None:
    with pytest.raises(SettingsError) as refused:
        parse_serve_args(argv, env={})
    assert "--ssl-certfile" in str(refused.value) and "--ssl-keyfile" in str(refused.value)


def test_serve_with_a_certificate_and_no_key_exits_naming_both_flags(certificate: tuple[Path, Path]) -> None:
    cert, _ = certificate
    out = subprocess.run(
        [sys.executable, "-m", "bargein", "serve", "--ssl-certfile", str(cert)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2
    assert "--ssl-certfile" in out.stderr and "--ssl-keyfile" in out.stderr and "Traceback" not in out.stderr


def test_missing_or_unusable_certificate_files_are_refused_before_serving(
    certificate: tuple[Path, Path], tmp_path: Path
) -> None:
    cert, key = certificate
    with pytest.raises(FileNotFoundError, match="--ssl-keyfile '/no/key.pem' does not exist"):
        check_tls(ServerConfig(ssl_certfile=str(cert), ssl_keyfile="/no/key.pem"))
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(SettingsError, match="are not a PEM certificate and its private key"):
        check_tls(ServerConfig(ssl_certfile=str(not_pem), ssl_keyfile=str(key)))
    check_tls(ServerConfig(ssl_certfile=str(cert), ssl_keyfile=str(key)))  # a good pair passes


def test_forwarded_allow_ips_default_to_uvicorns_and_refuse_what_is_no_address() -> None:
    assert parse_serve_args([], env={}).server.forwarded_allow_ips == ("127.0.0.1", "::1")
    env = {"BARGEIN_FORWARDED_ALLOW_IPS": "10.0.0.0/8, 192.0.2.7"}
    assert parse_serve_args([], env=env).server.forwarded_allow_ips == ("10.0.0.0/8", "192.0.2.7")
    assert parse_serve_args(["--forwarded-allow-ips", "*"], env={}).server.forwarded_allow_ips == ("*",)
    for bad in ("proxy.local", "10.0.0.1/8", "*,10.0.0.1"):  # uvicorn would take these as names
        with pytest.raises(SettingsError, match="must be an IP address or a network"):
            parse_serve_args(["--forwarded-allow-ips", bad], env={})


@pytest.mark.parametrize("origin", ["https://chat.example.com/app", "chat.example.com", "ftp://x"])
def test_allowed_origins_must_be_origins(origin: str) -> None:
    with pytest.raises(SettingsError, match="must be scheme://host"):
        parse_serve_args(["--allowed-origins", origin], env={})


# ---- serving TLS -----------------------------------------------------------------


@pytest.mark.slow
async def test_wss_gets_a_session_and_https_the_page(
    tls_server: EmbeddedServer, certificate: tuple[Path, Path]
) -> None:
    cert, _ = certificate
    url = f"wss://localhost:{tls_server.port}/v1/realtime"
    async with RealtimeClient(url, ssl=trusting(cert)) as client:
        assert client.session["type"] == "session.created"
        assert client.session["session_id"]
        assert "Paris" in await client.chat("Name the capital of France.", max_tokens=8, temperature=0)
    async with httpx.AsyncClient(verify=trusting(cert)) as http:
        page = await http.get(f"https://localhost:{tls_server.port}/")
    assert page.status_code == 200 and "bargein" in page.text


@pytest.mark.slow
async def test_tls_port_takes_no_plain_connection_and_an_untrusted_certificate_fails(
    tls_server: EmbeddedServer,
) -> None:
    with pytest.raises(InvalidMessage):  # the server answers plain HTTP with TLS, no HTTP response
        async with connect(f"ws://localhost:{tls_server.port}/v1/realtime", open_timeout=10):
            pass
    with pytest.raises(ssl.SSLCertVerificationError):
        async with connect(f"wss://localhost:{tls_server.port}/v1/realtime", open_timeout=10):
            pass  # the system's CAs do not know a self-signed certificate


# ---- behind a proxy ----------------------------------------------------------------


def proxied_settings(**server: object) -> Settings:
    """A server behind a proxy on the same machine: it serves the public name (the
    default, bound to loopback, serves only loopback names)."""
    return server_settings(allowed_hosts=("chat.example.com",), **server)


def proxied(server: EmbeddedServer, **headers: str) -> int:
    """Status of ``GET /v1/models`` as a TLS-terminating proxy forwards a page's request."""
    sent = {"Host": "chat.example.com", "Origin": PUBLIC_ORIGIN, "X-Forwarded-For": "203.0.113.9"} | headers
    return httpx.get(server.http_url + "/v1/models", headers=sent, timeout=30).status_code


@pytest.mark.slow
def test_self_origin_behind_a_trusted_proxy_uses_its_forwarded_scheme(live_server: LiveServer) -> None:
    with node_on_engine(live_server, proxied_settings(allowed_origins=("self",))) as server:
        # bargein hears http from the proxy; the page's origin is https: only
        # the forwarded scheme makes it the request's own origin
        assert proxied(server, **{"X-Forwarded-Proto": "https"}) == 200
        assert proxied(server) == 403
        assert proxied(server, **{"X-Forwarded-Proto": "https", "Origin": "https://evil.example"}) == 403
        # the same page with a default port spelled out is the same origin
        assert proxied(server, **{"X-Forwarded-Proto": "https", "Host": "chat.example.com:443"}) == 200


@pytest.mark.slow
def test_forwarded_headers_from_an_untrusted_peer_are_ignored(live_server: LiveServer) -> None:
    settings = proxied_settings(allowed_origins=("self",), forwarded_allow_ips=("192.0.2.1",))
    with node_on_engine(live_server, settings) as server, server_log("uvicorn.access") as log:
        assert proxied(server, **{"X-Forwarded-Proto": "https"}) == 403
    (line,) = [r for r in log.records if "/v1/models" in r.getMessage()]
    assert "127.0.0.1" in line.getMessage() and "203.0.113.9" not in line.getMessage()


@pytest.mark.slow
def test_client_address_in_the_access_log_is_the_forwarded_one_from_a_trusted_proxy(
    live_server: LiveServer,
) -> None:
    with node_on_engine(live_server, proxied_settings()) as server, server_log("uvicorn.access") as log:
        assert proxied(server, **{"X-Forwarded-Proto": "https"}) == 200
    (line,) = [r for r in log.records if "/v1/models" in r.getMessage()]
    assert "203.0.113.9" in line.getMessage()


@pytest.mark.slow
@pytest.mark.browser
def test_the_page_over_https_talks_wss_and_may_ask_for_the_microphone(tls_server: EmbeddedServer) -> None:
    with launch() as browser:
        # a self-signed certificate: the page's own check is not the point here
        context = browser.new_context(ignore_https_errors=True)
        page = context.new_page()
        page.goto(f"https://localhost:{tls_server.port}/")
        page.wait_for_selector('#conn[data-state="open"]', timeout=30_000)
        secure = page.evaluate("() => [isSecureContext, Boolean(navigator.mediaDevices?.getUserMedia)]")
        socket_url = page.evaluate("() => window.bargein.url")
        context.close()
    assert secure == [True, True]
    assert socket_url == f"wss://localhost:{tls_server.port}/v1/realtime"
