"""The imitation baseline's supervised phase: epochs of SFT on demonstrations for a budget of seconds.

    rec = sft_for_budget(trainer, demos, budget_s=900, learning_rate=5e-4, batch_size=8, seed=0)
    rec = sft_for_budget(..., position=rec, stop_at=time.monotonic() + 300)   # go on where it stopped

Issue 40's comparison RL must win: the warm start continued with supervised updates on verified
demonstrations of the whole training split, epoch after epoch, for as long as the GRPO phase trained.
`Run.imitate` (mcp_rl/runs/run.py) plays the demonstrations, calls this and records what it returns.

The budget counts the updates' seconds only, as `train.train_budget_s` counts the GRPO steps' (their
rollouts and updates): playing the scripted demonstrations takes no model time and is recorded apart.
Each epoch visits the demonstrations in a seeded order that is a pure function of (seed, epoch), so a
phase stopped at a deadline and resumed from `position` goes on with the very next batch.
"""

from __future__ import annotations

import random
import time
from typing import Callable


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The demonstrations' order in `epoch`: a seeded shuffle of range(n).

    >>> epoch_order(5, 0, 1) == epoch_order(5, 0, 1) != epoch_order(5, 0, 2)
    True
    >>> sorted(epoch_order(5, 3, 0))
    [0, 1, 2, 3, 4]
    """
    order = list(range(n))
    random.Random(f"{seed}:imitation:{epoch}").shuffle(order)
    return order


def sft_for_budget(trainer, demos: list, *, budget_s: float, learning_rate: float, batch_size: int, seed: int,
                   position: dict | None = None, stop_at: float | None = None,
                   clock: Callable[[], float] = time.monotonic) -> dict:
    """Supervised updates (`trainer.sft_step`) over `demos`, epoch after epoch, while the next batch still
    fits: in `budget_s` seconds of updates over the whole phase (those `position` records included), and
    before `stop_at` (a `clock()` time: the call's deadline, None for none). The next batch is assumed to
    take as long as the longest so far, so the phase never runs past its budget (a first update longer
    than the whole budget aside: it is taken, to have a measure).

    Returns the new position and this call's share: {"epoch", "batch", "seconds" (the whole phase's),
    "updates" and "longest_update_s" (this call's), "nll_first", "nll_last", "stopped": "budget" or "deadline"}."""
    if not demos or batch_size < 1 or budget_s <= 0:
        raise ValueError("the imitation phase needs demonstrations, batch_size >= 1 and a budget of seconds > 0")
    pos = position or {}
    epoch, batch, spent = int(pos.get("epoch", 0)), int(pos.get("batch", 0)), float(pos.get("seconds", 0.0))
    batches_per_epoch = -(-len(demos) // batch_size)
    longest, nlls, stopped = 0.0, [], "budget"
    while True:
        if spent + longest > budget_s:
            break
        if stop_at is not None and clock() + longest > stop_at:
            stopped = "deadline"
            break
        order = epoch_order(len(demos), seed, epoch)
        chunk = [demos[i] for i in order[batch * batch_size:(batch + 1) * batch_size]]
        t0 = clock()
        nlls.append(trainer.sft_step(chunk, learning_rate=learning_rate)["nll"])
        took = clock() - t0
        spent, longest = spent + took, max(longest, took)
        batch += 1
        if batch == batches_per_epoch:
            epoch, batch = epoch + 1, 0
            print(f"imitation | epoch {epoch} done | nll {nlls[-1]:.3f} | {spent:.0f} of {budget_s:.0f} s", flush=True)
    return {"epoch": epoch, "batch": batch, "seconds": spent, "updates": len(nlls), "longest_update_s": longest,
            "epochs_done": epoch + batch / batches_per_epoch,
            "nll_first": nlls[0] if nlls else None, "nll_last": nlls[-1] if nlls else None, "stopped": stopped}


__all__ = ["sft_for_budget", "epoch_order"]
