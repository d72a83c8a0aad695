"""The folder half of a run (`mcp_rl.runs.run.Run` is this plus the phases): its record committed, its
checkpoints, the trainer at its recorded step, the callbacks asked. Rank 0 writes; the other ranks
return from every write here, so nothing that calls these branches on rank.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from mcp_rl.scale import distributed

from mcp_rl.runs import parts
from mcp_rl.mcp.audit import TOOL_CALLS
from mcp_rl.runs.callbacks import Deadline, TrainerCallback
from mcp_rl.runs.config import Config
from mcp_rl.runs.evaluate import EvalResult, write_json_atomic
from mcp_rl.mcp.guard import short
from mcp_rl.training.manifest import MANIFEST, verify_manifest, write_manifest
from mcp_rl.runs.run_record import RunState


@dataclasses.dataclass
class _Loaded:
    trainer: parts.Trainer
    step: int | None  # the run step its weights are at; None while a step or warm start is under way


# Trainers loaded in this process, by run folder: a notebook cell run twice reuses the model
# (and, for ART, the vLLM server already on the GPU) instead of loading a second copy.
_LOADED: dict[str, _Loaded] = {}


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


class RunFolder:
    """A run folder: its config, its `RunState`, its trainer (see the module docstring)."""

    def __init__(self, cfg: Config, callbacks=(), env=None):
        self.cfg, self.dir, self.env = cfg, Path(cfg.out), env
        self.state = RunState.read(self.dir)
        self.results: dict[str, EvalResult] = {}
        self.callbacks: list[TrainerCallback] = [c for c in (Deadline.from_config(cfg.train),) if c] + list(callbacks)
        self._trainer = None
        self._key = f"{self.dir.resolve()}|{cfg.model}|{cfg.train.backend}"

    @property
    def step(self) -> int:
        return self.state.step

    # ---- the folder: rank 0 writes ------------------------------------------------------
    def commit(self) -> None:
        """state.json (the commit point), then metrics.jsonl (its history)."""
        if distributed.is_main():
            write_json_atomic(self.dir / "state.json", self.state.to_dict())
            write_json_atomic(self.dir / "metrics.jsonl", self.state.history)

    def _checkpoint(self, trainer) -> None:
        """The trainer's checkpoint for the recorded step, then the commit; the last two checkpoints are kept."""
        if not distributed.is_main():
            return
        ckpt = self.dir / "checkpoints" / f"step-{self.step:04d}"
        trainer.save(ckpt)
        if ckpt.is_dir() and not (ckpt / MANIFEST).is_file():  # a trainer of the user's that wrote none
            write_manifest(ckpt)
        self.commit()
        steps = sorted((p for p in (self.dir / "checkpoints").glob("step-*") if p.name[5:].isdigit()),
                       key=lambda p: int(p.name[5:]))  # by number: "step-10000" sorts before "step-9999"
        for old in steps[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def write(self, name: str, data) -> Path:
        """A file of a caller's in the run folder (a callback's results): text, bytes, or JSON (atomic)."""
        path = self.dir / name
        if distributed.is_main():
            if isinstance(data, bytes):
                path.write_bytes(data)
            elif isinstance(data, str):
                path.write_text(data)
            else:
                write_json_atomic(path, data)
        return path

    @property
    def _tool_log(self) -> Path:
        # One writer per file: ranks other than 0 log their rollouts' tool calls beside rank 0's.
        return self.dir / (TOOL_CALLS if distributed.is_main() else f"tool_calls.rank{distributed.rank()}.jsonl")

    def _ask(self, hook: str) -> str | None:
        """The first reason a callback's `should_stop` / `should_pause` gives, as rank 0 sees it."""
        reason = next((r for cb in self.callbacks if (r := getattr(cb, hook)(self))), None)
        return distributed.broadcast_object(reason, hook)

    # ---- the trainer ----------------------------------------------------------------------
    async def trainer(self, trainer=None):
        """The trainer at the recorded step: built once per process (or `trainer` given), then synced."""
        loaded = _LOADED.get(self._key)
        trainer = trainer or self._trainer or (loaded and loaded.trainer)
        if trainer is None:
            _make_room(self._key, self.cfg.train.backend)
            _seed_torch(self.cfg.train.seed)  # the LoRA init follows train.seed (the same on every rank)
            trainer = parts.build_trainer(self.cfg)
        await trainer.start()
        synced = loaded is not None and loaded.trainer is trainer and loaded.step == self.step
        ckpt = self.dir / "checkpoints" / f"step-{self.step:04d}"
        if self.state.phase in ("new", "base_done"):
            if trainer.step != 0 or trainer.sft_steps:
                raise ValueError(f"the run has not trained yet but the trainer has ({trainer.step} GRPO, "
                                 f"{trainer.sft_steps} warm-start updates; a warm start stopped before "
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
        self._trainer = trainer
        self._at(self.step)
        distributed.check_same(trainer, "trainer at the recorded step")
        for cb in self.callbacks:
            cb.on_init_end(self, trainer)
        return trainer

    def _at(self, step: int | None) -> None:
        """Where the trainer's weights are: the run's `step`, or None while they change before a commit
        (a stop then leaves a trainer the next `trainer()` must reload, not reuse)."""
        _LOADED[self._key] = _Loaded(self._trainer, step)

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
        self.state.step += 1
        self.state.history.append({"step": self.step, "recovered": "update saved by the trainer before the "
                                   "run recorded the step; its metrics are lost"})
        self._checkpoint(trainer)
        print(f"trainer: its checkpoint holds one update the run had not recorded (stopped mid-step): counted "
              f"as step {self.step}, not trained again")

    def _need_trainer(self):
        if self._trainer is None:
            raise RuntimeError("call `await run.trainer()` first")
        return self._trainer

    def _pin_train(self, train: list) -> list:
        """The training scenarios this run started with, in that order, whatever list a later call brings
        (a notebook cell that wrote more LLM tasks): step batches are drawn from the list's order."""
        ids, pinned = [s.id for s in train], self.state.train_ids
        if pinned is None:
            self.state.train_ids = ids
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


__all__ = ["RunFolder"]
