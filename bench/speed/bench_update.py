"""Benchmark: the GRPO update alone, padded (today's) vs packed (mcp_rl/training/packing.py), on the same sequences.

bench/speed/bench_step.py times whole steps, whose modes sample their own rollouts (trained tokens differ up to 4x
between modes in one step). This one feeds both update paths the same synthetic step: STEP_SEQS sequences
shaped like a learning run's (a prompt of tool schemas, assistant turns of 30-128 tokens between tool
results, lengths log-normal around --mean-len, one sequence at --longest: Gemma 3 270M's step 3 had 8078),
random weights in the real model's shape (Gemma 3 270M or SmolLM2-135M; speed and memory do not depend on
the weights), bf16 weights and autocast, LoRA r=16 on all linear layers as the pre-registered configs. Each
repetition runs every mode (old, new, new-B; the order reversed every other one) from the same LoRA weights;
a row per update: seconds, tokens/s, peak GiB (torch.cuda.max_memory_allocated; it counts every mode's model
copy, static_gib says how much of it was there before the update), MFU, and the loss (all modes must agree).

    python bench/speed/bench_update.py --shape gemma3-270m --reps 3 --out $OUT/update_gemma.jsonl
    python bench/speed/bench_update.py --shape qwen3b --checkpointing --seqs 24 --mean-len 2048 --longest 8192 \
        --old-micro-batch 2 --budget 16384 32768 --reps 2      # new at 16384, new-32768 beside it
    python bench/speed/bench_update.py --shape tiny --seqs 8 --mean-len 60 --longest 120 --reps 1   # CPU check

Levers (mcp_rl/training/kernels.py; bench/speed/attribute_update.py traces what they remove): `--levers lora-casts
fused-add liger` times, alternating, `new` (packed, the first --budget) against new + each lever and new + all of
them (no old mode unless --with-old), with the same LoRA start, so every row must print the same loss to bf16
rounding. Each row records what actually ran (`levers_ran`: LoRA input casts skipped, LoRA layers fused, Liger's
kernels applied and whether the RoPE function called is Liger's): Liger replaces RoPE module-wide, so the bench
sets the function each mode should call before its update. Liger needs CUDA: asked for on a CPU the bench stops
before timing anything, saying so. The LoRA levers need autocast (--precision bf16 on a CPU).

    python bench/speed/bench_update.py --shape qwen3b --checkpointing --seqs 24 --mean-len 2048 --longest 8192 \
        --budget 8192 --reps 2 --levers lora-casts fused-add liger --out $OUT/update_qwen3b_levers.jsonl
    python bench/speed/bench_update.py --shape tiny --seqs 8 --mean-len 60 --longest 120 --reps 1 --precision bf16 \
        --levers lora-casts fused-add                                          # CPU check of the lever modes
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GEMMA = dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
             num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768,
             query_pre_attn_scalar=256, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
             layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
               tie_word_embeddings=True)
QWEN3B = dict(vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
              num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              tie_word_embeddings=True)  # Qwen2.5-3B-Instruct's shape (Qwen2's q/k/v biases left out: a rounding error)
TINY = dict(SMOLLM2, vocab_size=500, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


LEVERS = {"lora-casts": "lora_no_upcast", "fused-add": "lora_fused_add", "liger": "liger_kernels"}


def model_of(shape: str, device: str, dtype=None):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 3B model's random init on the host took minutes of GPU lease
        if shape == "gemma3-270m":
            model = Gemma3ForCausalLM(Gemma3TextConfig(**GEMMA, bos_token_id=2, eos_token_id=1, pad_token_id=0))
        else:
            model = LlamaForCausalLM(LlamaConfig(**{"smollm2": SMOLLM2, "qwen3b": QWEN3B}.get(shape, TINY),
                                                 bos_token_id=1, eos_token_id=2, pad_token_id=2))
    dtype = dtype or (torch.bfloat16 if device == "cuda" else torch.float32)
    return model.to(device=device, dtype=dtype).eval()


def levers_ran(trainer) -> dict:
    """What this trainer's update actually runs: packing and the fused head, and the levers (the LoRA ones need
    autocast)."""
    from mcp_rl.training import kernels

    autocast = trainer.precision in ("bf16", "fp16")
    fused = sum(kernels.fusable(m) for m in trainer.model.modules()) if trainer.lora_fused_add and autocast else 0
    return {"packed": trainer.packed, "fused_head": trainer._fused,  # a failed probe (packing_works) turns packing off
            "lora_no_upcast": trainer.lora_no_upcast and autocast, "lora_fused_layers": fused,
            "liger": list(trainer.liger), "liger_rope": kernels.rope_is_liger(trainer.model)}


class Rope:
    """Liger replaces the rotary function of the model's transformers module for every model of the type: kept
    here per mode, set before each mode's update."""

    def __init__(self, model):
        import importlib

        from mcp_rl.training.kernels import ROPE_MODULES

        path = ROPE_MODULES.get(model.config.model_type)
        self.module = importlib.import_module(path) if path else None
        self.original = self.module.apply_rotary_pos_emb if self.module else None
        self.by_mode: dict[str, object] = {}

    def keep(self, mode: str, liger: bool) -> None:  # right after building the mode's trainer
        if self.module:
            self.by_mode[mode] = self.module.apply_rotary_pos_emb if liger else self.original
            self.module.apply_rotary_pos_emb = self.original

    def use(self, mode: str) -> None:
        if self.module:
            self.module.apply_rotary_pos_emb = self.by_mode[mode]


