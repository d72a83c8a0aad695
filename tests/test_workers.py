"""Tests for mcp_rl/workers.py: rollout workers over loopback HTTP, their 4xx answers, and a step that
survives a worker killed mid-rollout.

Each worker is a real `python -m mcp_rl rollout-worker --server company` process (the company server
over HTTP beside it); the policy is a scripted one served by `remote_rollouts` itself through
serve.openai_app, so a test takes seconds. Run: pytest tests/test_workers.py
"""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from mcp_rl.config import preset
from mcp_rl.launch import free_port
from mcp_rl.parts import rollout_config
from mcp_rl.policy import choice_from_text, tool_call_text
from mcp_rl.rollout import gather_rollouts
from mcp_rl.scenarios import load_scenarios
from mcp_rl.workers import WorkerPool, WorkersDown, remote_rollouts

REPO = Path(__file__).resolve().parent.parent
TOKEN = "sesame"
SCENARIOS = [s for s in load_scenarios(REPO / "data" / "scenarios.jsonl", split="train")][:6]


class SlowScript:
    """Lists the tables, then answers; `delay` seconds a turn, so a step is still running when a test acts."""

    name = "scripted"

    def __init__(self, delay: float = 0.0, on_call=None):
        self.delay, self.on_call, self.calls, self.step = delay, on_call, 0, 3

    async def complete(self, messages, tools, *, max_tokens=0, temperature=0.0):
        self.calls += 1
        if self.on_call:
            self.on_call(self.calls)
        await asyncio.sleep(self.delay)
        if not any(m["role"] == "tool" for m in messages):
            return choice_from_text(tool_call_text("list_tables", {}))
        return choice_from_text(tool_call_text("complete_task", {"answer": "42"}))


