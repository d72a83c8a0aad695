"""Does the counterfactual replay keep every honest demonstration grounded? And what does it cost?

    .venv/bin/python bench/checks/check_counterfactual.py [K [SEED]]     # all of data/scenarios.jsonl; bench/results/check_counterfactual.txt

Each scenario's demonstration (list_tables, describe_table, its reference query, complete_task) is
played through `mcp_rl.rollout.gather_rollouts` against the company server in process, then scored by
`rewards.score_group` with and without the company server's counterfactual worlds
(`mcp_rl.environments.company.worlds`). Prints the grounded share both ways, every scenario the replay
refuses (with its reference query and what each world showed), and the scoring time per trajectory.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_rl.environments import company  # noqa: E402
from mcp_rl.mcp.connect import ToolSession  # noqa: E402
from mcp_rl.mcp.guard import ToolPolicy  # noqa: E402
from mcp_rl.policies.policy import DemonstrationPolicy  # noqa: E402
from mcp_rl.rewards.score import RewardConfig, score_group  # noqa: E402
from mcp_rl.rollout import RolloutConfig, gather_rollouts  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402


async def measure(server, scenarios, k: int = 4, seed: int = 0) -> str:
    rcfg = RolloutConfig(temperature=0.0)
    async with ToolSession(server, call_timeout=30, max_result_chars=rcfg.max_result_chars, policy=ToolPolicy()) as s:
        groups = await gather_rollouts(DemonstrationPolicy(scenarios, company.PLAN), s, scenarios, rcfg, desc="demonstrations")
    cfg = RewardConfig()
    plain, cf, refused, secs = 0, 0, [], []
    for scenario, group in zip(scenarios, groups):
        await score_group(group, scenario, RewardConfig(counterfactual=False))
        plain += group.trajectories[0].metrics.get("grounded", 0) >= 0.999
        t0 = time.perf_counter()
        await score_group(group, scenario, cfg, counterfactual=company.worlds(server.company_db, k=k, seed=seed))
        secs.append(time.perf_counter() - t0)
        t = group.trajectories[0]
        cf += t.metrics.get("grounded", 0) >= 0.999
        if t.metrics.get("grounded", 0) < 0.999:
            refused.append(f"- {scenario.id} {scenario.answer!r}: {scenario.reference[:120]} | worlds "
                           f"{t.metadata.get('counterfactual', '')[:200]}")
    build, replay = [], []  # the cost split: building K worlds (once per group) and one replay on all of them
    for _ in range(10):
        worlds = company.worlds(server.company_db, k=k, seed=seed)
        async with worlds:
            t0 = time.perf_counter()
            await worlds.replay("run_query", {"sql": "SELECT 1"})
            t1 = time.perf_counter()
            for sc in scenarios[:20]:
                await worlds.replay("run_query", {"sql": sc.reference})
            build.append(t1 - t0)
            replay.append((time.perf_counter() - t1) / 20)
    n = len(scenarios)
    secs.sort()
    return "\n".join([
        f"demonstrations grounded without the replay: {plain}/{n}; with it (k={k} worlds, seed {seed}): {cf}/{n}",
        f"scoring time per trajectory (one-trajectory groups, worlds built per group as in score_group): mean "
        f"{1000 * sum(secs) / n:.0f} ms, median {1000 * secs[n // 2]:.0f} ms, max {1000 * secs[-1]:.0f} ms",
        f"cost split: building the {k} worlds (copies + in-process servers) {1000 * sum(build) / 10:.0f} ms per group; "
        f"one lookup replayed on all {k} {1000 * sum(replay) / 10:.1f} ms",
        *(["refused by the replay:"] + refused if refused else []),
    ])


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    from mcp_server import build_server

    from mcp_rl.environments.company import build_db as mod
    scenarios = [s for s in load_scenarios(ROOT / "data" / "scenarios.jsonl") if s.answer is not None]
    k, seed = (int(sys.argv[i]) if len(sys.argv) > i else d for i, d in ((1, 4), (2, 0)))
    with tempfile.TemporaryDirectory() as tmp:
        server = build_server(mod.build_db(Path(tmp) / "company.db"))
        text = f"# Counterfactual replay on every demonstration ({len(scenarios)} scenarios)\n\n" + asyncio.run(
            measure(server, scenarios, k, seed))
    print(text)
    (ROOT / "bench" / "results" / "check_counterfactual.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
