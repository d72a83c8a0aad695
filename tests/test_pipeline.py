"""The training loop: deterministic scenario order, zero-variance skipping, kill and resume.

Runs the real loop (company server over HTTP, LocalPolicy, PortableTrainer) on a
tiny random Llama with SmolLM2's tokenizer: fast, and about the loop, not learning.
Run: pytest tests/test_pipeline.py
"""

import dataclasses
import json

import pytest

from mcp_rl.environments.company import PLAN
from mcp_rl.runs import parts
from mcp_rl.runs import pipeline
from mcp_rl.mcp.audit import read_tool_calls
from mcp_rl.runs.callbacks import TrainerCallback
from mcp_rl.runs.config import apply_overrides, preset
from mcp_rl.runs.pipeline import step_batch
from mcp_rl.runs.run import open_run, run
from mcp_rl.tasks.scenarios import Scenario


def training_run(trainer, cfg, out, step=0, history=()):
    """A run in `out` past its warm start, at `step`, training `trainer` (a stand-in: no model loads)."""
    r = open_run(dataclasses.replace(cfg, out=str(out)))
    r._trainer = trainer
    r.state = dataclasses.replace(r.state, phase="training", step=step, history=list(history))
    return r


def test_step_batches_are_a_pure_function_of_seed_and_step():
    train = [Scenario(id=f"s{i}", task=f"t{i}") for i in range(10)]
    first = [step_batch(train, k, 4, seed=3) for k in range(5)]
    assert first == [step_batch(train, k, 4, seed=3) for k in range(5)]
    epoch0 = [s.id for b in first for s in b][:10]
    assert sorted(epoch0) == sorted(s.id for s in train)  # one epoch visits each scenario once
    assert step_batch(train, 0, 4, seed=4) != first[0]


@pytest.fixture
def tiny_trainer_factory(tiny_trainer):
    return lambda cfg: tiny_trainer(cfg, micro_batch_size=4)


def small_config(out, steps):
    return apply_overrides(preset("cpu", server="company"), [
        f"out={out}", f"train.steps={steps}", "train.groups_per_step=2", "train.group_size=2",
        "train.warm_start_scenarios=2", "train.warm_start_epochs=1", "train.eval_scenarios=3",
        "rollout.max_turns=6", "rollout.max_tokens=12",
        "reward.audit_scenarios=0"])  # the reward audit has its own tests (test_reward_audit.py)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_kill_and_resume_loses_and_repeats_no_step(tmp_path, monkeypatch, tiny_trainer_factory):
    monkeypatch.setattr(parts, "build_trainer", tiny_trainer_factory)
    out = tmp_path / "run"
    await run(small_config(out, steps=1))
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 1 and state["phase"] == "done"

    # Resume to 3 steps, killed during step 3 (after step 2 is committed).
    real_step = pipeline.train_step

    async def dying(trainer, server, batch, cfg, step, env=None):
        if step + 1 == 3:
            raise KeyboardInterrupt("killed")
        return await real_step(trainer, server, batch, cfg, step, env)

    monkeypatch.setattr(pipeline, "train_step", dying)
    cfg = small_config(out, steps=3)
    with pytest.raises(KeyboardInterrupt):
        await run(cfg, resume=True)
    assert json.loads((out / "state.json").read_text())["step"] == 2

    monkeypatch.setattr(pipeline, "train_step", real_step)
    result = await run(cfg, resume=True)
    state = json.loads((out / "state.json").read_text())
    steps = [h["step"] for h in state["history"]]
    assert steps == [0, 1, 2, 3]  # the warm start, then each step exactly once
    train = [s for s in pipeline.load_scenarios(cfg.scenarios) if s.split == "train"]
    for h in state["history"][1:]:  # the scenario order is reproduced across the kill
        assert h["scenarios"] == [s.id for s in step_batch(train, h["step"] - 1, 2, cfg.train.seed)]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == steps
    assert result["base"].n == 3 and (out / "report.md").exists()
    # Tool calls are in the audit log under their phase. The tiny random model rarely makes a call,
    # so only the demonstrations' (scripted) calls are certain; the rest may be absent.
    calls = read_tool_calls(out / "tool_calls.jsonl")
    phases = {c["phase"] for c in calls}
    assert "demonstrations" in phases
    assert phases <= {"eval base", "demonstrations", "step 1", "step 2", "step 3", "eval trained"}
    assert {c["tool"] for c in calls if c["phase"] == "demonstrations"} >= {"list_tables", "run_query"}
    assert "## Tool calls" in (out / "report.md").read_text()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0002", "step-0003"]


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_zero_variance_groups_are_skipped_and_logged(tmp_path, monkeypatch, tiny_trainer_factory):
    monkeypatch.setattr(parts, "build_trainer", tiny_trainer_factory)
    cfg = apply_overrides(small_config(tmp_path / "r", steps=1), ["train.warm_start_scenarios=0"])
    await run(cfg)
    rec = json.loads((tmp_path / "r" / "state.json").read_text())["history"][-1]
    # A random tiny model never answers right: every reward in a group is equal.
    assert rec["groups_skipped"] == 2 and rec["groups_trained"] == 0
    assert all("rewards =" in reason for reason in rec["skipped"])
    assert "loss" not in rec
    assert rec["decode"]["rows"] >= 4 and rec["decode"]["padded_prompt_tokens"] >= rec["decode"]["prompt_tokens"] > 0


