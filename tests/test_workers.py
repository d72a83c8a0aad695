"""Tests for mcp_rl/scale/workers.py and worker_server.py: rollout workers over loopback HTTP, their 4xx
answers, a step that survives a worker killed mid-rollout, and what a worker refuses (hardening).

Most workers are real `python -m mcp_rl rollout-worker --server company` processes (the company
server over HTTP beside it); the hardening tests run worker_app in-process (uvicorn in a thread) over
an in-process FastMCP server with a side-effect tool. The policy is a scripted one served on
loopback through serve.openai_app, so a test takes seconds. Run: pytest tests/test_workers.py
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

from mcp_rl.runs.config import preset
from mcp_rl.mcp.launch import free_port
from mcp_rl.runs.parts import rollout_config
from mcp_rl.policies.policy import choice_from_text, tool_call_text
from mcp_rl.rollout import gather_rollouts
from mcp_rl.tasks.scenarios import load_scenarios
from mcp_rl.scale.workers import WorkerPool, WorkersDown, remote_rollouts

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
    r = httpx.post(f"{url}/v1/rollouts", headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
                   **kw)
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
    from mcp_rl.environments.company import command as company_server_command
    from mcp_rl.mcp.launch import HttpServer

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

    from mcp_rl.runs import pipeline

    trained = []
    trainer = types.SimpleNamespace(policy=SlowScript(), train=lambda groups: trained.append(groups) or {"loss": 0.0})
    cfg = config([u for _, u in workers])
    rec = await pipeline.train_step(trainer, None, SCENARIOS[:2], cfg, 0)  # no local server: workers only
    assert rec["worker_requests"] == 2 and rec["worker_retries"] == 0
    assert rec["scenarios"] == [s.id for s in SCENARIOS[:2]] and rec["completed_rate"] == 1.0
    assert rec["groups_trained"] + rec["groups_skipped"] == 2


async def test_remote_trajectories_of_a_local_model_are_trainable(workers):
    from mcp_rl.policies.local_policy import LocalPolicy
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama
    from mcp_rl.training.portable import PortableTrainer

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


# ---------------------------------------------------------------- hardening: what a worker accepts
# In-process workers (uvicorn in a thread) over an in-process FastMCP server with one read-only tool
# and one with side effects; the scripted policy is served on loopback by serve.openai_app.

import dataclasses  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402

from mcp_rl.mcp.guard import ToolPolicy  # noqa: E402
from mcp_rl.ship.serve import ServerThread, openai_app  # noqa: E402
from mcp_rl.scale.workers import worker_app  # noqa: E402


def effects_server(launched):
    import fastmcp

    mcp = fastmcp.FastMCP("effects")

    @mcp.tool(annotations={"readOnlyHint": True})
    def look() -> str:
        """Look around."""
        return "nothing to see"

    @mcp.tool
    def launch(target: str) -> str:
        """Launch something (a side effect)."""
        launched.append(target)
        return "launched"

    return mcp


class CallThen:
    """Calls `tool` once, then completes."""

    name, tokenizer, step = "scripted", None, 0

    def __init__(self, tool, args):
        self.tool, self.args = tool, args

    async def complete(self, messages, tools, **kw):
        if not any(m["role"] == "tool" for m in messages):
            return choice_from_text(tool_call_text(self.tool, self.args))
        return choice_from_text(tool_call_text("complete_task", {"answer": "done"}))


def post(url, body, token=TOKEN, **headers):
    return httpx.post(f"{url}/v1/rollouts", json=body, timeout=60,
                      headers={**({"Authorization": f"Bearer {token}"} if token else {}), **headers})


@pytest.fixture
def fx():
    """A worker over the effects server (operator caps from the test) and a policy that calls `launch`."""
    launched, started = [], []

    def make(policy=None, **worker_kw):
        endpoint = ServerThread(openai_app(policy or CallThen("launch", {"target": "moon"}))).start()
        worker = ServerThread(worker_app(effects_server(launched), **{"token": TOKEN, **worker_kw})).start()
        started.extend([endpoint, worker])
        body = {"scenarios": [{"id": "s1", "task": "go"}], "group_size": 1,
                "policy": {"base_url": endpoint.base_url, "model": "scripted"}, "rollout": {"max_turns": 3},
                "tool_policy": {"allow": ["look"]}}
        return worker.base_url.removesuffix("/v1"), body

    yield make, launched
    for server in started:
        server.stop()


@pytest.mark.parametrize("operator, asked, status, ran", [
    ({}, {"allow_side_effects": True}, 403, False),                      # a request turned side effects on
    ({}, {"allow": ["launch"]}, 409, False),                             # ... or named a side-effect tool
    ({"tools": ToolPolicy(allow=["look"])}, {"allow": ["look", "launch"]}, 403, False),
    ({"tools": ToolPolicy(deny=["launch"], allow_side_effects=True)}, {"allow_side_effects": True}, 200, False),
    ({"tools": ToolPolicy(allow_side_effects=True)}, {"allow_side_effects": True}, 200, True),  # the operator's call
    ({}, {"read_only": ["launch"]}, 409, False),              # a request's read-only declaration gets past nothing
    ({"tools": ToolPolicy(read_only=["launch"])}, {}, 200, True),  # the operator's does
])
def test_the_operators_tool_flags_cap_what_a_request_may_ask(fx, operator, asked, status, ran):
    make, launched = fx
    url, body = make(**operator)
    r = post(url, {**body, "tool_policy": asked})
    assert r.status_code == status, r.text
    assert launched == (["moon"] if ran else [])  # a refused request ran no tool
    if status == 200 and not ran:  # denied by the operator: the call was refused as an unknown tool
        (traj,) = r.json()["groups"][0]
        assert traj["metrics"]["unknown_tools"] == 1


def test_a_worker_does_not_start_without_a_token():
    with pytest.raises(ValueError, match="needs a token"):
        worker_app("company")
    env = {k: v for k, v in os.environ.items() if k != "MCP_RL_WORKER_TOKEN"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mcp_rl", "rollout-worker", "--server", "company", "--port",
                           str(free_port())], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a token" in done.stderr and "--insecure-no-token" in done.stderr
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("headers, status", [
    ({"Content-Type": "text/plain"}, 415),  # what a web page may POST cross-site without a preflight
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ({"Content-Type": "application/json", "Host": "evil.test:80"}, 403),  # DNS rebinding
])
def test_a_browser_page_cannot_drive_a_tokenless_worker(fx, headers, status):
    make, launched = fx
    url, body = make(token=None, insecure_no_token=True, tools=ToolPolicy(allow_side_effects=True))
    r = httpx.post(f"{url}/v1/rollouts", content=json.dumps(body).encode(), headers=headers, timeout=60)
    assert r.status_code == status and r.json()["error"] and launched == []


def test_the_policy_url_must_be_on_this_machine(fx):
    make, launched = fx
    url, body = make()
    far = {**body, "policy": {**body["policy"], "base_url": "http://10.11.12.13:8000/v1?key=abc"}}
    r = post(url, far)
    assert r.status_code == 403 and "--allow-remote-policy" in r.json()["error"] and "abc" not in r.text
    from mcp_rl.scale.worker_server import _parse

    assert _parse(far, ToolPolicy(), True)[2]["base_url"].startswith("http://10.11")  # the operator may allow it


def test_an_endpoints_answer_is_not_echoed_back(fx):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def forbidden(request):
        return PlainTextResponse("INTERNAL-ADMIN-PAGE " * 30, status_code=403)

    internal = ServerThread(Starlette(routes=[Route("/v1/chat/completions", forbidden, methods=["POST"])])).start()
    try:
        make, _ = fx
        url, body = make()
        r = post(url, {**body, "policy": {**body["policy"], "base_url": internal.base_url}})
    finally:
        internal.stop()
    (traj,) = r.json()["groups"][0]
    assert traj["metrics"]["fatal"] and "HTTP 403" in traj["metadata"]["fatal_reason"]
    assert "INTERNAL-ADMIN-PAGE" not in r.text


def test_a_redirect_from_the_policy_endpoint_is_not_followed(fx):
    """Probe, round 2: the loopback check reads base_url only; a 307 elsewhere must not be followed."""
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

    hits = []

    async def elsewhere(request):
        hits.append(1)
        return RedirectResponse("http://127.0.0.1:9/v1/chat/completions", status_code=307)

    internal = ServerThread(Starlette(routes=[Route("/v1/chat/completions", elsewhere, methods=["POST"])])).start()
    try:
        make, _ = fx
        url, body = make()
        r = post(url, {**body, "policy": {**body["policy"], "base_url": internal.base_url}})
    finally:
        internal.stop()
    (traj,) = r.json()["groups"][0]
    assert hits and traj["metrics"]["fatal"] and "HTTP 307" in traj["metadata"]["fatal_reason"]


def test_a_body_over_the_cap_is_refused_before_it_is_read(fx):
    make, _ = fx
    url, _ = make(max_body_bytes=1000)
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST /v1/rollouts HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Authorization: Bearer {TOKEN}\r\nContent-Length: 40000000\r\n\r\n{{".encode())
        reply = b""
        while b"bytes;" not in reply:  # the old worker waited for all 40 MB here (the recv timed out)
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode()
    assert reply.startswith("HTTP/1.1 413") and "over 1000 bytes" in reply


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"scenarios": ' + b"[" * 900 + b"]" * 900 + b"}"])
def test_deeply_nested_json_is_a_400(fx, body):
    make, _ = fx
    url, _ = make()
    r = httpx.post(f"{url}/v1/rollouts", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert r.status_code == 400 and "nests deeper" in r.json()["error"]


def test_a_long_scenario_id_is_cut_in_the_audit_log(fx, tmp_path):
    from mcp_rl.mcp.audit import read_tool_calls

    make, _ = fx
    url, body = make(policy=CallThen("look", {}), audit=str(tmp_path / "calls.jsonl"))
    r = post(url, {**body, "scenarios": [{"id": "x" * 1_000_000, "task": "go"}]})
    assert r.status_code == 200, r.text[:300]
    (row,) = read_tool_calls(tmp_path / "calls.jsonl")
    assert row["tool"] == "look" and len(row["scenario"]) <= 200


def test_a_worker_answering_html_is_failed_over(fx):
    """A 200 with an HTML page (a proxy's login page) failed the whole step with JSONDecodeError."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    async def page(request):
        return HTMLResponse("<html>please log in</html>")

    make, _ = fx
    url, body = make(policy=CallThen("look", {}))
    html = ServerThread(Starlette(routes=[Route("/v1/rollouts", page, methods=["POST"])])).start()
    html_url = html.base_url.removesuffix("/v1")
    try:
        pool = WorkerPool([html_url, url], token=TOKEN)
        cfg = config([html_url, url]).rollout
        cfg = dataclasses.replace(cfg, tool_policy=ToolPolicy(allow=["look"]))
        groups = asyncio.run(pool.gather(SCENARIOS[:2], cfg, policy=body["policy"], group_size=1))
    finally:
        html.stop()
    assert len(groups) == 2 and list(pool.stats["failed_workers"]) == [html_url]
    assert "not a group of trajectories" in pool.stats["failed_workers"][html_url]


def children(pid):
    """Live child pids of `pid` (from /proc)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(p.name))
    return out


def alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2:].split()[0] != "Z"


@pytest.mark.timeout(180)
def test_sigterm_ends_rollouts_in_flight_and_stops_the_workers_server():
    """SIGTERM left the worker running until the request's own rollout timeout, and then its
    mcp_server.py child orphaned."""
    started = threading.Event()

    class Stuck:
        name, tokenizer, step = "scripted", None, 0

        async def complete(self, messages, tools, **kw):
            started.set()
            await asyncio.sleep(600)

    endpoint = ServerThread(openai_app(Stuck())).start()
    proc, url = start_worker()
    try:
        servers = children(proc.pid)
        assert servers, "the worker should have started the company server"
        body = {"scenarios": [{"id": "s", "task": "t"}], "group_size": 1, "rollout": {"timeout": 600},
                "policy": {"base_url": endpoint.base_url, "model": "scripted", "timeout": 600}}
        threading.Thread(target=lambda: httpx.post(f"{url}/v1/rollouts", json=body, timeout=700,
                                                   headers={"Authorization": f"Bearer {TOKEN}"}),
                         daemon=True).start()
        assert started.wait(60), "the rollout never reached the policy"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        proc.wait(timeout=30)
        assert time.monotonic() - start < 20
        deadline = time.monotonic() + 10
        while any(alive(p) for p in servers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in servers), "the worker's MCP server outlived it"
    finally:
        stop(proc)
        endpoint.stop()


def test_the_startup_line_hides_the_servers_secrets():
    port = free_port()
    spec = "http://bob:hunter2@127.0.0.1:9/mcp?api_key=abc123"
    proc = subprocess.Popen([sys.executable, "-m", "mcp_rl", "rollout-worker", "--server", spec, "--port", str(port),
                             "--token", TOKEN], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "rollout worker for" in line and "bob:***@127.0.0.1" in line
    assert "hunter2" not in line and "abc123" not in line
