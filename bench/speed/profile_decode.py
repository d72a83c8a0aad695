"""Where a batched decode's time goes (issue [speed] item 2: rollouts are 70-88% of a GRPO step).

One synthetic batch in a model's shape (random weights: speed only, no learning), as a step's turn gives the
policy: `--rows` left-padded prompts of `--width` tokens at most (lengths spread down to half of it), `--new`
sampled tokens each and no row stopping early (a base model's worst case). Modes, in this order on one model:
  base         no LoRA, CUDA graph (what the decode costs without an adapter)
  eager        LoRA r=16 on every linear layer (as the learning configs), no graph
  lora         the same with the graph: what rollouts run today
  lora+fused   LocalPolicy(fused_lora=True): the LoRA factors in the weights' dtype, the scaled add in one
               addmm (training/kernels.lora_sampling)
  lora+levers  instead, bf16 autocast with the update's LoRA levers (training/kernels.update_levers)
  lora+liger   the lora mode with Liger's RMSNorm/SwiGLU/GeGLU/RoPE kernels patched in (kernels.apply_liger)
  lora+fused+liger  both
  lora+fused+compiled  lora+fused with the one-token forward through torch.compile (LocalPolicy(compile_decode=True))
Each reports:
  whole     LocalPolicy._generate as rollouts call it: prefill seconds, decode milliseconds a step
  forward   the decoder's one-token step alone (decoder.Decoder.step: the graph replay or the eager forward)
  sampling  today's sampling alone on logits of the batch's shape (log-softmax, softmax, multinomial,
            the done checks), and beside it the exponential race (argmax of probs / Exp(1): the same
            distribution, no multinomial) with log-probs from one logsumexp (no vocabulary-wide log-softmax)
  host      whole - forward - sampling: the loop's own overhead (stop-string checks, syncs every 8 steps); below
            zero where the separately timed forward ran slower than inside the loop (eager runs)
  ops       aten ops of one eager decode step (views left out): a GPU launches about one kernel each, and a small
            model's decode step costs about its launches (session 21: a forward step of 8.1-9.0 ms for SmolLM2
            and Gemma x192 and Qwen2.5-3B x24 alike)

    python bench/speed/profile_decode.py --shape gemma3-270m --rows 192 --width 2048 --new 128 --out $OUT/decode_gemma.txt
    python bench/speed/profile_decode.py --shape tiny --rows 4 --width 64 --new 16 --modes base eager lora lora+fused
                                                                                   # CPU check (Liger needs CUDA)
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_update import model_of  # noqa: E402

from mcp_rl.policies.decoder import Decoder  # noqa: E402
from mcp_rl.policies.local_policy import LocalPolicy, _Request  # noqa: E402
from mcp_rl.training import kernels  # noqa: E402

MODES = ("base", "eager", "lora", "lora+fused", "lora+fused+compiled", "lora+levers", "lora+liger",
         "lora+fused+liger")


class Ops(TorchDispatchMode):
    """Counts the aten ops that compute (each a kernel on a GPU); views and `to`s (often no-ops) are left out."""

    VIEWS = {"view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "t", "transpose", "unsqueeze", "squeeze",
             "slice", "select", "permute", "alias", "as_strided", "detach", "detach_", "split", "unbind", "to"}

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in self.VIEWS:
            self.count[name] += 1
        return func(*args, **(kwargs or {}))


def word_tokenizer(vocab: int):
    """A tokenizer with one word per id ("t0" .. "t<vocab-1>", end-of-turn "t1"): random weights need ids, not text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t1", pad_token="t1", unk_token="t0")


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    """Seconds of `reps` calls of `fn`, after one call that is not counted."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return time.perf_counter() - t0


def batch(rows: int, width: int, vocab: int, new: int) -> list[_Request]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=g).tolist()
    lengths[0] = width
    return [_Request(torch.randint(2, vocab, (n,), generator=g).tolist(), 0, new, 1.0, concurrent.futures.Future())
            for n in lengths]


def sampling_today(logits, temperature: float, stops, done, tokens, lps, t: int) -> None:
    lp = torch.log_softmax(logits.float(), -1)  # as LocalPolicy._generate samples
    tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1)[:, 0]
    tok = torch.where(done, stops[0], tok)
    tokens[:, t], lps[:, t] = tok, lp.gather(-1, tok[:, None])[:, 0]
    done |= torch.isin(tok, stops)


def sampling_race(logits, temperature: float, stops, done, tokens, lps, t: int) -> None:
    x = logits.float()
    noise = torch.empty_like(x).exponential_()
    tok = (torch.softmax(x / temperature, -1) / noise).argmax(-1)  # P(argmax = i) = p_i (exponential race)
    tok = torch.where(done, stops[0], tok)
    tokens[:, t] = tok
    lps[:, t] = x.gather(-1, tok[:, None])[:, 0] - torch.logsumexp(x, -1)
    done |= torch.isin(tok, stops)


def profile(policy: LocalPolicy, reqs: list[_Request], new: int, mode: str) -> dict:
    graph = mode != "eager"
    policy.cuda_graph = graph
    device, n, width = policy.model.device, len(reqs), max(len(r.prompt_ids) for r in reqs)
    stats = policy.decode_stats
    t0 = time.perf_counter()
    policy._generate(reqs)  # warm-up: kernels, allocator, compiling
    first = time.perf_counter() - t0
    before = dict(stats)
    policy._generate(reqs)
    prefill = stats["prefill_s"] - before["prefill_s"]
    steps = stats["decode_steps"] - before["decode_steps"]
    whole = (stats["decode_s"] - before["decode_s"]) / steps

    ids = torch.full((n, width), policy.stop_ids[0], dtype=torch.long)
    keep = torch.zeros((n, width), dtype=torch.bool)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        keep[i, width - len(r.prompt_ids):] = True
    ids, keep = ids.to(device), keep.to(device)
    with torch.inference_mode(), kernels.lora_sampling(policy.model, on=policy.fused_lora):
        decoder = Decoder(policy.model, ids, keep, width + new, cuda_graph=graph and device.type == "cuda",
                          compiled=policy.compile_decode)
        logits, _ = decoder.prefill(0)
        tok = logits.argmax(-1)
        column = iter(range(width, width + new))
        forward = timed(lambda: decoder.step(tok, next(column)), new - 2) / (new - 2)
        captured = f"{decoder.graph is not None}{' compiled' if decoder.compiled else ''}"
        with Ops() as ops:  # one eager step, counted (a graph replays the same kernels)
            decoder._forward(decoder.step_ids, decoder.mask, decoder.smask, decoder.step_pos, 1)  # uncompiled

        stops = torch.tensor(policy.stop_ids, device=device)
        tokens = torch.zeros((n, new), dtype=torch.long, device=device)
        lps = torch.zeros((n, new), dtype=torch.float32, device=device)
        sample = {}
        for name, fn in (("today", sampling_today), ("race", sampling_race)):
            done = torch.zeros(n, dtype=torch.bool, device=device)
            sample[name] = timed(lambda: fn(logits, 1.0, stops, done, tokens, lps, 0), new) / new
    return {"mode": mode, "captured": captured, "first_s": first, "ops": sum(ops.count.values()), "rows": n, "width": width,
            "prefill_s": prefill, "steps": steps, "whole_ms": whole * 1e3, "forward_ms": forward * 1e3,
            "sampling_ms": sample["today"] * 1e3, "race_ms": sample["race"] * 1e3,
            "host_ms": (whole - forward - sample["today"]) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="gemma3-270m", choices=("gemma3-270m", "smollm2", "qwen3b", "tiny"))
    ap.add_argument("--rows", type=int, default=192)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model_of(args.shape, device)
    vocab = model.config.vocab_size
    policy = LocalPolicy(model, word_tokenizer(vocab), max_batch=args.rows, hand_back=False)
    reqs = batch(args.rows, args.width, vocab, args.new)
    rows, liger = [], False
    for mode in (m for m in MODES if m in args.modes):  # in MODES' order: LoRA, then Liger, are added in place
        if mode != "base" and not hasattr(policy.model, "peft_config"):
            from peft import LoraConfig, get_peft_model

            policy.model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
        policy.fused_lora, policy.compile_decode = "fused" in mode, "compiled" in mode
        if "liger" in mode and not liger:
            liger = bool(kernels.apply_liger(policy.model))
        levers = mode == "lora+levers"
        with contextlib.ExitStack() as stack:
            if levers:  # as the update: the LoRA levers need autocast (no weight cache: graphs capture the casts)
                stack.enter_context(torch.autocast(device, torch.bfloat16, cache_enabled=False))
                stack.enter_context(kernels.update_levers(policy.model, autocast=True, no_upcast=True, fused_add=True))
            rows.append(profile(policy, reqs, args.new, mode))
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    lines = [f"# profile_decode.py --shape {args.shape} --rows {args.rows} --width {args.width} --new {args.new} "
             f"on {name}", "",
             "| mode | graph captured | first batch s | ops a step (uncompiled) | prefill s | decode ms/step | "
             "forward ms | sampling ms (today) | sampling ms (race) | host ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['captured']} | {r['first_s']:.1f} | {r['ops']} | {r['prefill_s']:.3f} | "
                     f"{r['whole_ms']:.2f} | {r['forward_ms']:.2f} | {r['sampling_ms']:.2f} | {r['race_ms']:.2f} | {r['host_ms']:.2f} |")
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