def test_existing_run_needs_resume(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "state.json").write_text("{}")
    import asyncio
    with pytest.raises(ValueError, match="--resume"):
        asyncio.run(run(small_config(tmp_path / "x", 1)))


# ---------------------------------------------------------------- the warm-start quality gate


class GateTrainer:
    """A trainer stand-in whose policy fails every tool call until it has had `learns_after`
    warm-start epochs, then plays the verified demonstrations (a scripted policy, no model)."""

    def __init__(self, scenarios, learns_after: int):
        from mcp_rl.policies.policy import DemonstrationPolicy, ScriptedPolicy

        good = DemonstrationPolicy(scenarios, PLAN)
        bad = lambda m: {"tool": "run_query", "arguments": {"sql": "SELECT * FROM nowhere"}}  # noqa: E731
        self.epochs, self.calls = 0, []
        self.policy = ScriptedPolicy(lambda m: good.script(m) if self.epochs >= learns_after else bad(m))

    def warm_start(self, demos, epochs, *, learning_rate, batch_size, seed=0):
        self.epochs += epochs
        self.calls.append((epochs, seed))
        return {"epochs": float(epochs), "nll_first_epoch": 1.0, "nll_last_epoch": 1.0 / self.epochs}


@pytest.mark.parametrize("learns_after, max_extra, calls, passed", [
    (1, 2, [(1, 0)], [True]),                              # usable after the configured epoch: no extra one
    (2, 2, [(1, 0), (1, 1)], [False, True]),               # one extra epoch, then the gate passes
    (9, 2, [(1, 0), (1, 1), (1, 2)], [False, False, False]),  # bounded: two extra epochs, then RL anyway
    (9, 0, [(1, 0)], [False]),
])
async def test_warm_start_gate_adds_bounded_epochs_until_met(company_db, capsys, learns_after, max_extra, calls, passed):
    from mcp_server import build_server

    cfg = apply_overrides(preset("cpu"), [
        "train.warm_start_scenarios=2", "train.warm_start_gate_scenarios=3", "train.warm_start_max_tool_errors=1",
        "train.warm_start_min_completed=0.9", f"train.warm_start_max_extra_epochs={max_extra}", "rollout.max_turns=6"])
    train, _, _ = pipeline.load_splits(cfg)
    trainer = GateTrainer(train, learns_after)
    rec = await pipeline.warm_start(trainer, build_server(company_db), train, cfg)
    assert trainer.calls == calls
    assert [c["passed"] for c in rec["gate"]] == passed and rec["gate_passed"] is passed[-1]
    assert rec["gate_extra_epochs"] == len(calls) - 1 and rec["epochs"] == len(calls)
    for check in rec["gate"]:  # the failing policy errs on every turn and never completes
        assert (check["tool_errors"], check["completed_rate"]) == ((6.0, 0.0) if not check["passed"] else (0.0, 1.0))
    assert "NOT met" in capsys.readouterr().out or passed[-1]


