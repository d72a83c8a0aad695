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

What it found (tiny shape: 2 layers x 7 LoRA layers, 8 sequences in one packed micro-batch, checkpointing; CPU,
torch 2.13, transformers 5.24, peft 0.21.2), per update; "forward" counts the first pass and checkpointing's recompute:

| op | issued by | no lever | lora_no_upcast | + lora_fused_add |
|---|---|---|---|---|
| cast bf16 -> f32 of a LoRA layer's input | peft tuners_utils.py `_cast_input_dtype`, forward | 28 | 0 | 0 |
| cast f32 -> bf16 of that input and of the LoRA weights | torch linear.py under autocast (lora_A, lora_B), forward | 84 | 56 (weights) | 56 |
| casts in backward | ToCopyBackward0: those casts' gradients, RMSNorm's | 67 | 39 | 39 |
| `* scaling` over a LoRA output | peft lora/layer.py, forward; MulBackward0 | 26 + 14 | 26 + 14 | 0 (rank-sized, in AddmmBackward0) |
| `result + ...` LoRA into the base output | peft lora/layer.py, forward | 26 | 26 | 0 |
| RMSNorm's float32 round trip | LlamaRMSNorm, forward (Liger's kernel fuses it) | 18 casts, 18 mul, 9 add | same | same |
| RoPE rotate-and-add | apply_rotary_pos_emb, forward (Liger) | 16 mul, 8 add | same | same |
| SwiGLU product, residual adds | LlamaMLP (Liger), LlamaDecoderLayer | 4 mul, 6 add | same | same |
| all casts / copies / adds / muls | | 204 / 67 / 120 / 193 | 120 / 67 / 120 / 193 | 120 / 67 / 94 / 181 |

So the dtype copies the H100 profile counted are mostly peft's: per LoRA layer and pass the input's float32 round trip
(activation-sized, both ways in forward and in backward) and the weights' casts (rank-sized, 56 here: many launches,
few bytes). The bf16 adds and scalar multiplies are LoRA's scaled add over every projection's output (gate and up:
5x the hidden size wide), then the residual stream, RoPE and RMSNorm. The Liger lever needs CUDA: compare with
profile_update.py --levers there.
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


def where(event) -> tuple[str, str, str]:
    """(phase, module, issuer): forward / recompute (checkpointing's second forward, run from backward) / backward /
    optimizer; the innermost nn.Module class it ran in (LoRA's lora_A/lora_B are `Linear` in peft's `Linear`); the
    frame outside torch that called it (the profiler records Python frames and modules as parent events), or in
    backward the autograd node that ran it (the engine runs it under no Python frame or module)."""
    parent, frame, module = event.cpu_parent, None, None
    while parent is not None:
        name = parent.name
        if "evaluate_function:" in name:
            node = name.split("evaluate_function:")[-1].strip()
            return ("recompute", module or "-", frame) if frame else ("backward", "-", "autograd " + node)
        if name.startswith("nn.Module: ") and module is None:
            module = name[len("nn.Module: "):].rsplit("_", 1)[0]
        if ".py(" in name:
            if "/optim/" in name or "clip_grad" in name:
                return "optimizer", "-", name[name.index("torch/"):][:100]
            if frame is None and "/torch/" not in name:
                cut = [name.index(p) for p in ("peft/", "transformers/", "mcp_rl/", "bench") if p in name]
                frame = name[min(cut):][:100] if cut else name[-100:]
        parent = parent.cpu_parent
    return "forward", module or "-", frame or "?"


def attribute(trainer, seqs) -> collections.Counter:
    """Counts of (kind, phase, module, issuer, input shapes, dtypes) over one update, after a warm-up; 0-dim operands
    left out."""
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
    for (kind, phase, module, who, _, _), n in counts.items():
        file_fn = who.split("(")[0] + (":" + who.split(": ")[-1] if "): " in who else "")
        totals[(kind, phase, module, file_fn)] += n
    lines = ["| kind | total |", "|---|---|"]
    lines += [f"| {k} | {sum(n for key, n in counts.items() if key[0] == k)} |" for k in ("cast", "copy", "add", "mul")]
    lines += ["", "| kind | phase | module | issued by (file:function, or autograd node) | count |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {p} | {m} | {w} | {n} |" for (k, p, m, w), n in totals.most_common()]
    lines += ["", f"top {top} by call site and shape:", "",
              "| kind | phase | module | issued by | input shapes | dtypes | count |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {k} | {p} | {m} | {w} | {s} | {d} | {n} |" for (k, p, m, w, s, d), n in counts.most_common(top)]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="tiny", choices=("tiny", "smollm2"))
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--mean-len", type=int, default=60)
    ap.add_argument("--longest", type=int, default=120)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--no-checkpointing", action="store_true")
    ap.add_argument("--levers", nargs="*", default=[], choices=("lora-casts", "fused-add"),
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
                              lora_no_upcast="lora-casts" in args.levers, lora_fused_add="fused-add" in args.levers)
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
