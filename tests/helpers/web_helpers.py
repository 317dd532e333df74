"""Helpers for the web view's tests: a recipe whose every name is hostile, and an HTTP
client that keeps cookies per test (the browser test drives a real browser instead)."""

from __future__ import annotations

import re
from typing import Any

import aiohttp

HOSTILE = "<script>alert(1)</script>"
HOSTILE_STEP = "Load\"'<b>x"
HOSTILE_ACTION = 'a"><img/src=x/onerror=alert(2)>'
HOSTILE_JOB = "J<script>alert(3)</script>\"'&x"
HOSTILE_WM = "wm\"><script>alert(4)</script>"
OWN_SCRIPT = '<script src="/static/web.js" defer></script>'
HOSTILE_TEXTS = (HOSTILE, HOSTILE_STEP, HOSTILE_ACTION, HOSTILE_JOB, HOSTILE_WM)


def hostile_work_master() -> dict[str, Any]:
    """A Work Master whose id, steps and action carry markup and quotes."""
    return {
        "ID": HOSTILE_WM,
        "Description": {"Locale": "en", "Text": HOSTILE},
        "dataschema": "1.1.0",
        "data": {
            "Steps": [{"Name": HOSTILE_STEP, "Initial": True}, {"Name": HOSTILE}],
            "Transitions": [{"Source": HOSTILE_STEP, "Target": HOSTILE,
                             "Condition": "always"}],
            "Actions": [{"Name": HOSTILE_ACTION, "Step": HOSTILE, "Qualifier": "N",
                         "Interaction": "push_command", "TypeId": "com.example.x.v1",
                         "TimeoutSeconds": 600}],
        },
    }


def hostile_order(job: str = HOSTILE_JOB) -> dict[str, Any]:
    return {"JobOrderID": job, "WorkMasterID": [{"ID": HOSTILE_WM}], "Priority": 1}


def assert_escaped(html: str) -> None:
    """No hostile text as markup: each appears only escaped (or not at all)."""
    for text in HOSTILE_TEXTS:
        assert text not in html, f"unescaped {text!r}"
    # the only script is the page's own file; no injected script, image or frame
    html = html.replace(OWN_SCRIPT, "", 1)
    tags = set(re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", html))
    assert not tags & {"script", "img", "iframe", "b"}, tags


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


class Client:
    """An aiohttp session against one server, cookies kept, no redirects followed."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.headers = headers or {}
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True),
                                             headers=self.headers,
                                             timeout=aiohttp.ClientTimeout(total=10))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.session is not None
        await self.session.close()

    async def get(self, path: str, **kw: Any) -> tuple[int, str, Any]:
        assert self.session is not None
        async with self.session.get(self.base + path, allow_redirects=False, **kw) as r:
            return r.status, await r.text(), r.headers

    async def post(self, path: str, data: dict[str, str], *, origin: str | None = "same",
                   **kw: Any) -> tuple[int, str, Any]:
        assert self.session is not None
        headers = dict(kw.pop("headers", {}))
        if origin == "same":
            headers["Origin"] = self.base
        elif origin is not None:
            headers["Origin"] = origin
        async with self.session.post(self.base + path, data=data, headers=headers,
                                     allow_redirects=False, **kw) as r:
            return r.status, await r.text(), r.headers
