"""The test suite's network guard (tests/netguard/sitecustomize.py, installed by tests/conftest.py): loopback
passes, anything else is refused and logged, in pytest's process and in a Python a test starts. No packet
leaves: the real connect is replaced by a recorder before each refused call.
Run: pytest tests/test_netguard.py"""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

GUARD = Path(__file__).resolve().parent / "netguard" / "sitecustomize.py"


def guard():
    spec = importlib.util.spec_from_file_location("netguard_under_test", GUARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("host, local", [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True), ("localhost", True), ("0.0.0.0", True),
    (b"127.0.0.1", True), ("pypi.org", False), ("93.184.216.34", False), ("10.0.0.1", False), ("192.168.1.2", False),
    ("2001:db8::1", False), ("files.pythonhosted.org", False),
])
def test_only_loopback_counts_as_local(host, local):
    assert guard().is_local(host) is local


def test_a_connection_beyond_loopback_is_refused_and_logged_in_this_process(tmp_path, monkeypatch):
    g, reached = guard(), []
    monkeypatch.setattr(g, "_connect", lambda sock, address: reached.append(address))  # no packet ever leaves
    monkeypatch.setenv("MCP_RL_NET_LOG", str(tmp_path / "net.log"))  # this test's own log, not the session's
    with socket.socket() as sock, pytest.raises(g.OffLoopback, match="192.0.2.1:9"):
        g.connect(sock, ("192.0.2.1", 9))
    with socket.socket() as sock:
        g.connect(sock, ("127.0.0.1", 9))  # loopback goes through to the real connect (here, the recorder)
    with pytest.raises(g.OffLoopback, match="name lookup of 'pypi.org'"):
        g.getaddrinfo("pypi.org", 443)
    assert reached == [("127.0.0.1", 9)]
    assert (tmp_path / "net.log").read_text().count("pid ") == 2


def test_the_guard_is_on_in_this_session_and_in_a_python_a_test_starts(tmp_path):
    assert socket.getaddrinfo.__module__ == "mcp_rl_netguard"  # conftest installed it here
    code = ("import socket, sitecustomize as g\n"
            "g._connect = lambda sock, address: print('CONNECTED', address)\n"  # no packet ever leaves
            "try:\n    socket.socket().connect(('192.0.2.1', 9))\nexcept g.OffLoopback as e:\n    print('REFUSED', e)\n")
    env = {**os.environ, "MCP_RL_NET_LOG": str(tmp_path / "child.log")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert "REFUSED" in done.stdout and "CONNECTED" not in done.stdout, done.stdout + done.stderr
    assert "192.0.2.1:9" in (tmp_path / "child.log").read_text()
