"""Demonstration plans: the tool calls that solve a task, which `policy.DemonstrationPolicy` plays
through the real loop (warm starts, the reward audit's honest row). An environment gives its own
(`Environment.plan`); `sql_plan` makes one for a SQL server from its tool and argument names.

    plan = sql_plan(("run_query", "sql"), list_tables="list_tables", describe=("describe_table", "table_name"))
    plan(scenario)   # [list_tables, describe_table per table, run_query(reference), complete_task(answer)]

Light on purpose (no model or HTTP imports): environments import it when they are looked up.
"""

from __future__ import annotations

import re
from typing import Any, Callable


def format_answer(answer: Any) -> str:
    """Scenario answers as text: lists joined by ", ", floats to 2 decimals unless integral.

    >>> format_answer([1, 2.5, "x"]), format_answer(3.0), format_answer(2.34567)
    ('1, 2.5, x', '3', '2.35')
    """
    if isinstance(answer, (list, tuple)):
        return ", ".join(format_answer(a) for a in answer)
    if isinstance(answer, float):
        return str(int(answer)) if answer.is_integer() else f"{answer:.2f}".rstrip("0").rstrip(".")
    return "" if answer is None else str(answer)


# A FROM/JOIN followed by a table name (optionally quoted); CTE names are dropped below.
_TABLE_REF = re.compile(r"\b(?:from|join)\s+[\"`\[]?([A-Za-z_][A-Za-z0-9_]*)", re.IGNORECASE)
_CTE_NAME = re.compile(r"(?:\bwith|,)\s*(?:recursive\s+)?([A-Za-z_][A-Za-z0-9_]*)\s+as\s*\(", re.IGNORECASE)


def tables_in_sql(sql: str) -> list[str]:
    """Tables a query reads, in order of first mention (CTE names excluded)."""
    ctes = {m.lower() for m in _CTE_NAME.findall(sql)}
    seen: list[str] = []
    for t in _TABLE_REF.findall(sql):
        if t.lower() not in ctes and t not in seen and t.lower() not in ("select", "lateral"):
            seen.append(t)
    return seen


def sql_plan(query: tuple[str, str], *, list_tables: str | None = None,
             describe: tuple[str, str] | None = None) -> Callable[[Any], list[dict]]:
    """A demonstration plan for a SQL server, from its tool and argument names: `list_tables()`,
    `describe(table)` for each table of the task's `.reference` SQL, `query(reference)`, then
    `complete_task(answer=<.answer as text>)` (the steps an environment without one of them skips).

    >>> plan = sql_plan(("run_query", "sql"))
    >>> [s["tool"] for s in plan(type("S", (), {"reference": "SELECT 1", "answer": 1})())]
    ['run_query', 'complete_task']
    """
    def plan(scenario: Any) -> list[dict]:
        steps: list[dict] = [{"tool": list_tables, "arguments": {}}] if list_tables else []
        if scenario.reference:
            if describe:
                steps += [{"tool": describe[0], "arguments": {describe[1]: name}} for name in tables_in_sql(scenario.reference)]
            steps.append({"tool": query[0], "arguments": {query[1]: scenario.reference}})
        steps.append({"tool": "complete_task", "arguments": {"answer": format_answer(scenario.answer)}})
        return steps

    return plan


def actions_plan(scenario: Any) -> list[dict]:
    """A task's gold actions (`scenario.extra["actions"]`, [{"tool", "arguments"}]), then complete_task
    with its answer ("done" for a task whose outcome the environment checks itself).

    >>> from types import SimpleNamespace as S
    >>> actions_plan(S(extra={"actions": [{"tool": "reset", "arguments": {}}]}, answer=None))[-1]
    {'tool': 'complete_task', 'arguments': {'answer': 'done'}}
    """
    steps = [{"tool": a["tool"], "arguments": dict(a.get("arguments") or {})} for a in scenario.extra.get("actions", [])]
    answer = "done" if scenario.answer is None else format_answer(scenario.answer)
    return steps + [{"tool": "complete_task", "arguments": {"answer": answer}}]


def demonstrable(scenario: Any) -> bool:
    """Whether a plan has something to replay for this task: a reference query or gold actions."""
    return bool(getattr(scenario, "reference", None) or (getattr(scenario, "extra", None) or {}).get("actions"))


__all__ = ["format_answer", "tables_in_sql", "sql_plan", "actions_plan", "demonstrable"]
