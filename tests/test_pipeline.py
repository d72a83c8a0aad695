"""The training loop: deterministic scenario order, zero-variance skipping, kill and resume.

Runs the real loop (company server over HTTP, LocalPolicy, PortableTrainer) on a
tiny random Llama with SmolLM2's tokenizer: fast, and about the loop, not learning.
Run: pytest tests/test_pipeline.py
"""

import json

import pytest

from mcp_rl import pipeline
from mcp_rl.audit import read_tool_calls
from mcp_rl.config import apply_overrides, preset
from mcp_rl.pipeline import step_batch
from mcp_rl.runs import run
from mcp_rl.scenarios import Scenario


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
        "rollout.max_turns=6", "rollout.max_tokens=12"])


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_kill_and_resume_loses_and_repeats_no_step(tmp_path, monkeypatch, tiny_trainer_factory):
    monkeypatch.setattr(pipeline, "build_trainer", tiny_trainer_factory)
    out = tmp_path / "run"
    await run(small_config(out, steps=1))
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 1 and state["phase"] == "done"

    # Resume to 3 steps, killed while checkpointing step 3 (after step 2 is committed).
    real_save = pipeline._checkpoint
    def dying(trainer, run_dir, st):
        if st["step"] == 3:
            raise KeyboardInterrupt("killed")
        real_save(trainer, run_dir, st)
    monkeypatch.setattr(pipeline, "_checkpoint", dying)
    cfg = small_config(out, steps=3)
    with pytest.raises(KeyboardInterrupt):
        await run(cfg, resume=True)
    assert json.loads((out / "state.json").read_text())["step"] == 2

    monkeypatch.setattr(pipeline, "_checkpoint", real_save)
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
    monkeypatch.setattr(pipeline, "build_trainer", tiny_trainer_factory)
    cfg = apply_overrides(small_config(tmp_path / "r", steps=1), ["train.warm_start_scenarios=0"])
    await run(cfg)
    rec = json.loads((tmp_path / "r" / "state.json").read_text())["history"][-1]
    # A random tiny model never answers right: every reward in a group is equal.
    assert rec["groups_skipped"] == 2 and rec["groups_trained"] == 0
    assert all("rewards =" in reason for reason in rec["skipped"])
    assert "loss" not in rec


def test_existing_run_needs_resume(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "state.json").write_text("{}")
    import asyncio
    with pytest.raises(ValueError, match="--resume"):
        asyncio.run(run(small_config(tmp_path / "x", 1)))
