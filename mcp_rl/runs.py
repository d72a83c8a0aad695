"""A run folder and its committed state: the resume logic the CLI and the notebooks share.

    run = open_run(cfg)                     # a new run, or the recorded one in cfg.out (says which)
    trainer = await run.trainer()           # model + LoRA at the recorded step (reused in this process)
    base = await run.evaluate("base", server, test)     # step 0 only; a re-run loads the saved result
    await run.warm_start(server, train)                  # once per run
    await run.train(server, train, val, test)            # from the recorded step to cfg.train.steps
    trained = await run.evaluate("trained", server, test)
    run.report()

Every tool call the run's rollouts make (evaluations, demonstrations, training steps) is appended
to `<out>/tool_calls.jsonl` (`mcp_rl.audit`); report.md counts them per tool.
Every phase is committed in `<out>/state.json` (written atomically), so re-running a
cell, restarting the kernel or resuming after a disconnect continues where the run
stands: "base" is always the step-0 policy, and no step is repeated or stacked
silently. `open_run(cfg, fresh=True)` starts a new folder beside an existing run instead.

A folder whose record is gone or unreadable is refused, never taken for a new run: checkpoints or
evaluations without state.json, a state.json without the config.json it was recorded with, either
file empty, cut short or of the wrong shape (`RunFolderError`, one line naming the file). A
checkpoint is loaded only after its files match the sha256 manifest saved with it (`mcp_rl.manifest`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from . import distributed, parts, pipeline
from .audit import TOOL_CALLS, log_tool_calls
from .config import Config, redacted
from .evaluate import EvalResult, load_eval, write_json_atomic, write_report
from .guard import short
from .manifest import verify_manifest
from .run_record import RunFolderError, changes, check_record, legacy_custom, read_record, read_state

# Trainers loaded in this process, by run folder: a notebook cell run twice reuses the model
# (and, for ART, the vLLM server already on the GPU) instead of loading a second copy.
_LOADED: dict[str, object] = {}


def _make_room(key: str, backend: str) -> None:
    """Before a second model loads in this process (a new run folder: FRESH_RUN, another DRIVE):
    forget the other runs' portable trainers so their GPU memory can be freed; refuse a second ART
    model, whose vLLM engine keeps its share of the GPU for the life of the process."""
    others = [k for k in _LOADED if k != key]
    art = [k for k in others if k.endswith("|art")]
    if backend == "art" and art:
        raise RuntimeError(f"an ART model (vLLM) is already loaded in this process for {art[0].split('|')[0]}, and "
                           "one GPU holds one: restart the session (Colab: Runtime > Restart session) and run the cells "
                           "again, or set FRESH_RUN = False to go on with that run")
    for k in others:
        if not k.endswith("|art"):
            del _LOADED[k]
    if others:
        import gc

        import torch

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _seed_torch(seed: int) -> None:
    try:
        import torch
    except ImportError:  # a remote policy only: no weights to initialise here
        return
    torch.manual_seed(seed)


class Run:
    """One run folder; see the module docstring. Build it with `open_run`."""

    def __init__(self, cfg: Config):
        self.cfg, self.dir = cfg, Path(cfg.out)
        self.state = read_state(self.dir)
        self.results: dict[str, EvalResult] = {}
        self._trainer = None

    @property
    def step(self) -> int:
        return int(self.state["step"])

    def _commit(self) -> None:
        if distributed.is_main():  # under torchrun, rank 0 alone writes the run folder
            write_json_atomic(self.dir / "state.json", self.state)

    @property
    def _tool_log(self) -> Path:
        # One writer per file: ranks other than 0 log their rollouts' tool calls beside rank 0's.
        return self.dir / (TOOL_CALLS if distributed.is_main() else f"tool_calls.rank{distributed.rank()}.jsonl")

    async def trainer(self, trainer=None):
        """The trainer at the recorded step: built once per process (or `trainer` given), then synced."""
        key = f"{self.dir.resolve()}|{self.cfg.model}|{self.cfg.train.backend}"
        trainer = trainer or self._trainer or _LOADED.get(key)
        if trainer is None:
            _make_room(key, self.cfg.train.backend)
            _seed_torch(self.cfg.train.seed)  # the LoRA init follows train.seed (the same on every rank)
            trainer = parts.build_trainer(self.cfg)
            if hasattr(trainer, "register"):  # ART: starts vLLM and Unsloth on the GPU
                await trainer.register()
        ckpt = self.dir / "checkpoints" / f"step-{self.step:04d}"
        # A trainer counts updates (a step whose groups all tied makes none); the run counts steps.
        synced = getattr(trainer, "_run_key", None) == key and getattr(trainer, "_run_step", None) == self.step
        if self.state["phase"] in ("new", "base_done"):
            if trainer.step != 0 or getattr(trainer, "sft_steps", 0):
                raise ValueError(f"the run has not trained yet but the trainer has ({trainer.step} GRPO, "
                                 f"{getattr(trainer, 'sft_steps', 0)} warm-start updates; a warm start stopped before "
                                 "its commit leaves them): it is not the base model. Restart the runtime (a fresh "
                                 "trainer), or open_run(cfg, fresh=True)")
        elif ckpt.exists() and not synced:
            verify_manifest(ckpt)  # a checkpoint copied in part fails here, with its file named
            record = trainer.load(ckpt) or {}
            print(f"trainer: loaded {ckpt}")
            self._count_an_unrecorded_update(trainer, int(record.get("step", trainer.step)))
        elif not synced:
            raise ValueError(f"{self.dir} records step {self.step} but {ckpt} is missing; "
                             f"open_run(cfg, fresh=True) starts a new run")
        trainer._run_key, trainer._run_step = key, self.step
        self._trainer = _LOADED[key] = trainer
        distributed.check_same(trainer, "trainer at the recorded step")
        return trainer

    def _count_an_unrecorded_update(self, trainer, recorded: int) -> None:
        """ART saves each update itself, inside `trainer.train`; a process stopped after that and before
        the run recorded the step leaves ART one update ahead. Training that step's batch again would
        stack a second update on it, so the step counts as done (its metrics are lost)."""
        ahead = trainer.step - recorded
        if ahead <= 0:
            return
        if ahead > 1:
            raise ValueError(f"{self.dir}: the trainer is {ahead} updates past the run's record (step {self.step}); "
                             "only the step in progress can be unrecorded: is it the art_path this run used?")
        self.state["step"] += 1
        self.state["history"].append({"step": self.step, "recovered": "update saved by the trainer before the "
                                      "run recorded the step; its metrics are lost"})
        pipeline._checkpoint(trainer, self.dir, self.state)
        print(f"trainer: its checkpoint holds one update the run had not recorded (stopped mid-step): counted "
              f"as step {self.step}, not trained again")

    def _need_trainer(self):
        if self._trainer is None:
            raise RuntimeError("call `await run.trainer()` first")
        return self._trainer

    async def evaluate(self, label: str, server, scenarios) -> EvalResult:
        """Evaluate the current policy as `label`; a result saved for this step is loaded, not redone.

        "base" is the step-0 policy by definition: once the run is past step 0 it is only ever loaded.
        Under torchrun rank 0 evaluates (and writes); the other ranks wait and take its result and state."""
        if not distributed.active():
            return await self._evaluate(label, server, scenarios)
        result = await self._evaluate(label, server, scenarios) if distributed.is_main() else None
        result, self.state = distributed.broadcast_object((result, self.state), f"evaluation {label!r}")
        self.results[label] = result
        return result

    async def _evaluate(self, label: str, server, scenarios) -> EvalResult:
        trainer = self._need_trainer()
        saved = self.dir / f"eval_{label}.jsonl"
        if label == "base" and self.state["phase"] != "new":
            if not saved.exists():
                raise ValueError(f"{self.dir} is past the base evaluation (phase {self.state['phase']}) and has no "
                                 f"saved base result: open_run(cfg, fresh=True) starts again")
            result = load_eval(self.dir, label)
            print(f"base: evaluated at step 0 of this run | {result.line()}")
        elif self.state["evals"].get(label) == self.step and saved.exists():
            result = load_eval(self.dir, label)
            print(f"{label}: evaluated earlier at step {self.step} of this run | {result.line()}")
        else:
            with log_tool_calls(self._tool_log):
                result = await pipeline.evaluate_policy(trainer.policy, server, scenarios, self.cfg, label, self.dir)
            self.state["evals"][label] = self.step
            if label == "base":
                self.state["phase"] = "base_done"
            self._commit()
        self.results[label] = result
        return result

    async def warm_start(self, server, train) -> dict | None:
        """The supervised warm start, once per run (before any GRPO step); then checkpoint."""
        trainer = self._need_trainer()
        if self.state["phase"] == "new":
            raise ValueError("evaluate the base model first (`await run.evaluate('base', ...)`), so the "
                             "comparison has a before")
        if self.state["phase"] != "base_done":
            print(f"warm start: already done in this run (phase {self.state['phase']}, step {self.step})")
            return None
        rec, train = None, self._pin_train(train)
        trainer._run_step = None  # until the commit below: stopped midway, this trainer is no base model
        if self.cfg.train.warm_start_scenarios:
            with log_tool_calls(self._tool_log):
                rec = {"step": 0, "phase": "warm_start", **await pipeline.warm_start(trainer, server, train, self.cfg)}
            self.state["history"].append(rec)
        else:
            print("warm start: none for this config (train.warm_start_scenarios = 0)")
        self.state["phase"] = "training"
        pipeline._checkpoint(trainer, self.dir, self.state)
        trainer._run_step = self.step
        return rec

    def _pin_train(self, train: list) -> list:
        """The training scenarios this run started with, in that order, whatever list a later call brings
        (a notebook cell that wrote more LLM tasks): step batches are drawn from the list's order."""
        ids, pinned = [s.id for s in train], self.state.get("train_ids")
        if pinned is None:
            self.state["train_ids"] = ids
            return list(train)
        if ids == pinned:
            return list(train)
        by_id = {s.id: s for s in train}
        missing = [i for i in pinned if i not in by_id]
        if missing:
            raise ValueError(f"{self.dir}: {len(missing)} of the {len(pinned)} training scenarios this run started "
                             f"with are not in the list given (e.g. {short(missing[0], 60)}); pass them again, or "
                             "open_run(cfg, fresh=True) starts a new run")
        print(f"train: this run keeps the {len(pinned)} training scenarios it started with; "
              f"{len(by_id) - len(pinned)} others given now are left out")
        return [by_id[i] for i in pinned]

    async def train(self, server, train, val=(), test=()) -> dict:
        """GRPO steps from the recorded step to `cfg.train.steps` (nothing to do once there).

        Every `train.eval_every` steps it evaluates `pipeline.periodic_scenarios(cfg, val, test)`:
        val, or test where `train.eval_every_split` says so, cut to `train.eval_every_scenarios`."""
        trainer = self._need_trainer()
        if self.state["phase"] == "new":
            raise ValueError("evaluate the base model first (`await run.evaluate('base', ...)`)")
        if self.state["phase"] == "base_done":
            await self.warm_start(server, train)
        if self.step >= self.cfg.train.steps:
            print(f"train: already at step {self.step} of {self.cfg.train.steps}; raise train.steps to go on")
        elif self.step:
            print(f"train: resuming at step {self.step} of {self.cfg.train.steps}")
        self.state["phase"] = "training"
        train = self._pin_train(train)
        trainer._run_step = None  # a step stopped midway may have updated it: the next trainer() reloads
        with log_tool_calls(self._tool_log):
            periodic = pipeline.periodic_scenarios(self.cfg, val, test)
            self.state = await pipeline.train_loop(trainer, server, train, self.cfg, self.dir, self.state, periodic)
        trainer._run_step = self.step
        return self.state

    def report(self, title: str | None = None) -> Path:
        results = list(self.results.values())
        if not results:
            results = [load_eval(self.dir, label) for label in self.state["evals"]
                       if (self.dir / f"eval_{label}.jsonl").exists()]
        return write_report(self.dir, results, self.state["history"], title=title or f"mcp-rl run: {self.cfg.model}")


