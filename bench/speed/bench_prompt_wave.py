"""Benchmark: the host's cost of a turn wave's prompts (LocalPolicy.complete's `prompt_ids`), on the CPU.

After each batched decode of a GRPO step every rollout (192 in the learning configs) sends its next turn at
about the same moment, and each prompt is rendered and tokenized (chat_templates.prompt_ids) in a thread
(`asyncio.to_thread`) before it can join a batch. This times a wave of `--wave` such prompts after 1..`--turns`
turns, on 1, 2 and all of this machine's threads: the company server's real tools and tool results (in-process,
capped at 3000 characters as rollouts cap them; bench_prefix.tool_results), the rollout system prompt, a
task from data/scenarios.jsonl, each earlier assistant turn a `run_query` call as a plain message (rollouts pass
the sampled Choice: the same render, with a marker token spliced for its ids). SmolLM2's tokenizer (embedded).

    .venv/bin/python bench/speed/bench_prompt_wave.py --out bench/results/prompt_wave.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "speed"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_generation import header, write_outputs  # noqa: E402
from bench_prefix import tool_results  # noqa: E402

from mcp_rl.policies.chat_templates import prompt_ids  # noqa: E402
from mcp_rl.policies.models import load_local_tokenizer  # noqa: E402
from mcp_rl.rollout import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402


def conversation(scenario, results: list[str], turns: int) -> list[dict]:
    history = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": scenario.task}]
    for k in range(turns):
        call = json.dumps({"name": "run_query", "arguments": {"sql": scenario.reference}})
        history += [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                    {"role": "tool", "tool_call_id": f"call_{k}", "content": results[k]}]
    return history


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wave", type=int, default=192, help="prompts in a wave (rollouts in a step)")
    ap.add_argument("--turns", type=int, default=4, help="waves after 1..TURNS turns")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    tok = load_local_tokenizer()
    scenarios = load_scenarios(ROOT / "data" / "scenarios.jsonl")[:16]
    tools, results = asyncio.run(tool_results(scenarios, args.turns))
    threads = sorted({1, 2, os.cpu_count() or 1})
    rows, lines = [], [header(), "", "| turns | prompt tokens (mean) | ms a prompt | " +
                       " | ".join(f"wave of {args.wave}, {n} thread{'s' * (n > 1)} s" for n in threads) + " |",
                       "|---|---|---|" + "---|" * len(threads)]
    for turns in range(1, args.turns + 1):
        wave = [conversation(scenarios[i % len(scenarios)], results[i % len(scenarios)], turns) for i in range(args.wave)]
        sizes = [len(prompt_ids(tok, m, tools)) for m in wave[:16]]  # and warm-up
        row = {"turns": turns, "prompt_tokens": sum(sizes) / len(sizes)}
        for n in threads:
            with ThreadPoolExecutor(n) as pool:
                t0 = time.perf_counter()
                list(pool.map(lambda m: prompt_ids(tok, m, tools), wave))
                row[f"wave_s_{n}"] = round(time.perf_counter() - t0, 3)
        row["ms_a_prompt"] = round(1000 * row["wave_s_1"] / args.wave, 2)
        rows.append(row)
        lines.append(f"| {turns} | {row['prompt_tokens']:.0f} | {row['ms_a_prompt']:.1f} | "
                     + " | ".join(f"{row[f'wave_s_{n}']:.2f}" for n in threads) + " |")
    write_outputs(args.out, "\n".join(lines), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
