"""How uvicorn serves bargein's app: one ``uvicorn.Config`` for ``bargein serve``
and for the embedded test server, so both listen the same way.

WebSockets through websockets' sans-I/O implementation (the legacy one is
deprecated), frames bounded by ``max_frame_bytes``, uvicorn's pings, TLS
from ``--ssl-certfile``/``--ssl-keyfile``, and uvicorn's proxy headers
trusted only from ``--forwarded-allow-ips``: from those peers
``X-Forwarded-For`` becomes the client address (access logs, the per-address
limits of ``app/auth.py``) and ``X-Forwarded-Proto`` the scheme (the ``self``
origin of the Origin check).
"""

from __future__ import annotations

import os
import ssl
from typing import Any

import uvicorn

from bargein.app.settings import ServerConfig, Settings, SettingsError


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration serving ``app`` under ``settings``.

    Args:
        app: the ASGI app (``bargein.app.server.create_app``).
        settings: host, port, TLS, proxies, pings and the frame bound.
        overrides: other ``uvicorn.Config`` arguments (``log_config``, ...).
    """
    server = settings.server
    options: dict[str, Any] = {
        "host": server.host,
        "port": server.port,
        "log_level": server.log_level,
        "ws": "websockets-sansio",
        "ws_max_size": settings.session.max_frame_bytes,
        "ws_ping_interval": server.ws_ping_interval_s or None,
        "ws_ping_timeout": server.ws_ping_timeout_s or None,
        "ssl_certfile": server.ssl_certfile,
        "ssl_keyfile": server.ssl_keyfile,
        "proxy_headers": True,
        # Given explicitly: uvicorn would otherwise read FORWARDED_ALLOW_IPS itself.
        "forwarded_allow_ips": list(server.forwarded_allow_ips),
    }
    return uvicorn.Config(app, **(options | overrides))


def check_tls(server: ServerConfig) -> None:
    """Refuse, before the model loads, a certificate and key that cannot serve TLS.

    Raises:
        FileNotFoundError: one of the files is missing (naming its flag).
        SettingsError: they are not a PEM certificate and its private key
            (OpenSSL's reason).
    """
    if server.ssl_certfile is None or server.ssl_keyfile is None:
        return
    for flag, path in (("--ssl-certfile", server.ssl_certfile), ("--ssl-keyfile", server.ssl_keyfile)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{flag} {path!r} does not exist")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(server.ssl_certfile, server.ssl_keyfile)
    except ssl.SSLError as exc:
        raise SettingsError(
            f"--ssl-certfile {server.ssl_certfile!r} and --ssl-keyfile {server.ssl_keyfile!r} "
            f"are not a PEM certificate and its private key ({exc})"
        ) from None
