"""Start an MCP server as a subprocess on a local HTTP port, for as long as a block runs.

    async with serve_http(company_server_command()) as url:   # http://127.0.0.1:PORT/mcp
        ...

Used by the demo and the notebooks so the agent talks to the company server
over a real transport (streamable HTTP), one session per rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = REPO / "mcp_server.py"


def company_server_command(db: str | Path | None = None) -> list[str]:
    """argv that runs this repo's company-db server (mcp_server.py)."""
    if not SERVER_SCRIPT.exists():
        raise FileNotFoundError(f"{SERVER_SCRIPT} is missing: install mcp-rl from a checkout (pip install -e .)")
    return [sys.executable, str(SERVER_SCRIPT), *(["--db", str(db)] if db else [])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def serve_http(argv: list[str], *, port: int | None = None, token: str | None = None,
                     startup_timeout: float = 60.0):
    """Run `argv --transport http --host 127.0.0.1 --port P`; yield its /mcp URL; stop it after."""
    port = port or free_port()
    env = {**os.environ, **({"MCP_RL_TOKEN": token} if token else {})}
    # stderr goes to a file, not a pipe: a chatty server must never block on a full pipe.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([*argv, "--transport", "http", "--host", "127.0.0.1", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"MCP server {argv} exited with code {proc.returncode}: "
                                   f"{(log.seek(0), log.read())[1][-2000:]}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                if loop.time() > deadline:
                    raise RuntimeError(f"MCP server {argv} did not listen on port {port} within {startup_timeout:.0f} s")
                await asyncio.sleep(0.2)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
