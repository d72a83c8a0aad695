"""Start an MCP server as a subprocess on a local HTTP port.

    server = HttpServer([sys.executable, "my_server.py"]).start()   # notebooks: stays up across cells
    print(server.url)                                               # http://127.0.0.1:PORT/mcp
    server.stop()

    async with serve_http(argv) as url:                             # scripts: for as long as a block runs
        ...

`Environment.serve` / `.start` use it for an environment whose server is a command (the company one),
so the agent talks to it over a real transport (streamable HTTP), one session per rollout.

The child never outlives its starter: `stop()` (or the `with` block) ends it, so does the starting
interpreter's normal exit (atexit), and on Linux so does the starter's death by any signal,
SIGKILL included (PR_SET_PDEATHSIG, asked for in the child before it runs the server). A Jupyter
kernel killed at shutdown, or a rollout worker killed by its supervisor, leaves no server running.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import signal
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

def _die_with_parent() -> Any:
    """A preexec_fn asking Linux for SIGTERM to the child when the thread that started it dies; None
    elsewhere (atexit and stop() end it there). libc is loaded here, in the parent: a forked child
    of a threaded process must not import or load anything before it execs."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG


def _end(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_LIVE: set[subprocess.Popen] = set()  # started and not stopped: ended when the interpreter exits
atexit.register(lambda: [_end(p) for p in list(_LIVE)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """`argv --transport http --host 127.0.0.1 --port P` as a child process."""

    def __init__(self, argv: list[str], *, port: int | None = None, token: str | None = None,
                 startup_timeout: float = 60.0):
        self.argv, self.port, self.token, self.startup_timeout = list(argv), port or free_port(), token, startup_timeout
        self.proc: subprocess.Popen | None = None
        # stderr goes to a file, not a pipe: a chatty server must never block on a full pipe.
        self._log = tempfile.TemporaryFile(mode="w+")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def spec(self) -> dict:
        """A ServerSpec for mcp_rl (the URL, with the token when there is one)."""
        return {"url": self.url, **({"token": self.token} if self.token else {})}

    def start(self) -> "HttpServer":
        self._spawn()
        return self._wait()

    def _spawn(self) -> None:
        env = {**os.environ, **({"MCP_RL_TOKEN": self.token} if self.token else {})}
        # PDEATHSIG follows the thread that forks: only the main thread lives as long as the process.
        main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            [*self.argv, "--transport", "http", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=self._log, text=True,
            preexec_fn=_die_with_parent() if main else None)
        _LIVE.add(self.proc)

    def _wait(self) -> "HttpServer":
        try:
            return self._wait_listening()
        except BaseException:  # a failed start, or Ctrl-C / a cancelled task while waiting: no orphan
            self.stop()
            raise

    def _wait_listening(self) -> "HttpServer":
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self.proc.poll() is not None:
                self._log.seek(0)
                raise RuntimeError(f"MCP server {self.argv} exited with code {self.proc.returncode}: "
                                   f"{self._log.read()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"MCP server {self.argv} did not listen on port {self.port} "
                                       f"within {self.startup_timeout:.0f} s")
                time.sleep(0.2)

    @property
    def alive(self) -> bool:
        """Started and not exited (a notebook cell run twice keeps a live server)."""
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None:
            _end(self.proc)
            _LIVE.discard(self.proc)

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.asynccontextmanager
async def serve_http(argv: list[str], *, port: int | None = None, token: str | None = None,
                     startup_timeout: float = 60.0):
    """Run an HttpServer for the duration of an `async with`; yield its /mcp URL."""
    server = HttpServer(argv, port=port, token=token, startup_timeout=startup_timeout)
    try:
        server._spawn()  # on this (the loop's) thread: a worker thread's exit would signal the child
        await asyncio.to_thread(server._wait)  # cancelled while starting: the finally stops it
        yield server.url
    finally:
        server.stop()


class Running:
    """A server that needs no starting (a URL, a stdio command, a FastMCP object), shaped like a started
    HttpServer for notebooks: `.spec`, `.alive`, `.stop()` (a stdio server lives one session at a time)."""

    def __init__(self, spec):
        self.spec, self.alive = spec, True

    @property
    def url(self) -> str | None:
        return self.spec if isinstance(self.spec, str) and self.spec.startswith(("http://", "https://")) else None

    def stop(self) -> None:
        self.alive = False
