"""Tests for mcp_rl/environment.py: an Environment's per-rollout episodes (in process and over stdio),
bound arguments the model never sees, the environment's own reward, gold-action demonstrations.
Run: pytest tests/test_environment.py"""

import contextlib
import json
import sys
import textwrap
from pathlib import Path

import fastmcp
import pytest

from mcp_rl.environment import Environment, Episode, environment, stdio_episodes
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.policies.policy import ScriptedPolicy, play
from mcp_rl.rewards.score import score_trajectory
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, failed_outside_policy, gather_rollouts, rollout
from mcp_rl.runs.evaluate import evaluate
from mcp_rl.tasks.scenarios import Scenario, load_scenarios, save_scenarios

OPEN = RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True), temperature=0.0)  # each rollout has its own state


def call(name, **args):
    return {"tool": name, "arguments": args}


def cart_server(state: dict) -> fastmcp.FastMCP:
    """A stateful server (its tools are unannotated, so they count as having side effects)."""
    mcp = fastmcp.FastMCP("cart")

    @mcp.tool
    def add(item: str, state_key: str) -> str:
        """Put an item in the cart."""
        state.setdefault(state_key, []).append(item)
        return f"added {item}"

    @mcp.tool
    def cart(state_key: str) -> str:
        """What the cart holds."""
        return json.dumps(state.get(state_key, []))

    return mcp


def cart_environment(opened: list, closed: list, fail_for: str | None = None) -> Environment:
    @contextlib.asynccontextmanager
    async def episode(scenario):
        if fail_for and scenario is not None and scenario.id == fail_for:
            raise RuntimeError("no sandbox left")
        state: dict = {}
        opened.append(state)
        try:  # one server and one state per rollout; the key is the episode's, never the model's
            yield Episode(cart_server(state), state=state, bind={"state_key": f"k{len(opened)}"})
        finally:
            closed.append(state)

    async def score(traj, scenario, ep):  # the environment checks the outcome, not the answer
        items = [i for v in ep.state.values() for i in v]
        return {"score": float(items == [scenario.extra["want"]]), "items": float(len(items))}

    return Environment("cart", episode=episode, score=score)


def buyer(item: str) -> ScriptedPolicy:
    return ScriptedPolicy(play(call("add", item=item), call("cart"), call(COMPLETE_TOOL_NAME, answer="done")))


async def test_each_rollout_gets_its_own_state_and_the_environment_scores_it():
    opened, closed = [], []
    env = cart_environment(opened, closed)
    scenarios = [Scenario(id=f"s{i}", task=f"Buy item {i}.", extra={"want": f"item{i}"}) for i in range(16)]
    groups = await gather_rollouts(ScriptedPolicy(_buy_what_is_asked), env, scenarios, OPEN)
    trajs = [g.trajectories[0] for g in groups]
    assert len(opened) == len(closed) == 16  # 16 in parallel: each opened and torn down
    for t in trajs:
        assert t.metrics["env_reward"] == 1.0 and t.metrics["env_reward/items"] == 1.0, t.logs
        cart_reply = [m["content"] for m in t.messages() if m["role"] == "tool"][1]
        assert len(json.loads(cart_reply)) == 1  # no rollout saw another's item


def _buy_what_is_asked(messages):
    task = next(m["content"] for m in messages if m["role"] == "user")
    done = sum(m["role"] == "assistant" for m in messages)
    item = "item" + task.split()[-1].rstrip(".")
    return [call("add", item=item), call("cart"), call(COMPLETE_TOOL_NAME, answer="done")][min(done, 2)]


async def test_bound_arguments_are_hidden_from_the_model_and_set_on_every_call():
    env = cart_environment([], [])
    traj = await rollout(buyer("x"), env, Scenario(id="s", task="Buy x.", extra={"want": "x"}), OPEN)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in traj.tools}
    assert "state_key" not in schemas["add"]["properties"] and schemas["add"]["required"] == ["item"]
    assert traj.metrics["env_reward"] == 1.0


async def test_a_model_cannot_override_a_bound_argument():
    opened = []
    env = cart_environment(opened, [])
    policy = ScriptedPolicy(play(call("add", item="x", state_key="someone-else"), call(COMPLETE_TOOL_NAME, answer="d")))
    await rollout(policy, env, Scenario(id="s", task="Buy x.", extra={"want": "x"}), OPEN)
    assert list(opened[0]) == ["k1"]