def open_run(cfg: Config, *, fresh: bool = False, resume: bool = True) -> Run:
    """The run in `cfg.out`: new if the folder is empty, else the recorded one (resume=True) or,
    with fresh=True, a new sibling folder `<out>-<time>` (cfg.out is updated to it)."""
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
    run = Run(cfg)
    run.state = distributed.broadcast_object(run.state, "run state")  # rank 0's record, on every rank
    if holds_run and run.state["phase"] != "new":
        recorded, now = read_record(out / "config.json"), redacted(cfg)
        legacy_custom(recorded, now)
        changed = changes(recorded, now)
        if changed:
            raise ValueError(f"{out} was recorded with other settings ({'; '.join(changed[:4])}"
                             f"{f'; {len(changed) - 4} more' if len(changed) > 4 else ''}): resuming would mix two "
                             "runs. Set them back, or start a new run (fresh=True, FRESH_RUN = True, or another --out)")
        print(f"run {out}: resuming the recorded run at step {run.step} (phase {run.state['phase']}); "
              f"FRESH_RUN / fresh=True starts a new folder")
    else:
        print(f"run {out}: new run")
    if distributed.is_main():
        write_json_atomic(out / "config.json", redacted(cfg))  # keys and tokens stay out
    return run


async def run(cfg: Config, *, resume: bool = False, trainer=None) -> dict:
    """The whole pipeline; returns {"base": EvalResult, ["warm_start": ...,] "trained": ..., "report": path}."""
    r = open_run(cfg, resume=resume)
    train, val, test = pipeline.load_splits(cfg)
    print(f"model {cfg.model} | backend {cfg.train.backend} | {len(train)} train, {len(test)} test scenarios",
          flush=True)
    async with parts.open_server(cfg) as server:
        await parts.check_tools(server, cfg)  # a refused server stops the run before the model loads
        if r.state["phase"] == "new":  # a gameable reward too (reward_audit.md); a resumed run was audited
            await pipeline.audit_before_training(server, train, cfg, r.dir)
        trainer = await r.trainer(trainer)
        await r.evaluate("base", server, test)
        if r.state["phase"] == "base_done":
            await r.warm_start(server, train)
            if cfg.train.warm_start_scenarios and cfg.train.eval_warm_start:
                await r.evaluate("warm_start", server, test)
        elif (r.dir / "eval_warm_start.jsonl").exists():
            r.results["warm_start"] = load_eval(r.dir, "warm_start")
        await r.train(server, train, val, test)
        await r.evaluate("trained", server, test)
        r.state["phase"] = "done"
        r._commit()
    report = r.report() if distributed.is_main() else None
    if report is not None:
        print(f"report: {report}", flush=True)
    return {**r.results, "report": report, "trainer": trainer}


__all__ = ["Run", "RunFolderError", "open_run", "run"]
