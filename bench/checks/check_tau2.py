"""τ²-bench telecom (solo mode) through our loop: gold, empty and cheat policies, each scored by the
environment (τ²'s own evaluator under our evidence rule, diagnosis.py) with τ²'s reward beside it.

    .venv/bin/python bench/checks/check_tau2.py            # the policies below on the 40 test tasks
    .venv/bin/python bench/checks/check_tau2.py --audit    # plus the reward audit's cheat battery (a few minutes)
    # the tables are also saved as bench/results/check_tau2.txt

Scripted policies, each task its own rollout (and its own τ² environment): `gold` is the environment's
demonstration (the task's diagnosis, then its gold actions: Environment.demonstrations, one task at a
time, since τ²'s tickets repeat, 5 texts for 114 tasks); `gold actions, blind` the gold actions alone;
`empty` calls complete_task at once; `transfer at once` hands the ticket to a human agent without
looking (τ²'s gold outcome where the SIM is PIN-locked or the contract has ended); `diagnose, then
transfer` makes the task's own diagnosis and transfers whatever it showed; `read everything, then
transfer` makes one fixed battery of reads covering every fault, then transfers. The audit
(mcp_rl.rewards.reward_audit.audit_reward) runs on groups of test tasks with distinct tickets, for the
same reason, and its rows are summed over the groups.
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
from mcp_rl.environments.tau2_telecom import MAX_TURNS  # noqa: E402
from mcp_rl.mcp.guard import ToolPolicy  # noqa: E402
from mcp_rl.policies.policy import ScriptedPolicy, play  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, rollout  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402

CFG = RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True), max_turns=MAX_TURNS, temperature=0.0)
DONE = {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "done"}}
TRANSFER = {"tool": "transfer_to_human_agents", "arguments": {"summary": "The customer needs help."}}
# Every read that shows a fault in some τ² telecom task (the base tasks' customer, line, bill and app are the
# same: John Smith, 555-123-2002): the "look at everything" a policy can make without reading the results.
EVERYTHING = [{"tool": n, "arguments": a} for n, a in (
    ("get_customer_by_phone", {"phone_number": "555-123-2002"}), ("check_status_bar", {}), ("check_network_status", {}),
    ("check_sim_status", {}), ("check_apn_settings", {}), ("check_network_mode_preference", {}),
    ("check_data_restriction_status", {}), ("check_vpn_status", {}), ("check_wifi_calling_status", {}),
    ("check_app_permissions", {"app_name": "messaging"}), ("get_details_by_id", {"id": "L1002"}),
    ("get_bills_for_customer", {"customer_id": "C1001"}), ("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}))]


async def scores(env, tasks, make_policy) -> tuple[list, float]:
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(rollout(make_policy(s), env, s, CFG) for s in tasks))
    failed = [t.metadata["fatal_reason"] for t in trajs if t.metrics.get("fatal")]
    if failed:
        raise SystemExit(f"{len(failed)} rollouts failed outside the policy, e.g. {failed[0]}")
    return [t.metrics for t in trajs], time.perf_counter() - t0


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
           f"{time.perf_counter() - t0:.1f} s). score: the environment's reward (τ²'s, paid only when the "
           "episode diagnosed before it acted); τ²: τ²'s own reward; diagnosed: the evidence rule's verdict.", "",
           "| policy | mean score | solved (score) | solved (τ²) | diagnosed | seconds |", "|---|---|---|---|---|---|"]
    looks = lambda s: s.extra["diagnosis"]  # noqa: E731
    for name, make in (("gold (diagnosis, then gold actions)", lambda s: env.demonstrations([s])),
                       ("gold actions, blind", lambda s: ScriptedPolicy(play(*s.extra["actions"], DONE))),
                       ("empty (complete_task at once)", lambda s: ScriptedPolicy(play(DONE))),
                       ("transfer at once", lambda s: ScriptedPolicy(play(TRANSFER, DONE))),
                       ("diagnose, then transfer", lambda s: ScriptedPolicy(play(*looks(s), TRANSFER, DONE))),
                       ("read everything, then transfer", lambda s: ScriptedPolicy(play(*EVERYTHING, TRANSFER, DONE)))):
        got, secs = await scores(env, tasks, make)
        n, count = len(got), lambda key: sum(m.get(key) == 1.0 for m in got)
        out.append(f"| {name} | {sum(m['env_reward'] for m in got) / n:.3f} | {count('env_reward')}/{n} | "
                   f"{count('env_reward/tau2')}/{n} | {count('env_reward/diagnosed')}/{n} | {secs:.1f} |")
    out += ["", "Looking, then transferring whatever the reads showed, is paid on the tasks whose gold is the transfer "
            "(a PIN-locked SIM, an ended contract): the reads are there and show the cause, so no rule on one episode "
            "tells it from a transfer made because of what they showed."]
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