def start_worker(token=TOKEN):
    port = free_port()
    argv = [sys.executable, "-m", "mcp_rl", "rollout-worker", "--server", "company", "--port", str(port)]
    proc = subprocess.Popen(argv + (["--token", token] if token else []), cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {proc.stderr.read()[-1000:]}")
        try:
            httpx.get(f"{url}/v1/health", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError("worker did not start in 90 s")


def stop(proc):
    try:  # the worker and the company server it started: one process group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def workers():
    started = [start_worker(), start_worker()]
    yield started
    for proc, _ in started:
        stop(proc)


def config(urls, token=TOKEN):
    return preset("cpu", server="company", rollout_workers=urls, worker_token=token,
                  rollout={"max_turns": 4, "max_tokens": 64, "concurrency": 16})


def test_health_needs_the_token(workers):
    _, url = workers[0]
    assert httpx.get(f"{url}/v1/health").status_code == 401
    assert httpx.get(f"{url}/v1/health", headers={"Authorization": "Bearer nope"}).status_code == 401
    r = httpx.get(f"{url}/v1/health", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.json()["ok"] is True


LONG = "x" * 10_000
GOOD = {"scenarios": [{"id": "a", "task": "t"}], "group_size": 1,
        "policy": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}}


@pytest.mark.parametrize("body, status, says", [
    (b"{not json" + LONG.encode(), 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({**GOOD, "scenarios": []}, 400, "non-empty list"),
    ({**GOOD, "scenarios": [{"id": "a"}]}, 400, "task"),
    ({**GOOD, "scenarios": [{"id": "a", "task": LONG}], "extra": 1}, 400, "unknown field"),
    ({**GOOD, "group_size": 0}, 400, "group_size"),
    ({**GOOD, "policy": {"base_url": LONG, "model": "m"}}, 400, "policy must be"),
    ({**GOOD, "rollout": {"max_turns": 0}}, 400, "max_turns"),
    ({**GOOD, "rollout": {"nope": 1}}, 400, "nope"),
    ({**GOOD, LONG: 1}, 400, "unknown field"),  # a long field name is quoted as a prefix
    ({**GOOD, "tool_policy": {"allow": ["ok", "", LONG]}}, 400, "tool names"),
    ({**GOOD, "scenarios": [{"id": LONG, "task": ""}]}, 400, "invalid rollout request"),  # Scenario's own check
    ({**GOOD, "policy": {**GOOD["policy"], "timeout": "soon"}}, 400, "policy.timeout must be a number"),
    ({**GOOD, "policy": {**GOOD["policy"], "step": "x"}}, 400, "policy.step must be a number"),
])
def test_bad_requests_get_a_short_4xx(workers, body, status, says):
    _, url = workers[0]
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{url}/v1/rollouts", headers={"Authorization": f"Bearer {TOKEN}"}, **kw)
    assert r.status_code == status and says in r.json()["error"]
    assert len(r.text) < 500  # quotes a prefix of the input at most


def test_a_wrong_token_is_refused_before_the_body_is_read(workers):
    _, url = workers[0]
    r = httpx.post(f"{url}/v1/rollouts", json=GOOD)
    assert r.status_code == 401 and "token" in r.json()["error"]
    with pytest.raises(ValueError, match="401"):  # a refusal is an error to fix, not a dead worker
        asyncio.run(remote_rollouts(SlowScript(), SCENARIOS[:1], config([url], token=None), group_size=1))


@pytest.fixture(scope="module")
def company():
    from mcp_rl.launch import HttpServer, company_server_command

    with HttpServer(company_server_command()) as server:
        yield server.spec


async def test_remote_groups_carry_the_metrics_of_local_rollouts(workers, company):
    cfg = config([u for _, u in workers])
    groups, stats = await remote_rollouts(SlowScript(), SCENARIOS[:4], cfg, group_size=2)
    assert [len(g.trajectories) for g in groups] == [2] * 4 and stats["retried"] == 0
    assert [g.trajectories[0].metadata["scenario_id"] for g in groups] == [s.id for s in SCENARIOS[:4]]
    local = await gather_rollouts(SlowScript(), company, SCENARIOS[:1], rollout_config(cfg), group_size=1)
    remote, here = groups[0].trajectories[0], local[0].trajectories[0]
    assert set(remote.metrics) == set(here.metrics) and remote.metrics["completed"] and not remote.metrics["fatal"]
    assert remote.metrics["tool_calls/list_tables"] == 1 and remote.metadata["answer"] == "42"
    assert remote.metadata["policy_step"] == 3  # the trainer's step, as the worker was told


@pytest.mark.timeout(180)
async def test_a_worker_killed_mid_step_loses_and_duplicates_no_group():
    started = [start_worker(), start_worker()]
    try:
        (victim, dead_url), (_, live_url) = started

        def kill_first_worker(calls):
            if calls == 3:  # first turns are in flight on both workers (6 groups, round robin)
                os.killpg(victim.pid, signal.SIGKILL)

        groups, stats = await remote_rollouts(SlowScript(delay=0.5, on_call=kill_first_worker), SCENARIOS,
                                              config([dead_url, live_url]), group_size=2)
    finally:
        for proc, _ in started:
            stop(proc)
    assert [g.trajectories[0].metadata["scenario_id"] for g in groups] == [s.id for s in SCENARIOS]
    assert all(len(g.trajectories) == 2 for g in groups)
    assert all(t.metrics["completed"] and not t.metrics["fatal"] for g in groups for t in g.trajectories)
    assert list(stats["failed_workers"]) == [dead_url] and stats["retried"] >= 1
    assert stats["requests"] == len(SCENARIOS) + stats["retried"]


async def test_no_live_worker_is_a_clear_error():
    urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]  # nothing listens
    with pytest.raises(WorkersDown, match="every rollout worker failed"):
        await WorkerPool(urls).gather(SCENARIOS[:2], config(urls).rollout, policy=GOOD["policy"], group_size=1)


async def test_a_training_step_rolls_out_on_the_workers(workers):
    import types

    from mcp_rl import pipeline

    trained = []
    trainer = types.SimpleNamespace(policy=SlowScript(), train=lambda groups: trained.append(groups) or {"loss": 0.0})
    cfg = config([u for _, u in workers])
    rec = await pipeline.train_step(trainer, None, SCENARIOS[:2], cfg, 0)  # no local server: workers only
    assert rec["worker_requests"] == 2 and rec["worker_retries"] == 0
    assert rec["scenarios"] == [s.id for s in SCENARIOS[:2]] and rec["completed_rate"] == 1.0
    assert rec["groups_trained"] + rec["groups_skipped"] == 2


async def test_remote_trajectories_of_a_local_model_are_trainable(workers):
    from mcp_rl.local_policy import LocalPolicy
    from mcp_rl.models import load_local_tokenizer, tiny_llama
    from mcp_rl.train import PortableTrainer

    tok = load_local_tokenizer()
    trainer = PortableTrainer(LocalPolicy(tiny_llama(tok), tok, name="tiny"), max_seq_len=4096)
    cfg = config([u for _, u in workers])
    cfg.rollout.max_turns, cfg.rollout.max_tokens = 1, 8
    groups, _ = await remote_rollouts(trainer.policy, SCENARIOS[:1], cfg, group_size=2)
    for traj, reward in zip(groups[0].trajectories, (1.0, 0.0)):
        traj.reward = reward
    choice = next(m for m in groups[0].trajectories[0].messages_and_choices if not isinstance(m, dict))
    assert choice.logprobs.content[0].token.startswith("token_id:")  # what the trainer needs, over the wire
    assert (await trainer.train(groups))["updated"] == 1.0
