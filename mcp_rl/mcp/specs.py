"""Name an MCP server: which transport a spec means, and the `fastmcp.Client` for it.

`make_client(spec)` turns a `ServerSpec` (a FastMCP object, a .py path, a shell command, an
http(s) URL, or a dict; `mcp_rl.mcp.connect` lists the forms) into a not yet connected client:
in-process, stdio (with a clean environment, `stdio_env`) or streamable HTTP (with a pool that
closes idle connections after 1 s). `describe_spec(spec)` is its one-line, secret-free name for
logs and errors. Sessions over these clients are `mcp_rl.mcp.connect.ToolSession`'s.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Union
from urllib.parse import urlsplit

import fastmcp
import httpx2
from fastmcp.client.transports import FastMCPTransport, StdioTransport, StreamableHttpTransport
from mcp.client.stdio import DEFAULT_INHERITED_ENV_VARS

from mcp_rl.redact import redact

ServerSpec = Union[fastmcp.FastMCP, str, os.PathLike, dict]

__all__ = ["ServerSpec", "ServerUnavailable", "make_client", "is_stdio", "describe_spec", "stdio_env", "STDIO_ENV_ALLOWLIST"]

_DICT_KEYS = {"url", "headers", "token", "command", "args", "env", "env_passthrough", "inherit_env", "cwd"}
# What a stdio server inherits from us unless its spec says more: the MCP SDK's list (PATH, HOME,
# USER, SHELL, TERM; SYSTEMROOT, APPDATA, ... on Windows) plus locale, time zone, temp and XDG
# folders, which interpreters and npx/uvx read. None of these holds a secret.
STDIO_ENV_ALLOWLIST: tuple[str, ...] = (
    *DEFAULT_INHERITED_ENV_VARS, "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "TMP", "TEMP",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR", "SYSTEMROOT", "COMSPEC", "WINDIR")
_URL = re.compile(r"\s*https?://", re.I)


class ServerUnavailable(RuntimeError):
    """The MCP server could not be started or reached; the message says what to check."""


def is_stdio(spec: ServerSpec) -> bool:
    """Whether `spec` runs a server over stdio (not in-process, not a URL, not an MCP config)."""
    return not (isinstance(spec, fastmcp.FastMCP) or isinstance(spec, str) and _URL.match(spec)
                or isinstance(spec, dict) and bool({"url", "mcpServers"} & spec.keys()))


def _stdio_argv(spec: str | os.PathLike) -> list[str] | None:
    """The argv a path or command spec runs, or None when it is a URL."""
    text = str(spec).strip()
    if not isinstance(spec, os.PathLike) and _URL.match(text):
        return None
    if isinstance(spec, os.PathLike) or (
            text.endswith(".py") and (" " not in text or Path(text).expanduser().is_file())):
        return [sys.executable, str(Path(text).expanduser().resolve())]
    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"Cannot parse server command {redact(text)[:200]!r}: {e}") from None
    if not argv:
        raise ValueError("Empty server spec: give a .py path, a command such as "
                         "'python mcp_server.py', or an http(s)://…/mcp URL.")
    return _python_first(argv)


def _python_first(argv: list[str]) -> list[str]:
    # "python" on PATH is often not the interpreter that has the server's packages (an
    # unactivated venv), so a Python server runs under this interpreter, as a .py path does.
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if argv and argv[0].endswith(".py"):
        return [sys.executable, *argv]
    return argv


def _check_argv(argv: list[str], spec: Any, cwd: Any = None) -> None:
    if shutil.which(argv[0]) is None:
        raise ServerUnavailable(f"Cannot start MCP server {describe_spec(spec)}: command "
                                f"{redact(argv[0])[:200]!r} was not found on PATH. Install it or give its full path.")
    base = Path(cwd or os.getcwd())
    if argv[0] == sys.executable and len(argv) > 1 and argv[1].endswith(".py") \
            and not (base / argv[1]).is_file():
        raise ServerUnavailable(f"Cannot start MCP server {describe_spec(spec)}: no such file "
                                f"{redact(argv[1])[:200]!r}. Check the path (relative paths are from {base}).")


def _env_names(names: Any) -> list[str]:
    if isinstance(names, str) or not all(isinstance(n, str) and n for n in names or []):
        raise ValueError("'env_passthrough' must be a list of variable names such as "
                         f"[\"OPENAI_API_KEY\", \"AWS_*\"], got {redact(repr(names))[:200]}")
    return list(names or [])


def stdio_env(env: dict | None = None, passthrough: list[str] = (), inherit: bool = False) -> dict[str, str]:
    """The environment a stdio server starts with: `STDIO_ENV_ALLOWLIST` and `passthrough` names
    (a trailing * matches a prefix) copied from ours, or all of ours with `inherit`, then `env`.

    >>> env = stdio_env({"API_KEY": "k"}, passthrough=["NO_SUCH_VARIABLE"])
    >>> env["API_KEY"], "NO_SUCH_VARIABLE" in env, env.get("PATH") == os.environ.get("PATH")
    ('k', False, True)
    """
    patterns = [*STDIO_ENV_ALLOWLIST, *passthrough]

    def wanted(name: str) -> bool:
        return any(name == p or p.endswith("*") and name.startswith(p[:-1]) for p in patterns)

    # Like the SDK, skip exported shell functions ("() { ...") unless the whole environment is asked for.
    base = dict(os.environ) if inherit else {k: v for k, v in os.environ.items()
                                             if wanted(k) and not v.startswith("()")}
    return {**base, **{str(k): str(v) for k, v in (env or {}).items()}}


def _http_client(headers: dict | None = None, timeout: httpx2.Timeout | None = None,
                 auth: httpx2.Auth | None = None, **_: Any) -> httpx2.AsyncClient:
    """The MCP SDK's HTTP client, except that idle pooled connections close after 1 s.

    httpx keeps them 5 s, exactly uvicorn's default keep-alive: a call sent as the server drops
    the idle connection fails with "Connection closed" and ends the MCP session. Rollouts pause
    seconds between calls while the policy generates, so this hit up to 68 rollouts of ~3,500 in a
    GPU run (bench/RESULTS.md); tests/test_connect.py reproduces it. `follow_redirects`, which
    fastmcp passes to a custom factory, is dropped: the SDK follows same-origin redirects itself.
    """
    return httpx2.AsyncClient(headers=headers, auth=auth, verify=_ssl_context(),
                              timeout=timeout or httpx2.Timeout(30.0, read=300.0),
                              limits=httpx2.Limits(keepalive_expiry=1.0))


@functools.cache
def _ssl_context():
    """httpx's default TLS context, built once per process and shared by every client.

    Each rollout opens its own session, and httpx builds a context per client by loading the
    whole CA bundle (~20 ms, on the event loop, even for http://): 192 rollouts waited ~4 s for
    their first request, every GRPO step (bench/HISTORY.md section 30). httpx's docs advise
    reusing one context. SSL_CERT_FILE / SSL_CERT_DIR are read when the first client is made."""
    return httpx2.create_ssl_context()


def make_client(spec: ServerSpec, *, token: str | None = None, headers: dict | None = None,
                timeout: float | None = 30.0, connect_timeout: float | None = 30.0,
                log_file: Any = None, message_handler: Any = None) -> fastmcp.Client:
    """A (not yet connected) `fastmcp.Client` for `spec`. `timeout` is the default per-request
    timeout, `connect_timeout` bounds the MCP handshake, `log_file` (Path or file) receives a
    stdio server's stderr (default: ours), `message_handler` the server's notifications (fastmcp's).
    Raises ValueError for a malformed spec and ServerUnavailable for a command or script that does
    not exist."""
    kw = dict(timeout=timeout, init_timeout=connect_timeout, message_handler=message_handler)
    if isinstance(spec, fastmcp.FastMCP):
        return fastmcp.Client(FastMCPTransport(spec), **kw)
    env, passthrough, inherit, cwd = None, [], False, None
    if isinstance(spec, dict):
        if "mcpServers" in spec:
            return fastmcp.Client(spec, **kw)
        unknown = set(spec) - _DICT_KEYS
        if unknown or not ({"url", "command"} & set(spec)):
            raise ValueError(f"Server dict has keys {sorted(spec)}; expected 'url' (with optional "
                             "'headers', 'token') or 'command' (with optional 'args', 'env', 'cwd').")
        headers = {**(spec.get("headers") or {}), **(headers or {})}
        token = token or spec.get("token")
        if "url" in spec:
            argv, url = None, str(spec["url"])
        else:
            cmd = spec["command"]
            argv = (_python_first(list(map(str, cmd))) if isinstance(cmd, (list, tuple))
                    else _stdio_argv(str(cmd)))
            if not argv:
                raise ValueError(f"'command' must be a command, not {redact(repr(cmd))[:200]}; use 'url' for "
                                 "http(s) servers.")
            argv += [str(a) for a in spec.get("args") or []]
            env, cwd = spec.get("env"), spec.get("cwd")
            passthrough = _env_names(spec.get("env_passthrough"))
            inherit = spec.get("inherit_env", False)
            if not isinstance(inherit, bool):
                raise ValueError(f"'inherit_env' must be true or false, got {inherit!r}")
            if env is not None and not isinstance(env, dict):
                raise ValueError(f"'env' must be a mapping of variable names to values, got {type(env).__name__}")
    elif isinstance(spec, (str, os.PathLike)):
        argv = _stdio_argv(spec)
        url = str(spec).strip()
    else:
        raise ValueError(f"Unsupported server spec {type(spec).__name__}: give a FastMCP object, "
                         "a .py path, a shell command, an http(s) URL, or a dict.")
    if argv is None:
        return fastmcp.Client(StreamableHttpTransport(url, headers=headers or None, auth=token,
                                                      httpx_client_factory=_http_client), **kw)
    if token or headers:
        raise ValueError(f"token/headers apply to http(s) servers only; {describe_spec(spec)} runs "
                         "over stdio (pass secrets to it through env instead).")
    _check_argv(argv, spec, cwd)
    # A clean environment: exported API keys must not reach every server (third-party npx
    # packages included). The SDK merges this over its own get_default_environment().
    transport = StdioTransport(argv[0], argv[1:], env=stdio_env(env, passthrough, inherit),
                               cwd=str(cwd) if cwd else None,
                               keep_alive=False, log_file=log_file)
    return fastmcp.Client(transport, **kw)


def describe_spec(spec: ServerSpec) -> str:
    """A one-line description of `spec` for logs and errors. Secrets never appear: header values,
    env values, URL credentials and query values, and what `mcp_rl.redact.redact` masks in a command.

    >>> describe_spec("uvx mcp-server-postgres postgresql://bob:hunter2@db/x --pat ghp_1")
    'stdio: uvx mcp-server-postgres postgresql://bob:***@db/x --pat ***'
    """
    if isinstance(spec, fastmcp.FastMCP):
        return f"in-process FastMCP server {spec.name!r}"
    if getattr(spec, "episode", None) is not None:  # an mcp_rl Environment: a server per rollout
        return f"environment {str(getattr(spec, 'name', '?'))[:60]!r} (a server per rollout)"
    if isinstance(spec, dict):
        if "mcpServers" in spec:
            return f"MCP config with servers {sorted(spec['mcpServers'])}"
        if "url" in spec:
            extra = sorted(spec.get("headers") or {}) + (["token"] if spec.get("token") else [])
            return describe_spec(str(spec["url"])) + (f" (with {', '.join(extra)})" if extra else "")
        cmd = spec.get("command", "")
        cmd = shlex.join(map(str, cmd)) if isinstance(cmd, (list, tuple)) else str(cmd)
        args = " ".join(shlex.quote(str(a)) for a in spec.get("args") or [])
        desc = describe_spec(f"{cmd} {args}".strip())
        names = sorted(spec.get("env") or {}) + sorted(spec.get("env_passthrough") or [])
        desc += f" (env: {', '.join(names)})" if names else ""
        return desc + (" (inherits the whole environment)" if spec.get("inherit_env") else "")
    if not isinstance(spec, (str, os.PathLike)):
        return f"<unsupported spec of type {type(spec).__name__}>"
    text = str(spec).strip()
    if _URL.match(text):
        # Only scheme, host, port and path: the user name goes too (a URL is often pasted with a
        # key for a user name), and so does every query value. netloc, not .port, which raises
        # on a malformed port ("h:abc") where a description must not.
        u = urlsplit(text)
        query = "&".join(f"{q.split('=', 1)[0]}=***" for q in u.query.split("&") if q)
        # redact() as well: a key can sit in the path (".../sk-…/mcp").
        return "http: " + redact(f"{u.scheme}://{u.netloc.rpartition('@')[2]}{u.path}") + (f"?{query}" if query else "")
    # The command line as written, through the one redaction helper (mcp_rl.redact): DSN passwords,
    # values after --token/--pat/-p, NAME=secret pairs and well-known token formats are masked.
    return "stdio: " + redact(text)
