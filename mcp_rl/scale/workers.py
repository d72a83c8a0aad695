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
import logging
import os
from typing import Any

import art
import httpx

from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.quote import short
from mcp_rl.redact import redact
from mcp_rl.rollout import RolloutConfig
from mcp_rl.tasks.scenarios import Scenario
from mcp_rl.scale.worker_server import add_worker_parser, cmd_rollout_worker, worker_app  # noqa: F401 - the worker's side

__all__ = ["worker_app", "remote_rollouts", "WorkerPool", "WorkersDown", "add_worker_parser"]
log = logging.getLogger(__name__)


class WorkersDown(RuntimeError):
    """No rollout worker is left to send a group to."""


class _WorkerFailed(Exception):
    """This worker cannot be used any more in this call (its groups go elsewhere)."""


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
        tool_policy = (cfg.tool_policy or ToolPolicy()).as_dict()
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
    from mcp_rl.ship.serve import ServerThread, openai_app

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
