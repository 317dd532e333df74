"""Node.js for the tests that run a peer of ``tests/peers`` written on node-opcua: the
``node`` binary found (the ``node`` fixture of ``tests/conftest.py`` asks for it) and
the environment to run it in."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

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


async def start_peer(node: str, script: str, args: list[str], ready: str, log: Path,
                     timeout_s: float = 30.0) -> asyncio.subprocess.Process:
    """Run ``tests/peers/{script}`` with ``args`` until it prints ``ready``; its output
    goes to ``log`` (never a pipe nobody reads: node-opcua's warnings would fill it)."""
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            node, str(PEERS / script), *args, cwd=str(PEERS),
            env={**os.environ, **NODE_ENV}, stdout=out, stderr=subprocess.STDOUT)
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while ready not in log.read_text(errors="replace"):
        assert proc.returncode is None, f"{script} exit {proc.returncode}:\n{log.read_text()}"
        assert loop.time() < end, f"{script} not ready:\n{log.read_text()}"
        await asyncio.sleep(0.05)
    return proc


async def stop_peer(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM, and wait for it (a peer still running at a test's end)."""
    if proc.returncode is None:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
