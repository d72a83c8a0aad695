"""The test suite's network guard, in every Python process a test starts (this folder is on their PYTHONPATH;
tests/conftest.py installs the same guard in pytest's own process).

Tests talk to loopback only: a connection or name lookup for anywhere else is refused with an error naming
it, and written to the file named by MCP_RL_NET_LOG, which fails the test session (so a test that quietly
depended on the package index, a model hub or a judge API cannot pass, nor come back unnoticed)."""

import ipaddress
import os
import socket
import traceback

_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}


class OffLoopback(ConnectionRefusedError):
    """A test reached for the network beyond loopback."""


def is_local(host) -> bool:
    """Loopback, a local name, or not a network address at all (a Unix socket path)."""
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host is None or not isinstance(host, str):
        return True
    host = host.strip("[]").split("%")[0].lower()
    if host in LOCAL_NAMES or host == "":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def refuse(what: str):
    line = f"pid {os.getpid()}: {what}\n" + "".join(traceback.format_stack(limit=12)[:-2])
    if os.environ.get("MCP_RL_NET_LOG"):
        with open(os.environ["MCP_RL_NET_LOG"], "a") as log:
            log.write(line + "\n")
    raise OffLoopback(f"tests may use loopback only, and this reached for {what} (tests/netguard)")


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not is_local(address[0]):
        refuse(f"{address[0]}:{address[1]}")
    return _connect(self, address)


def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not is_local(address[0]):
        refuse(f"{address[0]}:{address[1]}")
    return _connect_ex(self, address)


def getaddrinfo(host, *args, **kwargs):
    if not is_local(host):
        refuse(f"a name lookup of {host!r}")
    return _getaddrinfo(host, *args, **kwargs)


def install() -> None:
    socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo


if __name__ == "sitecustomize" and os.environ.get("MCP_RL_NET_LOG"):  # a Python a test started
    install()
