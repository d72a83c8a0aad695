"""Benchmark: multi-turn rollouts' prefill with LocalPolicy(reuse_prefix=True) against without, side by side.

Episodes shaped like GRPO rollouts against the company server: the rollout system prompt, the server's
tools plus `complete_task`, a task from data/scenarios.jsonl, `--group` episodes per task, all in flight
at once (so turns batch as in a step). Each turn samples `--max-tokens` greedy tokens, then appends a real
tool result (list_tables, describe_table, the task's reference SQL, a wide query: the server run in-process,
results capped at 3000 characters as rollouts cap them). The same episodes run twice on one model,
reuse off then on; printed: prefill tokens (computed, and copied from the cache), prefill and decode
seconds, the ratios, and whether every turn's tokens and logprobs matched.

    python bench/speed/bench_prefix.py --out bench/results/prefix_cpu.txt                 # CPU, tiny random Llama
    python bench/speed/bench_prefix.py --model smollm2 --tasks 8 --group 8 --turns 6 --max-tokens 64   # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "speed"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_generation import SMOLLM2, TINY, header  # noqa: E402

from mcp_rl.policies.local_policy import LocalPolicy, load_local_model, load_local_tokenizer  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL, DEFAULT_SYSTEM_PROMPT  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402


def build(name: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if name == "smollm2":
        return load_local_model("smollm2")
    tok = load_local_tokenizer()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), **(SMOLLM2 if name == "smollm2-shape" else TINY), bos_token_id=1,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if device == "cuda" else torch.float32)
    return model.eval(), tok


async def tool_results(scenarios, turns: int) -> tuple[list[dict], list[list[str]]]:
    """The company server's tools, and per scenario the results of `turns` real calls."""
    from mcp_rl.environments.company.build_db import build_db
    from mcp_rl.environments.company.server import build_server
    from mcp_rl.mcp.connect import ToolSession

    db = build_db(Path(tempfile.mkdtemp()) / "company.db")
    calls = [("list_tables", {}), ("describe_table", {"table_name": "employees"}), None,
             ("run_query", {"sql": "SELECT * FROM departments"}), ("describe_table", {"table_name": "departments"}),
             ("run_query", {"sql": "SELECT name, title, salary FROM employees LIMIT 20"})]
    async with ToolSession(build_server(db), max_result_chars=3000) as session:
        tools = await session.openai_tools()
        results = []
        for s in scenarios:
            mine = [c or ("run_query", {"sql": s.reference}) for c in calls]
            results.append([(await session.call(*mine[k % len(mine)])).text for k in range(turns)])
    return tools + [COMPLETE_TOOL], results


async def episodes(policy, tools, scenarios, results, group: int, turns: int, max_tokens: int,
                   temperature: float = 0.0) -> list[list]:
    async def one(s, res):
        history, out = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": s.task}], []
        for k in range(turns):
            choice = await policy.complete(history, tools, max_tokens=max_tokens, temperature=temperature)
            out.append((list(history), choice))
            history += [choice, {"role": "tool", "tool_call_id": f"call_{k}", "content": res[k]}]
        return out

    return await asyncio.gather(*[one(s, res) for s, res in zip(scenarios, results) for _ in range(group)])


async def once(model, tok, args, tools, scenarios, results, reuse: bool) -> tuple[list, dict, str]:
    """One pass over the episodes with a fresh policy: (each episode's Choices, decode_stats, a report line)."""
    import torch

    policy = LocalPolicy(model, tok, max_batch=args.max_batch, batch_wait_s=0.05, reuse_prefix=reuse)
    await episodes(policy, tools, scenarios[:1], results[:1], 1, 2, 4)  # warm-up
    policy.decode_stats = dict.fromkeys(policy.decode_stats, 0.0)
    needed = [0]  # prompt tokens no cached prefix covers: what a prefill per row would compute
    if reuse:
        policy.clear_prefix_cache()
        plan = policy.prefix_cache.plan

        def counting(prompts, n_forced):
            needed[0] += sum(len(p) - max(0, min(policy.prefix_cache.match(p)[1], len(p) - n_forced - 1))
                             for p in prompts)
            return plan(prompts, n_forced)

        policy.prefix_cache.plan = counting
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    out = await episodes(policy, tools, scenarios, results, args.group, args.turns, args.max_tokens, args.temperature)
    wall, s = time.perf_counter() - t0, policy.decode_stats
    cache = (f" | keep {s['keep_s']:.3f} s | cache {policy.prefix_cache.nbytes / 2**20:.1f} MiB, "
             f"{len(policy.prefix_cache)} entries, {policy.prefix_cache.stats['evicted']} evicted | a prefill per "
             f"row would compute {needed[0]}") if reuse else ""
    line = (f"reuse {'on ' if reuse else 'off'} | {int(s['rows'])} rows in {policy.generate_calls - 1} decodes | "
            f"prompt tokens {int(s['prompt_tokens'])} (padded {int(s['padded_prompt_tokens'])}) | prefilled "
            f"{int(s['prefill_tokens'])}, copied {int(s['reused_tokens'])} | prefill {s['prefill_s']:.3f} s | "
            f"decode {s['decode_s']:.3f} s | wall {wall:.2f} s{cache}")
    return out, dict(s), line


