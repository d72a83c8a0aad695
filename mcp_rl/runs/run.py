"""A run: the one owner of a run folder and its committed state, shared by the CLI and the notebooks.

    run = open_run(cfg)                     # a new run, or the recorded one in cfg.out (says which)
    run = open_run(cfg, env=env)            # the same on an Environment of your own (mcp_rl.environment)
    trainer = await run.trainer()           # model + LoRA at the recorded step (reused in this process)
    base = await run.evaluate("base", server, test)     # step 0 only; a re-run loads the saved result
    await run.warm_start(server, train)                  # once per run
    await run.train(server, train, val, test)            # from the recorded step to cfg.train.steps
    await run.imitate(server, train, 900)                # or, instead: SFT on all demonstrations for 900 s
    trained = await run.evaluate("trained", server, test)
    run.report()

`Run` alone writes the folder: config.json, state.json (a `RunState`, the commit point), metrics.jsonl,
checkpoints (through the trainer's `save`, with their sha256 manifest; the last two kept), evaluation
rows and report.md. Under torchrun rank 0 writes and evaluates and the other ranks get its results:
the branching on rank happens here and in `distributed.on_main`, never in a caller. Experiments extend
a run with callbacks (mcp_rl/runs/callbacks.py), passed to `open_run` or `run`; the config's own
(`train.eval_every`, `train.deadline_s`) are added by the run.

Every tool call the run's rollouts make is appended to `<out>/tool_calls.jsonl` (`mcp_rl.mcp.audit`).
Re-running a cell, restarting the kernel or resuming after a disconnect continues where the run
stands: "base" is always the step-0 policy, and no step is repeated or stacked silently.
`open_run(cfg, fresh=True)` starts a new folder beside an existing run instead. A folder whose record
is gone or unreadable is refused in one line, never restarted (`RunFolderError`, mcp_rl/runs/run_record.py);
a checkpoint is loaded only after its files match its manifest (`mcp_rl.training.manifest`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from mcp_rl.scale import distributed

from mcp_rl.runs import parts

from mcp_rl.runs import pipeline
from mcp_rl.mcp.audit import log_tool_calls
from mcp_rl.runs.callbacks import HeldOutCurve
from mcp_rl.runs.config import Config, redacted
from mcp_rl.environment import Environment, environment
from mcp_rl.runs.evaluate import EvalResult, load_eval, save_eval, write_json_atomic, write_report
from mcp_rl.rewards.evidence import flags
from mcp_rl.runs.run_folder import RunFolder
from mcp_rl.runs.run_record import RunFolderError, RunState, changes, check_record, legacy_custom, read_record


class Run(RunFolder):
    """One run folder; see the module docstring. Build it with `open_run`."""

    async def measure(self, label: str, server, scenarios) -> EvalResult:
        """Evaluate the current policy now and save its rows (eval_<label>.jsonl), recording no phase:
        rank 0 evaluates, every rank gets its result; the callbacks hear of it (`on_evaluate`)."""
        trainer, t0 = self._need_trainer(), time.monotonic()

        async def evaluate() -> EvalResult:
            with log_tool_calls(self._tool_log):
                result = await pipeline.evaluate_policy(trainer.policy, server, scenarios, self.cfg, label, self.env)
            save_eval(self.dir, result)
            return result

        result = await distributed.on_main(evaluate, f"evaluation {label!r}")
        for cb in self.callbacks:
            cb.on_evaluate(self, label, result, time.monotonic() - t0)
        return result

    async def evaluate(self, label: str, server, scenarios) -> EvalResult:
        """Evaluate the current policy as `label`; a result saved for this step is loaded, not redone.
        "base" is the step-0 policy by definition: once the run is past step 0 it is only ever loaded."""
        self._need_trainer()
        saved = self.dir / f"eval_{label}.jsonl"
        if label == "base" and self.state.phase != "new":
            if not saved.exists():
                raise ValueError(f"{self.dir} is past the base evaluation (phase {self.state.phase}) and has no "
                                 f"saved base result: open_run(cfg, fresh=True) starts again")
            result = load_eval(self.dir, label)
            print(f"base: evaluated at step 0 of this run | {result.line()}")
        elif self.state.evals.get(label) == self.step and saved.exists():
            result = load_eval(self.dir, label)
            print(f"{label}: evaluated earlier at step {self.step} of this run | {result.line()}")
        else:
            result = await self.measure(label, server, scenarios)
            self.state.evals[label] = self.step
            if label == "base":
                self.state.phase = "base_done"
            self.commit()
        self.results[label] = result
        return result

    async def warm_start(self, server, train) -> dict | None:
        """The supervised warm start, once per run (before any GRPO step); then checkpoint."""
        trainer = self._need_trainer()
        if self.state.phase == "new":
            raise ValueError("evaluate the base model first (`await run.evaluate('base', ...)`), so the "
                             "comparison has a before")
        if self.state.phase != "base_done":
            print(f"warm start: already done in this run (phase {self.state.phase}, step {self.step})")
            return None
        rec, train = None, self._pin_train(train)
        self._at(None)  # until the commit below: stopped midway, this trainer is no base model
        if self.cfg.train.warm_start_scenarios:
            with log_tool_calls(self._tool_log):
                rec = {"step": 0, "phase": "warm_start", **await pipeline.warm_start(trainer, server, train, self.cfg, self.env)}
            self.state.history.append(rec)
        else:
            print("warm start: none for this config (train.warm_start_scenarios = 0)")
        self.state.phase = "training"
        self._checkpoint(trainer)
        self._at(self.step)
        return rec

    async def train(self, server, train, val=(), test=()) -> RunState:
        """GRPO steps from the recorded step to `cfg.train.steps`, or until a callback's `should_stop`;
        each step is committed by its checkpoint. Every `train.eval_every` steps `HeldOutCurve` evaluates
        `pipeline.periodic_scenarios(cfg, val, test)`: val, or test where `train.eval_every_split` says so."""
        trainer, cfg = self._need_trainer(), self.cfg
        if self.state.phase == "new":
            raise ValueError("evaluate the base model first (`await run.evaluate('base', ...)`)")
        if self.state.phase == "base_done":
            await self.warm_start(server, train)
        if self.step >= cfg.train.steps:
            print(f"train: already at step {self.step} of {cfg.train.steps}; raise train.steps to go on")
        elif self.step:
            print(f"train: resuming at step {self.step} of {cfg.train.steps}")
        self.state.phase, train = "training", self._pin_train(train)
        curve = HeldOutCurve(server, pipeline.periodic_scenarios(cfg, val, test), cfg.train.eval_every,
                             cfg.train.eval_every_split)
        self.callbacks.append(curve)
        try:
            with log_tool_calls(self._tool_log):
                for cb in self.callbacks:
                    await cb.on_train_begin(self)
                while self.step < cfg.train.steps:
                    self._at(None)  # a step stopped midway may have updated it: the next trainer() reloads
                    await self._step(trainer, server, train)
                    self._at(self.step)
                    for cb in self.callbacks:
                        await cb.on_step_end(self, self.state.history[-1])
                    reason = self._ask("should_stop")
                    if reason:
                        print(reason, flush=True)
                        break
        finally:
            self.callbacks.remove(curve)
        return self.state

    async def imitate(self, server, train, budget_s: float, *, stop_at: float | None = None) -> dict:
        """The imitation baseline, instead of GRPO steps (issue 40): after the warm start, supervised epochs
        on the demonstrations of the whole training split for `budget_s` seconds of updates
        (`mcp_rl.runs.imitation`), stopping before `stop_at` (a time.monotonic() time) if that comes first.
        Each call commits its share as a history entry (phase "imitation") and a checkpoint; `state.step`
        counts these calls in such a run, which takes no GRPO step. A later call goes on where the last one
        stopped (a fresh AdamW: the SFT moments are not checkpointed); once the budget is spent, it returns
        the last entry."""
        from mcp_rl.runs.imitation import sft_for_budget

        trainer, cfg, history = self._need_trainer(), self.cfg, self.state.history
        if self.state.phase == "new":
            raise ValueError("evaluate the base model first (`await run.evaluate('base', ...)`)")
        if any("reward_mean" in h for h in history):
            raise ValueError(f"{self.dir} has taken GRPO steps: the imitation baseline starts from a warm start, "
                             "in a run folder of its own")
        if self.state.phase == "base_done":
            await self.warm_start(server, train)
        done = [h for h in history if h.get("phase") == "imitation"]
        if done and abs(done[-1]["budget_s"] - budget_s) > 1e-6:
            raise ValueError(f"{self.dir} spends {done[-1]['budget_s']:g} s on imitation, not {budget_s:g} s: "
                             "pass the recorded budget, or start a new run")
        if done and done[-1]["stopped"] == "budget":
            print(f"imitation: done in this run ({done[-1]['seconds']:.0f} of {budget_s:.0f} s)")
            return done[-1]
        train, t, t0 = self._pin_train(train), cfg.train, time.monotonic()
        with log_tool_calls(self._tool_log):
            demos = await pipeline.play_demonstrations(trainer, server, train, cfg, self.env, phase="imitation")
        play_s = time.monotonic() - t0
        self._at(None)  # until the commit below: stopped midway, this trainer is at no recorded step
        rec = sft_for_budget(trainer, demos, budget_s=budget_s, learning_rate=t.warm_start_lr,
                             batch_size=t.warm_start_batch_size, seed=t.seed, position=done[-1] if done else None,
                             stop_at=stop_at)
        self.state.step += 1
        rec = {"step": self.step, "phase": "imitation", "budget_s": budget_s, "demonstrations": len(demos),
               "play_seconds": round(play_s, 1), **rec}
        history.append(rec)
        self._checkpoint(trainer)
        self._at(self.step)
        print(f"imitation | {rec['updates']} updates on {len(demos)} demonstrations, {rec['epochs_done']:.2f} epochs "
              f"| {rec['seconds']:.0f} of {budget_s:.0f} s | stopped at the {rec['stopped']}", flush=True)
        return rec

    async def _step(self, trainer, server, train) -> None:
        cfg, step = self.cfg, self.step
        batch = pipeline.step_batch(train, step, cfg.train.groups_per_step, cfg.train.seed)
        rec = await pipeline.train_step(trainer, server, batch, cfg, step, self.env)
        rec["hack_flags"] = flags(rec, [h for h in self.state.history if "reward_mean" in h])
        rec.update(distributed.check_same(trainer, f"after step {step + 1}"))  # raises where ranks differ
        self.state.step = step + 1
        self.state.history.append(rec)
        self._checkpoint(trainer)
        print(f"step {step + 1}/{cfg.train.steps} | reward {rec['reward_mean']:.3f} | grounded success "
              f"{rec['grounded_rate']:.0%} (correct {rec['success_rate']:.0%}) | trained {rec['groups_trained']} groups, "
              f"skipped {rec['groups_skipped']} | loss {rec.get('loss', float('nan')):.4f} | {rec['seconds']:.0f} s"
              + (f" | off-policy gap {rec['logprob_gap']:.3f}" if "logprob_gap" in rec else "")
              + (f" | HACK? {'; '.join(rec['hack_flags'])}" if rec["hack_flags"] else ""), flush=True)

    def should_pause(self) -> str | None:
        """A callback's reason to leave the run before its final evaluation (resumable), or None."""
        return self._ask("should_pause")

    def finish(self) -> None:
        self.state.phase = "done"
        self.commit()

    def end(self, results: dict) -> dict:
        for cb in self.callbacks:
            cb.on_run_end(self, results)
        return results

    def report(self, title: str | None = None) -> Path:
        results = list(self.results.values())
        if not results:
            results = [load_eval(self.dir, label) for label in self.state.evals
                       if (self.dir / f"eval_{label}.jsonl").exists()]
        if not distributed.is_main():
            return self.dir / "report.md"
        return write_report(self.dir, results, self.state.history, title=title or f"mcp-rl run: {self.cfg.model}")


