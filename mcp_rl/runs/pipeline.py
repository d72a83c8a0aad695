"""The pipeline's phases as plain functions: load splits, the reward audit, evaluate, warm-start, one
GRPO step. They return values and write no run folder: mcp_rl/runs/run.py strings them into a resumable
run and records what they return (mcp_rl/runs/parts.py builds the server and trainer they use).

    python -m mcp_rl train --preset cpu --out runs/demo [--resume]
    summary = asyncio.run(mcp_rl.run(preset("cpu")))

A step: scenarios (a pure function of seed and step, so a resumed run neither loses nor repeats
one) → groups of rollouts → rewards → zero-variance groups skipped and logged → update.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import art

from mcp_rl.scale import distributed
from mcp_rl.mcp.audit import log_tool_calls
from mcp_rl.runs.config import Config
from mcp_rl.tasks.demonstrations import demonstrable
from mcp_rl.environment import Environment, environment
from mcp_rl.runs.evaluate import EvalResult, evaluate
from mcp_rl.rewards.evidence import monitor
from mcp_rl.runs.parts import Trainer, rollout_config
from mcp_rl.rewards.reward_audit import audit_reward
from mcp_rl.rewards.score import score_group
from mcp_rl.rollout import failed_outside_policy, gather_rollouts
from mcp_rl.tasks.scenarios import load_scenarios


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


def periodic_scenarios(cfg: Config, val, test) -> list:
    """What a run evaluates every `eval_every` steps (callbacks.HeldOutCurve): val, or test for a held-out curve."""
    pool = list(test if cfg.train.eval_every_split == "test" else val)
    return pool[: cfg.train.eval_every_scenarios] if cfg.train.eval_every_scenarios else pool


def _log(msg: str) -> None:
    print(msg, flush=True)


def load_splits(cfg: Config, env: Environment | None = None) -> tuple[list, list, list]:
    """(train, val, test) checkable scenarios of `cfg.scenarios` (a verified answer, or any task where the
    environment scores its own, `Environment.score`); val and test capped at eval_scenarios."""
    scenarios, scored = load_scenarios(cfg.scenarios), env is not None and env.score is not None
    split = lambda name: [s for s in scenarios if s.split == name and (scored or s.answer is not None)]  # noqa: E731
    train, val, test = split("train"), split("val")[: cfg.train.eval_scenarios], split("test")[: cfg.train.eval_scenarios]
    if not train or not test:
        raise ValueError(f"{cfg.scenarios} needs verified scenarios in the train and test splits "
                         f"(found {len(train)} train, {len(test)} test)")
    return train, val, test


def _env(cfg: Config, env: Environment | None) -> Environment:
    return env if env is not None else environment(cfg.server)


async def evaluate_policy(policy, server, scenarios, cfg: Config, label: str, env: Environment | None = None) -> EvalResult:
    """Verified success of `policy` on `scenarios` (greedy by default); a run saves the rows. `env`
    (default: the one cfg.server names) supplies the counterfactual worlds right answers are replayed on."""
    rcfg = rollout_config(cfg, temperature=cfg.train.eval_temperature)
    with log_tool_calls(phase=f"eval {label}"):  # rows go to the run's log when one is open
        result, _ = await evaluate(policy, server, scenarios, label=label, rollout_cfg=rcfg, reward_cfg=cfg.reward,
                                  k=cfg.train.eval_k, counterfactual=_env(cfg, env).counterfactual())
    _log(result.line())
    return result


async def audit_before_training(server, train, cfg: Config, run_dir: Path | None = None,
                                env: Environment | None = None):
    """The reward audit (mcp_rl.rewards.reward_audit) on the training split before any model loads: its table
    goes to `<run>/reward_audit.md`; raises RewardGameable when a cheat succeeds on more than
    `cfg.reward.audit_max_success` of the scenarios (1.0 turns the audit off)."""
    if cfg.reward.audit_max_success >= 1 or cfg.reward.audit_scenarios == 0:
        _log("reward audit | off (reward.audit_max_success=1.0 or reward.audit_scenarios=0): cheats were not checked")
        return None
    env = _env(cfg, env)
    verified = [s for s in train if s.answer is not None or env.score is not None]  # what a cheat could be paid for
    scenarios = verified[: cfg.reward.audit_scenarios] if cfg.reward.audit_scenarios else verified
    if not scenarios:
        _log("reward audit | no training task has a verified answer: the audit needs some (RULER and custom "
             "rewards are audited on them too)")
        return None
    # The environment's demonstrations (where every task has a reference to replay) give the honest row.
    demos = env.demonstrations(scenarios) if all(map(demonstrable, scenarios)) else None
    report = await audit_reward(server, scenarios, cfg.reward, rollout_config(cfg), demonstrations=demos,
                                counterfactual=env.counterfactual())
    if run_dir is not None and distributed.is_main():
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "reward_audit.md").write_text("# Reward audit\n\n" + report.table() + "\n")
    _log(f"reward audit | {len(report.rows)} cheating policies on {len(scenarios)} training scenarios:\n{report.table()}")
    report.check()
    return report


async def play_demonstrations(trainer: Trainer, server, scenarios, cfg: Config, env: Environment | None = None,
                              phase: str = "warm start") -> list:
    """The environment's demonstrations of `scenarios`, each played through the real server (so tool outputs
    are real): the completed ones, as trajectories to imitate (the warm start's, the imitation baseline's)."""
    env = _env(cfg, env)
    demo_policy = env.demonstrations(scenarios, tokenizer=trainer.policy.tokenizer)
    if demo_policy is None:
        raise ValueError(f"environment {env.name[:60]!r} has no demonstrations (Environment.plan): set "
                         "train.warm_start_scenarios=0, or give the environment a plan")
    with log_tool_calls(phase="demonstrations"):  # each rank plays its share; every rank gets them all
        groups = distributed.unshard_groups(await gather_rollouts(demo_policy, server, distributed.shard(scenarios),
                                                           rollout_config(cfg), desc="demonstrations"), "demonstrations")
    demos = [t for g in groups for t in g.trajectories if t.metrics.get("completed") and not t.metrics.get("fatal")]
    _log(f"{phase} | {len(demos)}/{len(scenarios)} demonstrations completed through the server")
    if not demos:
        reasons = {t.metadata.get("fatal_reason") or f"not completed in {t.metrics.get('turns')} turns"
                   for g in groups for t in g.trajectories}
        raise ValueError(f"no demonstration completed ({'; '.join(sorted(reasons))[:300]}); a demonstration needs "
                         f"about 5 turns (rollout.max_turns is {cfg.rollout.max_turns})")
    return demos


async def warm_start(trainer: Trainer, server, train, cfg: Config, env: Environment | None = None) -> dict:
    """Supervised pass on the environment's demonstrations of the first `warm_start_scenarios` training
    scenarios, each played through the real server (so tool outputs are real)."""
    env = _env(cfg, env)
    demos = await play_demonstrations(trainer, server, train[: cfg.train.warm_start_scenarios], cfg, env)
    t = cfg.train
    metrics = trainer.warm_start(demos, epochs=t.warm_start_epochs, learning_rate=t.warm_start_lr,
                                 batch_size=t.warm_start_batch_size)
    rec = {"demonstrations": len(demos), **metrics}
    if t.warm_start_gate_scenarios:
        rec.update(gate := await warm_start_gate(trainer, server, demos, train, cfg, env))
        rec["epochs"] = float(t.warm_start_epochs + gate["gate_extra_epochs"])
    return rec


def gate_scenarios(train, cfg: Config) -> list:
    """The gate's scenarios: training ones after the demonstrations' (so it measures what the
    demonstrations taught, not their recall), the first ones when the split has no others."""
    rest = train[cfg.train.warm_start_scenarios:] or train
    return rest[: cfg.train.warm_start_gate_scenarios]


async def warm_start_gate(trainer, server, demos, train, cfg: Config, env: Environment | None = None) -> dict:
    """Play the gate scenarios with the warm-start policy (eval settings); while its tool errors per
    episode or its completion rate miss the thresholds, one more warm-start epoch, at most
    `warm_start_max_extra_epochs`. Returns the gate's record (each check, passed or not)."""
    t, scenarios, checks = cfg.train, gate_scenarios(train, cfg), []
    while True:
        # Rank 0 decides for every rank: ranks that took different numbers of epochs would deadlock.
        r = await distributed.on_main(lambda: evaluate_policy(trainer.policy, server, scenarios, cfg,
                                                              f"warm_start_gate{len(checks)}", env),
                                      f"warm-start gate check {len(checks)}")
        passed = r.mean_tool_errors <= t.warm_start_max_tool_errors and r.completed_rate >= t.warm_start_min_completed
        checks.append({"epochs": t.warm_start_epochs + len(checks), "tool_errors": r.mean_tool_errors,
                       "completed_rate": r.completed_rate, "success_rate": r.success_rate, "passed": passed})
        extra = len(checks) - 1
        verdict = (f"warm-start gate | {r.mean_tool_errors:.2f} tool errors per episode (at most "
                   f"{t.warm_start_max_tool_errors:g}), completed {r.completed_rate:.0%} (at least "
                   f"{t.warm_start_min_completed:.0%}), n={r.n}")
        if passed or extra >= t.warm_start_max_extra_epochs:
            _log(f"{verdict}: {'passed' if passed else 'NOT met'} after {extra} extra epoch(s)"
                 + ("" if passed else "; RL starts from this policy anyway (raise train.warm_start_max_extra_epochs)"))
            break
        _log(f"{verdict}: one more epoch ({extra + 1}/{t.warm_start_max_extra_epochs})")
        more = trainer.warm_start(demos, epochs=1, learning_rate=t.warm_start_lr, batch_size=t.warm_start_batch_size,
                                  seed=extra + 1)
        checks[-1]["next_epoch_nll"] = more.get("nll_last_epoch")
    return {"gate": checks, "gate_passed": checks[-1]["passed"], "gate_extra_epochs": len(checks) - 1,
            "gate_tool_errors": checks[-1]["tool_errors"], "gate_completed_rate": checks[-1]["completed_rate"]}


