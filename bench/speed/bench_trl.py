"""Benchmark: one GRPO step of our PortableTrainer against TRL's GRPOTrainer, same model, same batch.

Both trainers get the Qwen2.5-3B-shaped random model and the batch of bench_trainer.py: 2 groups x 4
trajectories x 2048 tokens (a third prompt, the rest one assistant turn), LoRA r=8 alpha=16 on all
linear layers, gradient checkpointing (non-reentrant), bf16 autocast, Dr. GRPO loss, beta=0 (no
reference model), micro batch 2 with gradient accumulation over the 8 sequences, clipping at 1.0,
then one AdamW step at lr 1e-5. Each trainer loads its own copy of the model, one after the other
in the same process, runs one warm-up step and --steps timed ones; peak GPU memory is reset after
the warm-up. Tokens/s counts every token of every sequence for both.

  ours  `PortableTrainer.train_step(groups)`, the pipeline's call, including ART's tokenization of
        the trajectories (its cost is printed apart).
  TRL   `GRPOTrainer(..., peft_config=LoraConfig(...))`, then per micro-batch its `training_step`
        (compute_loss + accelerator.backward) on the dict `_generate_and_score_completions` returns,
        built from the same ART token ids, masks, sampled logprobs and advantages (its
        `_prepare_inputs` is bypassed, so no generation); then clipping and the optimizer from its
        own `create_optimizer()` (fused AdamW), as `Trainer.train` does.

What differs between the two steps: TRL computes log-probs through its fused LM head (tiles of the
vocab projection, a Triton kernel on CUDA, never the full [B, T, vocab] logits) and also each
token's entropy; ours materialises the fp32 logits of the completion positions and takes
logsumexp. TRL's dr_grpo divides by max_completion_length (set to the completion length here),
ours by max_seq_len: a constant scale on the gradient. Only bf16: 4-bit needs bitsandbytes.

    python bench/speed/bench_trl.py --tokenizer DIR --out bench/results/trl.txt
    python bench/speed/bench_trl.py --tokenizer DIR --ours old new:4096 new:16384 --out $OUT/trl_new.txt   # both settings
    python bench/speed/bench_trl.py --tokenizer DIR --shape tiny --seq-len 256   # CPU check
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # TRL pings the Hub (telemetry) when a trainer is built
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_generation import write_outputs  # noqa: E402
from bench_trainer import QWEN3B, TINY, groups_for, save_random_model  # noqa: E402

from mcp_rl.policies.local_policy import LocalPolicy, art_tokenizer, load_local_model  # noqa: E402
from mcp_rl.training.portable import PortableTrainer  # noqa: E402


def fresh_model(model_dir: Path):
    """(cuda?, model, tokenizer, load seconds), loaded after emptying the GPU and resetting its peak counters,
    so each trainer's peak is its own."""
    import torch

    cuda = torch.cuda.is_available()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model, tok = load_local_model(str(model_dir))
    return cuda, model, tok, time.perf_counter() - t0


def bench_ours(model_dir: Path, micro: int, budget: int, args) -> dict:
    """PortableTrainer.train_step, as bench_trainer.bench_mode (bf16, checkpointing, LoRA r=8), in one of two
    settings: budget 0 = old (padded micro-batches of `micro` sequences), else new (`packed=True`,
    `micro_batch_tokens=budget`: packed rows, the LM head only on trained tokens through Liger's fused kernel)."""
    import torch

    cuda, model, tok, load_s = fresh_model(model_dir)
    trainer = PortableTrainer(LocalPolicy(model, tok, name="qwen3b-shape"), learning_rate=1e-5, micro_batch_size=micro,
                              max_seq_len=args.seq_len, gradient_checkpointing=True, precision="bf16",
                              micro_batch_tokens=budget, packed=budget > 0)
    if budget and not trainer.packed:
        print("warning: ours-new asked for packed sequences and the probe refused them: padded path", flush=True)
    static = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")
    groups, seq_len = groups_for(tok, args.seq_len, args.seqs)
    trainer.train_step(groups)  # warm-up: kernels, allocator, optimizer state
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tokens, seconds, loss, tok_s = 0.0, 0.0, 0.0, 0.0
    for _ in range(args.steps):
        m = trainer.train_step(groups)
        if cuda:
            torch.cuda.synchronize()
        tokens, seconds, loss = tokens + m["num_tokens"], seconds + m["seconds"], m["loss"]
        tok_s += m["tokenize_seconds"]
        assert m["updated"] == 1.0 and m["num_sequences"] == args.seqs, m
    row = {"trainer": "mcp_rl PortableTrainer" + (" new" if budget else ""), "label": "ours-new" if budget else "ours",
           "micro_batch": budget or micro, "seqs": args.seqs,
           "seq_len": seq_len, "steps": args.steps, "s_per_step": seconds / args.steps, "tok_s": tokens / seconds,
           "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
           "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan"),
           "static_gib": static, "load_s": load_s, "loss": loss, "packed": trainer.packed, "fused_head": trainer._fused,
           "budget": budget, "art_tokenize_s": tok_s / args.steps}
    del trainer, model
    return row


