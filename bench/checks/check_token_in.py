"""Off-policy gap of multi-turn rollouts: the sampler's logprobs vs the trainer's on ART's tokens (CPU).

    .venv/bin/python bench/checks/check_token_in.py [--model gemma3-270m|smollm2] [--text]

Builds the pre-registered config's trainer in fp32 (bench/experiments/learning/<model>.yaml), warm-starts it on 4
demonstrations (so turns are multi-turn), samples 4 x 6 rollouts at temperature 0.7 from training
scenarios 4-7, tokenizes them as the trainer does (ART) and prints the mean |trainer - sampler|
logprob, the tokens with a ratio outside 1 +- 0.2, and per sequence where the large gaps sit.
`--text` renders each prompt from the messages' text, as LocalPolicy did before token-in prompts.
Results: bench/RESULTS.md section 10.
"""
import argparse
import asyncio
import sys
from pathlib import Path

import art
import torch
from art.preprocessing.tokenize import tokenize_trajectory_groups

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mcp_rl.runs import parts  # noqa: E402
from mcp_rl.runs import pipeline  # noqa: E402
from mcp_rl.runs.config import load_config  # noqa: E402
from mcp_rl.policies.local_policy import LocalPolicy  # noqa: E402
from mcp_rl.training.loss import off_policy_stats  # noqa: E402
from mcp_rl.rollout import rollout  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m", choices=("gemma3-270m", "smollm2"))
    ap.add_argument("--text", action="store_true", help="prompts from text (the old way)")
    args = ap.parse_args()
    if args.text:
        LocalPolicy.token_in = False
    cfg = load_config(ROOT / "bench" / "experiments" / "learning" / f"{args.model}.yaml")
    cfg.train.precision, cfg.rollout.max_tokens, cfg.rollout.max_turns, cfg.rollout.concurrency = "fp32", 64, 4, 24
    cfg.train.warm_start_scenarios, cfg.train.warm_start_epochs, cfg.train.warm_start_gate_scenarios = 4, 1, 0
    cfg.out = "/tmp/check_token_in"
    trainer = parts.build_trainer(cfg)
    train, _, _ = pipeline.load_splits(cfg)
    rc = parts.rollout_config(cfg, temperature=0.7)
    async with parts.open_server(cfg) as server:
        await pipeline.warm_start(trainer, server, train, cfg)
        trajs = await asyncio.gather(*[rollout(trainer.policy, server, sc, rc) for sc in train[4:8] for _ in range(6)])
    for i, t in enumerate(trajs):
        t.reward = float(i % 2)
    groups = [art.TrajectoryGroup(trajs[i:i + 6]) for i in range(0, 24, 6)]
    seqs = [trainer._sequence(r) for r in tokenize_trajectory_groups(
        trainer.tokenizer, groups, allow_training_without_logprobs=False, scale_rewards=False)]
    trainer.model.eval()
    with torch.no_grad():
        new, old, mask = trainer._logprobs(seqs)
    first = max(1, min(s["mask"].index(1) for s in seqs))
    for i, s in enumerate(seqs):
        known = torch.isfinite(old[i]) & (mask[i] > 0)
        d = (new[i] - torch.where(known, old[i], 0.0)).abs() * known
        big = [(int(j) + first, round(float(d[j]), 3)) for j in torch.nonzero(d > 0.05).flatten()[:6]]
        if big:
            print(f"sequence {i}: {len(s['ids'])} tokens, mean gap {float(d.sum() / known.sum()):.4f}, "
                  f"large at (position, nats) {big}")
    total, clipped, n = off_policy_stats(new, old, mask)
    print(f"prompts from {'text' if args.text else 'sampled ids'}: mean gap {total / n:.2e}, "
          f"{int(clipped)} of {int(n)} tokens outside 1 +- 0.2, turns {[t.metrics.get('turns') for t in trajs]}")


if __name__ == "__main__":
    asyncio.run(main())