def _seed_sampling(seed: int, step: int) -> None:
    """torch's generator (LocalPolicy samples with it) from (seed, step): a resumed run draws as the
    uninterrupted one would, as far as the batches' composition allows. No torch (a remote policy): nothing."""
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(seed * 1_000_003 + step)


async def train_step(trainer: Trainer, server, batch, cfg: Config, step: int, env: Environment | None = None) -> dict:
    """One GRPO step: rollouts of `batch`, rewards, zero-variance groups skipped (and logged), update."""
    t0, env = time.monotonic(), _env(cfg, env)
    _seed_sampling(cfg.train.seed, step)
    decode_before = dict(getattr(trainer.policy, "decode_stats", None) or {}) or None
    mine = distributed.shard(batch)  # this rank's groups (all of them in one process)
    worker_stats = None
    with log_tool_calls(phase=f"step {step + 1}"):
        if cfg.rollout_workers:  # on remote workers, next to their MCP servers (mcp_rl/scale/workers.py)
            from mcp_rl.scale.workers import remote_rollouts

            port = cfg.policy_port + distributed.rank() if cfg.policy_port else 0
            groups, worker_stats = await remote_rollouts(trainer.policy, mine, cfg, group_size=cfg.train.group_size,
                                                         port=port)
        else:
            groups = await gather_rollouts(trainer.policy, server, mine, rollout_config(cfg),
                                           group_size=cfg.train.group_size, desc=f"step {step + 1}")
    rollout_s = time.monotonic() - t0
    mine_scored = []
    for group, scenario in zip(groups, mine):
        kept = art.TrajectoryGroup([t for t in group.trajectories if not failed_outside_policy(t)])
        mine_scored.append(await score_group(kept, scenario, cfg.reward, counterfactual=env.counterfactual())
                           if len(kept.trajectories) > 1 else kept)
    scored, skipped, outside = [], [], 0
    for g, scenario in zip(distributed.unshard_groups(mine_scored, f"step {step + 1} rollouts"), batch):
        if g is None:
            skipped.append(f"{scenario.id}: judge failed")
            continue
        outside += cfg.train.group_size - len(g.trajectories)
        if len(g.trajectories) < 2:
            skipped.append(f"{scenario.id}: {cfg.train.group_size - len(g.trajectories)} rollouts cut short by the "
                           "endpoint, server or clock")
            continue
        rewards = [t.reward for t in g.trajectories]
        if len(set(rewards)) <= 1:
            skipped.append(f"{scenario.id}: all {len(rewards)} rewards = {rewards[0]:.3f}")
        scored.append(g)
    trajs = [t for g in scored for t in g.trajectories]
    rec = {
        "step": step + 1,
        "reward_mean": sum(t.reward for t in trajs) / max(len(trajs), 1),
        "success_rate": sum(t.metrics.get("answer_correct", 0) >= 0.999 for t in trajs) / max(len(trajs), 1),
        "grounded_rate": sum(t.metrics.get("grounded", 0) >= 0.999 for t in trajs) / max(len(trajs), 1),
        **monitor(trajs),
        "completed_rate": sum(bool(t.metrics.get("completed")) for t in trajs) / max(len(trajs), 1),
        "groups_skipped": len(skipped), "skipped": skipped, "scenarios": [s.id for s in batch],
        "failed_outside_policy": outside,  # left out of their groups, not trained on
        "policy_step": trainer.policy.step,
    }
    if worker_stats is not None:
        rec["worker_requests"], rec["worker_retries"] = worker_stats["requests"], worker_stats["retried"]
    varied = [g for g in scored if len({t.reward for t in g.trajectories}) > 1]
    rec["groups_trained"] = len(varied)
    if varied:
        if hasattr(trainer.policy, "clear_prefix_cache"):  # its KV copies would sit on the GPU through the update
            trainer.policy.clear_prefix_cache()
        rec.update({k: v for k, v in (await trainer.train(varied)).items() if k != "step"})
    else:
        _log(f"step {step + 1}: every group had zero reward variance; no update (try a larger group_size)")
    rec["seconds"] = round(time.monotonic() - t0, 1)
    rec["rollout_seconds"] = round(rollout_s, 1)  # the rest is rewards and the update
    rec["generate_calls"] = getattr(trainer.policy, "generate_calls", None)  # cumulative: batched decodes so far
    if decode_before is not None:  # this step's sampling profile (LocalPolicy.decode_stats)
        rec["decode"] = {k: round(v - decode_before[k], 3) for k, v in trainer.policy.decode_stats.items()}
    return rec


__all__ = ["load_splits", "audit_before_training", "evaluate_policy", "play_demonstrations", "warm_start", "warm_start_gate", "gate_scenarios",
           "train_step", "step_batch", "periodic_scenarios"]
