"""Callbacks: how an experiment extends a run without rebinding library functions (TRL's `TrainerCallback`).

    class Timings(TrainerCallback):
        def on_evaluate(self, run, label, result, seconds):
            print(f"{label} took {seconds:.0f} s")

    await mcp_rl.run(cfg, callbacks=[Timings()])          # or open_run(cfg, callbacks=[...])

A run (`mcp_rl.runs.run.Run`) calls every hook on every rank, in the order the callbacks were given;
what `should_stop` and `should_pause` answer is rank 0's (broadcast), so the ranks stop together.
The hooks that may play rollouts (`on_train_begin`, `on_step_end`) are coroutines: a run is async
throughout (its MCP sessions), and an evaluation inside a hook runs on the run's event loop.

Two callbacks come from the config, so their settings are recorded in config.json:
`HeldOutCurve` (train.eval_every: an evaluation every N steps, its success in the step's record)
and `Deadline` (train.deadline_s, train.train_budget_s, train.pause_at_deadline).
"""

from __future__ import annotations

import time
from typing import Any

# `train.deadline_s` counts from here: the run's process imports this with the rest of mcp_rl's run
# machinery, before any model loads, so model loading counts against the deadline (as it does on a device).
STARTED = time.monotonic()

__all__ = ["TrainerCallback", "HeldOutCurve", "Deadline", "STARTED"]


class TrainerCallback:
    """Every hook does nothing; override the ones you need. `run` is the `mcp_rl.runs.run.Run`: read
    `run.cfg`, `run.step`, `run.state` (a `RunState`), `run.dir`; write through `run.commit()` (the state)
    and `run.write(name, data)` (a file of your own), which rank 0 alone performs."""

    def on_init_end(self, run: Any, trainer: Any) -> None:
        """The trainer is loaded and at the run's recorded step."""

    async def on_train_begin(self, run: Any) -> None:
        """`run.train` starts its GRPO steps (also when it resumes, or has none left)."""

    async def on_step_end(self, run: Any, record: dict) -> None:
        """A GRPO step is committed (checkpoint, state.json); `record` is its entry in `run.state.history`."""

    def on_evaluate(self, run: Any, label: str, result: Any, seconds: float) -> None:
        """An evaluation of the run's policy ended (not one loaded from an earlier call)."""

    def should_stop(self, run: Any) -> str | None:
        """After each step (and its `on_step_end`): a reason to end the GRPO steps here, or None."""
        return None

    def should_pause(self, run: Any) -> str | None:
        """After the steps, before the final evaluation: a reason to leave the run there (resumable), or None."""
        return None

    def on_run_end(self, run: Any, results: dict) -> None:
        """`mcp_rl.run` ended: finished (final evaluation and report written), or paused ("paused" in
        `results`, the reason). Write files through `run.write`."""


class HeldOutCurve(TrainerCallback):
    """Every `every` steps, evaluate `scenarios` (greedy, the eval settings) and record the success in the
    step's record as `<split>_success` (rows in eval_<split>_step<k>.jsonl). A step whose evaluation a stop
    interrupted is evaluated when the run resumes, so the curve keeps its point."""

    def __init__(self, server: Any, scenarios: list, every: int, split: str = "val"):
        self.server, self.scenarios, self.every, self.key = server, list(scenarios), every, f"{split}_success"
        self.split = split

    async def on_train_begin(self, run: Any) -> None:
        last = run.state.history[-1] if run.state.history else {}
        if last.get("step") == run.step and "reward_mean" in last and self._due(run.step) and self.key not in last:
            await self._evaluate(run, last)

    async def on_step_end(self, run: Any, record: dict) -> None:
        if self._due(record["step"]):
            await self._evaluate(run, record)

    def _due(self, step: int) -> bool:
        return bool(self.every and step and step % self.every == 0 and self.scenarios)

    async def _evaluate(self, run: Any, record: dict) -> None:
        result = await run.measure(f"{self.split}_step{record['step']}", self.server, self.scenarios)
        record[self.key] = result.success_rate
        run.commit()


class Deadline(TrainerCallback):
    """Stop the GRPO steps while one more step (plus the held-out evaluation that may follow it) and the
    final evaluation still fit in `deadline_s` from `start`, and before the steps' seconds over the whole
    run pass `train_budget_s` (0: no limit). With `pause`, a stop at the deadline leaves the run before
    its final evaluation (`should_pause`), for a later call to resume."""

    def __init__(self, deadline_s: float = 0.0, train_budget_s: float = 0.0, *, pause: bool = False,
                 start: float | None = None):
        self.deadline_s, self.train_budget_s, self.pause = deadline_s, train_budget_s, pause
        self.start = STARTED if start is None else start
        self.evals: dict[str, float] = {}  # seconds per evaluation label, this process
        self.steps: list[float] = []       # seconds per step, this process
        self.paused_at: int | None = None

    @classmethod
    def from_config(cls, train: Any) -> "Deadline | None":
        if not (train.deadline_s or train.train_budget_s):
            return None
        return cls(train.deadline_s, train.train_budget_s, pause=train.pause_at_deadline)

    def on_evaluate(self, run: Any, label: str, result: Any, seconds: float) -> None:
        self.evals[label] = seconds

    async def on_step_end(self, run: Any, record: dict) -> None:
        self.steps.append(float(record.get("seconds", 0.0)))

    def should_stop(self, run: Any) -> str | None:
        if run.step >= run.cfg.train.steps or not self.steps:
            return None
        final = 1.5 * max(self.evals.values(), default=60.0) + 20.0  # RL rollouts can get longer; plus the report
        curve = max((v for k, v in self.evals.items() if "_step" in k), default=0.0)
        longest = max(self.steps) * 1.1 + curve
        spent = sum(h.get("seconds", 0.0) for h in run.state.history if "reward_mean" in h)  # earlier calls too
        if self.train_budget_s and spent + longest > self.train_budget_s:
            return f"training budget: {spent:.0f} of {self.train_budget_s:.0f} s spent: stopping after step {run.step}"
        left = self.deadline_s - (time.monotonic() - self.start)
        if self.deadline_s and left < longest + (0.0 if self.pause else final):
            self.paused_at = run.step if self.pause else None
            return (f"deadline: {left:.0f} s left, a step takes up to {longest:.0f} s and the final eval "
                    f"~{final:.0f} s: stopping after step {run.step}")
        return None

    def should_pause(self, run: Any) -> str | None:
        return None if self.paused_at is None else f"paused after step {self.paused_at}: resume with --resume"