def trainer_gap(model, tok, tools, turns: list) -> tuple[float, float]:
    """Mean and largest |sampled logprob - one forward over the conversation's logprob| (the trainer's view)."""
    import torch

    from mcp_rl.policies.chat_templates import prompt_ids

    diffs = []
    with torch.inference_mode():
        for history, choice in turns:
            prompt, ids = prompt_ids(tok, history, tools), [int(t.token.split(":")[1]) for t in choice.logprobs.content]
            logits = model(torch.tensor([prompt + ids], device=model.device)).logits[0, len(prompt) - 1:-1]
            lp = logits.float().log_softmax(-1).gather(-1, torch.tensor(ids, device=model.device)[:, None])[:, 0]
            diffs += (lp.cpu() - torch.tensor([t.logprob for t in choice.logprobs.content])).abs().tolist()
    return sum(diffs) / len(diffs), max(diffs)


async def run(args) -> str:
    import statistics

    model, tok = build(args.model)
    scenarios = load_scenarios(ROOT / "data" / "scenarios.jsonl")[: args.tasks]
    tools, results = await tool_results(scenarios, args.turns)
    lines, outs, stats = [], {}, {False: [], True: []}
    for _ in range(args.repeat):  # off and on alternate: a shared machine's load falls on both alike
        for reuse in (False, True):
            outs[reuse], s, line = await once(model, tok, args, tools, scenarios, results, reuse)
            stats[reuse].append(s)
            lines.append(line)
            print(line, flush=True)
    off, on = ({k: statistics.median(s[k] for s in stats[r]) for k in stats[r][0]} for r in (False, True))
    gaps = {r: trainer_gap(model, tok, tools, [t for e in outs[r] for t in e]) for r in (False, True)}
    turns = [(a, b) for ea, eb in zip(outs[False], outs[True]) for (_, a), (_, b) in zip(ea, eb)]
    same = sum([t.token for t in a.logprobs.content] == [t.token for t in b.logprobs.content] for a, b in turns)
    gap = max(abs(x.logprob - y.logprob) for a, b in turns for x, y in zip(a.logprobs.content, b.logprobs.content))
    if args.temperature:  # sampled turns part at the first token that differs: nothing to compare
        same, gap = "-", float("nan")
    lines += [f"ratio on/off (medians of {args.repeat}) | prefill tokens "
              f"{on['prefill_tokens'] / off['prefill_tokens']:.3f} "
              f"({1 - on['prefill_tokens'] / off['prefill_tokens']:.1%} saved) | prefill seconds "
              f"{on['prefill_s'] / off['prefill_s']:.3f} | prefill+decode+keep seconds "
              f"{sum(on[k] for k in ('prefill_s', 'decode_s', 'keep_s')) / (off['prefill_s'] + off['decode_s']):.3f}",
              f"last pass: turns token-identical {same}/{len(turns)} | largest |logprob on - off| {gap:.2e}",
              "sampler vs one forward over the conversation (the trainer's logprobs), mean / largest |difference|: "
              f"off {gaps[False][0]:.2e} / {gaps[False][1]:.2e}, on {gaps[True][0]:.2e} / {gaps[True][1]:.2e}"]
    setup = (f"model {args.model} | {args.tasks} tasks x {args.group} episodes x {args.turns} turns | max_tokens "
             f"{args.max_tokens} | temperature {args.temperature} | max_batch {args.max_batch}")
    return "\n".join([header(), setup, "", *lines, ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", choices=["tiny", "smollm2-shape", "smollm2"])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4, help="episodes per task (a GRPO group)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="passes of each, alternating off and on")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy, and turns compared on vs off")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    report = asyncio.run(run(args))
    print("\n" + report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
