"""Data-parallel training on torch.distributed: rank helpers, a gradient all-reduce, a rank-0 guard.

    torchrun --nproc-per-node 2 -m mcp_rl train --preset cpu --out runs/ddp        # gloo on a CPU
    torchrun --nnodes 2 --node-rank R --master-addr HOST0 --master-port 29500 \\
        --nproc-per-node 8 -m mcp_rl train ...                                      # NCCL on GPUs

Outside torchrun (no WORLD_SIZE > 1 in the environment) every helper is the one-process
identity: `rank()` 0, `world()` 1, `shard(x)` x, `total(n)` n, `all_reduce_grads` nothing.

How a run splits (mcp_rl/runs/pipeline.py, mcp_rl/training/portable.py): every rank computes the same step
batch (a pure function of seed and step), rolls out its `shard` of the groups, and
`unshard` gathers every rank's groups back in batch order, so each rank holds the whole
step. The trainer then tokenizes all groups (advantages are per group) and backpropagates
its `shard` of the sequences, with the loss normaliser of the *whole* step (`total`); the
gradients are summed by `all_reduce_grads`, so 2 ranks x half the sequences give the
gradient of 1 rank x all of them (bench/checks/check_ddp.py checks it). Clipping and AdamW then
see identical gradients on every rank, so LoRA and optimizer state stay identical;
`check_same` verifies it (sums of weights and moments, and a hash of the LoRA bytes, per rank) when
the trainer is built and after each step; each step's metrics record what it saw (`rank_state_diff`,
`rank_lora_identical`) and, on GPUs, every rank's memory peak (`gpu_peak_gib_by_rank`).
Only rank 0 writes checkpoints, state.json, metrics and reports (`is_main`).

A rank that dies: torchrun stops the others and reports the failed rank; without torchrun the
survivors' next collective fails, raised here as `RankFailed` naming what it was. Every file a run
writes goes through a temporary name and a rename, so nothing is left half-written.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from typing import Any, Awaitable, Callable, Iterable, Sequence, TypeVar

import torch
import torch.distributed as dist

__all__ = ["init", "rank", "world", "is_main", "shard", "unshard", "unshard_groups", "total", "all_reduce_grads",
           "check_same", "barrier", "broadcast_object", "on_main", "RankFailed"]

T = TypeVar("T")
TIMEOUT_ENV = "MCP_RL_DIST_TIMEOUT_S"  # a rank waits this long for the others (rank 0 evaluates alone)


class RankFailed(RuntimeError):
    """A collective failed: another rank died or timed out. The run folder holds the last committed step."""


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """True on rank 0 (and in a single process): the one rank that writes files."""
    return rank() == 0


def init(backend: str | None = None) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE, RANK, MASTER_ADDR/PORT); idempotent.

    gloo without CUDA, NCCL with it (each rank on cuda:LOCAL_RANK). Returns whether it is distributed."""
    if active() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return active()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, 7200)))
    dist.init_process_group(backend=backend, timeout=timeout)
    return True


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _collective(what: str, fn, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, dist.DistBackendError) as e:  # gloo: "Connection closed by peer"; timeouts
        raise RankFailed(f"rank {rank()} of {world()}: {what} failed ({type(e).__name__}: {str(e)[:200]}); "
                         f"another rank died or stalled (see its log). Nothing after the last committed step "
                         f"was written; rerun with --resume") from e


def shard(items: Sequence[T], r: int | None = None, n: int | None = None) -> list[T]:
    """This rank's share: every n-th item from position r (balanced when items are sorted by size).

    >>> shard(list(range(5)), 0, 2), shard(list(range(5)), 1, 2)
    ([0, 2, 4], [1, 3])
    """
    r, n = rank() if r is None else r, world() if n is None else n
    return list(items[r::n])


def interleave(shards: Sequence[Sequence[T]]) -> list[T]:
    """The inverse of `shard` over all ranks' shares.

    >>> interleave([[0, 2, 4], [1, 3]])
    [0, 1, 2, 3, 4]
    """
    out: list[T] = []
    for i in range(max((len(s) for s in shards), default=0)):
        out.extend(s[i] for s in shards if i < len(s))
    return out


def unshard(mine: list[T], what: str = "gather") -> list[T]:
    """Every rank's `shard` gathered back in the original order (picklable items)."""
    if not active():
        return list(mine)
    shards: list[Any] = [None] * world()
    _collective(what, dist.all_gather_object, shards, list(mine))
    return interleave(shards)


def unshard_groups(mine: list[Any], what: str = "gather") -> list[Any]:
    """`unshard` for art.TrajectoryGroup objects (or None), which do not unpickle: sent as their trajectories."""
    if not active():
        return list(mine)
    import art

    plain = unshard([None if g is None else list(g.trajectories) for g in mine], what)
    return [None if t is None else art.TrajectoryGroup(t) for t in plain]


def broadcast_object(value: T, what: str = "broadcast") -> T:
    """Rank 0's `value` on every rank."""
    if not active():
        return value
    box = [value if is_main() else None]
    _collective(what, dist.broadcast_object_list, box, src=0)
    return box[0]


async def on_main(make: Callable[[], Awaitable[T]], what: str = "rank 0's result") -> T:
    """Rank 0 alone awaits `make()`; every rank gets its value. Evaluations go through this, so the
    ranks never diverge on what one found (nor deadlock on a decision taken from it)."""
    return broadcast_object(await make() if is_main() else None, what)


def total(values: float | Iterable[float], what: str = "sum") -> Any:
    """Sum over ranks of a number (or a list of numbers)."""
    single = isinstance(values, (int, float))
    if not active():
        return values if single else list(values)
    t = torch.tensor([values] if single else list(values), dtype=torch.float64, device=_device())
    _collective(what, dist.all_reduce, t)
    out = t.tolist()
    return out[0] if single else out


def all_reduce_grads(params: Sequence[torch.Tensor], what: str = "gradient all-reduce") -> None:
    """Sum the gradients of `params` over ranks, in one flat buffer (a rank without sequences adds zeros)."""
    if not active():
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1).float() for p in params]).to(_device())
    _collective(what, dist.all_reduce, flat)
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
        offset += n


def barrier(what: str = "barrier") -> None:
    if active():
        _collective(what, dist.barrier)


def fingerprint(trainer: Any) -> list[float]:
    """Step, LoRA weights and AdamW moments of `trainer`, as sums (float64): equal on every rank."""
    weights = sum(float(p.detach().double().sum()) + float(p.detach().double().abs().sum()) for p in trainer.params)
    moments = 0.0
    for state in trainer.optimizer.state.values():
        for v in state.values():
            if torch.is_tensor(v):
                moments += float(v.detach().double().abs().sum())
    return [float(trainer.step), weights, moments]


def digest(trainer: Any) -> str:
    """A hash of the LoRA weights' bytes: equal on two ranks only if the weights are bitwise identical."""
    h = hashlib.blake2b(digest_size=16)
    for p in trainer.params:
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_same(trainer: Any, what: str = "state check", rtol: float = 1e-6) -> dict:
    """Raise RuntimeError when the ranks' LoRA weights, optimizer state or step differ (beyond `rtol` of
    their sums). Returns what was seen: the largest relative difference from rank 0's sums and whether
    every rank's LoRA weights are bitwise identical ({} in one process)."""
    if not active():
        return {}
    mine = fingerprint(trainer)
    gathered: list[Any] = [None] * world()
    _collective(what, dist.all_gather_object, gathered, (mine, digest(trainer)))
    every = [f for f, _ in gathered]
    largest = 0.0
    for r, theirs in enumerate(every):
        diffs = [abs(a - b) / max(1.0, abs(a)) for a, b in zip(every[0], theirs)]
        largest = max(largest, *diffs)
        if any(d > rtol for d in diffs):
            raise RuntimeError(f"{what}: rank {r}'s trainer differs from rank 0's (step, weights, moments: "
                               f"{theirs} vs {every[0]}); every rank must build the same model with the same "
                               f"seed and read the same checkpoint (a run folder all ranks see)")
    return {"rank_state_diff": largest, "rank_lora_identical": len({d for _, d in gathered}) == 1}
