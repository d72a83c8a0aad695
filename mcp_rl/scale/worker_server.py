"""The rollout worker's side: an HTTP app that runs rollouts for remote trainers, and its command.

    python -m mcp_rl rollout-worker --server company --port 8101 --token T     # beside the server

`worker_app(server, token=...)` serves `POST /v1/rollouts` and `GET /v1/health` on 127.0.0.1 (the
contract, and what a worker accepts, are in mcp_rl/scale/workers.py's docstring); `cmd_rollout_worker`
is the `rollout-worker` command, `add_worker_parser` its flags. workers.py re-exports all three.
"""

from __future__ import annotations

import dataclasses
import hmac
import os
import sys
from typing import Any

import httpx
import openai
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_rl.mcp.guard import SIDE_EFFECTS, SideEffectsRefused, ToolPolicy, ToolPolicyError, tool_name
from mcp_rl.ship.http_checks import BadRequest, LoopbackOnly, is_loopback_url, read_json
from mcp_rl.policies.policy import ContextOverflow, PolicyError
from mcp_rl.quote import short
from mcp_rl.redact import redact
from mcp_rl.rollout import RolloutConfig, gather_rollouts
from mcp_rl.tasks.scenarios import Scenario

__all__ = ["worker_app", "cmd_rollout_worker", "add_worker_parser", "SHUTDOWN_S", "MAX_GROUP"]
MAX_GROUP = 256
SHUTDOWN_S = 3.0  # after SIGTERM, rollouts in flight get this long before they are cancelled
NEED_TOKEN = ("a rollout worker needs a token: pass --token (or set MCP_RL_WORKER_TOKEN); "
              "--insecure-no-token serves without one, on a machine nobody else uses")