async def test_an_episode_that_fails_to_start_is_counted_not_scored():
    env = cart_environment([], [], fail_for="s1")
    groups = await gather_rollouts(buyer("x"), env, [Scenario(id="s1", task="Buy x.", extra={"want": "x"})], OPEN,
                                   group_size=3)
    for t in groups[0].trajectories:
        assert failed_outside_policy(t) and "could not start an episode" in t.metadata["fatal_reason"]
        assert "no sandbox left" in t.metadata["fatal_reason"] and "env_reward" not in t.metrics


async def test_the_environment_reward_is_the_verified_component_and_evaluation_takes_it():
    env = cart_environment([], [])
    wrong = ScriptedPolicy(play(call("add", item="y"), call(COMPLETE_TOOL_NAME, answer="done")))
    s = Scenario(id="s", task="Buy x.", extra={"want": "x"})
    bad = await rollout(wrong, env, s, OPEN)
    assert bad.metrics["env_reward"] == 0.0 and score_trajectory(bad, s) < 0.5
    result, _ = await evaluate(buyer("x"), env, [s, s], label="x", rollout_cfg=OPEN)
    assert result.success_rate == 1.0 and result.grounded_rate == 1.0
    with pytest.raises(ValueError, match="Environment.score"):
        await evaluate(buyer("x"), "mcp_server.py", [s], label="x", rollout_cfg=OPEN)


async def test_a_broken_scorer_fails_the_rollout_outside_the_policy():
    env = cart_environment([], [])

    async def broken(traj, scenario, ep):
        raise KeyError("state gone")

    env.score = broken
    traj = await rollout(buyer("x"), env, Scenario(id="s", task="Buy x.", extra={"want": "x"}), OPEN)
    assert failed_outside_policy(traj) and "environment score failed: KeyError" in traj.metadata["fatal_reason"]


async def test_gold_actions_demonstrate_on_any_server_and_are_kept_in_the_task_file(tmp_path):
    env = cart_environment([], [])
    s = Scenario(id="s", task="Buy x.", extra={"want": "x", "actions": [{"tool": "add", "arguments": {"item": "x"}}]})
    save_scenarios(tmp_path / "t.jsonl", [s, Scenario(id="plain", task="No extras.")])
    loaded = load_scenarios(tmp_path / "t.jsonl")
    assert loaded[0] == s and '"extra"' not in (tmp_path / "t.jsonl").read_text().splitlines()[1]
    demo = env.demonstrations(loaded[:1])
    traj = await rollout(demo, env, loaded[0], OPEN)
    assert traj.metrics["env_reward"] == 1.0 and traj.metadata["answer"] == "done"
    empty = await rollout(ScriptedPolicy(play(call(COMPLETE_TOOL_NAME, answer="done"))), env, loaded[0], OPEN)
    assert empty.metrics["env_reward"] == 0.0
    assert env.demonstrations(loaded) is None  # a task without actions: nothing to replay


STDIO_SERVER = textwrap.dedent('''
    import json, os, pathlib
    from fastmcp import FastMCP
    mcp = FastMCP("notes")
    STATE = pathlib.Path(os.environ["MCP_RL_ROLLOUT_DIR"]) / "notes.json"   # this rollout's own folder

    @mcp.tool
    def write(note: str) -> str:
        """Keep a note."""
        notes = json.loads(STATE.read_text()) if STATE.exists() else []
        STATE.write_text(json.dumps(notes + [note]))
        return "kept"

    @mcp.tool
    def read() -> str:
        """Every note kept."""
        return STATE.read_text() if STATE.exists() else "[]"

    mcp.run(show_banner=False)
''')


