"""Remote rollout workers: the agent loop runs next to an MCP server on another machine, over HTTP.

    python -m mcp_rl rollout-worker --server company --port 8101 --token T     # beside the server
    python -m mcp_rl train --workers http://127.0.0.1:8101,http://127.0.0.1:8102 --worker-token T ...

A worker serves `POST /v1/rollouts` on 127.0.0.1 (`GET /v1/health` for a liveness probe): scenarios, a
group size, the rollout settings, the tool policy and a policy endpoint come in; it runs
`gather_rollouts` against its own server, with an `OpenAIPolicy` calling the endpoint back, and
answers with the groups of `art.Trajectory` (JSON), the same metrics, logprobs and metadata as
local rollouts. Rewards are scored by the trainer, as for local rollouts.

What a worker accepts (it runs a stranger's tool calls against the operator's server):
- a token: every request needs `Authorization: Bearer <token>` (401 otherwise); a worker does not
  start without one unless `--insecure-no-token` is given, and then says so on stderr;
- `Content-Type: application/json` POSTs to a loopback Host only (http_checks.LoopbackOnly: a web
  page in the operator's browser can send neither), bodies up to `max_body_bytes`, read in chunks;
- the operator's `--tools` / `--deny-tools` / `--allow-side-effects` cap every request's tool policy:
  a request may narrow it (fewer tools, more denied) and is refused (403, or 409 once the server's
  tools are known) when it would widen it;
- a policy `base_url` on this machine (the trainer's endpoint through a tunnel), unless the
  operator passes `--allow-remote-policy`; the endpoint's answers are never echoed back: a failed
  call is reported by its HTTP status and exception type only.
A malformed request gets a 4xx with a one-line reason quoting at most a short prefix of the input.
SIGTERM (or Ctrl-C) cancels the rollouts in flight after `SHUTDOWN_S` seconds and stops the server
the worker started; the startup line shows the server spec with its secrets redacted.

The trainer side (`remote_rollouts`, which pipeline.train_step calls when `Config.rollout_workers`
is set) serves its policy with `serve.openai_app` on 127.0.0.1:`policy_port` for the step, sends
one request per group, spread over the workers, and sends a group whose worker failed (refused the
connection, dropped it, timed out, answered 5xx, or answered something that is not a group of
trajectories) to another live worker. Each group's result is kept once, so a step ends with every
group exactly once, or raises when no worker is left. A group retried after a worker died
mid-rollout runs its tool calls again on the other server: fine for the read-only tools rollouts
allow by default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import sys
from typing import Any

import art
import httpx
import openai
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .guard import SIDE_EFFECTS, SideEffectsRefused, ToolPolicy, ToolPolicyError, classify_tool, short, tool_name
from .http_checks import BadRequest, LoopbackOnly, is_loopback_url, read_json
from .policy import ContextOverflow, PolicyError
from .redact import redact
from .rollout import RolloutConfig, gather_rollouts
from .scenarios import Scenario

__all__ = ["worker_app", "remote_rollouts", "WorkerPool", "WorkersDown", "add_worker_parser"]
log = logging.getLogger(__name__)
MAX_GROUP = 256
SHUTDOWN_S = 3.0  # after SIGTERM, rollouts in flight get this long before they are cancelled


class WorkersDown(RuntimeError):
    """No rollout worker is left to send a group to."""


class _WorkerFailed(Exception):
    """This worker cannot be used any more in this call (its groups go elsewhere)."""


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
        risky = [tool_name(t) for t in self.filter(tools) if classify_tool(t) == SIDE_EFFECTS
                 and tool_name(t) not in (self.cap.allow or ())]
        if risky:
            raise SideEffectsRefused(f"this worker's operator allows no tools with side effects, and the request "
                                     f"would offer {', '.join(short(n) for n in risky[:5])}; name read-only tools "
                                     "in tool_policy.allow, or ask the operator for --tools / --allow-side-effects", risky)


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
    return _Capped(allow=tp.allow, deny=tuple(dict.fromkeys((*tp.deny, *cap.deny))),
                   allow_side_effects=tp.allow_side_effects, cap=cap)


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
    from .audit import log_tool_calls
    from .connect import describe_spec
    from .policy import OpenAIPolicy

    if not token and not insecure_no_token:
        raise ValueError("a rollout worker needs a token: pass --token (or set MCP_RL_WORKER_TOKEN); "
                         "--insecure-no-token serves without one, on a machine nobody else uses")
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
        client = openai.AsyncOpenAI(base_url=p["base_url"], api_key=str(p.get("api_key") or "none"),
                                    timeout=float(p.get("timeout") or cfg.timeout), max_retries=0)
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


def _group(r: httpx.Response) -> art.TrajectoryGroup:
    """A worker's 200 answer as one group; _WorkerFailed when it is not one (a proxy's HTML page, a
    different service on that port): the group goes to another worker instead of failing the step."""
    try:
        (trajs,) = r.json()["groups"]
        return art.TrajectoryGroup([art.Trajectory.model_validate(t) for t in trajs])
    except Exception as e:  # noqa: BLE001 - JSONDecodeError, KeyError, TypeError, ValueError, ValidationError
        raise _WorkerFailed(f"HTTP {r.status_code} but not a group of trajectories ({type(e).__name__})") from None


class WorkerPool:
    """Groups spread over rollout workers; a failed worker's groups go to the live ones.

    `stats` after a call: requests, retried groups, and the workers that failed (with why)."""

    def __init__(self, urls: list[str], *, token: str | None = None, per_worker: int = 4):
        if not urls:
            raise ValueError("WorkerPool needs at least one worker URL (http://HOST:PORT)")
        self.urls = [u.rstrip("/") for u in urls]
        self.token, self.per_worker = token, max(1, per_worker)
        self.stats: dict[str, Any] = {}

    async def gather(self, scenarios: list[Scenario], cfg: RolloutConfig, *, policy: dict,
                     group_size: int) -> list[art.TrajectoryGroup]:
        alive, failed = list(self.urls), {}
        load = {u: 0 for u in self.urls}
        gates = {u: asyncio.Semaphore(self.per_worker) for u in self.urls}
        self.stats = {"requests": 0, "retried": 0, "failed_workers": failed}
        rollout = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "tool_policy"}
        tp = cfg.tool_policy or ToolPolicy()
        tool_policy = {"allow": None if tp.allow is None else list(tp.allow), "deny": list(tp.deny),
                       "allow_side_effects": tp.allow_side_effects}
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        timeout = httpx.Timeout(cfg.timeout + 60.0, connect=10.0)  # a rollout's own limit, plus the reply

        async def post(client: httpx.AsyncClient, url: str, scenario: Scenario) -> art.TrajectoryGroup:
            body = {"scenarios": [dataclasses.asdict(scenario)], "group_size": group_size, "policy": policy,
                    "rollout": rollout, "tool_policy": tool_policy}
            self.stats["requests"] += 1
            try:
                r = await client.post(f"{url}/v1/rollouts", json=body, headers=headers)
            except httpx.HTTPError as e:  # refused, reset, timed out: the worker is gone for this step
                raise _WorkerFailed(f"{type(e).__name__}: {redact(str(e)[:200])}") from e
            if r.status_code >= 500:
                raise _WorkerFailed(f"HTTP {r.status_code}: {short(r.text, 200)}")
            if r.status_code >= 400:  # our request or our token is wrong: every worker would say so
                raise ValueError(f"rollout worker {redact(url)} refused the request (HTTP {r.status_code}): "
                                 f"{short(r.text, 300)}")
            return _group(r)

        async def one(client: httpx.AsyncClient, i: int) -> art.TrajectoryGroup:
            url = alive[i % len(alive)] if alive else None  # round robin first, least loaded after a failure
            while True:
                if url is None:
                    raise WorkersDown(f"every rollout worker failed ({'; '.join(f'{redact(u)}: {w}' for u, w in failed.items())}); "
                                      "start them again (python -m mcp_rl rollout-worker) and rerun with --resume")
                load[url] += 1
                try:
                    async with gates[url]:
                        if url not in alive:  # it failed while this group waited for a slot
                            raise _WorkerFailed(failed.get(url, "failed"))
                        return await post(client, url, scenarios[i])
                except _WorkerFailed as e:
                    if url in alive:
                        alive.remove(url)
                        failed[url] = str(e)
                        log.warning("rollout worker %s failed (%s); its groups go to the others", redact(url), e)
                    self.stats["retried"] += 1
                finally:
                    load[url] -= 1
                url = min(alive, key=lambda u: load[u]) if alive else None

        async with httpx.AsyncClient(timeout=timeout) as client:
            tasks = [asyncio.ensure_future(one(client, i)) for i in range(len(scenarios))]
            try:
                return list(await asyncio.gather(*tasks))
            finally:
                for t in tasks:
                    t.cancel()


async def remote_rollouts(policy: Any, scenarios: list[Scenario], cfg: Any, *, group_size: int,
                          port: int = 0) -> tuple[list[art.TrajectoryGroup], dict]:
    """`gather_rollouts` on `cfg.rollout_workers` (a Config): `policy` is served on 127.0.0.1:`port`
    (0: a free port) for the call; workers call it back at that address (tunnel it to their machines)."""
    from .serve import ServerThread, openai_app

    name = getattr(policy, "name", None) or "policy"
    pool = WorkerPool(cfg.rollout_workers, token=cfg.worker_token or os.environ.get("MCP_RL_WORKER_TOKEN"),
                      per_worker=max(1, cfg.rollout.concurrency // max(1, group_size)))
    # The endpoint's default and cap of a turn are the rollout's (workers send max_tokens anyway).
    app = openai_app(policy, name=name, default_max_tokens=cfg.rollout.max_tokens, max_tokens=cfg.rollout.max_tokens,
                     request_timeout=cfg.rollout.timeout)
    with ServerThread(app, port=port or None) as srv:
        spec = {"base_url": srv.base_url, "model": name, "step": int(getattr(policy, "step", 0) or 0),
                "timeout": cfg.rollout.timeout}
        groups = await pool.gather(scenarios, dataclasses.replace(cfg.rollout, tool_policy=cfg.tool_policy()),
                                   policy=spec, group_size=group_size)
    return groups, pool.stats


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

    from .launch import HttpServer, company_server_command
    from .serve import HOST

    if not 0 < a.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {a.port}")
    if not a.token and not a.insecure_no_token:  # before any server is started
        raise ValueError("a rollout worker needs a token: pass --token (or set MCP_RL_WORKER_TOKEN); "
                         "--insecure-no-token serves without one, on a machine nobody else uses")
    tools = ToolPolicy(allow=a.tools, deny=a.deny_tools or (), allow_side_effects=a.allow_side_effects)
    _sigterm_unwinds()
    with contextlib.ExitStack() as stack:
        server: Any = a.server
        if a.server == "company":  # our server over HTTP, for as long as the worker runs
            server = stack.enter_context(HttpServer(company_server_command(), token=a.server_token)).spec
        elif a.server_token and a.server.startswith("http"):
            server = {"url": a.server, "token": a.server_token}
        app = worker_app(server, token=a.token, insecure_no_token=a.insecure_no_token, tools=tools,
                         allow_remote_policy=a.allow_remote_policy, audit=a.audit)
        if not a.token:
            print("WARNING: this rollout worker accepts requests WITHOUT A TOKEN (--insecure-no-token): any "
                  "program on this machine can run tool calls against the server through it", file=sys.stderr, flush=True)
        offered = "tools " + ",".join(tools.allow) if tools.allow else \
            ("every tool" if tools.allow_side_effects else "read-only tools")
        print(f"rollout worker for {redact(a.server)!r} at http://{HOST}:{a.port}/v1/rollouts "
              f"({'token required' if a.token else 'NO TOKEN'}; {offered}"
              f"{'; minus ' + ','.join(tools.deny) if tools.deny else ''}"
              f"{'; any policy URL' if a.allow_remote_policy else ''})", flush=True)
        uvicorn.run(app, host=HOST, port=a.port, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_S)
    return 0


def add_worker_parser(subparsers: Any) -> Any:
    """The `rollout-worker` subcommand on cli.main's subparsers."""
    def names(text: str) -> list[str]:
        return [n.strip() for n in text.split(",") if n.strip()]

    sp = subparsers.add_parser("rollout-worker", help="serve rollouts against an MCP server over HTTP on 127.0.0.1",
                               description="Run rollouts for a remote trainer (train --workers URL,...) next to an "
                               "MCP server; the trainer's policy endpoint is called back for every turn.")
    sp.add_argument("--server", required=True, help="'company', a .py file, a shell command, or an http(s) MCP URL")
    sp.add_argument("--server-token", default=os.environ.get("MCP_RL_TOKEN"), help="bearer token of an HTTP MCP server")
    sp.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    sp.add_argument("--token", default=os.environ.get("MCP_RL_WORKER_TOKEN"),
                    help="require this bearer token from trainers (env MCP_RL_WORKER_TOKEN); required unless "
                    "--insecure-no-token")
    sp.add_argument("--insecure-no-token", action="store_true",
                    help="serve without a token: any program on this machine may run rollouts through the worker")
    sp.add_argument("--tools", type=names, metavar="A,B,...",
                    help="the most a request may offer the agent: only these server tools (whatever their class)")
    sp.add_argument("--deny-tools", type=names, metavar="A,B,...", help="never offer these server tools")
    sp.add_argument("--allow-side-effects", action="store_true",
                    help="let requests offer tools not annotated read-only (default: read-only tools only)")
    sp.add_argument("--allow-remote-policy", action="store_true",
                    help="let a request's policy base_url be another machine (default: 127.0.0.1 / localhost only)")
    sp.add_argument("--audit", help="append every tool call the worker's rollouts make to this JSONL file")
    sp.set_defaults(fn=cmd_rollout_worker)
    return sp