def test_gate_scenarios_come_after_the_demonstrations():
    train = [Scenario(id=f"s{i}", task=f"t{i}") for i in range(10)]
    cfg = apply_overrides(preset("cpu"), ["train.warm_start_scenarios=4", "train.warm_start_gate_scenarios=3"])
    assert [s.id for s in pipeline.gate_scenarios(train, cfg)] == ["s4", "s5", "s6"]
    cfg = apply_overrides(cfg, ["train.warm_start_scenarios=10"])
    assert [s.id for s in pipeline.gate_scenarios(train, cfg)] == ["s0", "s1", "s2"]


def test_report_shows_the_gate(tmp_path):
    from mcp_rl.runs.evaluate import write_report

    history = [{"step": 0, "phase": "warm_start", "demonstrations": 8, "epochs": 2.0, "nll_last_epoch": 0.3,
                "gate": [{"epochs": 1, "tool_errors": 3.5, "completed_rate": 0.5, "success_rate": 0.0, "passed": False},
                         {"epochs": 2, "tool_errors": 0.4, "completed_rate": 1.0, "success_rate": 0.25, "passed": True}]}]
    text = write_report(tmp_path, [], history).read_text()
    assert "8 demonstrations, 2 epoch(s)" in text and "| 1 | 3.50 | 50% | 0.0% | no |" in text
    assert "| 2 | 0.40 | 100% | 25.0% | yes |" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_gate_on_a_real_trainer_takes_its_extra_epoch(company_db, tiny_trainer_factory):
    """A tiny random model never makes a tool call: the gate fails, and its one extra epoch is real SFT steps."""
    from mcp_server import build_server

    cfg = apply_overrides(small_config("unused", steps=0), [
        "train.warm_start_gate_scenarios=2", "train.warm_start_max_extra_epochs=1", "train.warm_start_batch_size=1"])
    train, _, _ = pipeline.load_splits(cfg)
    trainer = tiny_trainer_factory(cfg)
    rec = await pipeline.warm_start(trainer, build_server(company_db), train, cfg)
    assert rec["gate_passed"] is False and rec["gate_extra_epochs"] == 1 and len(rec["gate"]) == 2
    assert trainer.sft_steps == 2 * 2  # two demonstrations, batch 1, two epochs
    assert rec["gate"][0]["completed_rate"] == 0.0 and "next_epoch_nll" in rec["gate"][0]


@pytest.mark.parametrize("split, n, want", [("val", 0, ["v0", "v1", "v2"]), ("test", 0, ["t0", "t1", "t2"]),
                                            ("test", 2, ["t0", "t1"])])
def test_periodic_scenarios_pick_the_split_and_count(split, n, want):
    val, test = [Scenario(id=f"v{i}", task="q") for i in range(3)], [Scenario(id=f"t{i}", task="q") for i in range(3)]
    cfg = apply_overrides(preset("cpu"), [f"train.eval_every_split={split}", f"train.eval_every_scenarios={n}"])
    assert [s.id for s in pipeline.periodic_scenarios(cfg, val, test)] == want


async def test_train_loop_records_a_held_out_curve(tmp_path, company_db):
    """eval_every=1 on the test split: each step's record carries test_success and its rows are saved."""
    from mcp_server import build_server

    from mcp_rl.policies.policy import DemonstrationPolicy

    cfg = apply_overrides(preset("cpu"), ["train.steps=2", "train.groups_per_step=1", "train.group_size=2",
                                          "train.eval_every=1", "train.eval_every_split=test",
                                          "train.eval_every_scenarios=2", "train.warm_start_scenarios=0"])
    train, _, test = pipeline.load_splits(cfg)

    class Trainer:  # plays the demonstrations: every group ties, so no update is asked for
        policy = DemonstrationPolicy(train + test, PLAN)

        def save(self, path):
            path.mkdir(parents=True, exist_ok=True)

    r = training_run(Trainer(), cfg, tmp_path / "run")
    state = await r.train(build_server(company_db), train, [], test)
    assert [h["test_success"] for h in state.history] == [1.0, 1.0]
    assert (r.dir / "eval_test_step1.jsonl").exists() and (r.dir / "eval_test_step2.jsonl").exists()
    assert all(h["rollout_seconds"] <= h["seconds"] for h in state.history)
    assert json.loads((r.dir / "state.json").read_text())["history"][-1]["test_success"] == 1.0  # committed


