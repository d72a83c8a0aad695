"""Benchmark: one learning-proof GRPO step with today's settings and with the new ones, side by side.

Both modes run in one process on the same model, server, scenarios and starting weights: before
each mode's step the trainer is restored from the same checkpoint, and torch is re-seeded, so the
only differences are the settings under test. Modes:
  old  LocalPolicy(batch_wait_s=0.3, hand_back=False) (a batch waits a fixed 0.3 s after its first
       request, as bench/experiments/learning_proof.py ran before 2026-12-04, and answers every request when its
       longest row ends), transformers 5.17's attention (repeat_kv), trainer micro-batches of
       micro_batch_size sequences
  new  LocalPolicy(batch_wait_s=WAIT, batch_gap_s=GAP, hand_back=True) (a batch closes once no request
       came for GAP seconds; a finished row is answered at once, so its rollout calls its tool during
       the decode's tail), packed GQA decode attention (decoder.packed_gqa_sdpa), trainer
       micro-batches packed to MICRO_BATCH_TOKENS padded tokens; with --packed (issue [speed]) the packed
       update instead (mcp_rl/training/packing.py: sequences end to end in rows of MICRO_BATCH_TOKENS at most, the LM
       head only on trained tokens, through Liger-Kernel's fused linear cross-entropy on CUDA); with
       --reuse-prefix each episode's KV cache kept between its turns (mcp_rl/policies/prefix_cache.py); since
       session 21 new samples through fused LoRA layers (LocalPolicy's fused_lora) and updates with the LoRA levers
       (train.lora_no_upcast, lora_fused_add), both on by default; old runs peft's own paths; with
       --compile-decode new decodes through torch.compile (LocalPolicy's compile_decode; its first step
       pays the compiling)
  join new with continuous batching (LocalPolicy's join: a request joins the decode already running);
       `--modes new join` times joining alone, against new
Each row: step seconds, rollout seconds (the rest is rewards + update), batched decodes, trained
tokens and tokens/s. Before any step, a greedy check plays `--greedy-scenarios` held-out
scenarios in both modes from the same weights and counts rollouts whose tokens are identical
(greedy: batch composition should change nothing but float rounding; sampled steps use different
batches, so their tokens are not compared).

    python bench/speed/bench_step.py --config bench/experiments/learning/smollm2.yaml --steps 3 --out bench/results/step_bench.txt
    python bench/speed/bench_step.py --packed --micro-batch-tokens 16384 --greedy-scenarios 0 --steps 8 \
        --out bench/results/step_bench_smollm2_h100.txt
    python bench/speed/bench_step.py --config bench/experiments/learning/gemma3-270m.yaml --packed --steps 4 \
        --first-step 5 --out /tmp/step_bench_gemma.txt   # steps 5-8 in a second call while the machine is warm
                                                         # ($OUT is new each call: copy the rows there after)
    python bench/speed/bench_step.py --random-weights TOKENIZER_DIR --shape tiny --steps 1 \
        --set rollout.concurrency=8 train.groups_per_step=2 train.group_size=2 rollout.max_tokens=16   # CPU check

The T4-shaped step (issue [speed] item 4: Qwen2.5-3B's shape, float16, a 15 GiB cap; random weights, so the
SmolLM2 tokenizer's vocabulary and no learning; `--jitter-rewards` gives the groups the reward variance random
weights never have, so the update runs on the rollouts' real tokens, for its time and memory only):

    python bench/speed/bench_step.py --random-weights /tmp/tok --shape qwen3b --modes new --packed \
        --memory-cap-gib 15 --jitter-rewards --greedy-scenarios 0 --steps 2 --set train.precision=fp16 \
        train.gradient_checkpointing=true train.groups_per_step=4 train.group_size=6 rollout.max_turns=4 \
        rollout.concurrency=24 policy_batch=24 --out bench/results/step_bench_t4shape_<device>.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "speed"), str(ROOT / "bench" / "experiments")]

import learning_proof  # noqa: E402  (bench/experiments/learning_proof.py: its trainer builder and random shapes)

from mcp_rl.runs import parts  # noqa: E402
from mcp_rl.runs import pipeline  # noqa: E402
from mcp_rl.runs.config import apply_overrides, load_config  # noqa: E402


def set_mode(trainer, mode: dict) -> None:
    from transformers import AttentionInterface

    from bench_packed_gqa import attention

    from mcp_rl.policies.prefix_cache import PrefixCache

    trainer.policy.batch_wait_s, trainer.policy.batch_gap_s = mode["batch_wait_s"], mode["batch_gap_s"]
    trainer.micro_batch_tokens, trainer.policy.hand_back = mode["micro_batch_tokens"], mode["hand_back"]
    trainer.packed = mode.get("packed", False)
    # On by default since session 21 (the sampler's fused LoRA layers, the update's LoRA levers); old ran without.
    trainer.policy.fused_lora = mode.get("fused_lora", False)
    trainer.policy.compile_decode = mode.get("compile_decode", False)
    trainer.policy.join = mode.get("join", False)
    if hasattr(trainer, "lora_fused_add"):
        trainer.lora_no_upcast = trainer.lora_fused_add = mode.get("levers", False)
    # The cpu preset turns the KV reuse on (exact in float32 only): off unless this mode asks, a fresh cache if so.
    trainer.policy.prefix_cache = PrefixCache(int(1.5 * 2**30)) if mode.get("reuse_prefix") else None
    if trainer.packed != mode.get("packed", False):
        raise SystemExit("--packed: this model or attention cannot run packed sequences (see the warning above)")
    AttentionInterface.register("sdpa", attention("packed" if mode["packed_gqa"] else "repeat"))


def tokens_of(groups) -> list[list[int]]:
    out = []
    for g in groups:
        for t in g.trajectories:
            out.append([int(lp.token.split(":")[1]) for c in t.messages_and_choices if not isinstance(c, dict)
                        for lp in (c.logprobs.content if c.logprobs else [])])
    return out


def jitter_rewards(seed: int) -> None:
    """Random weights give every rollout of a group the same reward, so no group would be trained on: add a
    tiny seeded noise to each reward (for time and memory only, never for learning)."""
    import random

    rng, score = random.Random(seed), pipeline.score_group

    async def jittered(group, *args, **kwargs):
        group = await score(group, *args, **kwargs)
        for t in group.trajectories:
            t.reward += rng.uniform(0, 1e-3)
        return group

    pipeline.score_group = jittered


async def bench(args) -> list[dict]:
    import torch

    cfg = apply_overrides(load_config(args.config), args.set)
    if args.memory_cap_gib and torch.cuda.is_available():  # as small as the card being modelled (a T4: 15 GiB)
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * 2**30 / total))
    if args.jitter_rewards:
        jitter_rewards(cfg.train.seed)
    train, _, test = pipeline.load_splits(cfg)
    # learning_proof.build_trainer is gone (9e21ea1): the library's builder, the policy batch from the config
    # (smollm2.yaml: 192 wide, 0.3 s); set_mode then sets every setting under test, the KV reuse too.
    cfg.policy_batch = max(cfg.policy_batch, cfg.rollout.concurrency)
    dtype = torch.float16 if cfg.train.precision == "fp16" else torch.bfloat16
    model = learning_proof.random_model(args.random_weights, args.shape, dtype) if args.random_weights else None
    trainer = parts.build_trainer(cfg, model=model)
    modes = {"old": {"batch_wait_s": 0.3, "batch_gap_s": None, "micro_batch_tokens": 0, "hand_back": False,
                     "packed_gqa": False, "packed": False},
             "new": {"batch_wait_s": args.wait, "batch_gap_s": args.gap, "micro_batch_tokens": args.micro_batch_tokens,
                     "hand_back": True, "packed_gqa": True, "packed": args.packed,
                     "reuse_prefix": args.reuse_prefix, "fused_lora": True, "levers": True,
                     "compile_decode": args.compile_decode}}
    modes["join"] = {**modes["new"], "join": True, "reuse_prefix": False}  # new + continuous batching
    modes = {k: modes[k] for k in args.modes}
    rows: list[dict] = []
    async with parts.open_server(cfg) as server:
        with tempfile.TemporaryDirectory() as tmp:
            start = Path(tmp) / "start"
            trainer.save(start)
            if args.greedy_scenarios and len(modes) >= 2:
                from mcp_rl.rollout import gather_rollouts

                seen = {}
                for name, mode in modes.items():
                    set_mode(trainer, mode)
                    groups = await gather_rollouts(trainer.policy, server, test[: args.greedy_scenarios],
                                                   parts.rollout_config(cfg, temperature=0.0), desc=None)
                    seen[name] = tokens_of(groups)
                base, *others = list(seen)
                for other in others:
                    same = sum(a == b for a, b in zip(seen[base], seen[other]))
                    rows.append({"check": f"greedy tokens identical, {base} vs {other}", "same": same,
                                 "of": len(seen[base])})
                    print(f"greedy check: {same}/{len(seen[base])} rollouts with identical tokens, {base} vs {other}",
                          flush=True)
            for step in range(args.first_step - 1, args.first_step - 1 + args.steps):
                batch = pipeline.step_batch(train, step, cfg.train.groups_per_step, cfg.train.seed)
                names = list(modes)
                order = names[step % len(names):] + names[: step % len(names)]  # rotate: no mode always goes first
                if len(names) > 2 and (step // len(names)) % 2:  # and, with three, none always follows the same one
                    order.reverse()
                for name in order:
                    trainer.load(start)
                    set_mode(trainer, modes[name])
                    torch.manual_seed(cfg.train.seed + step)
                    calls = trainer.policy.generate_calls
                    t0 = time.monotonic()
                    rec = await pipeline.train_step(trainer, server, batch, cfg, step)
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    row = {"step": step + 1, "mode": name, **modes[name], "seconds": round(time.monotonic() - t0, 2),
                           "rollout_seconds": rec["rollout_seconds"],
                           "generate_calls": trainer.policy.generate_calls - calls,
                           "num_tokens": rec.get("num_tokens"), "tokens_per_s": rec.get("tokens_per_s"), "success_rate": rec["success_rate"],
                           # the trainer's own seconds (tokenize + forward/backward + optimizer): tokens / tokens_per_s
                           "train_seconds": round(rec["num_tokens"] / rec["tokens_per_s"], 2)
                           if rec.get("tokens_per_s") else None, "max_seq_tokens": rec.get("max_seq_tokens"),
                           "max_padding": rec.get("max_padding"), "tokenize_seconds": rec.get("tokenize_seconds"), "device": torch.cuda.get_device_name(0)
                           if torch.cuda.is_available() else "cpu",
                           # GPU peaks (train.gpu_peaks): the rollouts' (after trainer.load) and the update's
                           "peak_rollout_gib": rec.get("gpu_peak_gib_before_update"),
                           "peak_update_gib": rec.get("gpu_peak_gib_update"),
                           "groups_trained": rec.get("groups_trained"), "shape": args.shape if args.random_weights else None,
                           "precision": cfg.train.precision, "memory_cap_gib": args.memory_cap_gib or None,
                           # where the rollouts' seconds went (LocalPolicy.decode_stats over this step)
                           "decode": rec.get("decode")}
                    row["update_seconds"] = round(row["seconds"] - row["rollout_seconds"], 2)
                    row["rollout_gaps"] = gaps([s for s in trainer.policy.decode_spans if s[0] >= t0],
                                               t0, t0 + rec["rollout_seconds"])
                    row["first_of_call"] = not any(r.get("mode") == name for r in rows)  # pays this process's warm-up
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:  # row by row: a call cut off by its time limit keeps the steps done
                        with Path(args.out).with_suffix(".jsonl").open("a") as f:
                            f.write(json.dumps(row) + "\n")
                if args.advance:
                    trainer.save(start)
    return rows


def gaps(spans: list[tuple[float, float]], start: float, end: float) -> dict:
    """Where the rollouts' seconds went outside the GPU's decodes (LocalPolicy.decode_spans): before the first
    decode, between decodes, after the last (the step's tool calls, sessions, tokenizing and batches filling).

    >>> gaps([(1.0, 2.0), (2.5, 4.0)], 0.0, 5.0)
    {'before_first_s': 1.0, 'between_s': 0.5, 'after_last_s': 1.0, 'decoding_s': 2.5}
    """
    if not spans:
        return {"before_first_s": round(end - start, 3), "between_s": 0.0, "after_last_s": 0.0, "decoding_s": 0.0}
    spans = sorted(spans)
    between = sum(max(0.0, b[0] - a[1]) for a, b in zip(spans, spans[1:]))
    return {"before_first_s": round(spans[0][0] - start, 3), "between_s": round(between, 3),
            "after_last_s": round(max(0.0, end - spans[-1][1]), 3),
            "decoding_s": round(sum(b - a for a, b in spans), 3)}


def table(rows: list[dict], modes: list[str] | None = None) -> str:
    """The rows as a markdown table and the means; `modes` (as --modes gave them): the first is the baseline."""
    gib = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731  (no GPU: no peaks)
    lines = ["| step | mode | step s | rollouts s | rewards + update s | update s | decodes | trained tokens | "
             "update tok/s | longest seq | padding | peak GiB rollouts / update | prefill s | decode s | decode steps | "
             "joined | no decode running: before / between / after s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "mode" in r:
            d = r.get("decode") or {}  # the rollouts' sampling: GPU seconds in prefill and decode, rows that joined
            g = r.get("rollout_gaps") or {}
            lines.append(f"| {r['step']} | {r['mode']} | {r['seconds']:.1f} | {r['rollout_seconds']:.1f} | "
                         f"{r['update_seconds']:.1f} | {r.get('train_seconds') or 0:.1f} | {r['generate_calls']} | "
                         f"{r.get('num_tokens') or 0:.0f} | {r.get('tokens_per_s') or 0:.0f} | "
                         f"{r.get('max_seq_tokens') or 0:.0f} | {r.get('max_padding') or 0:.0f} | {gib(r.get('peak_rollout_gib'))} / "
                         f"{gib(r.get('peak_update_gib'))} | {d.get('prefill_s', 0):.1f} | {d.get('decode_s', 0):.1f} | "
                         f"{d.get('decode_steps', 0):.0f} | {d.get('joined', 0):.0f} | "
                         f"{g.get('before_first_s', 0):.1f} / {g.get('between_s', 0):.1f} / {g.get('after_last_s', 0):.1f} |")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    present = list(dict.fromkeys(r["mode"] for r in rows if "mode" in r))
    names = [m for m in (modes or []) if m in present] + [m for m in present if m not in (modes or [])]
    steps = {m: [r["seconds"] for r in rows if r.get("mode") == m] for m in names}
    if len(names) >= 2:
        base = names[0]
        lines += ["", "mean step: " + ", ".join(f"{m} {mean(steps[m]):.1f} s" for m in names) + "; speedup over "
                  + base + ": " + ", ".join(f"{m} {mean(steps[base]) / max(mean(steps[m]), 1e-9):.2f}x" for m in names[1:])]
        # Each process's first step of a mode pays one-off costs (compiling with --compile-decode, the allocator).
        later = {m: [r["seconds"] for r in rows if r.get("mode") == m and not r.get("first_of_call", r["step"] == 1)]
                 for m in names}
        if all(later.values()):
            lines += ["mean without each call's first step: " + ", ".join(f"{m} {mean(later[m]):.1f} s" for m in names)]
        upd = {m: [r["train_seconds"] for r in rows if r.get("mode") == m and r.get("train_seconds")] for m in names}
        peak = {m: max([r["peak_update_gib"] or 0 for r in rows if r.get("mode") == m], default=0) for m in names}
        if all(upd.values()):
            lines += ["mean update: " + ", ".join(f"{m} {mean(upd[m]):.1f} s" for m in names) + "; update peak: "
                      + ", ".join(f"{m} {peak[m]:.1f} GiB" for m in names)]
    lines += [f"{r['check']}: {r['same']}/{r['of']}" for r in rows if "check" in r]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "bench" / "experiments" / "learning" / "smollm2.yaml"))
    ap.add_argument("--steps", type=int, default=3, help="steps per mode (each from the same weights)")
    ap.add_argument("--wait", type=float, default=2.0, help="new mode: the longest a batch waits to fill")
    ap.add_argument("--gap", type=float, default=0.1, help="new mode: close the batch after this long without a request")
    ap.add_argument("--micro-batch-tokens", type=int, default=65536, help="new mode: padded tokens per micro-batch")
    ap.add_argument("--greedy-scenarios", type=int, default=32, help="held-out scenarios in the greedy check (0: none)")
    ap.add_argument("--packed", action="store_true", help="new mode: the packed update (no padding; "
                    "--micro-batch-tokens bounds its packed rows)")
    ap.add_argument("--reuse-prefix", action="store_true", help="new mode: keep each episode's KV cache between "
                    "its turns (policy_reuse_prefix, 1.5 GiB); old never does")
    ap.add_argument("--compile-decode", action="store_true", help="new mode: the decode step through torch.compile")
    ap.add_argument("--first-step", type=int, default=1, help="start at this step (its batch and seed), appending to "
                    "--out's rows: a run too long for one device call goes on in the next")
    ap.add_argument("--advance", action="store_true", help="keep each step's update (the next step starts after it)")
    ap.add_argument("--random-weights", metavar="TOKENIZER_DIR", default=None, help="random weights (machinery only)")
    ap.add_argument("--shape", choices=("smollm2", "tiny", "qwen3b"), default="smollm2", help="shape for --random-weights")
    ap.add_argument("--modes", nargs="+", choices=("old", "new", "join"), default=["old", "new"],
                    help="modes to time (join: new with continuous batching, LocalPolicy's join); the first is the "
                    "baseline the others are compared with")
    ap.add_argument("--memory-cap-gib", type=float, default=0.0, help="cap this process's GPU memory (a T4: 15)")
    ap.add_argument("--jitter-rewards", action="store_true", help="tiny random reward noise, so random weights' "
                    "groups are trained on (time and memory only)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="config overrides")
    ap.add_argument("--out", default=None, help="write the table here (and the rows beside it as .jsonl)")
    args = ap.parse_args(argv)
    if args.first_step > 1 and (args.advance or not args.out):
        ap.error("--first-step goes on from the steps in --out's rows, each from the same start: give --out, "
                 "and no --advance (its steps build on the ones before)")
    earlier: list[dict] = []
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        rows_file = Path(args.out).with_suffix(".jsonl")
        if args.first_step > 1:
            if not rows_file.exists():
                ap.error(f"--first-step {args.first_step}: no rows at {rows_file} to go on from (the earlier call's "
                         "--out, on this machine)")
            earlier = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
            if any("step" in r and r["step"] >= args.first_step for r in earlier):
                ap.error(f"{rows_file} already has steps from {args.first_step} on")
        else:
            rows_file.write_text("")
    rows = asyncio.run(bench(args))
    text = table(earlier + rows, args.modes)
    print(text, flush=True)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