def step_seqs(n: int, mean_len: int, longest: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    lengths = [min(longest, max(mean_len // 3, int(rng.lognormvariate(math.log(mean_len) - 0.08, 0.4))))
               for _ in range(n - 1)] + [longest]
    seqs = []
    for n_tok in lengths:
        prompt = min(n_tok // 2, mean_len // 2)
        mask = [0] * prompt
        while len(mask) < n_tok:  # an assistant turn, then a tool result
            turn = rng.randint(30, 128)
            mask += [1] * turn + [0] * rng.randint(40, 400)
        mask = mask[:n_tok]
        mask[-1] = 1  # the last turn ends the episode: at least one trained token
        seqs.append({"ids": [rng.randrange(3, vocab) for _ in range(n_tok)], "mask": mask,
                     "old": [-rng.random() * 3 if m else float("nan") for m in mask], "adv": rng.uniform(-1, 1)})
    return seqs


def update(trainer, seqs: list[dict]) -> dict:
    """train_step's update without ART's tokenizer: the same micro-batches, loss, backward and optimizer step."""
    import torch

    from mcp_rl.training.loss import grpo_loss

    cuda = trainer.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # What the process holds before the update: every mode's model copy (the bench keeps all of them on the GPU),
    # so peak_gib is comparable between modes of one run only; peak_gib - static_gib is this update's own.
    static = torch.cuda.memory_allocated() / 2**30 if cuda else None
    t0 = time.perf_counter()
    constant, total, batches = trainer.max_seq_len * len(seqs), 0.0, trainer._micro_batches(seqs)
    trainer.model.train()
    with trainer.levers():
        for batch in batches:
            new, old, mask = trainer._logprobs(batch)
            adv = torch.tensor([s["adv"] for s in batch], device=trainer.device)
            loss = grpo_loss(new, old, adv, mask, kind="dr_grpo", constant=constant)
            trainer._backward(loss)
            total += float(loss.detach())
        grad_norm = trainer._update(trainer.optimizer)
    trainer.model.eval()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = sum(len(s["ids"]) for s in seqs)
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds),
            "micro_batches": len(batches), "loss": total, "grad_norm": grad_norm,
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            "static_gib": round(static, 2) if cuda else None}


def lever_table(timed: dict[str, list[dict]]) -> str:
    """Mean seconds, tokens/s, MFU, the update's own peak, the loss and what ran, a row per mode; speedup and the
    loss's relative difference against `new`."""
    lines = ["| mode | s | x new | tokens/s | MFU | peak over static GiB | loss | rel. diff | levers ran |",
             "|---|---|---|---|---|---|---|---|---|"]
    ref = timed.get("new") or []
    ref_s = sum(r["seconds"] for r in ref) / len(ref) if ref else None
    worst = 0.0
    for mode, rs in timed.items():
        if not rs:
            lines.append(f"| {mode} | failed | | | | | | | |")
            continue
        s = sum(r["seconds"] for r in rs) / len(rs)
        peak = max((r["peak_gib"] or 0) - (r["static_gib"] or 0) for r in rs) if rs[0]["peak_gib"] is not None else None
        diff = abs(rs[0]["loss"] - ref[0]["loss"]) / max(abs(ref[0]["loss"]), 1e-12) if ref else float("nan")
        worst = max(worst, diff) if mode != "old" else worst
        ran = rs[0]["levers_ran"]
        said = ", ".join([*([] if ran["packed"] or mode == "old" else ["NOT PACKED"]),
                          *(["no-upcast"] if ran["lora_no_upcast"] else []),
                          *([f"fused {ran['lora_fused_layers']} LoRA"] if ran["lora_fused_layers"] else []),
                          *([f"liger {'+'.join(ran['liger'])} (rope {'liger' if ran['liger_rope'] else 'hf'})"]
                            if ran["liger"] else [])]) or "none"
        lines.append(f"| {mode} | {s:.2f} | {ref_s / s if ref_s else float('nan'):.2f}x | "
                     f"{sum(r['tokens_per_s'] for r in rs) / len(rs):,.0f} | {sum(r['mfu'] for r in rs) / len(rs):.1%} | "
                     f"{'-' if peak is None else f'{peak:.2f}'} | {rs[0]['loss']:.6g} | {diff:.1e} | {said} |")
    lines.append(f"largest relative loss difference from new: {worst:.1e} "
                 f"({'within' if worst <= 1e-2 else 'OVER'} bf16 rounding, 1e-2)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import torch

    from mcp_rl.training.portable import PortableTrainer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=("gemma3-270m", "smollm2", "qwen3b", "tiny"), default="gemma3-270m")
    ap.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in both modes (the 3B shape)")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="the GPU's dense bf16 peak (H100 SXM: 989.4)")
    ap.add_argument("--seqs", type=int, default=192, help="sequences in the step (12 groups x 16)")
    ap.add_argument("--mean-len", type=int, default=1250)
    ap.add_argument("--longest", type=int, default=8078)
    ap.add_argument("--old-micro-batch", type=int, default=8, help="old: sequences a micro-batch (pre-registered 8)")
    ap.add_argument("--budget", type=int, nargs="+", default=[16384],
                    help="new: tokens of a micro-batch's packed rows; several: a mode new-B for each after the first")
    ap.add_argument("--levers", nargs="*", default=[], choices=list(LEVERS),
                    help="time new + each lever and new + all of them beside new (mcp_rl/training/kernels.py)")
    ap.add_argument("--with-old", action="store_true", help="with --levers: the old padded mode too")
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16", "fp32"),
                    help="the trainer's (auto: bf16 on an H100, fp32 on a CPU); the model's weights follow it")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="rows as JSONL")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if "liger" in args.levers and device != "cuda":
        ap.error("--levers liger: Liger-Kernel's kernels need a CUDA GPU and there is none here (leave liger out)")
    from mcp_rl.training.portable import resolve_precision

    precision = resolve_precision(args.precision, torch.device(device))
    base = model_of(args.shape, device, {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32))
    seqs = step_seqs(args.seqs, args.mean_len, args.longest, base.config.vocab_size)
    n_params = sum(p.numel() for p in base.parameters())
    budgets = {"old": 0, "new": args.budget[0], **{f"new-{b}": b for b in args.budget[1:]}}
    switches = {m: {} for m in budgets}
    if args.levers:  # new against new + each lever and new + all: one budget, the old mode on request
        budgets = {**({"old": 0} if args.with_old else {}), "new": args.budget[0]}
        switches = {m: {} for m in budgets}
        combos = [[lv] for lv in args.levers] + ([list(args.levers)] if len(args.levers) > 1 else [])
        for combo in combos:
            mode = "new+" + ("all" if len(combo) > 1 else combo[0])
            budgets[mode], switches[mode] = args.budget[0], {LEVERS[lv]: True for lv in combo}
    rope = Rope(base)
    trainers = {}
    for i, (mode, budget) in enumerate(budgets.items()):
        torch.manual_seed(1)  # the same LoRA initialisation
        tok = types.SimpleNamespace(pad_token_id=0)  # no text: the sequences are token ids already
        model = copy.deepcopy(base) if i < len(budgets) - 1 else base  # the last mode takes the original
        policy = types.SimpleNamespace(model=model, tokenizer=tok, step=0)
        trainers[mode] = PortableTrainer(
            policy, learning_rate=2e-4, lora_r=16, lora_alpha=32, max_seq_len=8192, precision=precision,
            micro_batch_size=args.old_micro_batch, micro_batch_tokens=budget,
            packed=mode != "old", gradient_checkpointing=args.checkpointing, **switches[mode])
        trainers[mode].tokenizer = policy.tokenizer
        rope.keep(mode, bool(trainers[mode].liger))
    del base, model
    print(f"{args.shape}: {len(seqs)} sequences, {sum(len(s['ids']) for s in seqs)} tokens, "
          f"{sum(sum(s['mask']) for s in seqs)} trained, longest {max(len(s['ids']) for s in seqs)}; "
          f"packed {trainers['new'].packed}, fused head {trainers['new']._fused}", flush=True)
    # Model FLOPs utilisation by the usual convention: 6 x parameters per trained-over token (forward and
    # backward; attention's own FLOPs and checkpointing's recompute not counted), over the GPU's dense peak.
    rows = []
    for rep in range(args.reps + 1):  # rep 0 warms up (Triton and cuBLAS autotuning)
        for mode in (list(budgets) if rep % 2 == 0 else list(budgets)[::-1]):
            state = {n: p.detach().clone() for n, p in trainers[mode].model.named_parameters() if p.requires_grad}
            rope.use(mode)
            ran = levers_ran(trainers[mode])
            try:
                result = update(trainers[mode], seqs)
            except torch.OutOfMemoryError as e:  # a miss to report, not a crash: the other mode still runs
                trainers[mode].optimizer.zero_grad(set_to_none=True)
                result = {"error": "out of memory", "detail": str(e)[:200]}
                torch.cuda.empty_cache()
            if "seconds" in result:
                result["mfu"] = round(6 * n_params * result["tokens"] / result["seconds"] / (args.peak_tflops * 1e12), 4)
            row = {"shape": args.shape, "rep": rep, "mode": mode, "warmup": rep == 0, **result, "precision": precision,
                   "checkpointing": args.checkpointing, "budget": budgets[mode], "levers_ran": ran,
                   "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
            with torch.no_grad():  # back to the same weights: every update starts from the same LoRA
                for n, p in trainers[mode].model.named_parameters():
                    if n in state:
                        p.copy_(state[n])
            rows.append(row)
            print(json.dumps(row), flush=True)
    timed = {m: [r for r in rows if r["mode"] == m and not r["warmup"] and "error" not in r] for m in budgets}
    if args.levers:
        print(lever_table(timed), flush=True)
    for m in (m for m in budgets if m != "old" and timed[m] and timed.get("old")):
        mean = {k: sum(r["seconds"] for r in timed[k]) / len(timed[k]) for k in ("old", m)}
        peak = {k: max((r["peak_gib"] or 0) - (r["static_gib"] or 0) for r in timed[k]) for k in ("old", m)}
        mfu = {k: sum(r["mfu"] for r in timed[k]) / len(timed[k]) for k in ("old", m)}
        print(f"mean update: old {mean['old']:.2f} s, {m} {mean[m]:.2f} s, {mean['old'] / mean[m]:.2f}x; "
              f"peak over static old {peak['old']:.1f} GiB, {m} {peak[m]:.1f} GiB; "
              f"MFU old {mfu['old']:.1%}, {m} {mfu[m]:.1%}; "
              f"loss old {timed['old'][0]['loss']:.6g}, {m} {timed[m][0]['loss']:.6g}", flush=True)
    if args.out:
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
