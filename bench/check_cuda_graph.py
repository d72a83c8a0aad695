"""Check: LocalPolicy's CUDA-graph decode gives the eager decode's tokens, and how much faster it is.

On a GPU, SmolLM2-135M's shape with random weights (no weights needed; SmolLM2's tokenizer from
--tokenizer DIR), greedy, 64 new tokens, real rollout prompts: 1 and 16 concurrent requests
decoded with `LocalPolicy(cuda_graph=True)` (the default) and `cuda_graph=False`, side by side
in one run (each timed on its second run, after warm-up).

    python bench/check_cuda_graph.py --tokenizer DIR --out bench/results/graph_check.txt
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_generation import build, requests  # noqa: E402

from mcp_rl.local_policy import LocalPolicy  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL  # noqa: E402


async def decode(model, tok, msgs, graph: bool) -> tuple[float, list, list]:
    import torch

    policy = LocalPolicy(model, tok, max_batch=64, cuda_graph=graph)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    choices = await asyncio.gather(*[policy.complete(m, [COMPLETE_TOOL], max_tokens=64, temperature=0) for m in msgs])
    torch.cuda.synchronize()
    return (time.perf_counter() - t0, [[x.token for x in c.logprobs.content] for c in choices],
            [[x.logprob for x in c.logprobs.content] for c in choices])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model, tok = build("smollm2-shape", args.tokenizer)
    lines = []
    for n in (1, 16):
        msgs = requests(n)
        runs = {}
        for graph in (True, False):
            asyncio.run(decode(model, tok, msgs, graph))  # warm-up
            runs[graph] = asyncio.run(decode(model, tok, msgs, graph))
        (tg, ig, lg), (te, ie, le) = runs[True], runs[False]
        diff = max(abs(a - b) for x, y in zip(lg, le) for a, b in zip(x, y))
        lines.append(f"n={n}: graph {tg:.2f}s eager {te:.2f}s ({te / tg:.1f}x) | same tokens "
                     f"{sum(a == b for a, b in zip(ig, ie))}/{n} rows | max logprob diff {diff:.4f} | "
                     f"tokens {sum(map(len, ig))}")
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
