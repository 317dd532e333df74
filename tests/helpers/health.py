"""The host's HTTP endpoints (``/healthz``, ``/readyz``, ``/metrics``) as tests read them."""

from __future__ import annotations

import aiohttp


async def get(port: int, path: str) -> tuple[int, str]:
    """GET ``path`` on 127.0.0.1:``port``: the status and the body; ``(0, "")`` when
    nothing answers."""
    try:
        async with aiohttp.ClientSession() as s, \
                s.get(f"http://127.0.0.1:{port}{path}",
                      timeout=aiohttp.ClientTimeout(total=5)) as r:
            return r.status, await r.text()
    except aiohttp.ClientConnectionError:
        return 0, ""