@pytest.mark.parametrize("stamp, name, refused", [
    (None, "t4", None), (None, "t4-unsloth", None), ("art Tesla T4, 15360 MiB", "t4", None),
    ("unsloth Tesla T4, 15360 MiB", "t4-unsloth", None), ("unsloth Tesla T4, 15360 MiB", "t4", "PRESET = 't4-unsloth'"),
    ("art Tesla T4, 15360 MiB", "t4-unsloth", "PRESET = 't4'"),
])
def test_a_preset_the_installed_stack_cannot_train_is_refused(tmp_path, stamp, name, refused):
    path = tmp_path / "mcp-rl-installed"
    if stamp:
        path.write_text(stamp + "\n")
    if refused:
        with pytest.raises(ValueError, match=refused):
            parts.check_install(preset(name), path)
    else:
        parts.check_install(preset(name), path)


async def test_a_rollout_cut_short_by_the_endpoint_is_left_out_of_its_group(tmp_path, company_db):
    """A policy endpoint down after its retries used to be scored -0.1 and trained on as the policy's
    mistake, next to its group's correct answers (found by review). It is now left out: here the two
    rollouts left tie, so there is nothing to train."""
    from mcp_server import build_server

    from mcp_rl.policies.policy import DemonstrationPolicy, PolicyError

    cfg = apply_overrides(preset("cpu"), ["train.steps=1", "train.groups_per_step=1", "train.group_size=3",
                                          "train.warm_start_scenarios=0"])
    scenarios, _, _ = pipeline.load_splits(cfg)

    class DownOnce(DemonstrationPolicy):
        calls = 0

        async def complete(self, *a, **k):
            DownOnce.calls += 1
            if DownOnce.calls == 1:
                raise PolicyError("endpoint down after 3 retries")
            return await super().complete(*a, **k)

    class Trainer:
        policy, trained = DownOnce(scenarios, PLAN), []

        async def train(self, groups):
            self.trained.append(groups)
            return {}

        def save(self, path):
            path.mkdir(parents=True, exist_ok=True)

    trainer = Trainer()
    state = await training_run(trainer, cfg, tmp_path / "run").train(build_server(company_db), scenarios)
    rec = state.history[-1]
    assert rec["failed_outside_policy"] == 1 and rec["groups_trained"] == 0 and trainer.trained == []
    assert rec["success_rate"] == 1.0  # the two left, both right; the failed one is not counted


async def test_a_periodic_evaluation_stopped_midway_runs_on_resume(tmp_path, company_db):
    """The step is committed before its evaluation; a stop during the evaluation lost the curve's point
    for good (found by review). A due step without its point is evaluated first when the run resumes."""
    from mcp_server import build_server

    from mcp_rl.policies.policy import DemonstrationPolicy

    cfg = apply_overrides(preset("cpu"), ["train.steps=1", "train.eval_every=1", "train.eval_every_split=test",
                                          "train.eval_every_scenarios=1", "train.warm_start_scenarios=0"])
    train, _, test = pipeline.load_splits(cfg)

    class Trainer:
        policy = DemonstrationPolicy(test, PLAN)

    stopped = [{"step": 1, "reward_mean": 0.0}]  # as a stop during step 1's evaluation left it
    r = training_run(Trainer(), cfg, tmp_path / "run", step=1, history=stopped)
    seen = []

    class Evaluations(TrainerCallback):
        def on_evaluate(self, run, label, result, seconds):
            seen.append(label)

    r.callbacks.append(Evaluations())
    state = await r.train(build_server(company_db), train, [], test)
    assert state.history[-1]["test_success"] == 1.0 and (r.dir / "eval_test_step1.jsonl").exists()
    await r.train(build_server(company_db), train, [], test)  # its point recorded: not evaluated twice
    assert seen == ["test_step1"]
