"""The host's HTTP endpoints (``/healthz``, ``/readyz``, ``/metrics``) as tests read them."""

from __future__ import annotations

import re

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


async def metric(port: int, name: str) -> float:
    """One sample of ``/metrics`` (its first series of ``name``, labels or not); 0 when
    the host has not reported it yet."""
    _, text = await get(port, "/metrics")
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([\d.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0
