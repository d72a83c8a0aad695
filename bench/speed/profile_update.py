"""Where the GPU time of one GRPO update goes (issue [speed]: the 3B-shape update's MFU target is 25%).

bench_update.py's synthetic step and trainer settings, one mode (old: padded micro-batches of --old-micro-batch
sequences; new: packed, --budget tokens), one warm-up update, then one under torch.profiler: GPU kernel time
by kind (matrix products, attention, Liger's fused head, the rest), the top kernels, and wall seconds.

    python bench/speed/profile_update.py --shape qwen3b --checkpointing --seqs 24 --mean-len 2048 --longest 8192 \
        --mode new --budget 8192 --out $OUT/profile_qwen3b_new.txt
    python bench/speed/profile_update.py ... --mode new --budget 8192 --levers lora-casts fused-add liger   # all on

`--levers` turns bench_update.py's levers on together (mcp_rl/training/kernels.py); the header line says what ran.
"""
import argparse
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_update import LEVERS, levers_ran, model_of, step_seqs, update  # noqa: E402

from mcp_rl.training.portable import PortableTrainer  # noqa: E402

# First match wins. Section 24's table had the first three and "other"; the elementwise kinds after them split
# "other" so the levers' effect shows: dtype copies, adds, multiplies (PyTorch's kernels name their functor).
KINDS = (("attention", ("fmha", "flash", "attention", "efficient", "sdpa")),
         ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90", "wgmma")),
         ("fused head (Liger)", ("cross_entropy", "liger", "_ce_", "flce", "element_mul_kernel")),
         ("Liger RMSNorm/SwiGLU/RoPE", ("rms_norm", "swiglu", "silu_mul", "rope")),
         ("elementwise: dtype copies", ("copy",)),
         ("elementwise: adds", ("add",)),
         ("elementwise: multiplies", ("mul",)))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(x in low for x in keys)), "other (elementwise, norms, reductions)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen3b")
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--seqs", type=int, default=24)
    ap.add_argument("--mean-len", type=int, default=2048)
    ap.add_argument("--longest", type=int, default=8192)
    ap.add_argument("--mode", choices=("old", "new"), default="new")
    ap.add_argument("--old-micro-batch", type=int, default=2)
    ap.add_argument("--budget", type=int, default=8192)
    ap.add_argument("--levers", nargs="*", default=[], choices=list(LEVERS), help="levers on (new mode)")
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16", "fp32"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()  # the CPU only checks the script (--shape tiny)
    if "liger" in args.levers and not cuda:
        ap.error("--levers liger: Liger-Kernel's kernels need a CUDA GPU and there is none here (leave liger out)")
    from mcp_rl.training.portable import resolve_precision

    precision = resolve_precision(args.precision, torch.device("cuda" if cuda else "cpu"))
    model = model_of(args.shape, "cuda" if cuda else "cpu",
                     {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32))
    seqs = step_seqs(args.seqs, args.mean_len, args.longest, model.config.vocab_size)
    torch.manual_seed(1)
    policy = types.SimpleNamespace(model=model, tokenizer=types.SimpleNamespace(pad_token_id=0), step=0)
    trainer = PortableTrainer(policy, learning_rate=2e-4, lora_r=16, lora_alpha=32, max_seq_len=8192, precision=precision,
                              micro_batch_size=args.old_micro_batch,
                              micro_batch_tokens=args.budget if args.mode == "new" else 0,
                              packed=args.mode == "new", gradient_checkpointing=args.checkpointing,
                              **{LEVERS[lv]: True for lv in args.levers})
    trainer.tokenizer = policy.tokenizer
    warm = update(trainer, seqs)
    act = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[act.CUDA if cuda else act.CPU]) as prof:
        timed = update(trainer, seqs)
    dev = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    events = [e for e in prof.key_averages() if e.device_type == dev]
    if not cuda:  # CPU ops nest, so self time is what adds up
        for e in events:
            e.self_device_time_total = e.self_cpu_time_total
    total = sum(e.self_device_time_total for e in events) or 1.0
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_device_time_total
    lines = [f"{args.shape} {args.mode} (packed {trainer.packed}, fused head {trainer._fused}, budget "
             f"{args.budget if args.mode == 'new' else '-'}, checkpointing {args.checkpointing}, {precision}, "
             f"levers ran {levers_ran(trainer)}): "
             f"{timed['tokens']} tokens, {timed['micro_batches']} micro-batches",
             f"warm-up {warm['seconds']} s; profiled update {timed['seconds']} s wall (profiler on), "
             f"GPU kernels {total / 1e6:.2f} s (busy {total / 1e6 / timed['seconds']:.0%} of the wall)", "",
             "| kind | GPU s | share |", "|---|---|---|"]
    lines += [f"| {k} | {v / 1e6:.2f} | {v / total:.1%} |" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])]
    lines += ["", "| kernel | calls | GPU s | share | kind |", "|---|---|---|---|---|"]
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
        lines.append(f"| {e.key[:90]} | {e.count} | {e.self_device_time_total / 1e6:.3f} | "
                     f"{e.self_device_time_total / total:.1%} | {kind_of(e.key)} |")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
