"""τ²-bench telecom (solo mode) through our loop: gold, empty and cheat policies scored by τ²'s own evaluator.

    .venv/bin/python bench/checks/check_tau2.py            # gold / empty / transfer-at-once on the 40 test tasks
    .venv/bin/python bench/checks/check_tau2.py --audit    # plus the reward audit's cheat battery (a few minutes)
    # the tables are also saved as bench/results/check_tau2.txt

Scripted policies, each task its own rollout (and its own τ² environment): `gold` replays the task's gold
actions (Environment.demonstrations, one task at a time: τ²'s telecom tickets repeat across tasks, 5
texts for 114 tasks, and DemonstrationPolicy finds its task by the text); `empty` calls complete_task at
once; `transfer at once` hands the ticket to a human agent without looking (the gold outcome of the tasks
whose SIM is PIN-locked). The audit (mcp_rl.rewards.reward_audit.audit_reward) runs on groups of test
tasks with distinct tickets, for the same reason, and its rows are summed over the groups.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_rl.environment import environment  # noqa: E402
from mcp_rl.mcp.guard import ToolPolicy  # noqa: E402
from mcp_rl.policies.policy import ScriptedPolicy, play  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, rollout  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402

CFG = RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True), max_turns=20, temperature=0.0)
DONE = {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "done"}}
TRANSFER = {"tool": "transfer_to_human_agents", "arguments": {"summary": "The customer needs help."}}


async def scores(env, tasks, make_policy) -> tuple[list[float], float]:
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(rollout(make_policy(s), env, s, CFG) for s in tasks))
    failed = [t.metadata["fatal_reason"] for t in trajs if t.metrics.get("fatal")]
    if failed:
        raise SystemExit(f"{len(failed)} rollouts failed outside the policy, e.g. {failed[0]}")
    return [t.metrics["env_reward"] for t in trajs], time.perf_counter() - t0


def distinct_ticket_groups(tasks) -> list[list]:
    """Tasks dealt into groups in which no two share a ticket (the audit looks tasks up by their text)."""
    groups: list[list] = []
    for s in tasks:
        home = next((g for g in groups if all(o.task != s.task for o in g)), None)
        groups.append([s]) if home is None else home.append(s)
    return groups


async def audit(env, tasks) -> str:
    from mcp_rl.rewards.reward_audit import audit_reward

    wins: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # n, successes, reward sum
    for group in distinct_ticket_groups(tasks):
        report = await audit_reward(env, group, rollout_cfg=CFG, demonstrations=env.demonstrations(group))
        for row in [report.demonstrations, *report.rows]:
            w = wins["demonstrations (honest)" if row is report.demonstrations else row.name]
            w[0] += row.n
            w[1] += row.success * row.n
            w[2] += row.mean_reward * row.n
    lines = ["| policy | n | success | mean reward |", "|---|---|---|---|"]
    for name, (n, ok, total) in sorted(wins.items(), key=lambda kv: -kv[1][1] / max(kv[1][0], 1)):
        lines.append(f"| {name} | {n:.0f} | {ok / max(n, 1):.1%} | {total / max(n, 1):+.3f} |")
    return "\n".join(lines)


async def main(args) -> str:
    t0 = time.perf_counter()
    env = environment("tau2-telecom")
    tasks = load_scenarios(env.scenarios, split=args.split)
    out = [f"τ²-bench telecom, solo mode, {len(tasks)} {args.split} tasks (environment built in "
           f"{time.perf_counter() - t0:.1f} s)", "", "| policy | mean τ² reward | solved | seconds |", "|---|---|---|---|"]
    for name, make in (("gold actions", lambda s: env.demonstrations([s])),
                       ("empty (complete_task at once)", lambda s: ScriptedPolicy(play(DONE))),
                       ("transfer at once", lambda s: ScriptedPolicy(play(TRANSFER, DONE)))):
        got, secs = await scores(env, tasks, make)
        out.append(f"| {name} | {sum(got) / len(got):.3f} | {sum(g == 1.0 for g in got)}/{len(got)} | {secs:.1f} |")
    if args.audit:
        out += ["", "Reward audit (audit_reward, summed over groups of distinct tickets):", "", await audit(env, tasks)]
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--audit", action="store_true", help="also run the reward audit's cheat battery")
    text = asyncio.run(main(parser.parse_args()))
    print(text)
    (ROOT / "bench" / "results" / "check_tau2.txt").write_text(text + "\n")
