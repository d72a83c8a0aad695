"""Benchmark: two host costs of every GRPO step, before and after session 25's fixes, side by side, on the CPU.

Session 25's Gemma step bench on an H100 (results/step_bench_gemma3-270m_h100_s25.txt) showed ~4 s of each
step's rollouts before the first decode and ~4 s of each update tokenizing trajectories. Both were host work:

- **Opening a step's MCP sessions.** Every rollout (192 a step) opens its own session over streamable HTTP
  to the company server, lists its tools, and only then asks the policy. httpx built a TLS context per
  client (the CA bundle loaded, ~20 ms, on the event loop, even for http://); now one is shared
  (mcp_rl/mcp/specs.py `_ssl_context`). Timed here: the seconds until every rollout's first request
  reaches the policy (a policy that then ends each episode), one TLS context per client vs one shared.
- **ART's tokenizing for the update** (`tokenize_trajectory_groups`, 12 groups x 16 trajectories of 4
  tool-call turns and an answer, the company server's real tool results). ART builds `set(range(vocab_size))`
  for every trajectory and decodes every token by itself. Before: the view's marker was the highest usable
  added token (Gemma: 262,143) and each token was decoded again; now the lowest special one (`_sentinel`) and each id
  decoded once (`art_tokenizer.decode`). The results are checked equal.

    .venv/bin/python bench/speed/bench_step_host.py --out bench/results/step_host.txt
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "speed"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from bench_generation import header, write_outputs  # noqa: E402
from bench_prefix import tool_results  # noqa: E402

from mcp_rl.mcp import specs  # noqa: E402
from mcp_rl.policies.chat_templates import art_tokenizer  # noqa: E402
from mcp_rl.policies.hermes import choice_from_text  # noqa: E402
from mcp_rl.policies.models import GEMMA3_270M, load_local_tokenizer  # noqa: E402
from mcp_rl.rollout import DEFAULT_SYSTEM_PROMPT, gather_rollouts  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402

SCENARIOS = ROOT / "data" / "scenarios.jsonl"


class FirstRequests:
    """A policy that records when each rollout's first request arrives, then ends the episode."""

    model_name, step = "first-requests", 0

    def __init__(self):
        self.times: list[float] = []

    async def complete(self, messages, tools=None, **_):
        self.times.append(time.monotonic())
        raise RuntimeError("timed; episode ends here")


async def sessions_open(rollouts: int, repeats: int) -> list[dict]:
    from mcp_rl.runs import config, parts

    cfg = config.load_config(ROOT / "bench" / "experiments" / "learning" / "gemma3-270m.yaml")
    scenarios = load_scenarios(SCENARIOS)[:12]
    group = max(1, rollouts // len(scenarios))
    shared, rows = specs._ssl_context, []
    async with parts.open_server(cfg) as server:
        for name, ctx in (("one TLS context per client", shared.__wrapped__), ("one shared", shared)):
            specs._ssl_context = ctx
            try:
                times = []
                for _ in range(repeats + 1):  # the first is a warm-up
                    policy, t0 = FirstRequests(), time.monotonic()
                    await gather_rollouts(policy, server, scenarios, parts.rollout_config(cfg), group_size=group,
                                          desc=None)
                    if len(policy.times) != len(scenarios) * group:
                        raise SystemExit(f"{len(policy.times)} of {len(scenarios) * group} rollouts reached the policy")
                    times.append(max(policy.times) - t0)
            finally:
                specs._ssl_context = shared
            rows.append({"part": "open sessions", "setting": name, "rollouts": len(scenarios) * group,
                         "median_s": statistics.median(times[1:]), "min_s": min(times[1:])})
    return rows


class _BeforeView(art_tokenizer):
    """The view as it was before session 25: the highest usable added token as ART's marker, no decode memo."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        template = tokenizer.chat_template or ""
        skip = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
        self._mark = next(i for i, t in sorted(tokenizer.added_tokens_decoder.items(), reverse=True)
                          if i not in skip and t.content not in template
                          and tokenizer.encode(t.content, add_special_tokens=False) == [i])

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    @property
    def vocab_size(self) -> int:
        return self._mark + 1


def step_groups(tok, tools, scenarios, results):
    import art

    groups = []
    for s, res in zip(scenarios, results):
        trajectories = []
        for k in range(16):
            msgs = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT}, {"role": "user", "content": s.task}]
            for t, result in enumerate(res):
                call = json.dumps({"name": "run_query", "arguments": {"sql": s.reference}})
                msgs += [choice_from_text(f"<tool_call>\n{call}\n</tool_call>", tok),
                         {"role": "tool", "tool_call_id": f"call_{t}", "content": result}]
            msgs.append(choice_from_text("The answer is 3.", tok))
            trajectories.append(art.Trajectory(messages_and_choices=msgs, tools=tools, reward=float(k % 2)))
        groups.append(art.TrajectoryGroup(trajectories))
    return groups


def art_tokenizing(models: list[str], repeats: int) -> list[dict]:
    from art.preprocessing.tokenize import tokenize_trajectory_groups

    scenarios = load_scenarios(SCENARIOS)[:12]
    tools, results = asyncio.run(tool_results(scenarios, 4))
    rows = []
    for model in models:
        tok = load_local_tokenizer() if model == "smollm2" else load_local_tokenizer(model)
        groups = step_groups(tok, tools, scenarios, results)
        fields = ("token_ids", "assistant_mask", "tokens", "chat")
        seen = []
        for name, view in (("before: highest marker, every token decoded", _BeforeView), ("now", art_tokenizer)):
            times = []
            for _ in range(repeats):
                v = view(tok)
                t0 = time.perf_counter()
                out = list(tokenize_trajectory_groups(v, groups, False, False, shuffle_group_trajectories=False))
                times.append(time.perf_counter() - t0)
            seen.append([[getattr(r, f) for f in fields] for r in out])
            rows.append({"part": f"ART tokenizing, {model}", "setting": name, "rollouts": len(out),
                         "median_s": statistics.median(times), "min_s": min(times),
                         "tokens": sum(len(r.token_ids) for r in out)})
        if seen[0] != seen[1]:
            raise SystemExit(f"{model}: the two views tokenized differently")
        rows[-1]["same_as_before"] = True
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rollouts", type=int, default=192, help="rollouts in the step (12 scenarios x group)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["smollm2", GEMMA3_270M])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = asyncio.run(sessions_open(args.rollouts, args.repeats)) + art_tokenizing(args.models, args.repeats)
    lines = [header(), "", "| part | setting | rollouts | median s | fastest s | before / now |", "|---|---|---|---|---|---|"]
    for k, r in enumerate(rows):
        ratio = f"{rows[k - 1]['median_s'] / r['median_s']:.1f}x" if k % 2 else ""
        lines.append(f"| {r['part']} | {r['setting']} | {r['rollouts']} | {r['median_s']:.2f} | {r['min_s']:.2f} | {ratio} |")
    lines.append("\nART tokenizing: both views give the same token ids, masks, tokens and text (checked).")
    write_outputs(args.out, "\n".join(lines), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
