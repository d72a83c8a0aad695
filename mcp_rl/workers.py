"""Remote rollout workers: the agent loop runs next to an MCP server on another machine, over HTTP.

    python -m mcp_rl rollout-worker --server company --port 8101 --token T     # beside the server
    python -m mcp_rl train --workers http://127.0.0.1:8101,http://127.0.0.1:8102 --worker-token T ...

A worker serves `POST /v1/rollouts` on 127.0.0.1 (`GET /v1/health` for a liveness probe): scenarios, a
group size, the rollout settings, the tool policy and a policy endpoint come in; it runs
`gather_rollouts` against its own server, with an `OpenAIPolicy` calling the endpoint back, and
answers with the groups of `art.Trajectory` (JSON), the same metrics, logprobs and metadata as
local rollouts. Rewards are scored by the trainer, as for local rollouts. With a token set every
request needs `Authorization: Bearer <token>` (401 otherwise); a malformed request gets a 4xx with
a one-line reason that quotes at most a short prefix of the input.

The trainer side (`remote_rollouts`, which pipeline.train_step calls when `Config.rollout_workers`
is set) serves its policy with `serve.openai_app` on 127.0.0.1:`policy_port` for the step, sends
one request per group, spread over the workers, and sends a group whose worker failed (refused the
connection, dropped it, timed out, answered 5xx) to another live worker. Each group's result is
kept once, so a step ends with every group exactly once, or raises when no worker is left. A
group retried after a worker died mid-rollout runs its tool calls again on the other server: fine
for the read-only tools rollouts allow by default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
from typing import Any

import art
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .guard import short  # a prefix of what a client sent, never all of it
from .guard import ToolPolicy, ToolPolicyError
from .rollout import RolloutConfig, gather_rollouts
from .scenarios import Scenario

__all__ = ["worker_app", "remote_rollouts", "WorkerPool", "WorkersDown", "add_worker_parser"]
log = logging.getLogger(__name__)
MAX_GROUP = 256


class WorkersDown(RuntimeError):
    """No rollout worker is left to send a group to."""


class _WorkerFailed(Exception):
    """This worker cannot be used any more in this call (its groups go elsewhere)."""



def _bad(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _parse(data: Any) -> tuple[list[Scenario], int, dict, RolloutConfig]:
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
    for key, kind in (("timeout", float), ("step", int)):
        value = policy.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"policy.{key} must be a number, got {short(value)}")
    try:
        parsed = [Scenario(**s) for s in scenarios]
        tool_policy = ToolPolicy(**(data.get("tool_policy") or {}))
        rollout = data.get("rollout") or {}
        if not isinstance(rollout, dict):
            raise ValueError(f"rollout must be an object of RolloutConfig fields, got {short(rollout)}")
        cfg = RolloutConfig(**{**rollout, "tool_policy": tool_policy})
    except TypeError as e:  # an unknown or missing dataclass field
        raise ValueError(str(e)[:200]) from None
    return parsed, size, policy, cfg


def worker_app(server: Any, *, token: str | None = None, max_body_bytes: int = 16 << 20,
               audit: str | None = None) -> Starlette:
    """A Starlette app running rollouts against `server` (a ServerSpec) for remote trainers."""
    from .audit import log_tool_calls
    from .connect import describe_spec
    from .policy import OpenAIPolicy

    def authorised(request: Request) -> bool:
        given = request.headers.get("authorization", "")
        return token is None or hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

    async def health(request: Request) -> JSONResponse:
        if not authorised(request):
            return _bad(401, "missing or wrong bearer token (Authorization: Bearer ...); pass the worker's --token")
        return JSONResponse({"ok": True, "server": describe_spec(server)})

    async def rollouts(request: Request) -> JSONResponse:
        if not authorised(request):
            return _bad(401, "missing or wrong bearer token (Authorization: Bearer ...); pass the worker's --token")
        body = await request.body()
        if len(body) > max_body_bytes:
            return _bad(413, f"the body is over {max_body_bytes} bytes; send fewer scenarios per request")
        try:
            scenarios, size, p, cfg = _parse(json.loads(body))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _bad(400, f"the body is not valid JSON ({type(e).__name__}): {short(body.decode('utf-8', 'replace'))}")
        except ValueError as e:  # a Scenario's own check may quote a whole field: cut it
            return _bad(400, f"invalid rollout request: {short(str(e), 300)}")
        policy = OpenAIPolicy(p["model"], base_url=p["base_url"], api_key=str(p.get("api_key") or "none"),
                              timeout=float(p.get("timeout") or cfg.timeout))
        policy.step = int(p.get("step") or 0)  # trajectories record the trainer's step, as local ones do
        try:
            with log_tool_calls(audit, phase="worker") if audit else log_tool_calls(None):
                groups = await gather_rollouts(policy, server, scenarios, cfg, group_size=size, desc="worker")
        except ToolPolicyError as e:
            return _bad(409, f"the server's tools do not fit the tool policy: {str(e)[:300]}")
        return JSONResponse({"groups": [[t.model_dump(mode="json") for t in g.trajectories] for g in groups]})

    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return _bad(404, f"no route {request.url.path[:60]}; a worker has GET /v1/health and POST /v1/rollouts")

    return Starlette(routes=[Route("/v1/health", health), Route("/v1/rollouts", rollouts, methods=["POST"])],
                     exception_handlers={404: not_found, 405: not_found})


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
                raise _WorkerFailed(f"{type(e).__name__}: {str(e)[:200]}") from e
            if r.status_code >= 500:
                raise _WorkerFailed(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code >= 400:  # our request or our token is wrong: every worker would say so
                raise ValueError(f"rollout worker {url} refused the request (HTTP {r.status_code}): {r.text[:300]}")
            (trajs,) = r.json()["groups"]
            return art.TrajectoryGroup([art.Trajectory.model_validate(t) for t in trajs])

        async def one(client: httpx.AsyncClient, i: int) -> art.TrajectoryGroup:
            url = alive[i % len(alive)] if alive else None  # round robin first, least loaded after a failure
            while True:
                if url is None:
                    raise WorkersDown(f"every rollout worker failed ({'; '.join(f'{u}: {w}' for u, w in failed.items())}); "
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
                        log.warning("rollout worker %s failed (%s); its groups go to the others", url, e)
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
    # The endpoint's default turn length is the rollout's (workers send max_tokens anyway).
    with ServerThread(openai_app(policy, name=name, default_max_tokens=cfg.rollout.max_tokens), port=port or None) as srv:
        spec = {"base_url": srv.base_url, "model": name, "step": int(getattr(policy, "step", 0) or 0),
                "timeout": cfg.rollout.timeout}
        groups = await pool.gather(scenarios, dataclasses.replace(cfg.rollout, tool_policy=cfg.tool_policy()),
                                   policy=spec, group_size=group_size)
    return groups, pool.stats


def cmd_rollout_worker(a: Any) -> int:
    import contextlib

    import uvicorn

    from .launch import HttpServer, company_server_command
    from .serve import HOST

    if not 0 < a.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {a.port}")
    with contextlib.ExitStack() as stack:
        server: Any = a.server
        if a.server == "company":  # our server over HTTP, for as long as the worker runs
            server = stack.enter_context(HttpServer(company_server_command(), token=a.server_token)).spec
        elif a.server_token and a.server.startswith("http"):
            server = {"url": a.server, "token": a.server_token}
        print(f"rollout worker for {a.server!r} at http://{HOST}:{a.port}/v1/rollouts"
              f"{' (token required)' if a.token else ''}", flush=True)
        uvicorn.run(worker_app(server, token=a.token, audit=a.audit), host=HOST, port=a.port, log_level="warning")
    return 0


def add_worker_parser(subparsers: Any) -> Any:
    """The `rollout-worker` subcommand on cli.main's subparsers."""
    import os

    sp = subparsers.add_parser("rollout-worker", help="serve rollouts against an MCP server over HTTP on 127.0.0.1",
                               description="Run rollouts for a remote trainer (train --workers URL,...) next to an "
                               "MCP server; the trainer's policy endpoint is called back for every turn.")
    sp.add_argument("--server", required=True, help="'company', a .py file, a shell command, or an http(s) MCP URL")
    sp.add_argument("--server-token", default=os.environ.get("MCP_RL_TOKEN"), help="bearer token of an HTTP MCP server")
    sp.add_argument("--port", type=int, required=True, help="port on 127.0.0.1")
    sp.add_argument("--token", default=os.environ.get("MCP_RL_WORKER_TOKEN"),
                    help="require this bearer token from trainers (env MCP_RL_WORKER_TOKEN)")
    sp.add_argument("--audit", help="append every tool call the worker's rollouts make to this JSONL file")
    sp.set_defaults(fn=cmd_rollout_worker)
    return sp
