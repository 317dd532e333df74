"""The client side of TLS for the host's connections (Redis, MQTT): the system's CAs
or a bundle, and a client certificate where the server asks for one."""

from __future__ import annotations

import ssl


def client_context(ca_file: str = "", cert_file: str = "",
                   key_file: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx
