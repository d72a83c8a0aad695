"""The pipeline's phases: load splits, evaluate, warm-start, GRPO steps (mcp_rl/runs.py strings them
into a resumable run).

    python -m mcp_rl train --preset cpu --out runs/demo [--resume]
    summary = asyncio.run(mcp_rl.run(preset("cpu")))

Each step: scenarios → groups of rollouts → rewards → zero-variance groups
skipped and logged → update → (every N steps) validation → atomic checkpoint →
state.json + metrics.jsonl rewritten atomically. `resume=True` continues from the
last complete step: the scenario order is a pure function of (seed, step), so no
step is lost or repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import shutil
import time
from pathlib import Path

from .audit import log_tool_calls
from .config import Config
from .connect import ToolSession
from .evaluate import EvalResult, evaluate, save_eval, write_json_atomic
from .launch import HttpServer, company_server_command
from .policy import DemonstrationPolicy
from .rewards import score_group
from .rollout import RolloutConfig, gather_rollouts
from .scenarios import load_scenarios

COMPANY = "company"  # Config.server value: our server, launched over HTTP on a local port


def step_batch(train, step: int, size: int, seed: int) -> list:
    """Scenarios for `step`: walk a seeded shuffle of the training split, epoch after epoch."""
    out, epoch_cache = [], {}
    for i in range(step * size, (step + 1) * size):
        epoch, j = divmod(i, len(train))
        if epoch not in epoch_cache:
            order = list(train)
            random.Random(f"{seed}:{epoch}").shuffle(order)
            epoch_cache[epoch] = order
        out.append(epoch_cache[epoch][j])
    return out


@contextlib.asynccontextmanager
async def open_server(cfg: Config):
    """Yield a ServerSpec for rollouts; 'company' starts mcp_server.py over HTTP."""
    if cfg.server == COMPANY:
        with HttpServer(company_server_command(), token=cfg.server_token) as server:
            yield server.spec
    else:
        yield cfg.server


def rollout_config(cfg: Config, **changes) -> RolloutConfig:
    """`cfg.rollout` with the tool policy of cfg's fields now (a Config changed in place included)."""
    return dataclasses.replace(cfg.rollout, tool_policy=cfg.tool_policy(), **changes)


async def check_tools(server, cfg: Config) -> None:
    """Raise SideEffectsRefused (or ToolPolicyError) now if the server's tools do not fit cfg's
    tool policy: one session, before a model is loaded or a rollout runs."""
    async with ToolSession(server, policy=cfg.tool_policy(), call_timeout=cfg.rollout.call_timeout):
        pass


def build_trainer(cfg: Config):
    t = cfg.train
    if t.backend == "art":
        from .art_backend import ARTTrainer

        if t.warm_start_scenarios:
            raise ValueError("the ART backend has no warm start: set train.warm_start_scenarios=0 "
                             "(warm-start with the portable backend, then train with ART from its adapter)")
        return ARTTrainer(base_model=cfg.model, project=Path(cfg.out).name, learning_rate=t.learning_rate,
                          loss=t.loss, max_seq_length=t.max_seq_len, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                          logprob_chunk_size=t.logprob_chunk_size,
                          art_path=str(Path(cfg.out) / ".art"))
    from .local_policy import LocalPolicy, load_local_model
    from .train import PortableTrainer

    # float16 weights where training runs in float16 (a T4, or precision forced to fp16 on another GPU)
    dtype = "float16" if t.precision == "fp16" else None
    if t.loader == "unsloth":  # Unsloth's 4-bit model, LoRA and sampler; the same trainer and loss
        from .unsloth_loader import UnslothPolicy, load_unsloth_model

        model, tokenizer = load_unsloth_model(cfg.model, load_in_4bit=cfg.load_in_4bit, dtype=dtype,
                                              max_seq_len=t.max_seq_len, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                                              seed=t.seed)
        policy = UnslothPolicy(model, tokenizer, name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix,
                               max_batch=cfg.policy_batch)
        return PortableTrainer(policy, learning_rate=t.learning_rate, loss=t.loss, micro_batch_size=t.micro_batch_size,
                               max_seq_len=t.max_seq_len, precision=t.precision)
    model, tokenizer = load_local_model(cfg.model, quantize_4bit=cfg.load_in_4bit, dtype=dtype)
    policy = LocalPolicy(model, tokenizer, name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix,
                         max_batch=cfg.policy_batch)
    return PortableTrainer(policy, learning_rate=t.learning_rate, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                           loss=t.loss, micro_batch_size=t.micro_batch_size, max_seq_len=t.max_seq_len, precision=t.precision,
                           gradient_checkpointing=t.gradient_checkpointing)


def _log(msg: str) -> None:
    print(msg, flush=True)


def load_splits(cfg: Config) -> tuple[list, list, list]:
    """(train, val, test) verified scenarios of `cfg.scenarios`; val and test capped at eval_scenarios."""
    scenarios = load_scenarios(cfg.scenarios)
    split = lambda name: [s for s in scenarios if s.split == name and s.answer is not None]  # noqa: E731
    train, val, test = split("train"), split("val")[: cfg.train.eval_scenarios], split("test")[: cfg.train.eval_scenarios]
    if not train or not test:
        raise ValueError(f"{cfg.scenarios} needs verified scenarios in the train and test splits "
                         f"(found {len(train)} train, {len(test)} test)")
    return train, val, test


async def evaluate_policy(policy, server, scenarios, cfg: Config, label: str, run_dir: Path | None = None) -> EvalResult:
    """Verified success of `policy` on `scenarios` (greedy by default); rows saved in run_dir."""
    rcfg = rollout_config(cfg, temperature=cfg.train.eval_temperature)
    with log_tool_calls(phase=f"eval {label}"):  # rows go to the run's log when one is open
        result, _ = await evaluate(policy, server, scenarios, label=label, rollout_cfg=rcfg, reward_cfg=cfg.reward)
    if run_dir is not None:
        save_eval(Path(run_dir), result)
    _log(result.line())
    return result


async def warm_start(trainer, server, train, cfg: Config) -> dict:
    """Supervised pass on demonstrations of the first `warm_start_scenarios` training scenarios,
    each played through the real server (so tool outputs are real)."""
    demos_for = train[: cfg.train.warm_start_scenarios]
    demo_policy = DemonstrationPolicy(demos_for, tokenizer=trainer.policy.tokenizer)
    with log_tool_calls(phase="demonstrations"):
        groups = await gather_rollouts(demo_policy, server, demos_for, rollout_config(cfg), desc="demonstrations")
    demos = [t for g in groups for t in g.trajectories if t.metrics.get("completed") and not t.metrics.get("fatal")]
    _log(f"warm start | {len(demos)}/{len(demos_for)} demonstrations completed through the server")
    if not demos:
        reasons = {t.metadata.get("fatal_reason") or f"not completed in {t.metrics.get('turns')} turns"
                   for g in groups for t in g.trajectories}
        raise ValueError(f"no demonstration completed ({'; '.join(sorted(reasons))[:300]}); a demonstration needs "
                         f"about 5 turns (rollout.max_turns is {cfg.rollout.max_turns})")
    metrics = await _maybe_async(trainer.warm_start(demos, epochs=cfg.train.warm_start_epochs,
                                                    learning_rate=cfg.train.warm_start_lr,
                                                    batch_size=cfg.train.warm_start_batch_size))
    return {"demonstrations": len(demos), **metrics}


async def _maybe_async(value):
    return await value if hasattr(value, "__await__") else value


def _checkpoint(trainer, run_dir: Path, state: dict) -> None:
    """Checkpoint, then state.json (the commit point), then metrics.jsonl."""
    trainer.save(run_dir / "checkpoints" / f"step-{state['step']:04d}")
    write_json_atomic(run_dir / "state.json", state)
    write_json_atomic(run_dir / "metrics.jsonl", state["history"])
    for old in sorted((run_dir / "checkpoints").glob("step-*"))[:-2]:  # keep the last two
        shutil.rmtree(old, ignore_errors=True)


async def train_step(trainer, server, batch, cfg: Config, step: int) -> dict:
    """One GRPO step: rollouts of `batch`, rewards, zero-variance groups skipped (and logged), update."""
    t0 = time.monotonic()
    with log_tool_calls(phase=f"step {step + 1}"):
        groups = await gather_rollouts(trainer.policy, server, batch, rollout_config(cfg),
                                       group_size=cfg.train.group_size, desc=f"step {step + 1}")
    scored, skipped = [], []
    for group, scenario in zip(groups, batch):
        g = await score_group(group, scenario, cfg.reward)
        if g is None:
            skipped.append(f"{scenario.id}: judge failed")
            continue
        rewards = [t.reward for t in g.trajectories]
        if len(set(rewards)) <= 1:
            skipped.append(f"{scenario.id}: all {len(rewards)} rewards = {rewards[0]:.3f}")
        scored.append(g)
    trajs = [t for g in scored for t in g.trajectories]
    rec = {
        "step": step + 1,
        "reward_mean": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "success_rate": sum(t.metrics.get("reward/verified", 0) >= 0.999 for t in trajs) / max(len(trajs), 1),
        "completed_rate": sum(bool(t.metrics.get("completed")) for t in trajs) / max(len(trajs), 1),
        "groups_skipped": len(skipped), "skipped": skipped, "scenarios": [s.id for s in batch],
        "policy_step": trainer.policy.step,
    }
    varied = [g for g in scored if len({t.reward for t in g.trajectories}) > 1]
    rec["groups_trained"] = len(varied)
    if varied:
        rec.update({k: v for k, v in (await _maybe_async(trainer.train(varied))).items() if k != "step"})
    else:
        _log(f"step {step + 1}: every group had zero reward variance; no update (try a larger group_size)")
    rec["seconds"] = round(time.monotonic() - t0, 1)
    return rec


async def train_loop(trainer, server, train, cfg: Config, run_dir: Path, state: dict, val=()) -> dict:
    """Steps `state["step"]`..`cfg.train.steps`, each committed by an atomic checkpoint."""
    while state["step"] < cfg.train.steps:
        step = state["step"]
        batch = step_batch(train, step, cfg.train.groups_per_step, cfg.train.seed)
        rec = await train_step(trainer, server, batch, cfg, step)
        if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and val:
            rec["val_success"] = (await evaluate_policy(trainer.policy, server, val, cfg, f"val_step{step + 1}",
                                                        run_dir)).success_rate
        state["step"] = step + 1
        state["history"].append(rec)
        _checkpoint(trainer, run_dir, state)
        _log(f"step {step + 1}/{cfg.train.steps} | reward {rec['reward_mean']:.3f} | success "
             f"{rec['success_rate']:.0%} | trained {rec['groups_trained']} groups, skipped "
             f"{rec['groups_skipped']} | loss {rec.get('loss', float('nan')):.4f} | {rec['seconds']:.0f} s")
    return state


__all__ = ["load_splits", "evaluate_policy", "warm_start", "train_step", "train_loop", "step_batch",
           "build_trainer", "open_server", "rollout_config", "check_tools"]
