"""Node.js for the tests that run a peer of ``tests/peers`` written on node-opcua: the
``node`` binary found (the ``node`` fixture of ``tests/conftest.py`` asks for it) and
the environment to run it in."""

from __future__ import annotations

import shutil
import subprocess

from helpers.servers import NPM_HINT, PEERS, ServerMissing, missing

NODE_ENV = {"NODE_NO_WARNINGS": "1"}    # node-opcua declares Node 22; it runs on 20


def find_node() -> str:
    """The ``node`` binary (20 or newer), with node-opcua installed in tests/peers;
    else a skip (a failure under CI)."""
    path = shutil.which("node")
    try:
        if path is None:
            raise ServerMissing("node not found on PATH")
        version = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
        if int(version.lstrip("v").split(".")[0] or 0) < 20:
            raise ServerMissing(f"node {version} is too old (20 or newer)")
        if not (PEERS / "node_modules" / "node-opcua" / "package.json").is_file():
            raise ServerMissing("node-opcua is not installed in tests/peers")
    except ServerMissing as e:
        missing(e, NPM_HINT)
    assert path is not None
    return path
