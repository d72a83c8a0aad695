"""Tests for mcp_rl/runs/callbacks.py: a run extended through callbacks, never by rebinding library functions.

The time budget and deadline (`Deadline`) are checked on a stand-in run; the whole `mcp_rl.run` with a
callback that stops and pauses it runs the real loop (company server in memory) with a scripted policy
that plays the verified demonstrations, so no model loads. Run: pytest tests/test_callbacks.py
"""

import json
import time
from types import SimpleNamespace as NS

import pytest

from mcp_rl.environments.company import PLAN
from mcp_rl.runs.callbacks import Deadline, TrainerCallback
from mcp_rl.runs.config import apply_overrides, preset
from mcp_rl.runs.run_folder import _LOADED


def stand_in_run(step, steps, seconds=()):
    history = [{"step": 0, "phase": "warm_start"}] + [{"step": i + 1, "reward_mean": 0.0, "seconds": s}
                                                      for i, s in enumerate(seconds)]
    return NS(step=step, cfg=NS(train=NS(steps=steps)), state=NS(history=history))


@pytest.mark.parametrize("deadline, budget, pause, elapsed, says", [
    (0, 0, False, 0, None),                        # neither set: never stops
    (1000, 0, False, 10, None),                    # plenty left: a step (11 s) plus the final eval (1.5 x 40 + 20)
    (100, 0, False, 10, "deadline: 90 s left"),    # 90 s < 11 + 80
    (100, 0, True, 10, None),                      # pausing: the final eval is the next call's, 90 s > 11
    (15, 0, True, 10, "deadline: 5 s left"),
    (0, 35, False, 0, "training budget: 30 of 35 s spent"),  # 3 steps of 10 s, one more would pass 35
    (0, 45, False, 0, None),
])
def test_the_deadline_and_budget_stop_before_a_step_that_would_not_fit(deadline, budget, pause, elapsed, says):
    cb = Deadline(deadline, budget, pause=pause, start=time.monotonic() - elapsed)
    run = stand_in_run(step=3, steps=10, seconds=[10.0, 10.0, 10.0])  # earlier calls' steps count for the budget
    cb.on_evaluate(run, "base", None, 40.0)
    cb.steps = [10.0]  # this call timed one step
    reason = cb.should_stop(run)
    assert (reason is None) if says is None else says in reason
    assert cb.should_pause(run) == ("paused after step 3: resume with --resume" if pause and says else None)


def test_the_deadline_never_cuts_a_run_that_has_no_step_left():
    cb = Deadline(1, 0, start=time.monotonic() - 100)
    cb.steps = [10.0]
    assert cb.should_stop(stand_in_run(step=4, steps=4)) is None


def test_the_config_installs_and_records_its_deadline(tmp_path):
    from mcp_rl.runs.run import open_run

    cfg = apply_overrides(preset("cpu"), [f"out={tmp_path / 'run'}", "train.deadline_s=560", "train.train_budget_s=900",
                                          "train.pause_at_deadline=true"])
    r = open_run(cfg)
    [cb] = [c for c in r.callbacks if isinstance(c, Deadline)]
    assert (cb.deadline_s, cb.train_budget_s, cb.pause) == (560.0, 900.0, True)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["train"]
    assert (recorded["deadline_s"], recorded["train_budget_s"], recorded["pause_at_deadline"]) == (560.0, 900.0, True)
    assert not [c for c in open_run(apply_overrides(cfg, [f"out={tmp_path / 'b'}", "train.pause_at_deadline=false",
                                                          "train.deadline_s=0", "train.train_budget_s=0"])).callbacks]
    with pytest.raises(ValueError, match="pause_at_deadline pauses at train.deadline_s"):
        apply_overrides(cfg, ["train.deadline_s=0"])


class Demonstrator:
    """A Trainer (mcp_rl.runs.parts.Trainer) whose policy plays the verified demonstrations: every group ties,
    so no update is asked for, and nothing loads."""

    step, sft_steps = 0, 0

    def __init__(self, scenarios):
        from mcp_rl.policies.policy import DemonstrationPolicy

        self.policy = DemonstrationPolicy(scenarios, PLAN)

    async def start(self):
        pass

    async def train(self, groups):
        raise AssertionError("tied groups are never trained on")

    def warm_start(self, *a, **k):
        raise AssertionError("no warm start in this config")

    def save(self, path):
        path.mkdir(parents=True, exist_ok=True)

    def load(self, path):
        return {"step": self.step}


class PauseAfter(TrainerCallback):
    def __init__(self, step):
        self.step, self.seen, self.ended = step, [], []

    async def on_step_end(self, run, record):
        self.seen.append(record["step"])

    def on_evaluate(self, run, label, result, seconds):
        self.seen.append(label)

    def should_stop(self, run):
        return f"stop at {run.step}" if run.step == self.step else None

    def should_pause(self, run):
        return f"paused after step {run.step}" if run.step == self.step else None

    def on_run_end(self, run, results):
        self.ended.append(sorted(k for k in results if k != "trainer"))
        run.write("mine.json", {"step": run.step})


async def test_a_callback_stops_and_pauses_a_run_that_resumes_to_its_end(tmp_path, monkeypatch):
    from mcp_rl.runs import parts
    from mcp_rl.runs.pipeline import load_splits
    from mcp_rl.runs.run import run

    monkeypatch.setattr(parts, "build_trainer", lambda cfg: pytest.fail("the run built a trainer of its own"))
    cfg = apply_overrides(preset("cpu"), [
        f"out={tmp_path / 'run'}", "server=company", "train.steps=3",
        "train.groups_per_step=1", "train.group_size=2", "train.warm_start_scenarios=0", "train.eval_scenarios=2",
        "reward.audit_scenarios=0"])
    train, _, test = load_splits(cfg)
    trainer, cb = Demonstrator(train + test), PauseAfter(2)
    _LOADED.clear()
    try:
        paused = await run(cfg, trainer=trainer, callbacks=[cb])
        assert paused["paused"] == "paused after step 2" and "trained" not in paused
        assert cb.seen == ["base", 1, 2] and cb.ended == [["base", "paused", "report"]]
        state = json.loads((tmp_path / "run" / "state.json").read_text())
        assert (state["step"], state["phase"]) == (2, "training") and not (tmp_path / "run" / "eval_trained.jsonl").exists()
        assert json.loads((tmp_path / "run" / "mine.json").read_text()) == {"step": 2}
        done = await run(cfg, resume=True, trainer=trainer, callbacks=[PauseAfter(0)])
        assert done["trained"].n == 2 and done["report"].is_file()
        state = json.loads((tmp_path / "run" / "state.json").read_text())
        assert (state["step"], state["phase"]) == (3, "done") and [h["step"] for h in state["history"]] == [1, 2, 3]
    finally:
        _LOADED.clear()
