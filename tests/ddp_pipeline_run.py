"""Helper for tests/test_distributed.py (not a test itself): the whole `mcp_rl.run` pipeline under torchrun,
on the tiny random Llama of tests/test_pipeline.py and the company server (one per rank) on 127.0.0.1.

    python -m torch.distributed.run --nproc-per-node 2 tests/ddp_pipeline_run.py OUT STEPS [--resume] [--die-at STEP]

`--die-at STEP`: rank 1 exits (as a crash) before step STEP's rollouts (a callback: nothing rebound).
"""

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from mcp_rl.scale import distributed  # noqa: E402
from mcp_rl.runs import parts  # noqa: E402
from mcp_rl.runs import run as runs  # noqa: E402
from mcp_rl.runs.callbacks import TrainerCallback  # noqa: E402
from mcp_rl.runs.config import apply_overrides, preset  # noqa: E402


class DieAt(TrainerCallback):
    """Rank 1 exits as a crash once step `step` is next (at the start of training, or after the step before)."""

    def __init__(self, step: int):
        self.step = step

    def _maybe_die(self, next_step: int) -> None:
        if next_step == self.step and distributed.rank() == 1:
            os._exit(3)

    async def on_train_begin(self, run) -> None:
        self._maybe_die(run.step + 1)

    async def on_step_end(self, run, record) -> None:
        self._maybe_die(record["step"] + 1)


def build(cfg):
    from mcp_rl.policies.local_policy import LocalPolicy
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama
    from mcp_rl.training.portable import PortableTrainer

    tok = load_local_tokenizer()
    policy = LocalPolicy(tiny_llama(tok), tok, name="tiny")
    return PortableTrainer(policy, learning_rate=1e-3, micro_batch_size=2, max_seq_len=4096)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("steps", type=int)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--die-at", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    cfg = apply_overrides(preset("cpu", server="company"), [
        f"out={a.out}", f"train.steps={a.steps}", "train.groups_per_step=2", "train.group_size=2",
        "train.warm_start_scenarios=2", "train.eval_scenarios=2", "rollout.max_turns=6", "rollout.max_tokens=12",
        "rollout.concurrency=4"])
    parts.build_trainer = build  # the test's tiny model (seeded by the run, as the real builder is)
    try:
        asyncio.run(runs.run(cfg, resume=a.resume, callbacks=[DieAt(a.die_at)]))
    except distributed.RankFailed as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
