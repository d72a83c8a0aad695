"""Name any MCP server, hold one session to it, and turn its tools and results into LLM terms.

A `ServerSpec` is one of:
  - a `fastmcp.FastMCP` object (in-process, no subprocess);
  - a path to a `.py` file, run over stdio with this interpreter;
  - a shell command run over stdio: "python mcp_server.py --db x.db", "uvx mcp-server-time",
    "npx -y @scope/some-server";
  - an "http(s)://host/mcp" URL (streamable HTTP), with optional `headers=` / `token=`;
  - a dict: {"url": ..., "headers": {...}, "token": ...} or
    {"command": "..." | [...], "args": [...], "env": {...}, "env_passthrough": [...],
     "inherit_env": false, "cwd": ...}
    (or a full MCP config {"mcpServers": {...}}, passed to fastmcp as is).

Environment of a stdio server: a clean one. It gets only the variables programs need to run
(`STDIO_ENV_ALLOWLIST`: PATH, HOME, USER, SHELL, TERM, LANG/LC_*, TZ, TMPDIR/TMP/TEMP, XDG_*_HOME,
and on Windows SYSTEMROOT, APPDATA and the like, after the MCP SDK's `get_default_environment()`),
plus what the spec names: `env` sets values ({"API_KEY": "..."}), `env_passthrough` copies named
variables from ours (["OPENAI_API_KEY", "AWS_*"]; a trailing * matches a prefix; unset ones are
left out), and `inherit_env: true` passes our whole environment (the old behaviour). So keys
exported in a notebook or shell reach no stdio server (an `npx` package included) unless named.
A plain string spec ("python server.py", "npx -y pkg") gets the clean environment; use the dict
form to give it variables. HTTP and in-process servers are not affected.

    async with ToolSession("python mcp_server.py") as session:
        tools = await session.openai_tools()          # OpenAI function schemas
        result = await session.call("list_tables", {})  # ToolResult, never raises
    async with ToolSession(spec, policy=ToolPolicy(allow=["list_tables"])) as session:
        ...  # only list_tables is listed or callable; side-effect tools are refused at open

A session opened with a `ToolPolicy` (`mcp_rl.mcp.guard`; rollouts always pass one) checks the
server's tools when it opens, raising `SideEffectsRefused` for tools with side effects nothing
allowed, and then lists and calls only the tools its filters admit: a filtered tool is never
described to the model, and a call to it is answered as an unknown tool. When the server says its
tools changed (`notifications/tools/list_changed`), the next call re-lists and re-checks them first;
if they no longer fit, that call and every later one raise `ToolsChanged` and nothing is called.

Show a server's tools from a shell: `python -m mcp_rl tools --server SPEC` (`mcp_rl.mcp.listing`).
Transports, sessions and protocol negotiation are fastmcp's; this module only decides which
transport a spec names, classifies failures, and shapes results for a model. Tool schemas are
shaped in `mcp_rl.mcp.schemas` (re-exported here: `mcp_tool_to_openai`, `normalize_schema`), results in
`mcp_rl.mcp.tool_results` (`ToolResult`, `result_to_text`, re-exported).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
from typing import Any

import anyio
import fastmcp
import httpx2
import mcp_types
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

# Re-exported: `from mcp_rl.mcp.connect import mcp_tool_to_openai` predates schemas.py, and
# `make_client`, `describe_spec`, `stdio_env` predate specs.py.
from mcp_rl.mcp.guard import ToolPolicy, ToolPolicyError, ToolsChanged
from mcp_rl.quote import short
from mcp_rl.mcp.schemas import hide_bound, mcp_tool_to_openai, normalize_schema
from mcp_rl.mcp.tool_results import BAD_ARGS, UNKNOWN_TOOL, ToolResult, explained, nbytes, result_to_text, truncate
from mcp_rl.redact import redact
from mcp_rl.mcp.specs import STDIO_ENV_ALLOWLIST, ServerSpec, ServerUnavailable, describe_spec, is_stdio, make_client, stdio_env

log = logging.getLogger(__name__)

__all__ = [
    "ServerSpec", "ServerUnavailable", "ToolResult", "ToolSession", "make_client", "describe_spec",
    "mcp_tool_to_openai", "normalize_schema", "result_to_text", "stdio_env", "STDIO_ENV_ALLOWLIST",
]

# ---------------------------------------------------------------- one session per rollout


class ToolSession:
    """One MCP session held open for a whole rollout (opening one per call, as ART's and the
    tutorial notebooks do, costs a subprocess start or an HTTP handshake every call).

        async with ToolSession(spec, call_timeout=30) as s:
            tools = await s.openai_tools()
            result = await s.call("name", {"arg": 1})
    """

    def __init__(self, spec: ServerSpec, *, call_timeout: float = 30.0, max_result_chars: int = 4000,
                 token: str | None = None, headers: dict | None = None,
                 connect_timeout: float = 30.0, policy: ToolPolicy | None = None, scenario: Any = None):
        self.spec, self.call_timeout, self.max_result_chars = spec, call_timeout, max_result_chars
        self.policy, self.scenario = policy, scenario
        # An environment with per-rollout episodes (mcp_rl.environment) is a spec too: the session opens
        # one episode for `scenario` and talks to its server, with its bound arguments hidden.
        self.episode: Any = None
        self._episode_cm: Any = None
        self._token, self._headers, self._connect_timeout = token, headers, connect_timeout
        self._client: fastmcp.Client | None = None
        self._stderr = None
        self._tools: list | None = None
        self._openai: list[dict] | None = None
        self._dead: str | None = None
        self._changed = False  # the server sent tools/list_changed: re-list and re-check before a call
        self._refused: ToolsChanged | None = None

    def __repr__(self) -> str:
        return f"ToolSession({describe_spec(self.spec)})"

    def _stderr_tail(self, lines: int = 15) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.flush()
            self._stderr.seek(0)
            tail = "\n".join(self._stderr.read()[-20_000:].strip().splitlines()[-lines:])
        except (OSError, ValueError):
            return ""
        # A server may log its own DSN or key (psql's connection string, a bad-token echo): redacted.
        return f"\nServer stderr (last lines):\n{redact(tail)}" if tail else ""

    async def __aenter__(self) -> "ToolSession":
        spec = await self._open_episode() if getattr(self.spec, "episode", None) is not None else self.spec
        stdio = is_stdio(spec)
        # A stdio server's stderr (banners, logs) would interleave with ours for every rollout;
        # keep it in a temp file and quote its tail when the server fails.
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") if stdio else None
        self._client = make_client(spec, token=self._token, headers=self._headers,
                                   timeout=self.call_timeout, connect_timeout=self._connect_timeout,
                                   log_file=self._stderr, message_handler=self._on_message)
        try:
            # fail_after, not wait_for: the client's context must be entered in this task.
            with anyio.fail_after(self._connect_timeout + 5):
                await self._client.__aenter__()
        except Exception as e:  # any transport failure means the same thing to the caller
            tail = self._stderr_tail()
            await self._close_quietly()
            where = ("that the command runs by itself in a terminal and that the server writes "
                     "nothing but MCP messages to stdout" if stdio else
                     "that the server is running, the URL (usually ending in /mcp) and the token")
            # httpx quotes the URL it failed on, userinfo and query included.
            msg = redact(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
            auth = "" if stdio else await self._auth_refused()
            raise ServerUnavailable(f"Could not connect to MCP server {describe_spec(self.spec)}: "
                                    f"{msg}.{auth} Check {where}.{tail}") from e
        if self.policy is not None:
            try:
                await self.restrict(self.policy)
            except BaseException:  # a refused session must not leave a server process behind
                await self._close_quietly()
                raise
        return self

    async def _open_episode(self) -> Any:
        self._episode_cm = self.spec.episode(self.scenario)
        try:
            self.episode = await self._episode_cm.__aenter__()
        except Exception as e:  # counted as the server's failure (rollout: "server unavailable"), never dropped silently
            self._episode_cm = None
            raise ServerUnavailable(f"{describe_spec(self.spec)} could not start an episode: "
                                    f"{type(e).__name__}: {short(redact(str(e)))}") from e
        return self.episode.spec

    async def score(self, traj: Any, scenario: Any) -> None:
        """The environment's own reward for this episode (`Environment.score`), before it is torn down:
        traj.metrics["env_reward"] and "env_reward/<name>" for sub-scores. A scorer that raises marks the
        rollout fatal ("environment score failed"): no fault of the policy, so it is left out of training."""
        scorer = getattr(self.spec, "score", None)
        if self.episode is None or scorer is None or traj.metrics.get("fatal"):
            return
        try:
            value = await scorer(traj, scenario, self.episode)
            parts = dict(value) if isinstance(value, dict) else {"score": value}
            traj.metrics["env_reward"] = min(1.0, max(0.0, float(parts.pop("score"))))
            traj.metrics.update({f"env_reward/{k}": float(v) for k, v in parts.items()})
        except Exception as e:  # noqa: BLE001
            traj.metrics["fatal"] = True
            traj.metadata["fatal_reason"] = f"environment score failed: {type(e).__name__}: {short(str(e))}"

    async def _auth_refused(self) -> str:
        """A sentence when a plain request to the HTTP server is refused for authentication (401/403):
        the MCP client reports that as a generic error response, which reads like a server fault."""
        spec = self.spec
        url = spec.get("url") if isinstance(spec, dict) else spec if isinstance(spec, str) else None
        token = self._token or (spec.get("token") if isinstance(spec, dict) else None)
        headers = {"Accept": "application/json, text/event-stream", **(self._headers or {}),
                   **(spec.get("headers") or {} if isinstance(spec, dict) else {}),
                   **({"Authorization": f"Bearer {token}"} if token else {})}
        if not url or not str(url).startswith(("http://", "https://")):
            return ""
        try:
            async with httpx2.AsyncClient(timeout=3.0) as client:
                r = await client.post(str(url), headers=headers, json={"jsonrpc": "2.0", "id": 0, "method": "ping"})
        except Exception:  # noqa: BLE001 - only a hint: the connection error above says the rest
            return ""
        if r.status_code not in (401, 403):
            return ""
        scheme = r.headers.get("www-authenticate", "").split(" ")[0][:20]
        return (f" The server refused the request for authentication (HTTP {r.status_code}"
                f"{f', {scheme}' if scheme else ''}): " + ("it does not accept the token given." if token else
                "pass its token (token=... in the spec; notebooks: TOKEN_SECRET)."))

    async def _close_quietly(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:  # a dead server must not turn closing into a hang or an exception
                with anyio.move_on_after(15):
                    await client.close()
            except Exception as e:  # noqa: BLE001
                log.debug("closing %s: %s", describe_spec(self.spec), redact(repr(e)))
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        episode_cm, self._episode_cm = self._episode_cm, None
        if episode_cm is not None:
            try:
                await episode_cm.__aexit__(None, None, None)
            except Exception as e:  # noqa: BLE001 - a teardown failure is logged; the rollout is already scored
                log.warning("%s: tearing down an episode failed: %s", describe_spec(self.spec), redact(repr(e))[:300])

    async def __aexit__(self, *exc) -> None:
        await self._close_quietly()

    def _require(self) -> fastmcp.Client:
        if self._client is None:
            raise RuntimeError("ToolSession is not open: use `async with ToolSession(spec) as s:`.")
        if self._dead:
            raise ServerUnavailable(self._dead)
        return self._client

    async def _on_message(self, message: Any) -> None:
        # Only a flag: the handler runs in the session's receive loop, so a list_tools from here would
        # wait on the very loop that must deliver its answer. The next call re-lists and re-checks.
        if isinstance(message, mcp_types.ToolListChangedNotification):
            self._changed = True
            log.info("MCP server %s changed its tools; re-checking them before the next call", describe_spec(self.spec))

    async def all_tools(self) -> list:
        """Every MCP Tool object the server lists, filters or not (fetched once per session, and
        again after the server says its tools changed)."""
        if self._tools is None or self._changed:
            self._changed = False
            self._tools, self._openai = list(await self._require().list_tools()), None
        return self._tools

    async def list_tools(self) -> list:
        """The server's MCP Tool objects that the session's policy admits (all without one). After
        tools/list_changed, the policy's check runs again on the new list: raises ToolsChanged (and so
        does every later call) when it fails."""
        if self._refused is not None:
            raise self._refused
        changed = self._changed and self._tools is not None
        tools = await self.all_tools()
        if self.policy is None:
            return tools
        if changed:
            try:
                self.policy.check(tools, server=describe_spec(self.spec))
            except ToolPolicyError as e:
                self._refused = ToolsChanged(
                    f"{describe_spec(self.spec)} changed its tools during the session (tools/list_changed) and "
                    f"the guard refuses the new list, so no further tool call is made in this session: {e}", e)
                log.warning("%s", self._refused)
                raise self._refused from e
        return self.policy.filter(tools)

    async def restrict(self, policy: ToolPolicy) -> None:
        """Apply `policy` from now on, after checking it against the server's tools: raises
        ToolPolicyError for a filter naming a tool the server lacks, SideEffectsRefused for tools with
        side effects that nothing allows. (A session given `policy=` does this when it opens.)"""
        policy.check(await self.all_tools(), server=describe_spec(self.spec))
        self.policy, self._openai = policy, None

    async def openai_tools(self) -> list[dict]:
        """The server's tools as OpenAI function schemas (computed once per session)."""
        if self._openai is None:
            self._openai = [hide_bound(mcp_tool_to_openai(t), self._bound()) for t in await self.list_tools()]
        return self._openai

    def _bound(self) -> dict:
        return dict(self.episode.bind) if self.episode is not None else {}

    async def list_resources(self) -> list:
        """The server's MCP Resource objects; [] for a server that has no resources."""
        try:
            return list(await self._require().list_resources())
        except MCPError as e:
            if e.code == -32601:  # method not found: many servers implement tools only
                return []
            raise

    async def read_resource(self, uri: str) -> str:
        """A resource's contents as text (binary parts as placeholders)."""
        contents = await self._require().read_resource(uri)
        parts = [c.text if getattr(c, "text", None) is not None else
                 f"[{getattr(c, 'mime_type', None) or 'binary'}, {nbytes(getattr(c, 'blob', None))} bytes]"
                 for c in contents]
        return "\n".join(parts)

    def _server_dead(self, why: str) -> ToolResult:
        why = redact(why)  # transport errors quote URLs (credentials, query keys)
        if self._dead is None:
            # The model gets one short line; the server's own last words go to the log.
            self._dead = (f"The tool server stopped ({why}); no further tool calls are possible "
                          "in this session.")
            log.warning("MCP server %s died: %s%s", describe_spec(self.spec), why, self._stderr_tail())
        return ToolResult(self._dead, True, "server_dead")

    async def call(self, name: str, arguments: Any = None) -> ToolResult:
        """Call tool `name`. Never raises for anything the server or the agent did, but one: failures
        come back as a ToolResult whose text tells the model what went wrong; a server whose tools
        changed mid-session into a list the policy refuses raises ToolsChanged (a ToolPolicyError,
        which rollouts raise as they do at open) and the tool is not called."""
        if self._dead:
            return ToolResult(self._dead, True, "server_dead")
        if isinstance(arguments, str):  # models often emit arguments as a JSON string
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return ToolResult(f"Arguments for {short(name)} are not valid JSON ({e}); send a JSON "
                                  "object.", True, "bad_arguments")
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict):
            return ToolResult(f"Arguments for {short(name)} must be a JSON object, got "
                              f"{type(arguments).__name__}: {short(arguments)}", True, "bad_arguments")
        try:
            tools = await self.list_tools()
        except ToolPolicyError:
            raise
        except Exception as e:  # noqa: BLE001
            return self._classify(e, name)
        names = [t.name for t in tools]
        if name not in names:
            return ToolResult(f"Unknown tool {short(name)}. Available tools: {', '.join(names) or '(none)'}.",
                              True, "unknown_tool")
        bound = self._bound()
        if bound:  # the episode's values, never the model's (state_key-like arguments it does not see)
            params = (tools[names.index(name)].input_schema or {}).get("properties") or {}
            arguments = {**arguments, **{k: v for k, v in bound.items() if k in params}}
        try:
            # The request timeout is fastmcp's; fail_after is a backstop should a transport never answer.
            with anyio.fail_after(self.call_timeout + 10):
                result = await self._require().call_tool_mcp(name, arguments, timeout=self.call_timeout)
        except Exception as e:  # noqa: BLE001 - classified below, never re-raised
            return explained(self._classify(e, name), tools[names.index(name)])
        text = result_to_text(result, self.max_result_chars)
        if not result.is_error:
            return ToolResult(text, False, None)
        if UNKNOWN_TOOL.search(text):
            return ToolResult(f"{text}\nAvailable tools: {', '.join(names)}.", True, "unknown_tool")
        kind = "bad_arguments" if BAD_ARGS.search(text) else "tool_error"
        return explained(ToolResult(text, True, kind), tools[names.index(name)])

    def _classify(self, e: BaseException, name: str) -> ToolResult:
        timed_out = isinstance(e, MCPError) and e.code == REQUEST_TIMEOUT
        if timed_out or isinstance(e, (TimeoutError, asyncio.TimeoutError)):
            return ToolResult(f"Tool {short(name)} timed out after {self.call_timeout:g}s; try simpler "
                              "arguments or another tool.", True, "timeout")
        if isinstance(e, MCPError) and e.code != CONNECTION_CLOSED:
            text = truncate(f"Error calling {short(name)}: {e.message}", self.max_result_chars)
            if UNKNOWN_TOOL.search(e.message):
                return ToolResult(text, True, "unknown_tool")
            bad = e.code == INVALID_PARAMS or BAD_ARGS.search(e.message)
            return ToolResult(text, True, "bad_arguments" if bad else "tool_error")
        if isinstance(e, ServerUnavailable):
            return ToolResult(str(e), True, "server_dead")
        if isinstance(e, MCPError) or _transport_gone(e):
            return self._server_dead(f"{type(e).__name__}: {e}")
        # Anything else failed on our side of a live connection (e.g. the client rejecting
        # structured output that does not match the tool's own output schema).
        return ToolResult(truncate(f"Error calling {short(name)}: {e}", self.max_result_chars), True, "tool_error")


def _transport_gone(e: BaseException) -> bool:
    """Whether `e` means the connection itself is lost (pipes, sockets, a failed session task)."""
    gone = (OSError, EOFError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream,
            httpx2.TransportError)
    if isinstance(e, gone) or re.search(r"failed to connect|connection closed|session task", str(e), re.I):
        return True
    return any(_transport_gone(sub) for sub in getattr(e, "exceptions", ()))
