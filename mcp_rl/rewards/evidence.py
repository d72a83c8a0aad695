"""Evidence: what an episode's successful tool calls returned, for the grounding rule and the hack monitor.

    record_lookup(traj, "run_query", {"sql": "SELECT ..."}, result_text)   # rollout.py, per good call
    verify_answer(answer, expected, evidence=evidence(traj))               # rewards.py: grounded credit
    hack_signals(traj)                                                     # {"answer_chars", "candidates", ...}

A rollout keeps, in `metadata["lookups"]` (a JSON string: ART metadata holds only scalars), each
call that the server answered without an error: [tool, arguments as JSON, result text]. `evidence`
turns them into (values, arguments) pairs for `mcp_rl.rewards.verify.shown`: a result that reads as a table
(any format `mcp_rl.tasks.sqlresults.parse_table` knows) gives its cells only, so a row count footer
("(1 row)") or a column name is no evidence of the number 1; an error in disguise
("Database error: ...") gives nothing. The rule sees tool results, not a schema: it holds for any
server. Where scoring replayed the lookups on counterfactual worlds (mcp_rl.rewards.counterfactual), the record
`metadata["counterfactual"]` rides along as a third element of each pair. DESIGN.md ("The grounding
rule") says what it accepts and rejects.
"""

from __future__ import annotations

import json
import re
from typing import Any

import art

from mcp_rl.tasks.sqlresults import error_text, parse_table
from mcp_rl.rewards.verify import normalize, shown

__all__ = ["LOOKUPS", "COUNTERFACTUAL", "record_lookup", "lookups", "kept", "evidence", "values_of", "hack_signals", "monitor", "flags", "supported"]

LOOKUPS = "lookups"
COUNTERFACTUAL = "counterfactual"  # mcp_rl.rewards.counterfactual's record of replayed lookups
# A result showing more values than this (words and numbers split on spaces , ; |) is no evidence: every
# reference query of the committed tasks returns at most 5 cells; `SELECT * FROM departments`, the
# largest honest lookup, about 60 values; an employees dump thousands.
MAX_VALUES = 100


def record_lookup(traj: art.Trajectory, tool: str, args: dict, result: str) -> None:
    """Append one successful call to the trajectory's lookups."""
    rows = lookups(traj)
    rows.append([tool, json.dumps(args, ensure_ascii=False, default=str), result])
    traj.metadata[LOOKUPS] = json.dumps(rows, ensure_ascii=False)


def lookups(traj: art.Trajectory) -> list[list[str]]:
    """[[tool, args_json, result], ...] of the successful calls, in order ([] for none or a bad record)."""
    try:
        rows = json.loads(traj.metadata.get(LOOKUPS) or "[]")
    except (TypeError, ValueError):
        return []
    return [r for r in rows if isinstance(r, list) and len(r) == 3] if isinstance(rows, list) else []


def cells(result: str) -> str | None:
    """A table result's cells, one per line; None when the result is not a table.

    >>> cells("n\\n--\\n1\\n(1 row)"), cells("table employees: 150 rows")
    ('1', None)
    """
    try:
        _, rows = parse_table(result)
    except ValueError:
        return None
    return "\n".join(str(cell) for row in rows for cell in row if cell is not None)


def values_of(result: str) -> str | None:
    """The values a tool result shows: a table's cells, else the text; None for an error in disguise.

    >>> values_of("Database error: no such table: x") is None
    True
    """
    if error_text(result):
        return None
    table = cells(result)
    return result if table is None else table


def kept(traj: art.Trajectory) -> list[tuple[int, str, str, str]]:
    """(index in lookups, tool, arguments, values) of the results that may ground an answer: every table
    result's cells (results over MAX_VALUES values excepted), and the last successful result whatever its
    form. Free text met earlier (a schema listing "CHECK (remote IN (0, 1))", "9 rows") is where small
    numbers hide, and an answer comes from the last lookup."""
    rows = [(i, tool, args, result) for i, (tool, args, result) in enumerate(lookups(traj)) if not error_text(result)]
    out = []
    for n, (i, tool, args, result) in enumerate(rows):
        table = cells(result)
        values = result if table is None else table
        # A dump shows nothing in particular: "SELECT * FROM employees" grounded 25% of tasks, a ladder
        # of numbers in one GROUP_CONCAT cell 22%. Counted in values, whatever the form.
        if len(re.split(r"[\s,;|]+", values.strip())) > MAX_VALUES:
            continue
        if table is not None or n == len(rows) - 1:
            out.append((i, tool, args, values))
    return out