def open_run(cfg: Config, *, env: Environment | None = None, fresh: bool = False, resume: bool = True,
             callbacks=()) -> Run:
    """The run in `cfg.out`: new if the folder is empty, else the recorded one (resume=True) or,
    with fresh=True, a new sibling folder `<out>-<time>` (cfg.out is updated to it). `env`: what it
    trains on (default: the environment cfg.server names); its settings go into the run's config."""
    env = env if env is not None else environment(cfg.server)
    cfg = env.configure(cfg)
    distributed.init()  # under torchrun (WORLD_SIZE > 1): join the process group; else nothing
    out = Path(cfg.out)
    holds_run = distributed.broadcast_object(out.exists() and any(out.iterdir()), "run folder")  # rank 0's view
    if holds_run and fresh:  # rank 0 names the new folder (the ranks' clocks may tick apart)
        out = distributed.broadcast_object(out.with_name(f"{out.name}-{time.strftime('%Y%m%d-%H%M%S')}"), "run folder")
        cfg = dataclasses.replace(cfg, out=str(out))
        holds_run = False
    elif holds_run and not resume:
        raise ValueError(f"{out} already holds a run: pass --resume to continue it, or --out a new folder")
    if holds_run:
        check_record(out)
    if distributed.is_main():
        out.mkdir(parents=True, exist_ok=True)
    run = Run(cfg, callbacks, env)
    run.state = distributed.broadcast_object(run.state, "run state")  # rank 0's record, on every rank
    if holds_run and run.state.phase != "new":
        recorded, now = read_record(out / "config.json"), redacted(cfg)
        legacy_custom(recorded, now)
        changed = changes(recorded, now)
        if changed:
            raise ValueError(f"{out} was recorded with other settings ({'; '.join(changed[:4])}"
                             f"{f'; {len(changed) - 4} more' if len(changed) > 4 else ''}): resuming would mix two "
                             "runs. Set them back, or start a new run (fresh=True, FRESH_RUN = True, or another --out)")
        print(f"run {out}: resuming the recorded run at step {run.step} (phase {run.state.phase}); "
              f"FRESH_RUN / fresh=True starts a new folder")
    else:
        print(f"run {out}: new run")
    if distributed.is_main():
        write_json_atomic(out / "config.json", redacted(cfg))  # keys and tokens stay out
    return run