@pytest.mark.slow
async def test_sixteen_parallel_rollouts_against_a_stateful_stdio_server_each_see_their_own(tmp_path):
    script = tmp_path / "notes_server.py"
    script.write_text(STDIO_SERVER)
    folders = []

    async def score(traj, scenario, ep):
        folders.append(ep.state)
        return float(json.loads((ep.state / "notes.json").read_text()) == [scenario.id])

    env = Environment("notes", episode=stdio_episodes([sys.executable, str(script)]), score=score)

    def writer(messages):
        sid = next(m["content"] for m in messages if m["role"] == "user").split()[-1]
        done = sum(m["role"] == "assistant" for m in messages)
        return [call("write", note=sid), call("read"), call(COMPLETE_TOOL_NAME, answer="done")][min(done, 2)]

    scenarios = [Scenario(id=f"n{i}", task=f"Write n{i}") for i in range(16)]
    cfg = RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True), concurrency=16)
    groups = await gather_rollouts(ScriptedPolicy(writer), env, scenarios, cfg)
    for g, s in zip(groups, scenarios):
        t = g.trajectories[0]
        assert t.metrics["env_reward"] == 1.0, (s.id, t.metadata.get("fatal_reason"))
        assert json.loads([m["content"] for m in t.messages() if m["role"] == "tool"][1]) == [s.id]
    assert len(set(folders)) == 16 and not any(Path(f).exists() for f in folders)  # private, and removed after


def test_an_environment_with_episodes_is_its_own_spec():
    env = cart_environment([], [])
    assert environment(env) is env
    with env.serve() as spec:
        assert spec is env
    assert env.start().spec is env


async def test_the_cheat_audit_runs_on_an_environment_that_checks_outcomes():
    from mcp_rl.rewards.reward_audit import audit_reward

    env = cart_environment([], [])
    tasks = [Scenario(id=f"s{i}", task=f"Buy item{i}.", extra={
        "want": f"item{i}", "actions": [{"tool": "add", "arguments": {"item": f"item{i}"}}]}) for i in range(6)]
    report = await audit_reward(env, tasks, rollout_cfg=OPEN, demonstrations=env.demonstrations(tasks), counterfactual=None)
    assert report.demonstrations.success == 1.0 and not report.failed()
    names = [r.name for r in report.rows]
    assert "another task's lookups, then paste the last result" in names and "empty answer" in names
    assert not any(n.startswith("lookups, then") for n in names)  # a task's own actions are the honest work


async def test_demonstrations_of_tasks_that_share_a_text_play_each_tasks_own_actions():
    env = cart_environment([], [])
    tasks = [Scenario(id=f"s{i}", task="Fix my cart.", extra={
        "want": f"item{i}", "actions": [{"tool": "add", "arguments": {"item": f"item{i}"}}]}) for i in range(4)]
    demo = env.demonstrations(tasks)
    groups = await gather_rollouts(demo, env, tasks, OPEN)
    assert [g.trajectories[0].metrics["env_reward"] for g in groups] == [1.0] * 4  # not the first task's plan 4 times
    from mcp_rl.policies.policy import PolicyError

    with pytest.raises(PolicyError, match="different demonstrations"):
        await demo.complete([{"role": "user", "content": "Fix my cart."}], [])


def test_an_environment_whose_turns_overflow_the_context_is_refused_when_configured():
    """Environment.max_turns is set after Config's own checks ran: configure() checks the episode still fits."""
    from mcp_rl.runs.config import Config, TrainConfig

    cfg = Config(train=TrainConfig(max_seq_len=3072))  # the user's own length: kept, and checked
    Environment("short", server="x.py", max_turns=8).configure(cfg)  # 1024 + 8 x 256 fits
    with pytest.raises(ValueError, match=r"max_turns x rollout.max_tokens \(30 x 256\)"):
        Environment("long", server="x.py", max_turns=30).configure(cfg)
    roomy = Environment("long", server="x.py", max_turns=30).configure(Config())  # the default length: made room
    assert roomy.train.max_seq_len == 1024 + 30 * 256


async def test_a_runs_evaluation_samples_eval_k_rollouts_a_task_for_pass_hat_k():
    from mcp_rl.runs import pipeline
    from mcp_rl.runs.config import Config, TrainConfig

    env = cart_environment([], [])
    cfg = Config(server_tools=["add", "cart"], train=TrainConfig(eval_k=3, eval_temperature=0.7))
    s = Scenario(id="s", task="Buy x.", extra={"want": "x"})
    result = await pipeline.evaluate_policy(buyer("x"), env, [s], cfg, "k", env=env)
    assert result.k == 3 and len(result.rows) == 3 and result.pass_hat_k == 1.0