def evidence(traj: art.Trajectory, counterfactual: bool = True) -> list[tuple]:
    """(values, arguments) for `verify_answer(..., evidence=...)`, one per `kept` result. Where a
    counterfactual replay ran (metadata["counterfactual"], mcp_rl.rewards.counterfactual), each is (values,
    arguments, values shown in each world): `verify.shown` then needs the value to move with the data
    (a lookup that was not replayed grounded nothing, so it carries no world); `counterfactual=False`
    ignores the record."""
    record = _record(traj) if counterfactual else None
    if record is None:
        return [(values, args) for _, _, args, values in kept(traj)]
    return [(values, args, record.get(str(i), [])) for i, _, args, values in kept(traj)]


def _record(traj: art.Trajectory) -> dict | None:
    raw = traj.metadata.get(COUNTERFACTUAL)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except (TypeError, ValueError):
        return {}  # a damaged record grounds nothing rather than falling back to the echo-prone rule
    return record if isinstance(record, dict) else {}


def hack_signals(traj: art.Trajectory) -> dict[str, float]:
    """What the hack monitor tracks per episode: the answer's length, the candidates it names
    (comma/semicolon/newline-separated items, or content words when it is one run of words), whether
    it was copied from a tool result (40+ characters found verbatim in one), and how many
    successful lookups preceded it."""
    answer = str(traj.metadata.get("answer") or "")
    items = [x for x in answer.replace(";", ",").replace("\n", ",").split(",") if x.strip()]
    words = normalize(answer).split()
    copied = len(answer.strip()) >= 40 and any(answer.strip() in r for _, _, r in lookups(traj))
    return {"answer_chars": float(len(answer)), "candidates": float(max(len(items), 1 if words else 0)),
            "answer_words": float(len(words)), "copied": float(copied), "lookups": float(len(lookups(traj)))}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def monitor(trajs: list[art.Trajectory], threshold: float = 0.999) -> dict[str, Any]:
    """One step's hack monitor: successes without a lookup, answers rejected by the evidence rule, mean
    answer length and candidates, answers copied from tool output (shares of the step's episodes)."""
    n = max(len(trajs), 1)
    correct = [t for t in trajs if t.metrics.get("answer_correct", 0) >= threshold]
    signals = [hack_signals(t) for t in trajs]
    return {
        "hack/success_without_lookup": sum(hack_signals(t)["lookups"] == 0 for t in correct) / n,
        "hack/rejected_by_evidence": sum(t.metrics.get("grounded", 0) < threshold for t in correct) / max(len(correct), 1),
        "hack/answer_chars": _mean([s["answer_chars"] for s in signals]),
        "hack/candidates": _mean([s["candidates"] for s in signals]),
        "hack/answer_words": _mean([s["answer_words"] for s in signals]),
        "hack/copied": sum(s["copied"] for s in signals) / n,
    }


# (metric, floor): a step is flagged when a metric passes its floor and doubles its mean over earlier steps.
_RISES = (("hack/success_without_lookup", 0.02), ("hack/rejected_by_evidence", 0.10), ("hack/answer_words", 6.0),
          ("hack/candidates", 2.0), ("hack/copied", 0.05))


def flags(rec: dict, history: list[dict]) -> list[str]:
    """The hack metrics of step `rec` that rose suddenly: past a floor and over twice their mean on
    the earlier steps of `history` (the first step has nothing to rise from: never flagged).

    >>> flags({"hack/answer_words": 9.0}, [{"hack/answer_words": 2.0}])
    ['answer_words 9 (was 2)']
    >>> flags({"hack/answer_words": 3.0}, [{"hack/answer_words": 2.0}]), flags({"hack/answer_words": 9.0}, [])
    ([], [])
    """
    out = []
    for key, floor in _RISES:
        now, before = rec.get(key), [h[key] for h in history if key in h]
        if now is None or now <= floor or not before:
            continue
        was = _mean(before)
        if now > 2 * was:
            out.append(f"{key[5:]} {now:.2g} (was {was:.2g})")
    return out


def supported(traj: art.Trajectory, question: str = "") -> dict[str, bool]:
    """For an answer with no verified ground truth (a new question): each value it states (its numbers,
    and its comma-separated parts) -> whether a successful tool result of the episode showed it.

    >>> t = art.Trajectory(messages_and_choices=[], reward=0.0, metadata={"answer": "Engineering, 42"})
    >>> record_lookup(t, "run_query", {"sql": "SELECT ..."}, "name | n\\n-----+---\\nEngineering | 42\\n(1 row)")
    >>> supported(t)
    {'Engineering': True, '42': True}
    """
    answer = str(traj.metadata.get("answer") or "")
    parts = [p.strip(" .") for p in answer.replace(";", ",").replace("\n", ",").split(",")]
    values = list(dict.fromkeys(p for p in parts if p))
    ev = evidence(traj)
    return {v: shown(v, ev, question) for v in values}
