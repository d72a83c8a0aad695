"""What the loopback HTTP apps (serve.openai_app, workers.worker_app) check before they read a request.

    app = LoopbackOnly(app, refuse=lambda status, message: JSONResponse(...))   # Host and Content-Type
    data = await read_json(request, max_bytes)                                # capped, depth-checked
    is_loopback_url("http://127.0.0.1:8000/v1")                                # True

Both apps listen on 127.0.0.1 only, which keeps other machines out but not a web page open in the
operator's browser: a page may POST to http://127.0.0.1:PORT. Two checks close that door without
CORS machinery: a POST must be `Content-Type: application/json` (a page cannot send that cross-site
without a CORS preflight, which these apps never approve), and the Host header must name a loopback
address (a DNS-rebinding page reaches 127.0.0.1 under its own host name). A body is read in chunks
and refused past its cap (by Content-Length before a byte is read, else as soon as it grows past),
and JSON nested deeper than `MAX_DEPTH` is a 400, not a RecursionError (a 500) in the handler.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Callable
from urllib.parse import urlsplit

__all__ = ["LoopbackOnly", "BadRequest", "read_json", "json_depth", "is_loopback_url", "LOOPBACK_HOSTS", "MAX_DEPTH"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
MAX_DEPTH = 64  # chat messages and rollout requests nest < 10 deep; tool arguments a little more


class BadRequest(Exception):
    """A request refused before it reaches a handler: `status` and a one-line `message`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _host_name(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1', '[::1]:80' -> '::1', 'localhost' -> 'localhost'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback_host(name: str | None) -> bool:
    """127.0.0.0/8, ::1 or localhost.

    >>> [is_loopback_host(h) for h in ("127.0.0.1", "127.9.9.9", "localhost", "::1", "10.0.0.1", "evil.test")]
    [True, True, True, True, False, False]
    """
    if not name:
        return False
    if name.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback_url(url: str) -> bool:
    """Whether `url` is http(s) to this machine.

    >>> is_loopback_url("http://127.0.0.1:9/v1"), is_loopback_url("http://[::1]:9/v1"), is_loopback_url("http://10.0.0.5/v1")
    (True, True, False)
    """
    try:
        parts = urlsplit(url)
        return parts.scheme in ("http", "https") and is_loopback_host(parts.hostname)
    except ValueError:
        return False


class LoopbackOnly:
    """ASGI middleware: refuse a request whose Host is not loopback (or one of `hosts`), and a POST whose
    Content-Type is not application/json; `refuse(status, message)` makes the app's own error response."""

    def __init__(self, app: Any, *, refuse: Callable[[int, str], Any], hosts: tuple[str, ...] = ()):
        self.app, self.refuse, self.hosts = app, refuse, tuple(h.lower() for h in hosts)

    def check(self, scope: dict) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        name = _host_name(headers.get("host", ""))
        if not (is_loopback_host(name) or name in self.hosts):
            return 403, (f"Host {name[:60]!r} is not this machine's loopback address; connect to "
                         "http://127.0.0.1:PORT (an SSH tunnel or a proxy that keeps the Host header)")
        if scope.get("method") == "POST":
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if kind != "application/json":
                return 415, f"Content-Type must be application/json, got {kind[:60] or 'none'!r}"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refused = self.check(scope)
            if refused is not None:
                return await self.refuse(*refused)(scope, receive, send)
        await self.app(scope, receive, send)


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest in `value` (no recursion: a deep value cannot overflow it).

    >>> json_depth({"a": [1, {"b": []}]}), json_depth(3)
    (4, 0)
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


async def read_json(request: Any, max_bytes: int, *, too_big: str = "send less per request") -> Any:
    """The request's body as JSON, read at most `max_bytes` deep; BadRequest (413 / 400) otherwise."""
    from mcp_rl.quote import short

    over = BadRequest(413, f"the body is over {max_bytes} bytes; {too_big}")
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise BadRequest(400, "Content-Length is not a number") from None
    if declared > max_bytes:  # refused before a byte of it is read
        raise over
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:  # chunked, or a Content-Length that lied: stop reading here
            raise over
    try:
        data = json.loads(body)
    except RecursionError:
        raise BadRequest(400, f"the JSON nests deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"the body is not valid JSON ({type(e).__name__}): "
                              f"{short(body[:200].decode('utf-8', 'replace'))}") from None
    if json_depth(data) > MAX_DEPTH:
        raise BadRequest(400, f"the JSON nests deeper than {MAX_DEPTH} levels")
    return data
