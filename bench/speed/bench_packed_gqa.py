"""Benchmark: LocalPolicy's decode with packed GQA attention vs transformers 5.17's repeat_kv, side by side.

transformers 5.17 (the GPU machine's, and the newest Unsloth allows) copies each key/value head
`num_key_value_groups` times before SDPA whenever a mask is given, which the StaticCache decode
always gives: every decode step then copies the whole cache in every layer (SmolLM2: 3 copies,
Qwen2.5-3B: 8). `mcp_rl.policies.decoder.packed_gqa_sdpa` folds a one-token query's heads onto the
key/value heads instead (as transformers 5.2x does). This times the same greedy batched decode
both ways, alternating, in one process: c concurrent real rollout prompts, each padded with
schema text to about --prompt-tokens tokens (a rollout at turn 4-5 carries 1,000-1,700), and
checks the two give the same tokens. Models as in bench_generation.py.

    python bench/speed/bench_packed_gqa.py --models smollm2 qwen3b-shape --tokenizer DIR --out bench/results/packed_gqa.txt
    python bench/speed/bench_packed_gqa.py --models tiny --tokenizer DIR --concurrency 4 --prompt-tokens 300 --max-tokens 8  # CPU
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "speed")]

from bench_generation import build, requests  # noqa: E402

from mcp_rl.policies.local_policy import LocalPolicy  # noqa: E402


def attention(mode: str):
    """transformers' "sdpa" as 5.17 runs it (`repeat`) or with the one-token query packed (`packed`)."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    from mcp_rl.policies.decoder import packed_gqa_sdpa

    def repeated(module, query, key, value, mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        groups = getattr(module, "num_key_value_groups", 1)
        if groups == 1 or query.shape[2] != 1 or mask is None:
            return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                          is_causal=is_causal, **kw)
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask[..., : key.shape[-2]],
                                                               scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    fn = packed_gqa_sdpa(sdpa_attention_forward) if mode == "packed" else repeated
    fn._mcp_rl = True  # decoder.py leaves a marked "sdpa" alone
    return fn


def padded(n: int, tokenizer, prompt_tokens: int) -> list[list[dict]]:
    schema = (ROOT / "mcp_rl" / "environments" / "company" / "build_db.py").read_text()
    out = []
    for messages in requests(n):
        text = messages[0]["content"]
        while len(tokenizer.encode(text)) < prompt_tokens:
            text += "\n" + schema[: 4 * (prompt_tokens - len(tokenizer.encode(text)))]
        out.append([{"role": "system", "content": text}, messages[1]])
    return out


async def decode(policy: LocalPolicy, batch: list[list[dict]], max_tokens: int) -> tuple[float, list]:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    choices = await asyncio.gather(*[policy.complete(m, [], max_tokens=max_tokens, temperature=0) for m in batch])
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, [[t.token for t in c.logprobs.content] for c in choices]


def main() -> None:
    from transformers import AttentionInterface

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2"])
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder for the random-weights shapes")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 192])
    ap.add_argument("--prompt-tokens", type=int, default=1500)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="timed decodes per mode and concurrency (after a warm-up)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.repeats < 1 or args.max_tokens < 1 or min(args.concurrency) < 1:
        ap.error("--repeats, --max-tokens and every --concurrency must be at least 1")
    lines = [f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"machine: {platform.machine()} | python {platform.python_version()} | greedy, {args.max_tokens} new tokens, "
             f"prompts ~{args.prompt_tokens} tokens", "",
             "model | concurrent | repeat_kv s | packed s | speed-up | same tokens", "---|---|---|---|---|---"]
    for name in args.models:
        model, tok = build(name, args.tokenizer)
        model.config._attn_implementation = "sdpa"
        for c in args.concurrency:
            policy = LocalPolicy(model, tok, max_batch=c, batch_wait_s=0.5, max_context=args.prompt_tokens * 2 + 512)
            batch = padded(c, tok, args.prompt_tokens)
            times, tokens = {"repeat": [], "packed": []}, {}
            for k in range(args.repeats + 1):
                for mode in (("repeat", "packed") if k % 2 == 0 else ("packed", "repeat")):
                    AttentionInterface.register("sdpa", attention(mode))
                    seconds, tokens[mode] = asyncio.run(decode(policy, batch, args.max_tokens))
                    if k:  # the first round warms up (graph capture, allocator)
                        times[mode].append(seconds)
            rep, pack = (min(times[m]) for m in ("repeat", "packed"))
            same = sum(a == b for a, b in zip(tokens["repeat"], tokens["packed"]))
            lines.append(f"{name} | {c} | {rep:.2f} | {pack:.2f} | {rep / pack:.2f}x | {same}/{c}")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
