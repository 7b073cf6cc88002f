"""The ``Host`` allow-list and the default ``Origin`` check (``--allowed-hosts``,
app/auth.py), against DNS rebinding and cross-site pages, on real sockets.

A browser page on another site sends its own ``Origin``; a DNS-rebinding page
(its own name resolved to the server's address) sends its own name as
``Host`` too. The servers run on live_server's engine (no second model load).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from bargein.app.auth import AuthConfig, host_of
from bargein.app.embedded import EmbeddedServer
from bargein.app.settings import ServerConfig, Settings, SettingsError, parse_serve_args
from bargein.session.conversation.config import SessionConfig
from tests.app.conftest import LiveServer, node_on_engine

EVIL = "http://evil.example"


def server_settings(**server: object) -> Settings:
    return Settings(
        session=SessionConfig(max_tokens=64, default_max_tokens=8),
        server=ServerConfig(port=0, log_level="warning", **server),  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def default_server(live_server: LiveServer) -> Iterator[EmbeddedServer]:
    """A server with the default hosts and origins, bound to loopback."""
    with node_on_engine(live_server, server_settings()) as server:
        yield server


def get(server: EmbeddedServer, path: str = "/v1/models", **headers: str) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{server.port}{path}", headers=headers, timeout=30)


def refusals(server: EmbeddedServer, reason: str) -> float:
    value = server.state.metrics.auth_refusals.labels(reason=reason)._value.get()
    return float(value)


# ---- settings ----------------------------------------------------------------------


def test_the_default_hosts_follow_the_bound_address() -> None:
    loopback = {"localhost", "127.0.0.1", "[::1]"}
    assert ServerConfig(host="127.0.0.1").trusted_hosts == loopback
    assert ServerConfig(host="::1").trusted_hosts == loopback
    assert ServerConfig(host="127.0.0.2").trusted_hosts == loopback | {"127.0.0.2"}
    assert ServerConfig(host="0.0.0.0").trusted_hosts == {"*"}
    settings = parse_serve_args(["--allowed-hosts", "Chat.Example.com,*.corp.example,::1"], env={})
    assert settings.server.trusted_hosts == {"chat.example.com", "*.corp.example", "[::1]"}


@pytest.mark.parametrize(
    "entry", ["http://chat.example.com", "chat.example.com:443", "a/b", "*.[::1]", "a b"]
)
def test_allowed_hosts_must_be_host_names(entry: str) -> None:
    with pytest.raises(SettingsError, match="allowed host"):
        parse_serve_args(["--allowed-hosts", f"localhost,{entry}"], env={})


def test_a_host_header_is_read_as_browsers_write_it() -> None:
    assert host_of("127.0.0.1:8000") == "127.0.0.1"
    assert host_of("[::1]:8000") == "[::1]"
    assert host_of("LocalHost.") == "localhost"
    for bad in ("", "a b", "user@127.0.0.1", "[::zz]", "::1", "127.0.0.1:99999999"):
        assert host_of(bad) is None
    with pytest.raises(ValueError, match="at least one host"):
        AuthConfig(allowed_hosts=frozenset())


# ---- defaults, on loopback ------------------------------------------------------------


@pytest.mark.slow
async def test_by_default_another_sites_page_cannot_open_a_websocket(default_server: EmbeddedServer) -> None:
    before = refusals(default_server, "origin_not_allowed")
    with pytest.raises(InvalidStatus) as refused:
        await connect(default_server.ws_url, origin=EVIL)  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body or b"")["error"]["code"] == "origin_not_allowed"
    assert refusals(default_server, "origin_not_allowed") == before + 1
    # the page bargein serves, any page on this machine, and clients without Origin
    for origin in (f"http://127.0.0.1:{default_server.port}", "http://localhost:3000", None):
        async with connect(default_server.ws_url, origin=origin) as ws:  # type: ignore[arg-type]
            assert '"session.created"' in str(await ws.recv())


@pytest.mark.slow
async def test_by_default_a_rebound_host_is_refused_before_the_upgrade(
    default_server: EmbeddedServer,
) -> None:
    port = default_server.port
    with pytest.raises(InvalidStatus) as refused:  # the browser connects to 127.0.0.1 by that name
        await connect(f"ws://rebind.evil.example:{port}/v1/realtime", host="127.0.0.1", port=port)
    assert refused.value.response.status_code == 400
    assert json.loads(refused.value.response.body or b"")["error"]["code"] == "host_not_allowed"


@pytest.mark.slow
def test_by_default_a_dns_rebinding_page_cannot_read_the_http_api(default_server: EmbeddedServer) -> None:
    before = refusals(default_server, "host_not_allowed")
    rebound = {"Host": f"rebind.evil.example:{default_server.port}"}
    for headers in (rebound, rebound | {"Origin": f"http://rebind.evil.example:{default_server.port}"}):
        response = get(default_server, **headers)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "host_not_allowed"
    assert get(default_server, "/", **rebound).status_code == 400  # the page too
    assert refusals(default_server, "host_not_allowed") == before + 3
    # probes stay open (a balancer names the node's address); loopback names pass
    assert get(default_server, "/healthz", **rebound).status_code == 200
    for host in ("localhost", f"127.0.0.1:{default_server.port}", "[::1]:8000", "LOCALHOST."):
        assert get(default_server, Host=host).status_code == 200
    assert get(default_server, Host="").status_code == 400


# ---- explicit lists -------------------------------------------------------------------


@pytest.mark.slow
def test_self_is_judged_against_the_allowed_hosts_not_the_host_header(live_server: LiveServer) -> None:
    with node_on_engine(live_server, server_settings(allowed_origins=("self",))) as server:
        own = f"http://127.0.0.1:{server.port}"
        assert get(server, Origin=own).status_code == 200
        assert get(server, Origin=EVIL).status_code == 403
        rebound = f"rebind.evil.example:{server.port}"
        assert get(server, Origin=f"http://{rebound}", Host=rebound).status_code == 400


@pytest.mark.slow
def test_listed_hosts_are_served_and_their_pages_allowed(live_server: LiveServer) -> None:
    settings = server_settings(allowed_hosts=("chat.example.com", "*.corp.example"))
    with node_on_engine(live_server, settings) as server:
        assert get(server, Host="chat.example.com", Origin="https://chat.example.com").status_code == 200
        assert get(server, Host="a.corp.example:8443", Origin="https://b.corp.example").status_code == 200
        assert get(server, Host="corp.example").status_code == 400  # *.x is its sub-domains only
        assert get(server, Host="127.0.0.1").status_code == 400  # a list replaces the default
        assert get(server, Host="chat.example.com", Origin=EVIL).status_code == 403


@pytest.mark.slow
def test_with_any_host_only_the_pages_own_origin_is_allowed_by_default(live_server: LiveServer) -> None:
    with node_on_engine(live_server, server_settings(allowed_hosts=("*",))) as server:
        assert get(server, Host="chat.example.com", Origin="http://chat.example.com").status_code == 200
        assert get(server, Host="chat.example.com", Origin=EVIL).status_code == 403
        assert get(server, Host="chat.example.com").status_code == 200