def _bad(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


@dataclasses.dataclass(frozen=True)
class _Capped(ToolPolicy):
    """A request's tool policy under the operator's: a tool is offered only if both admit it, and a
    tool with side effects only if the operator named it (--tools) or allowed them (--allow-side-effects)."""

    cap: ToolPolicy = dataclasses.field(default_factory=ToolPolicy)

    def admits(self, name: str) -> bool:
        return super().admits(name) and self.cap.admits(name)

    def check(self, tools: list[Any], server: str = "the MCP server") -> None:
        # The operator's names must exist (a typo hides nothing); then the request's own checks.
        ToolPolicy(allow=self.cap.allow, deny=self.cap.deny, allow_side_effects=True).check(tools, server)
        super().check(tools, server)
        if self.cap.allow_side_effects:
            return
        risky = [tool_name(t) for t in self.filter(tools) if self.classify(t) == SIDE_EFFECTS
                 and tool_name(t) not in (self.cap.allow or ())]
        if risky:
            raise SideEffectsRefused(f"this worker's operator allows no tools with side effects, and the request "
                                     f"would offer {', '.join(short(n) for n in risky[:5])}; name read-only tools "
                                     "in tool_policy.allow, or ask the operator for --tools / --read-only-tools / "
                                     "--allow-side-effects", risky)


def _capped(asked: dict, cap: ToolPolicy) -> ToolPolicy:
    """The request's tool policy within the operator's `cap`; BadRequest(403) when it asks for more."""
    tp = ToolPolicy(**asked)
    if cap.allow is not None and tp.allow is not None and set(tp.allow) - set(cap.allow):
        extra = sorted(set(tp.allow) - set(cap.allow))
        raise BadRequest(403, f"tool_policy.allow names tools this worker does not offer: "
                              f"{', '.join(short(n) for n in extra[:5])}; it offers {', '.join(cap.allow)}")
    if tp.allow_side_effects and not cap.allow_side_effects and cap.allow is None:
        raise BadRequest(403, "tool_policy.allow_side_effects: this worker's operator does not allow tools with "
                              "side effects (rollout-worker --allow-side-effects or --tools)")
    # Only the operator's read-only declarations count here: a request declaring a tool read-only
    # would otherwise get past an operator who allows no side effects.
    return _Capped(allow=tp.allow, deny=tuple(dict.fromkeys((*tp.deny, *cap.deny))),
                   allow_side_effects=tp.allow_side_effects, read_only=cap.read_only, cap=cap)


def _parse(data: Any, cap: ToolPolicy, remote_policy: bool) -> tuple[list[Scenario], int, dict, RolloutConfig]:
    """The request body as (scenarios, group_size, policy, rollout config); ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"the body must be a JSON object, got {short(data)}")
    unknown = set(data) - {"scenarios", "group_size", "policy", "rollout", "tool_policy"}
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(short(k) for k in sorted(unknown)[:5])}")
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, list) or not scenarios or not all(isinstance(s, dict) for s in scenarios):
        raise ValueError(f"scenarios must be a non-empty list of scenario objects, got {short(scenarios)}")
    size = data.get("group_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_GROUP:
        raise ValueError(f"group_size must be an integer 1..{MAX_GROUP}, got {short(size)}")
    policy = data.get("policy")
    if not isinstance(policy, dict) or not str(policy.get("base_url", "")).startswith(("http://", "https://")) \
            or not isinstance(policy.get("model"), str):
        raise ValueError(f"policy must be {{'base_url': 'http://...', 'model': NAME, 'step': N}}, got {short(policy)}")
    if not remote_policy and not is_loopback_url(policy["base_url"]):
        raise BadRequest(403, f"policy.base_url {short(redact(policy['base_url']))} is not on this machine; "
                              "tunnel the trainer's endpoint to 127.0.0.1, or start the worker with --allow-remote-policy")
    for key, kind in (("timeout", float), ("step", int)):
        value = policy.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"policy.{key} must be a number, got {short(value)}")
    try:
        parsed = [Scenario(**s) for s in scenarios]
        asked = data.get("tool_policy") or {}
        if not isinstance(asked, dict):
            raise ValueError(f"tool_policy must be an object of ToolPolicy fields, got {short(asked)}")
        tool_policy = _capped(asked, cap)
        rollout = data.get("rollout") or {}
        if not isinstance(rollout, dict):
            raise ValueError(f"rollout must be an object of RolloutConfig fields, got {short(rollout)}")
        cfg = RolloutConfig(**{**rollout, "tool_policy": tool_policy})
    except TypeError as e:  # an unknown or missing dataclass field
        raise ValueError(str(e)[:200]) from None
    return parsed, size, policy, cfg


class _Quiet:
    """An OpenAIPolicy whose failures say the endpoint's status and the exception type, never the
    endpoint's answer: a request chooses the base_url, and its rows come back to the requester."""

    token_in = False

    def __init__(self, inner: Any, step: int):
        self.inner, self.name, self.step = inner, inner.name, step

    async def complete(self, messages: list, tools: list, *, max_tokens: int, temperature: float) -> Any:
        try:
            return await self.inner.complete(messages, tools, max_tokens=max_tokens, temperature=temperature)
        except ContextOverflow:
            raise ContextOverflow(f"{short(self.name)}: the conversation exceeds the model's context") from None
        except Exception as e:  # noqa: BLE001 - PolicyError, or an answer the client could not read
            cause = e.__cause__ or e
            status = getattr(cause, "status_code", None)
            why = f"HTTP {status}" if status else type(cause).__name__
            raise PolicyError(f"{short(self.name)}: the policy endpoint failed ({why})") from None


def worker_app(server: Any, *, token: str | None = None, insecure_no_token: bool = False,
               tools: ToolPolicy | None = None, allow_remote_policy: bool = False,
               max_body_bytes: int = 16 << 20, audit: str | None = None, hosts: tuple[str, ...] = ()) -> Starlette:
    """A Starlette app running rollouts against `server` (a ServerSpec) for remote trainers.

    `tools`: the operator's cap on every request's tool policy (default: read-only tools only);
    `hosts`: Host names accepted besides loopback ones (a proxy's)."""
    from mcp_rl.mcp.audit import log_tool_calls
    from mcp_rl.mcp.connect import describe_spec
    from mcp_rl.policies.policy import OpenAIPolicy

    if not token and not insecure_no_token:
        raise ValueError(NEED_TOKEN)
    cap = tools or ToolPolicy()

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return not token or hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def health(request: Request) -> JSONResponse:
        if not authorised(request):
            return _bad(401, "missing or wrong bearer token (Authorization: Bearer ...); pass the worker's --token")
        return JSONResponse({"ok": True, "server": describe_spec(server)})

    async def rollouts(request: Request) -> JSONResponse:
        if not authorised(request):
            return _bad(401, "missing or wrong bearer token (Authorization: Bearer ...); pass the worker's --token")
        try:
            data = await read_json(request, max_body_bytes, too_big="send fewer scenarios per request")
            scenarios, size, p, cfg = _parse(data, cap, allow_remote_policy)
        except BadRequest as e:
            return _bad(e.status, e.message)
        except ValueError as e:  # a Scenario's own check may quote a whole field: cut it
            return _bad(400, f"invalid rollout request: {short(str(e), 300)}")
        # Our own client, closed when the request ends (a dropped one closes later, on a closed loop).
        # No redirects: the loopback check reads base_url only, and a 307 would take the rows elsewhere.
        client = openai.AsyncOpenAI(base_url=p["base_url"], api_key=str(p.get("api_key") or "none"),
                                    timeout=float(p.get("timeout") or cfg.timeout), max_retries=0,
                                    http_client=httpx.AsyncClient(follow_redirects=False))
        policy = _Quiet(OpenAIPolicy(p["model"], client=client), int(p.get("step") or 0))  # the trainer's step
        try:
            with log_tool_calls(audit, phase="worker") if audit else log_tool_calls(None):
                groups = await gather_rollouts(policy, server, scenarios, cfg, group_size=size, desc="worker")
        except ToolPolicyError as e:
            return _bad(409, f"the server's tools do not fit the tool policy: {str(e)[:300]}")
        finally:
            await client.close()
        return JSONResponse({"groups": [[t.model_dump(mode="json") for t in g.trajectories] for g in groups]})

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return _bad(404, f"no route {request.url.path[:60]}; a worker has GET /v1/health and POST /v1/rollouts")

    return Starlette(routes=[Route("/v1/health", health), Route("/v1/rollouts", rollouts, methods=["POST"])],
                     exception_handlers={404: not_found, 405: not_found},
                     middleware=[Middleware(LoopbackOnly, refuse=_bad, hosts=hosts)])


def _sigterm_unwinds() -> None:
    """SIGTERM as an exception in the main thread once uvicorn has shut down, so the `with` blocks
    stop the servers the worker started (uvicorn re-raises the signal it caught after its shutdown;
    with the default handler the process would die there, leaving its children orphaned)."""
    import signal

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def cmd_rollout_worker(a: Any) -> int:
    import contextlib

    import uvicorn

    from mcp_rl.runs import flags
    from mcp_rl.runs.config import Config
    from mcp_rl.environment import environment
    from mcp_rl.ship.serve import HOST

    if not 0 < a.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {a.port}")
    if not a.token and not a.insecure_no_token:  # before any server is started
        raise ValueError(NEED_TOKEN)
    cfg = flags.config(a, Config(), trains=False)
    tools = cfg.tool_policy()
    _sigterm_unwinds()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(environment(cfg.server).serve(cfg.server_token))  # started for the worker's life
        app = worker_app(server, token=a.token, insecure_no_token=a.insecure_no_token, tools=tools,
                         allow_remote_policy=a.allow_remote_policy, audit=a.audit)
        if not a.token:
            print("WARNING: this rollout worker accepts requests WITHOUT A TOKEN (--insecure-no-token): any "
                  "program on this machine can run tool calls against the server through it", file=sys.stderr, flush=True)
        offered = "tools " + ",".join(tools.allow) if tools.allow else \
            ("every tool" if tools.allow_side_effects else "read-only tools")
        print(f"rollout worker for {redact(cfg.server)!r} at http://{HOST}:{a.port}/v1/rollouts "
              f"({'token required' if a.token else 'NO TOKEN'}; {offered}"
              f"{'; minus ' + ','.join(tools.deny) if tools.deny else ''}"
              f"{'; any policy URL' if a.allow_remote_policy else ''})", flush=True)
        uvicorn.run(app, host=HOST, port=a.port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_S)
    return 0


def add_worker_parser(subparsers: Any) -> Any:
    """The `rollout-worker` subcommand on cli.main's subparsers. Its server section is the Config fields'
    (mcp_rl/runs/flags.py); --tools / --deny-tools / --allow-side-effects cap what a request may offer."""
    from mcp_rl.runs import flags

    sp = subparsers.add_parser("rollout-worker", help="serve rollouts against an MCP server over HTTP on 127.0.0.1",
                               description="Run rollouts for a remote trainer (train --workers URL,...) next to an "
                               "MCP server; the trainer's policy endpoint is called back for every turn. The server "
                               "section's tool flags are the most a request may offer the agent.")
    flags.add_flags(sp, "server", flags.SERVER, required=("server",), aliases=False)  # --token is the worker's own
    sp.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    sp.add_argument("--token", default=os.environ.get("MCP_RL_WORKER_TOKEN"),
                    help="require this bearer token from trainers (env MCP_RL_WORKER_TOKEN); required unless "
                    "--insecure-no-token")
    sp.add_argument("--insecure-no-token", action="store_true",
                    help="serve without a token: any program on this machine may run rollouts through the worker")
    sp.add_argument("--allow-remote-policy", action="store_true",
                    help="let a request's policy base_url be another machine (default: 127.0.0.1 / localhost only)")
    sp.add_argument("--audit", help="append every tool call the worker's rollouts make to this JSONL file")
    sp.set_defaults(fn=cmd_rollout_worker)
    return sp
