"""Tests for mcp_rl/mcp/launch.py's promise that a server child never outlives its starter, and for the
session-end check in tests/conftest.py that fails a test run leaving a server process behind.

    .venv/bin/python -m pytest tests/test_launch.py -q
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not alive(pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", ["SIGKILL", "exit"])
def test_the_company_server_dies_with_the_process_that_started_it(how):
    """A notebook kernel killed at shutdown (make test's orphan) or a script that never called stop()
    left `mcp_server.py --transport http` running."""
    end = "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)" if how == "SIGKILL" else "pass"
    code = ("from mcp_rl.environments.company import command as c\nfrom mcp_rl.mcp.launch import HttpServer\n"
            "s = HttpServer(c()).start()\nprint(s.proc.pid, flush=True)\n" + end)
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        if how == "SIGKILL":
            parent.kill()  # stopped, then killed: no Python code of the parent runs again
        parent.wait(timeout=60)
        assert wait_gone(child, 20), f"mcp_server.py (pid {child}) outlived its starter ({how})"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


LEAKY = '''
import subprocess, sys

def test_leaves_a_server(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "mcp_server.py", "--transport", "http"])
    open({pidfile!r}, "w").write(str(proc.pid))
    {stop}
'''


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the check reads /proc")
@pytest.mark.parametrize("stop", [False, True])
def test_the_session_fails_when_a_test_leaves_a_server_running(tmp_path, stop):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    shutil.copytree(ROOT / "tests" / "netguard", tmp_path / "netguard")  # the conftest installs its network guard
    pidfile = tmp_path / "pid"
    (tmp_path / "test_leaky.py").write_text(LEAKY.format(pidfile=str(pidfile),
                                                         stop="proc.kill(); proc.wait()" if stop else "pass"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_leaky.py")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    pid = int(pidfile.read_text())
    try:
        if stop:
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        else:
            assert done.returncode == 1 and "tests left 1 process(es) running" in done.stderr, done.stderr[-2000:]
            assert f"pid {pid}: " in done.stderr and wait_gone(pid, 10)  # reported, and killed
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_environment_serve_starts_company_for_the_block_and_passes_the_rest_as_given():
    """The one reading of a --server value that runs, the CLI's commands and the rollout worker share."""
    import socket as socket_module

    from mcp_rl.environment import environment

    server_spec = lambda spec, token=None: environment(spec).serve(token)  # noqa: E731
    with server_spec("company", "tok") as spec:
        port = int(spec["url"].rsplit(":", 1)[1].split("/")[0])
        assert spec["token"] == "tok" and spec["url"].startswith("http://127.0.0.1:")
        socket_module.create_connection(("127.0.0.1", port), timeout=5).close()  # listening during the block
    with pytest.raises(OSError):
        socket_module.create_connection(("127.0.0.1", port), timeout=2).close()  # stopped after it
    with server_spec("https://h/mcp", "t") as spec:
        assert spec == {"url": "https://h/mcp", "token": "t"}
    for plain in ("mcp_server.py", "uvx some-server", "http://h/mcp"):  # no token: the spec as it is
        with server_spec(plain) as spec:
            assert spec == plain