async def run(cfg: Config, *, env: Environment | None = None, resume: bool = False, trainer=None, callbacks=()) -> dict:
    """The whole pipeline; returns {"base": EvalResult, ["warm_start": ...,] "trained": ..., "report": path,
    "trainer": ...}, or, where a callback paused the run before its final evaluation, {"paused": reason, ...}."""
    r = open_run(cfg, env=env, resume=resume, callbacks=callbacks)
    cfg, env = r.cfg, r.env
    train, val, test = pipeline.load_splits(cfg, env)
    print(f"model {cfg.model} | backend {cfg.train.backend} | {len(train)} train, {len(test)} test scenarios",
          flush=True)
    with env.serve(cfg.server_token) as server:
        await parts.check_tools(server, cfg)  # a refused server stops the run before the model loads
        if r.state.phase == "new":  # a gameable reward too (reward_audit.md); a resumed run was audited
            await pipeline.audit_before_training(server, train, cfg, r.dir, env)
        trainer = await r.trainer(trainer)
        await r.evaluate("base", server, test)
        if r.state.phase == "base_done":
            await r.warm_start(server, train)
            if cfg.train.warm_start_scenarios and cfg.train.eval_warm_start:
                await r.evaluate("warm_start", server, test)
        elif (r.dir / "eval_warm_start.jsonl").exists():
            r.results["warm_start"] = load_eval(r.dir, "warm_start")
        await r.train(server, train, val, test)
        paused = r.should_pause()
        if paused:
            print(paused, flush=True)
            return r.end({**r.results, "paused": paused, "report": None, "trainer": trainer})
        await r.evaluate("trained", server, test)
        r.finish()
    report = r.report()
    print(f"report: {report}", flush=True)
    return r.end({**r.results, "report": report, "trainer": trainer})


__all__ = ["Run", "RunState", "RunFolderError", "open_run", "run"]
