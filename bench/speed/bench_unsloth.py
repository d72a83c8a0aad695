"""Benchmark: the portable trainer with Unsloth vs with peft + bitsandbytes, at T4-like settings.

On one GPU, float16 (a T4 has no bf16: fp16 autocast with dynamic loss scaling), the process's
memory capped at --cap-gib (15, a T4) with `torch.cuda.set_per_process_memory_fraction`, on a
Qwen2.5-3B-shaped model with random weights (speed and memory only), 4-bit NF4 base, LoRA r=8 on
all 7 projections, gradient checkpointing (peft: transformers' own; Unsloth: "unsloth"):

- update:    one `PortableTrainer.train_step` on 8 sequences x 2048 tokens (2 groups of 4, as
             bench_trainer.py), one warm-up and --steps timed steps; backends unsloth and peft;
- sample:    tokens/s of 1, 16 and 64 concurrent `complete` calls (rollout prompts, 128 tokens,
             temperature 1): UnslothPolicy (Unsloth's generate) and LocalPolicy (CUDA-graph loop);
- grpo_step: Unsloth only: 4 groups x 6 rollouts of up to 8 turns against the company server
             in-process (`gather_rollouts`), the tool-call envelope forced (a random model emits
             none), then the update. Random weights earn no reward signal, so the rewards are
             set to seeded random numbers before `train`: the step costs what a real one does.

Each backend runs in its own subprocess (importing Unsloth patches transformers and peft for the
whole process). Rows are appended to --out as JSON lines {"backend", "shape", "kind", "dtype",
"step_s", "peak_gib", "tokens_s", ...}; failures are rows too ({"error": ...}).

    python bench/speed/bench_unsloth.py --tokenizer /tmp/tok --out bench/results/unsloth.jsonl \
        --backends peft unsloth                  # on the GPU machine, after the bundle calls
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (ROOT, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def _cap(gib: float) -> None:
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total))


def _peak() -> tuple[float, float]:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30


def _reset() -> None:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def build(backend: str, model_dir: str, args):
    """(trainer, policy) for `backend`, float16, 4-bit base."""
    from mcp_rl.training.portable import PortableTrainer

    if backend == "unsloth":
        from mcp_rl.policies.unsloth_loader import UnslothPolicy, load_unsloth_model

        model, tok = load_unsloth_model(model_dir, load_in_4bit=True, dtype="float16", max_seq_len=args.max_seq_len,
                                        lora_r=8, lora_alpha=16)
        policy = UnslothPolicy(model, tok, name="qwen3b-shape", max_batch=64, batch_wait_s=0.05)
        trainer = PortableTrainer(policy, learning_rate=1e-5, micro_batch_size=args.micro, max_seq_len=args.max_seq_len,
                                  precision="fp16")
    else:
        from mcp_rl.policies.local_policy import LocalPolicy, load_local_model

        model, tok = load_local_model(model_dir, quantize_4bit=True, dtype="float16")
        policy = LocalPolicy(model, tok, name="qwen3b-shape", max_batch=64, batch_wait_s=0.05)
        trainer = PortableTrainer(policy, learning_rate=1e-5, lora_r=8, lora_alpha=16, micro_batch_size=args.micro,
                                  max_seq_len=args.max_seq_len, precision="fp16", gradient_checkpointing=True)
    return trainer, policy, tok


def bench_update(trainer, tok, args) -> dict:
    from bench_trainer import groups_for

    groups, seq_len = groups_for(tok, 2048, 8)
    trainer.train_step(groups)  # warm-up: kernels, allocator, optimizer state
    _reset()
    secs, tokens, m = 0.0, 0.0, {}
    for _ in range(args.steps):
        m = trainer.train_step(groups)
        secs, tokens = secs + m["seconds"], tokens + m["num_tokens"]
    alloc, reserved = _peak()
    return {"kind": "update", "seqs": 8, "seq_len": seq_len, "micro_batch": args.micro, "steps": args.steps,
            "step_s": secs / args.steps, "tokens_s": tokens / secs, "peak_gib": alloc, "peak_reserved_gib": reserved,
            "loss": m.get("loss"), "skipped_steps": m.get("skipped_steps")}


async def bench_sample(policy, args) -> list[dict]:
    from bench_generation import requests, timed

    policy.model.eval()  # a PeftModel starts in train mode: with checkpointing on, no KV cache (see RESULTS)
    await timed(policy, requests(2), 8, concurrent=True)  # warm-up
    rows = []
    for c in (1, 16, 64):
        _reset()
        s, n = await timed(policy, requests(c), 128, concurrent=True)
        alloc, reserved = _peak()
        rows.append({"kind": "sample", "concurrent": c, "tokens": n, "step_s": s, "tokens_s": n / s,
                     "peak_gib": alloc, "peak_reserved_gib": reserved})
    return rows


async def bench_grpo_step(trainer, policy, args) -> dict:
    import tempfile

    import mcp_server
    from mcp_rl.rollout import RolloutConfig, gather_rollouts
    from mcp_rl.tasks.scenarios import load_scenarios

    server = mcp_server.build_server(Path(tempfile.mkdtemp()) / "company.db")
    scenarios = load_scenarios(ROOT / "data" / "scenarios.jsonl", split="train")[:4]
    cfg = RolloutConfig(max_turns=8, max_tokens=args.turn_tokens, temperature=1.0, concurrency=24)
    policy.tool_prefix = True
    _reset()
    t0 = time.perf_counter()
    groups = await gather_rollouts(policy, server, scenarios, cfg, group_size=6, desc="grpo step")
    rollout_s = time.perf_counter() - t0
    rng = random.Random(0)
    for g in groups:
        for t in g.trajectories:
            t.reward = rng.random()
    metrics = await trainer.train(groups)
    total = time.perf_counter() - t0
    alloc, reserved = _peak()
    trajs = [t for g in groups for t in g.trajectories]
    turns = [sum(1 for m in t.messages_and_choices if not isinstance(m, dict)) for t in trajs]
    return {"kind": "grpo_step", "groups": 4, "group_size": 6, "max_turns": 8, "turn_tokens": args.turn_tokens,
            "step_s": total, "rollout_s": rollout_s, "update_s": metrics["seconds"], "peak_gib": alloc,
            "peak_reserved_gib": reserved, "mean_turns": sum(turns) / len(turns),
            "num_sequences": metrics["num_sequences"], "num_tokens": metrics["num_tokens"],
            "tokens_s": metrics["num_tokens"] / total, "updated": metrics["updated"],
            "skipped_too_long": metrics["skipped_too_long"]}


def child(args) -> int:
    """One backend in this process: every kind asked for, each row appended to --out as it ends."""
    import torch
    import transformers

    _cap(args.cap_gib)
    base = {"backend": args.child, "shape": "qwen2.5-3b", "dtype": "float16", "cap_gib": args.cap_gib,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__}

    def emit(row: dict) -> None:
        row = {**base, **row}
        print(json.dumps(row), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")

    t0 = time.perf_counter()
    try:
        trainer, policy, tok = build(args.child, args.model_dir, args)
    except Exception as e:  # noqa: BLE001 - a failed load is a result too
        emit({"kind": "load", "error": f"{type(e).__name__}: {e}"[:500]})
        traceback.print_exc()
        return 1
    if args.child == "unsloth":
        import unsloth

        base["unsloth"] = unsloth.__version__
    else:
        import bitsandbytes

        base["bitsandbytes"] = bitsandbytes.__version__
    base["load_s"] = round(time.perf_counter() - t0, 1)
    for kind in args.kinds:
        if kind == "grpo_step" and args.child != "unsloth":
            continue
        try:
            if kind == "update":
                emit(bench_update(trainer, tok, args))
            elif kind == "sample":
                for row in asyncio.run(bench_sample(policy, args)):
                    emit(row)
            elif kind == "grpo_step":
                emit(asyncio.run(bench_grpo_step(trainer, policy, args)))
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            emit({"kind": kind, "error": f"{type(e).__name__}: {e}"[:500]})
            if "out of memory" in str(e).lower():
                _reset()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="SmolLM2 tokenizer folder, saved beside the random model")
    ap.add_argument("--model-dir", default="/tmp/qwen3b-shape")
    ap.add_argument("--backends", nargs="+", default=["peft", "unsloth"], choices=["peft", "unsloth"])
    ap.add_argument("--kinds", nargs="+", default=["update", "sample", "grpo_step"])
    ap.add_argument("--cap-gib", type=float, default=15.0)
    ap.add_argument("--micro", type=int, default=2, help="micro batch of the update")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--turn-tokens", type=int, default=128, help="grpo_step: max new tokens per turn")
    ap.add_argument("--timeout-s", type=int, default=400, help="per backend subprocess")
    ap.add_argument("--out", required=True)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    from bench_generation import QWEN3B
    from bench_trainer import save_random_model

    save_random_model(Path(args.model_dir), QWEN3B, args.tokenizer)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for backend in args.backends:
        cmd = [sys.executable, __file__, "--child", backend, *(argv if argv is not None else sys.argv[1:])]
        try:
            rc = subprocess.run(cmd, timeout=args.timeout_s, env=os.environ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
            with open(args.out, "a") as f:
                f.write(json.dumps({"backend": backend, "shape": "qwen2.5-3b", "error": f"timed out after {args.timeout_s} s"}) + "\n")
        print(f"{backend}: exit {rc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
