"""Which code issues the GRPO update's dtype copies, adds and multiplies: one packed update traced on the CPU.

bench/HISTORY.md section 24 found half the H100's kernel time of the packed 3B-shape update in elementwise kernels
(dtype copies 19%, bf16 adds 8%, scalar multiplies) and guessed their source from kernel names. This traces them:
bench_update.py's synthetic step on a small model of the same family (Llama layout, bf16 weights, bf16 autocast,
LoRA r16 on all linear layers, packed rows, gradient checkpointing), one warm-up update, then one under
torch.profiler with shapes and Python stacks. Each aten::to / _to_copy / copy_ / add / mul that no other counted
op issued (a `to` runs a `_to_copy`, which runs a `copy_`: counted once, as the outermost) is attributed to the
Python frame that called it in forward (the first one outside torch, the profiler's stack), or to the autograd node
that ran it in backward. Counts are per update; they scale with layers x LoRA layers x micro-batches, not with the
hidden size, so the tiny shape tells the 3B one's launch mix. `--levers` runs the same with the update levers on.

    python bench/speed/attribute_update.py                      # the table, no levers
    python bench/speed/attribute_update.py --levers lora-casts  # the same with LoRA's input casts skipped

What it found (tiny shape: 2 layers, 7 LoRA layers each, 8 sequences, one micro-batch, checkpointing; CPU, torch
2.13, transformers 5.24, peft 0.21.2), per update, outermost ops:

| op | issued by (forward frame / backward node) | count | lora-casts |
|---|---|---|---|
| aten::to (bf16 -> f32 input copy) | peft lora/layer.py forward `_cast_input_dtype` | 28 | 0 |
| aten::to (f32 -> bf16, autocast) | peft lora/layer.py forward: lora_A(x) | 28 | 0 |
| aten::to (f32 -> bf16) | ToCopyBackward0: the two casts' gradients | 56 | 0 |
| aten::to (weights, autocast) | peft lora/layer.py forward: lora_A / lora_B | 56 | 56 |
| aten::mul | peft lora/layer.py forward `* scaling` | 28 | 28 |
| aten::add | peft lora/layer.py forward `result + ...` | 28 | 28 |
| aten::to / mul / add | transformers RMSNorm, RoPE, SwiGLU, residuals | see the printed table | (Liger's kernels) |

(The numbers in this docstring are from the run recorded in the commit that wrote it; rerun for yours.)
"""

from __future__ import annotations

import argparse
import collections
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_update import model_of, step_seqs, update  # noqa: E402

from mcp_rl.training.portable import PortableTrainer  # noqa: E402

# A real dtype copy is an aten::_to_copy (aten::to that changes nothing makes none); its inner copy_ is not counted
# again. Adds and multiplies in place or not count as one kind each.
KINDS = {"aten::_to_copy": "cast", "aten::copy_": "copy", "aten::add": "add", "aten::add_": "add",
         "aten::mul": "mul", "aten::mul_": "mul"}


def where(event) -> tuple[str, str]:
    """(phase, issuer): forward / recompute (checkpointing's second forward, run from backward) / backward /
    optimizer, and the frame outside torch that called `event` (the profiler records Python frames as parent
    events), or in backward the autograd node that ran it (the engine runs it under no Python frame)."""
    parent, frame = event.cpu_parent, None
    while parent is not None:
        name = parent.name
        if "evaluate_function:" in name:
            node = name.split("evaluate_function:")[-1].strip()
            return ("recompute", frame) if frame else ("backward", "autograd " + node)
        if ".py(" in name:
            if "/optim/" in name or "clip_grad" in name:
                return "optimizer", name[name.index("torch/"):][:100]
            if frame is None and "/torch/" not in name:
                cut = [name.index(p) for p in ("peft/", "transformers/", "mcp_rl/", "bench") if p in name]
                frame = name[min(cut):][:100] if cut else name[-100:]
        parent = parent.cpu_parent
    return "forward", frame or "?"


def attribute(trainer, seqs) -> collections.Counter:
    """Counts of (kind, phase, issuer, input shapes, dtypes) over one update, after a warm-up; 0-dim operands left out."""
    update(trainer, seqs)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True,
                                with_stack=True) as prof:
        update(trainer, seqs)
    counts = collections.Counter()
    for e in prof.events():
        if e.name not in KINDS or (e.name == "aten::copy_" and e.cpu_parent is not None
                                   and e.cpu_parent.name == "aten::_to_copy"):
            continue
        dtypes = [str(t) for t in (e.input_dtypes or []) if t and t != "Scalar"]
        if e.name == "aten::_to_copy":  # source -> destination, from the copy_ it runs
            dst = [c for c in e.cpu_children if c.name == "aten::copy_"]
            dtypes = dtypes[:1] + ([str(dst[0].input_dtypes[0])] if dst and dst[0].input_dtypes else [])
        if not any(e.input_shapes or []):  # 0-dim (Python scalars, step counters): no kernel of their own on a GPU
            continue
        shapes = " x ".join(str(tuple(x)) for x in (e.input_shapes or [])[:2] if x)
        counts[(KINDS[e.name], *where(e), shapes, "->".join(dtypes[:2]).replace("c10::", ""))] += 1
    return counts


def tables(counts: collections.Counter, top: int) -> list[str]:
    totals = collections.Counter()
    for (kind, phase, who, _, _), n in counts.items():
        totals[(kind, phase, who.split("(")[0])] += n
    lines = ["| kind | total |", "|---|---|"]
    lines += [f"| {k} | {sum(n for key, n in counts.items() if key[0] == k)} |" for k in ("cast", "copy", "add", "mul")]
    lines += ["", "| kind | phase | issued by (file, or autograd node) | count |", "|---|---|---|---|"]
    lines += [f"| {k} | {p} | {w} | {n} |" for (k, p, w), n in totals.most_common()]
    lines += ["", f"top {top} by call site and shape:", "", "| kind | phase | issued by | input shapes | dtypes | count |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {k} | {p} | {w} | {s} | {d} | {n} |" for (k, p, w, s, d), n in counts.most_common(top)]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--mean-len", type=int, default=60)
    ap.add_argument("--longest", type=int, default=120)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--levers", nargs="*", default=[], choices=("lora-casts",),
                    help="update levers to turn on (Liger's kernels need CUDA: profile_update.py on the GPU)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    model = model_of(args.shape, "cpu").to(torch.bfloat16)  # bf16 weights and autocast: the GPU path's precision
    seqs = step_seqs(args.seqs, args.mean_len, args.longest, model.config.vocab_size)
    policy = types.SimpleNamespace(model=model, tokenizer=types.SimpleNamespace(pad_token_id=0), step=0)
    torch.manual_seed(1)
    trainer = PortableTrainer(policy, learning_rate=2e-4, lora_r=16, lora_alpha=32, max_seq_len=8192,
                              precision="bf16", micro_batch_tokens=args.budget, packed=True,
                              gradient_checkpointing=not args.no_checkpointing,
                              lora_no_upcast="lora-casts" in args.levers)
    trainer.tokenizer = policy.tokenizer
    counts = attribute(trainer, seqs)
    lines = [f"{args.shape}, {len(seqs)} sequences, packed {trainer.packed}, checkpointing {not args.no_checkpointing}, "
             f"levers {args.levers or 'none'}; per update:", ""] + tables(counts, args.top)
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
