"""Tests for mcp_rl/mcp/connect.py: server specs, one long-lived session, results as text.

Run: .venv/bin/python -m pytest tests/test_connect.py -q
Servers are real: an in-memory FastMCP object, small server scripts written into tmp_path
and run over stdio and over HTTP on 127.0.0.1, the company server, and the third-party
`mcp-server-time` package over stdio.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastmcp import FastMCP
from fastmcp.client.transports import FastMCPTransport, StdioTransport, StreamableHttpTransport
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

from mcp_rl.mcp.connect import ServerUnavailable, ToolResult, ToolSession, describe_spec, make_client, result_to_text
from mcp_rl.mcp.listing import tools_json

ROOT = Path(__file__).resolve().parents[1]

# One script serves both stdio and HTTP tests: `python server.py [PORT]`.
SERVER_SCRIPT = textwrap.dedent('''
    """A tiny MCP server for tests/test_connect.py."""
    import asyncio, os, sys
    from fastmcp import FastMCP
    from fastmcp.server.dependencies import get_http_headers

    mcp = FastMCP("tiny")

    @mcp.tool
    def pid() -> int:
        """This server's process id."""
        return os.getpid()

    @mcp.tool
    async def sleep(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "awake"

    @mcp.tool
    def env(name: str) -> str:
        """One environment variable of the server process."""
        return os.environ.get(name, "<unset>")

    @mcp.tool
    def env_names() -> list[str]:
        """The names of every environment variable of the server process."""
        return sorted(os.environ)

    @mcp.tool
    def headers() -> dict:
        """The HTTP headers this call arrived with."""
        h = get_http_headers(include_all=True)
        return {"authorization": h.get("authorization"), "x-team": h.get("x-team")}

    if __name__ == "__main__":
        if len(sys.argv) > 1:
            mcp.run(transport="http", host="127.0.0.1", port=int(sys.argv[1]), show_banner=False)
        else:
            mcp.run(show_banner=False)
''')


def tiny_memory_server() -> FastMCP:
    mcp = FastMCP("memory")

    @mcp.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool
    def fail(reason: str) -> str:
        """Always fails."""
        raise ValueError(f"cannot do that: {reason}")

    @mcp.tool
    def big(n: int) -> str:
        """n characters of output."""
        return "x" * n

    @mcp.tool
    async def nap(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "rested"

    @mcp.resource("notes://readme", mime_type="text/plain")
    def readme() -> str:
        return "hello from a resource"

    return mcp


@pytest.fixture
def server_py(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_server.py"
    path.write_text(SERVER_SCRIPT)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_url(server_py: Path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(server_py), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"HTTP test server exited: {proc.stderr.read().decode()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("HTTP test server did not listen within 30 s")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------- specs → transports


@pytest.mark.parametrize("spec, transport, command, args_start", [
    ("python srv.py --db x.db", StdioTransport, sys.executable, ["srv.py", "--db", "x.db"]),
    ("npx -y @scope/some-server", StdioTransport, "npx", ["-y", "@scope/some-server"]),
    ("sh -c 'echo hi'", StdioTransport, "sh", ["-c", "echo hi"]),
    ({"command": ["python", "-m", "mod"], "args": ["--x"]}, StdioTransport, sys.executable, ["-m", "mod", "--x"]),
    ("https://example.com/mcp", StreamableHttpTransport, None, None),
    ({"url": "http://127.0.0.1:1/mcp", "headers": {"X-A": "1"}}, StreamableHttpTransport, None, None),
])
def test_make_client_picks_transport(spec, transport, command, args_start, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "srv.py").write_text("")
    monkeypatch.setattr("shutil.which", lambda c: c)  # npx need not be installed to be named
    t = make_client(spec).transport
    assert isinstance(t, transport)
    if command:
        assert (t.command, t.args) == (command, args_start)


def test_make_client_fastmcp_object_is_in_memory():
    assert isinstance(make_client(tiny_memory_server()).transport, FastMCPTransport)


def test_py_path_runs_under_this_interpreter(server_py):
    for spec in (server_py, str(server_py)):
        t = make_client(spec).transport
        assert t.command == sys.executable and t.args == [str(server_py.resolve())]


SECRET = "MCP_RL_TEST_SECRET_KEY"


@pytest.mark.parametrize("extra, sees_secret", [
    ({}, False),                                      # clean by default
    ({"env": {"EXTRA": "1"}}, False),                 # setting one variable passes no others
    ({"env_passthrough": [SECRET]}, True),            # named
    ({"env_passthrough": ["MCP_RL_TEST_SECRET_*"]}, True),  # a prefix
    ({"inherit_env": True}, True),                    # the whole environment, asked for
])
def test_stdio_child_env_is_clean_unless_named(server_py, monkeypatch, extra, sees_secret):
    monkeypatch.setenv(SECRET, "s3cret")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    t = make_client({"command": f"python {server_py}", **extra}).transport
    assert (SECRET in t.env) == sees_secret
    assert t.env["PATH"] == os.environ["PATH"] and t.env["LC_ALL"] == "C.UTF-8"  # what programs need to run
    assert t.env.get("EXTRA") == extra.get("env", {}).get("EXTRA")


def test_string_specs_get_the_clean_environment_too(server_py, monkeypatch):
    monkeypatch.setenv(SECRET, "s3cret")
    for spec in (str(server_py), f"python {server_py}", server_py):
        assert SECRET not in make_client(spec).transport.env


@pytest.mark.parametrize("extra, message", [
    ({"env_passthrough": SECRET}, "list of variable names"),  # a bare string is a common slip
    ({"inherit_env": "yes"}, "true or false"),
    ({"env": ["A=1"]}, "mapping"),
])
def test_bad_env_settings_say_how_to_fix(server_py, extra, message):
    with pytest.raises(ValueError, match=message):
        make_client({"command": f"python {server_py}", **extra})


def test_http_headers_and_token_reach_transport():
    t = make_client("http://127.0.0.1:1/mcp", token="s3cret", headers={"X-Team": "a"}).transport
    assert t.headers == {"X-Team": "a"} and t.auth.token.get_secret_value() == "s3cret"


@pytest.mark.parametrize("spec, error", [
    ("", ValueError),
    ("   ", ValueError),
    ("python 'unclosed", ValueError),
    (42, ValueError),
    ({"cmd": "x"}, ValueError),
    ({"url": "http://h/mcp", "bogus": 1}, ValueError),
    ("definitely-not-a-command-xyz --flag", ServerUnavailable),
    ("python does_not_exist.py", ServerUnavailable),
])
def test_make_client_rejects_bad_specs_clearly(spec, error):
    with pytest.raises(error, match=r"\w{4,}"):
        make_client(spec)


def test_token_for_a_stdio_server_is_an_error(server_py):
    with pytest.raises(ValueError, match="http"):
        make_client(str(server_py), token="abc")


@pytest.mark.parametrize("spec, shown, hidden", [
    ("python srv.py --token abc123 --db x.db", ["srv.py", "--db x.db"], ["abc123"]),
    ("uvx some-server --api-key=abc123", ["uvx some-server"], ["abc123"]),
    ("https://user:abc123@host.io/mcp?key=abc123", ["host.io/mcp"], ["abc123", "user"]),
    ({"url": "https://h/mcp", "headers": {"Authorization": "Bearer abc123"}, "token": "abc123"},
     ["h/mcp", "Authorization", "token"], ["abc123"]),
    ({"command": "npx -y @s/x", "env": {"API_TOKEN": "abc123"}}, ["npx -y @s/x", "API_TOKEN"], ["abc123"]),
    ({"command": "npx -y @s/x", "env_passthrough": ["OPENAI_API_KEY"], "inherit_env": True},
     ["OPENAI_API_KEY", "inherits the whole environment"], []),
])
def test_describe_spec_never_shows_secrets(spec, shown, hidden):
    text = describe_spec(spec)
    assert all(s in text for s in shown), text
    assert not any(h in text for h in hidden), text


def test_describe_spec_names_in_process_server():
    assert "'memory'" in describe_spec(tiny_memory_server())


# ---------------------------------------------------------------- results → text


PNG = base64.b64encode(b"\x89PNG" + b"\0" * 1230).decode()
RESULTS = [
    ("texts joined", {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, 100, "a\nb"),
    ("structured only", {"content": [], "structuredContent": {"n": 1, "xs": [1, 2]}}, 100, '{"n":1,"xs":[1,2]}'),
    ("text wins over structured", {"content": [{"type": "text", "text": "3"}], "structuredContent": {"r": 3}}, 100, "3"),
    ("image placeholder", {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}, 100,
     "[image/png, 1234 bytes]"),
    ("embedded text resource", {"content": [{"type": "resource", "resource": {"uri": "f://a", "text": "body"}}]},
     100, "body"),
    ("embedded blob", {"content": [{"type": "resource", "resource": {"uri": "f://b", "blob": PNG,
                                                                      "mimeType": "image/png"}}]},
     100, "[resource f://b, image/png, 1234 bytes]"),
    ("nothing", {"content": []}, 100, "(empty result)"),
    ("truncated", {"content": [{"type": "text", "text": "y" * 50}]}, 10, "y" * 10 + "\n[truncated 40 chars]"),
    ("exactly at limit", {"content": [{"type": "text", "text": "y" * 10}]}, 10, "y" * 10),
]


@pytest.mark.parametrize("result, max_chars, expected", [r[1:] for r in RESULTS], ids=[r[0] for r in RESULTS])
def test_result_to_text(result, max_chars, expected):
    assert result_to_text(result, max_chars) == expected


# ---------------------------------------------------------------- ToolSession in memory


async def test_openai_tools_are_cached_for_the_session():
    async with ToolSession(tiny_memory_server()) as s:
        first = await s.openai_tools()
        assert await s.openai_tools() is first
        assert {t["function"]["name"] for t in first} == {"add", "fail", "big", "nap"}


@pytest.mark.parametrize("name, arguments, kind, text", [
    ("add", {"a": 2, "b": 3}, None, "5"),
    ("add", '{"a": 2, "b": 3}', None, "5"),
    ("fail", {"reason": "no"}, "tool_error", "cannot do that: no"),
    ("nope", {}, "unknown_tool", "Available tools: add, fail, big, nap"),
    ("add", {"a": "two", "b": 3}, "bad_arguments", "a"),
    ("add", {"a": 1}, "bad_arguments", "b"),
    ("add", {"a": 1, "b": 2, "c": 3}, "bad_arguments", "c"),
    ("add", [1, 2], "bad_arguments", "must be a JSON object"),
    ("add", "{not json", "bad_arguments", "not valid JSON"),
])
async def test_call_classifies_outcomes(name, arguments, kind, text):
    async with ToolSession(tiny_memory_server()) as s:
        result = await s.call(name, arguments)
    assert isinstance(result, ToolResult)
    assert (result.kind, result.is_error) == (kind, kind is not None)
    assert text in result.text


@pytest.mark.parametrize("arguments", [{"a": "two", "b": 3}, {"a": 1}, {"a": 1, "b": 2, "c": 3}])
async def test_bad_arguments_end_with_what_the_tool_takes_without_pydantic_links(arguments):
    async with ToolSession(tiny_memory_server()) as s:
        result = await s.call("add", arguments)
    assert result.kind == "bad_arguments" and "errors.pydantic.dev" not in result.text
    assert result.text.endswith("add takes: a (integer, required), b (integer, required).")


async def test_call_timeout_leaves_session_usable():
    async with ToolSession(tiny_memory_server(), call_timeout=0.3) as s:
        start = time.monotonic()
        result = await s.call("nap", {"seconds": 5})
        assert result.kind == "timeout" and time.monotonic() - start < 3
        assert (await s.call("add", {"a": 1, "b": 1})).text == "2"


async def test_long_results_are_truncated_with_marker():
    async with ToolSession(tiny_memory_server(), max_result_chars=100) as s:
        result = await s.call("big", {"n": 1000})
    assert result.text.startswith("x" * 100) and result.text.endswith("[truncated 900 chars]")


async def test_resources_listed_and_read():
    async with ToolSession(tiny_memory_server()) as s:
        uris = [str(r.uri) for r in await s.list_resources()]
        assert uris == ["notes://readme"]
        assert await s.read_resource("notes://readme") == "hello from a resource"


async def test_tools_json_lists_the_servers_tools():
    parsed = json.loads(await tools_json(tiny_memory_server()))
    assert [t["function"]["name"] for t in parsed] == ["add", "fail", "big", "nap"]


async def test_using_a_closed_session_says_how_to_open_it():
    s = ToolSession(tiny_memory_server())
    with pytest.raises(RuntimeError, match="async with"):
        await s.list_tools()


# ---------------------------------------------------------------- stdio


async def test_stdio_keeps_one_process_for_the_whole_session(server_py):
    async with ToolSession(str(server_py)) as s:
        pids = {(await s.call("pid", {})).text for _ in range(3)}
    assert len(pids) == 1 and int(pids.pop()) != os.getpid()


async def test_stdio_server_sees_no_parent_secret_unless_passed(server_py, monkeypatch):
    monkeypatch.setenv(SECRET, "s3cret")
    async with ToolSession(str(server_py)) as s:
        names = json.loads((await s.call("env_names", {})).text)
    assert SECRET not in names and "PATH" in names
    assert set(names) <= {SECRET, "EXTRA", "PYTHONUTF8"} | set(os.environ)  # nothing but a subset of ours

    spec = {"command": f"python {server_py.name}", "cwd": server_py.parent, "env": {"EXTRA": "given"},
            "env_passthrough": [SECRET]}
    async with ToolSession(spec) as s:
        assert (await s.call("env", {"name": SECRET})).text == "s3cret"
        assert (await s.call("env", {"name": "EXTRA"})).text == "given"


@pytest.mark.parametrize("error, kind", [
    (MCPError(CONNECTION_CLOSED, "Connection closed"), "server_dead"),
    (BrokenPipeError(32, "Broken pipe"), "server_dead"),
    (RuntimeError("Client failed to connect: All connection attempts failed"), "server_dead"),
    (MCPError(REQUEST_TIMEOUT, "Request 'tools/call' timed out"), "timeout"),
    (TimeoutError(), "timeout"),
    (MCPError(INVALID_PARAMS, "Unknown tool: x"), "unknown_tool"),
    (MCPError(INVALID_PARAMS, "Invalid params"), "bad_arguments"),
    (MCPError(-32603, "Internal error"), "tool_error"),
    (RuntimeError("Tool t has an output schema but did not return structured content"), "tool_error"),
])
def test_exceptions_become_tool_results(error, kind):
    result = ToolSession(tiny_memory_server())._classify(error, "t")
    assert (result.kind, result.is_error) == (kind, True) and result.text


async def test_server_killed_mid_call_is_server_dead_and_stays_dead(server_py):
    async with ToolSession(str(server_py), call_timeout=30) as s:
        pid = int((await s.call("pid", {})).text)
        asyncio.get_running_loop().call_later(0.5, os.kill, pid, signal.SIGKILL)
        start = time.monotonic()
        result = await s.call("sleep", {"seconds": 20})
        assert result.kind == "server_dead" and time.monotonic() - start < 10
        start = time.monotonic()
        again = await s.call("pid", {})
        assert again.kind == "server_dead" and time.monotonic() - start < 0.5


async def test_server_that_cannot_start_raises_server_unavailable(tmp_path):
    bad = tmp_path / "broken_server.py"
    bad.write_text("import sys\nprint('cannot open database nowhere.db', file=sys.stderr)\nsys.exit(2)\n")
    with pytest.raises(ServerUnavailable) as err:
        async with ToolSession(str(bad)):
            pass
    message = str(err.value)
    assert "broken_server.py" in message and "cannot open database nowhere.db" in message
    assert "Check" in message and isinstance(err.value, RuntimeError)


async def test_server_that_never_answers_times_out_as_server_unavailable():
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match="(?s)Check.*still starting"):
        async with ToolSession("sh -c 'echo still starting >&2; sleep 60'", connect_timeout=1):
            pass
    assert time.monotonic() - start < 15


# ---------------------------------------------------------------- HTTP on 127.0.0.1


async def test_http_session_sends_token_and_headers(http_url):
    async with ToolSession(http_url, token="s3cret", headers={"X-Team": "red"}) as s:
        assert "headers" in {t["function"]["name"] for t in await s.openai_tools()}
        seen = json.loads((await s.call("headers", {})).text)
        assert seen == {"authorization": "Bearer s3cret", "x-team": "red"}
        assert (await s.call("sleep", {"seconds": 0})).text == "awake"


async def test_http_session_survives_idle_gaps_past_a_keep_alive_close(http_url):
    """A server that drops an idle keep-alive connection as the next request arrives (uvicorn's
    5 s keep-alive meeting httpx's 5 s pool expiry) must not end the session: the client's pool
    expires idle connections after 1 s. The proxy makes that race certain: it forwards bytes, and
    closes a connection that was idle for 1.2 s or more the moment the client writes to it."""
    upstream = http_url.split("//")[1].split("/")[0].split(":")
    dropped = 0

    async def handle(reader, writer):
        nonlocal dropped
        up_r, up_w = await asyncio.open_connection(upstream[0], int(upstream[1]))
        last = [time.monotonic()]

        async def pump(src, dst, from_client):
            nonlocal dropped
            try:
                while data := await src.read(65536):
                    if from_client and time.monotonic() - last[0] >= 1.2:
                        dropped += 1
                        break
                    last[0] = time.monotonic()
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            for w in (writer, up_w):
                w.close()

        await asyncio.gather(pump(reader, up_w, True), pump(up_r, writer, False))

    proxy = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    try:
        async with ToolSession(f"http://127.0.0.1:{port}/mcp", connect_timeout=10) as s:
            for _ in range(3):
                assert (await s.call("sleep", {"seconds": 0})).text == "awake"
                await asyncio.sleep(1.5)
            assert (await s.call("sleep", {"seconds": 0})).kind is None
    finally:
        proxy.close()
    assert dropped == 0  # the client never wrote to a connection idle that long


async def test_http_server_not_running_raises_server_unavailable():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ServerUnavailable, match="127.0.0.1.*Check that the server is running"):
        async with ToolSession(url, connect_timeout=5):
            pass


# ---------------------------------------------------------------- the company server


@pytest.fixture
def company_db_path(request):
    if not (ROOT / "mcp_server.py").exists():
        pytest.skip("mcp_server.py is not written yet")
    try:
        return request.getfixturevalue("company_db")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py has no company_db fixture yet")


async def test_company_server_tools_and_calls(company_db_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from mcp_server import build_server

    async with ToolSession(build_server(company_db_path)) as s:
        tools = await s.openai_tools()
        assert {"list_tables", "describe_table", "run_query"} <= {t["function"]["name"] for t in tools}
        assert all(t["function"]["parameters"]["type"] == "object" for t in tools)
        assert (await s.call("list_tables", {})).kind is None
        assert (await s.call("run_query", {"sql": "SELECT * FROM no_such_table"})).kind == "tool_error"
        assert (await s.call("run_query", {})).kind == "bad_arguments"


async def test_company_server_over_stdio(company_db_path):
    spec = f"python {shlex.quote(str(ROOT / 'mcp_server.py'))} --db {shlex.quote(str(company_db_path))}"
    async with ToolSession(spec) as s:
        assert (await s.call("list_tables", {})).kind is None


# ---------------------------------------------------------------- a third-party server


async def test_swap_in_third_party_server_mcp_server_time():
    # 2025.9.25 imports names that mcp 2.x removed; 2026.10.19 is the first release for mcp 2.x.
    pytest.importorskip("mcp_server_time", exc_type=ImportError,
                        reason="mcp-server-time>=2026.10.19 (the mcp 2.x release) is not installed")
    spec = f"{shlex.quote(sys.executable)} -m mcp_server_time --local-timezone Etc/UTC"
    async with ToolSession(spec) as s:
        tools = {t["function"]["name"]: t["function"] for t in await s.openai_tools()}
        assert {"get_current_time", "convert_time"} <= tools.keys()
        params = tools["get_current_time"]["parameters"]
        assert params["type"] == "object" and "timezone" in params["properties"]
        assert "(read-only)" in tools["get_current_time"]["description"]
        now = await s.call("get_current_time", {"timezone": "Asia/Tokyo"})
        assert now.kind is None and json.loads(now.text)["timezone"] == "Asia/Tokyo"
        assert (await s.call("get_current_time", {"timezone": "Mars/Olympus"})).kind == "tool_error"
        assert (await s.call("get_current_time", {})).kind == "bad_arguments"
        assert (await s.call("get_time", {})).kind == "unknown_tool"
        assert await s.list_resources() == []