def sequences(tok, groups) -> list[dict]:
    """ART's tokenization (what PortableTrainer trains on), split into TRL's prompt / completion."""
    import math

    from art.preprocessing.tokenize import tokenize_trajectory_groups

    out = []
    for r in tokenize_trajectory_groups(art_tokenizer(tok), groups, allow_training_without_logprobs=False,
                                        scale_rewards=False):
        ids, mask = list(r.token_ids), list(r.assistant_mask)
        first = mask.index(1)
        out.append({"prompt": ids[:first], "completion": ids[first:], "mask": mask[first:], "adv": float(r.advantage),
                    "old": [0.0 if math.isnan(x) else float(x) for x in r.logprobs[first:]]})
    return out


def collate(seqs: list[dict], pad: int, device) -> dict:
    """A micro-batch as `_generate_and_score_completions` returns it: prompts left-padded, completions right-padded."""
    import torch

    p, c = max(len(s["prompt"]) for s in seqs), max(len(s["completion"]) for s in seqs)

    def t(rows, dtype=torch.long):
        return torch.tensor(rows, dtype=dtype, device=device)

    return {"prompt_ids": t([[pad] * (p - len(s["prompt"])) + s["prompt"] for s in seqs]),
            "prompt_mask": t([[0] * (p - len(s["prompt"])) + [1] * len(s["prompt"]) for s in seqs]),
            "completion_ids": t([s["completion"] + [pad] * (c - len(s["completion"])) for s in seqs]),
            "completion_mask": t([s["mask"] + [0] * (c - len(s["mask"])) for s in seqs]),
            "old_per_token_logps": t([s["old"] + [0.0] * (c - len(s["old"])) for s in seqs], torch.float),
            "advantages": t([s["adv"] for s in seqs], torch.float),
            "num_items_in_batch": t(sum(sum(s["mask"]) for s in seqs))}


def zero_reward(completions, **kwargs) -> list[float]:
    return [0.0] * len(completions)  # never called: there is no generation here


