"""Check: LocalPolicy's CUDA-graph decode gives the eager decode's tokens, and how much faster it is.

On a GPU, SmolLM2-135M's shape with random weights (no weights needed; SmolLM2's tokenizer from
--tokenizer DIR), greedy, 64 new tokens, real rollout prompts: 1 and 16 concurrent requests
decoded with `LocalPolicy(cuda_graph=True)` (the default) and `cuda_graph=False`, side by side
in one run (each timed on its second run, after warm-up).

    python bench/checks/check_cuda_graph.py --tokenizer DIR --out bench/results/graph_check.txt
    python bench/checks/check_cuda_graph.py --model gemma3-270m --long    # Gemma 3: sliding-window layers, prompts past 512
    python bench/checks/check_cuda_graph.py --tokenizer DIR --join   # continuous batching: the second half joins

With --join both policies batch continuously (`join=True`): the first half of the requests starts the decode
and the second half is sent once it runs, so they join its graph (or eager) steps in free rows' slots (each
row says how many joined). Without a GPU it runs eager both ways (a CPU check of the joined rows' log-probs).

Each row also compares the graph decode's logprobs with one plain forward pass over prompt + tokens
(max difference; bf16), which checks the masks, the sliding window's included.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # bench_generation

from bench_generation import build, requests  # noqa: E402

from mcp_rl.policies.local_policy import LocalPolicy  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL  # noqa: E402


async def decode(model, tok, msgs, graph: bool, join: bool = False) -> tuple[float, list, list, int]:
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    policy = LocalPolicy(model, tok, max_batch=64, cuda_graph=graph, join=join)
    sync()
    t0 = time.perf_counter()
    ask = lambda m: policy.complete(m, [COMPLETE_TOOL], max_tokens=64, temperature=0)  # noqa: E731
    half = (len(msgs) + 1) // 2 if join else len(msgs)
    first = [asyncio.ensure_future(ask(m)) for m in msgs[:half]]
    while join and not policy.decode_stats["rows"]:  # the second half joins the running decode
        await asyncio.sleep(0.001)
    choices = await asyncio.gather(*first, *[ask(m) for m in msgs[half:]])
    sync()
    return (time.perf_counter() - t0, [[x.token for x in c.logprobs.content] for c in choices],
            [[x.logprob for x in c.logprobs.content] for c in choices], int(policy.decode_stats["joined"]))


def forward_diff(model, tok, msgs, tokens, logprobs) -> float:
    """Largest |decode logprob - plain forward logprob| over all rows and tokens."""
    import torch

    worst = 0.0
    for m, toks, lps in zip(msgs, tokens, logprobs):
        prompt = tok.apply_chat_template(m, tools=[COMPLETE_TOOL], add_generation_prompt=True, return_dict=False)
        ids = [int(t.split(":")[1]) for t in toks]
        with torch.no_grad():
            lp = model(torch.tensor([prompt + ids], device=model.device)).logits[0].float().log_softmax(-1)
        worst = max([worst] + [abs(lp[len(prompt) - 1 + k, i].item() - x) for k, (i, x) in enumerate(zip(ids, lps))])
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default=None, help="SmolLM2's tokenizer folder (the random smollm2-shape model)")
    ap.add_argument("--model", default="smollm2-shape", help="smollm2-shape (random), or an embedded/HF model name")
    ap.add_argument("--long", action="store_true", help="system prompts of ~800 tokens (past Gemma 3's 512 window)")
    ap.add_argument("--join", action="store_true", help="continuous batching: the second half of the requests joins the decode the first half started")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.model == "smollm2-shape":
        model, tok = build("smollm2-shape", args.tokenizer)
    else:
        from mcp_rl.policies.models import load_local_model

        model, tok = load_local_model(args.model)
    lines = []
    for n in (1, 16):
        msgs = requests(n)
        if args.long:
            msgs = [[{**m[0], "content": m[0]["content"] + "\n" + "Answer with the tools, briefly. " * 120}, *m[1:]]
                    for m in msgs]
        runs = {}
        for graph in (True, False):
            asyncio.run(decode(model, tok, msgs, graph, args.join))  # warm-up
            runs[graph] = asyncio.run(decode(model, tok, msgs, graph, args.join))
        (tg, ig, lg, jg), (te, ie, le, je) = runs[True], runs[False]
        diff = max(abs(a - b) for x, y in zip(lg, le) for a, b in zip(x, y))
        lines.append(f"{args.model}{' join' if args.join else ''} n={n}: graph {tg:.2f}s eager {te:.2f}s ({te / tg:.1f}x) | same tokens "
                     f"{sum(a == b for a, b in zip(ig, ie))}/{n} rows | max logprob diff {diff:.4f} | "
                     f"vs plain forward {forward_diff(model, tok, msgs, ig, lg):.4f} | tokens {sum(map(len, ig))}"
                     + (f" | joined: graph {jg}, eager {je}" if args.join else ""))
        print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