def bench_trl(model_dir: Path, micro: int, args) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    cuda, model, tok, load_s = fresh_model(model_dir)
    groups, seq_len = groups_for(tok, args.seq_len, args.seqs)
    t0 = time.perf_counter()
    seqs = sequences(tok, groups)  # the same ART call as inside our train_step: its cost is reported apart
    tokenize_s = time.perf_counter() - t0
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_trl_"), per_device_train_batch_size=micro,
        gradient_accumulation_steps=args.seqs // micro, num_generations=4,
        max_completion_length=max(len(s["completion"]) for s in seqs), learning_rate=1e-5, adam_beta2=0.99,
        weight_decay=0.0, max_grad_norm=1.0, beta=0.0, loss_type="dr_grpo", epsilon=0.2, scale_rewards="none",
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}, bf16=True,
        use_cpu=not cuda, report_to="none", logging_strategy="no", save_strategy="no", disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=zero_reward, args=config, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": ["unused"] * args.seqs}),
                          peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    # What Trainer.train does before its loop; then no generation: the batch is ready.
    trainer.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer._prepare_inputs = lambda batch: batch
    trainer.current_gradient_accumulation_steps = args.seqs // micro
    optimizer = trainer.create_optimizer()
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    device = next(trainer.model.parameters()).device
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batches = [collate(seqs[i:i + micro], pad, device) for i in range(0, len(seqs), micro)]
    tokens = sum(len(s["prompt"]) + len(s["completion"]) for s in seqs)
    static = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")

    def step() -> float:
        loss = sum(float(trainer.training_step(trainer.model, b, b["num_items_in_batch"])) for b in batches)
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        return loss

    step()  # warm-up: kernels, allocator, optimizer state
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    seconds = time.perf_counter() - t0
    row = {"trainer": "TRL GRPOTrainer", "micro_batch": micro, "seqs": args.seqs, "seq_len": seq_len,
           "steps": args.steps, "s_per_step": seconds / args.steps, "tok_s": tokens * args.steps / seconds,
           "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
           "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else float("nan"),
           "static_gib": static, "load_s": load_s, "loss": loss, "completion_len": config.max_completion_length,
           "art_tokenize_s": tokenize_s}
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'trainer':<26} | {'micro':>5} | {'seqs x len':>10} | {'s/step':>6} | {'tok/s':>7} | "
            f"{'peak alloc GiB':>14} | {'peak reserved GiB':>17} | {'weights+LoRA GiB':>16}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['trainer']:<26} | {r['micro_batch']:>5} | {r['seqs']:>4} x {r['seq_len']:<4} | "
                     f"{r['s_per_step']:>6.2f} | {r['tok_s']:>7.0f} | {r['peak_alloc_gib']:>14.2f} | "
                     f"{r['peak_reserved_gib']:>17.2f} | {r['static_gib']:>16.2f}")
    trl = rows[-1]
    for ours in rows[:-1]:
        name = f"TRL / {ours['label']}"
        lines.append(f"{name:<26} | {'':>5} | {'':>10} | {trl['s_per_step'] / ours['s_per_step']:>5.2f}x | "
                     f"{trl['tok_s'] / ours['tok_s']:>6.2f}x | "
                     f"{trl['peak_alloc_gib'] / ours['peak_alloc_gib']:>13.2f}x | "
                     f"{trl['peak_reserved_gib'] / ours['peak_reserved_gib']:>16.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder (SmolLM2's) saved beside the random model")
    ap.add_argument("--model-dir", default="/tmp/qwen3b-shape", help="where the random model is saved (reused)")
    ap.add_argument("--shape", choices=["qwen3b", "tiny"], default="qwen3b")
    ap.add_argument("--micro", type=int, default=2, help="micro batch size of both trainers")
    ap.add_argument("--seqs", type=int, default=8, help="sequences per step (groups of 4); a multiple of --micro")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per trainer (after one warm-up)")
    ap.add_argument("--ours", nargs="+", default=["old"], metavar="old|new:BUDGET",
                    help="our settings, each timed beside TRL: old (padded micro-batches of --micro) or new:BUDGET "
                         "(packed, micro-batches of BUDGET tokens of packed rows)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.seqs % 4 or args.seqs % args.micro:
        ap.error("--seqs must be a multiple of 4 (the group size) and of --micro")
    import torch
    import transformers
    import trl

    model_dir = Path(args.model_dir if args.shape == "qwen3b" else args.model_dir + "-tiny")
    save_random_model(model_dir, QWEN3B if args.shape == "qwen3b" else TINY, args.tokenizer)
    rows = []
    for spec in args.ours:
        rows.append(bench_ours(model_dir, args.micro, int(spec.partition(":")[2] or 0) if spec != "old" else 0, args))
        print(json.dumps(rows[-1]), flush=True)  # kept in the log if TRL's side then fails
    rows.append(bench_trl(model_dir, args.micro, args))
    trl_row = rows[-1]
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = "\n".join([
        f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
        f"device: {dev} | torch {torch.__version__} | transformers {transformers.__version__} | trl {trl.__version__} "
        f"| python {platform.python_version()}",
        f"model: {args.shape}-shaped Qwen2, random weights | LoRA r=8 all-linear | gradient checkpointing "
        f"| bf16 autocast | dr_grpo, beta=0 | {args.steps} timed steps after 1 warm-up "
        "| tokens/s counts every token of every sequence",
        "", table(rows), "",
        "ours-old: padded micro-batches of `micro` sequences; ours-new: `micro` is its token budget (packed rows, "
        "the LM head only on trained tokens, Liger's fused kernel where it runs)",
        *(f"{r['label']}: packed {r['packed']}, fused head {r['fused_head']}, ART tokenization "
          f"{r['art_tokenize_s']:.3f} s/step (inside its s/step; TRL gets the batch tokenized)" for r in rows[:-1]),
        f"loss (last step): {', '.join(r['label'] + ' ' + format(r['loss'], '.5g') for r in rows[:-1])}; "
        f"TRL {trl_row['loss']:.5g}, TRL x max_completion_length / max_seq_len = "
        f"{trl_row['loss'] * trl_row['completion_len'] / args.seq_len:.5g} "
        "(the same objective up to Dr. GRPO's constant)", ""])
    write_outputs(args.out, report, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
