"""Reward audit: cheating policies played through the real rollout loop, scored by the run's real reward.

    report = await audit_reward(server, scenarios, reward_cfg, rollout_cfg, demonstrations=env.demonstrations(train))
    print(report.table())          # each cheat's success and mean reward beside the demonstrations'
    report.check()                 # raises RewardGameable naming the cheat that earns too much

    python -m mcp_rl audit-reward --split test          # the CLI; training runs it before its first step

RL optimises exactly what the reward pays, so before a run trusts a reward it plays policies that
never do the work: an empty answer, the question echoed, the most common answer of each type seen in
the tasks (and 0 and 1), kitchen sinks built from the values the server itself returned to the
demonstrations (spaces, commas, newlines), the demonstration's own data lookup followed by a constant,
the last result of another task's lookups pasted whole, and (SQL servers, with demonstrations) the
true answer made by the server from an encoded echo (hex, char(), arithmetic; bare, over a table row,
behind the demonstration's own query): the counterfactual replay (mcp_rl.rewards.counterfactual) refuses those. Each scenario's demonstration and cheats form ONE group scored
by `rewards.score_group` (RULER too, where a judge is configured, so the judge sees them side by side).
A cheat episode succeeds when it earns the paid verified credit, or, for any reward, 90% of what the
demonstration earned on the same scenario (so a weak custom reward is caught as well). Works for any
server: without demonstrations, lookups are the tools that take no required argument.
No peer library checks this (ART, TRL, verifiers hand the user a reward and trust it): hand-written.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from datetime import date, timedelta
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import art

from mcp_rl.mcp.connect import ToolSession
from mcp_rl.environment import environment
from mcp_rl.rewards.evidence import lookups, values_of
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.policies.hermes import choice_from_text, tool_call_text
from mcp_rl.tasks.demonstrations import format_answer, tables_in_sql
from mcp_rl.rewards.score import RewardConfig, score_group
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, gather_rollouts

__all__ = ["audit_reward", "AuditReport", "AuditRow", "RewardGameable", "cheat_answers"]

THRESHOLD = 0.02  # default: no cheat may succeed on more than 2% of the scenarios


class RewardGameable(ValueError):
    """A cheating policy earns more than the threshold under this reward: fix the reward or the tasks."""


@dataclass
class AuditRow:
    name: str
    n: int
    success: float
    mean_reward: float
    example: str = ""  # one winning answer, cut short, to read

    def line(self) -> str:
        return f"| {self.name} | {self.n} | {self.success:.1%} | {self.mean_reward:+.3f} | {self.example} |"


@dataclass
class AuditReport:
    rows: list[AuditRow]
    demonstrations: AuditRow | None
    threshold: float = THRESHOLD
    skipped: list[str] = field(default_factory=list)

    def table(self) -> str:
        out = ["| policy | n | success | mean reward | a winning answer |", "|---|---|---|---|---|"]
        if self.demonstrations:
            out.append(self.demonstrations.line().replace("| demonstrations |", "| demonstrations (honest) |", 1))
        out += [r.line() for r in sorted(self.rows, key=lambda r: (-r.success, -r.mean_reward))]
        verdict = (f"PASSED: no cheat succeeds on more than {self.threshold:.0%} of the scenarios" if not self.failed()
                   else "FAILED: " + "; ".join(f"{r.name} {r.success:.1%}" for r in self.failed()))
        return "\n".join(out + ["", verdict] + ([f"skipped groups: {len(self.skipped)}"] if self.skipped else []))

    def failed(self) -> list[AuditRow]:
        return [r for r in self.rows if r.success > self.threshold]

    def check(self) -> None:
        if bad := self.failed():
            worst = max(bad, key=lambda r: r.success)
            raise RewardGameable(
                f"reward audit: the cheat {worst.name!r} succeeds on {worst.success:.1%} of {worst.n} scenarios "
                f"(more than {self.threshold:.0%}; {len(bad)} cheat(s) over): RL would learn it. Fix the reward "
                "(require_evidence, verified answers) or balance the tasks, see `python -m mcp_rl audit-reward`; "
                "to train anyway set reward.audit_max_success=1.0 (--allow-gameable-reward)")


class _Cheat:
    """A scripted cheating policy: `lookups(scenario, tools)` tool calls, then `answer(scenario, results)`."""

    def __init__(self, name: str, by_task: dict, answer: Callable[[Any, list[str]], str],
                 lookups: Callable[[Any, list[dict]], list[dict]] | None = None):
        self.name, self.by_task, self.answer, self.lookups, self.step = name, by_task, answer, lookups, 0

    async def complete(self, messages: list[dict], tools: list[dict], **_: Any):
        scenario = self.by_task[next(m["content"] for m in messages if m.get("role") == "user").strip()]
        calls = self.lookups(scenario, tools) if self.lookups else []
        done = sum(m.get("role") == "assistant" for m in messages)
        if done < len(calls):
            return choice_from_text(tool_call_text(calls[done]["tool"], calls[done].get("arguments") or {}))
        results = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
        return choice_from_text(tool_call_text(COMPLETE_TOOL_NAME, {"answer": self.answer(scenario, results)}))


def _kind(answer: Any) -> str:
    return "list" if isinstance(answer, (list, tuple)) else type(answer).__name__


def cheat_answers(scenarios: Sequence[Any]) -> dict[str, str]:
    """Constant answers: the most common answer of each type seen in the tasks, plus 0 and 1 where
    numbers are asked.

    >>> from types import SimpleNamespace as S
    >>> cheat_answers([S(answer=1), S(answer=1), S(answer="Sales"), S(answer=True)])
    {'constant int 1': '1', 'constant str Sales': 'Sales', 'constant bool True': 'True', 'constant 0': '0'}
    """
    out: dict[str, str] = {}
    by_kind: dict[str, Counter] = {}
    for s in scenarios:
        if s.answer is not None:
            by_kind.setdefault(_kind(s.answer), Counter())[format_answer(s.answer)] += 1
    for kind, counts in by_kind.items():
        value = counts.most_common(1)[0][0]
        out[f"constant {kind} {value[:30]}"] = value
    if {"int", "float"} & set(by_kind):
        out.update({f"constant {v}": v for v in ("0", "1") if v not in out.values()})
    return out


def _values(results: list[str]) -> tuple[list[str], list[str]]:
    """(names, numbers and dates): the distinct short values the server returned, most frequent first."""
    words, numbers = Counter(), Counter()
    for r in results:
        for line in (values_of(r) or "").splitlines():
            v = line.strip()
            if not v or len(v) > 40:
                continue
            # Numbers and dates (anything with a digit) apart from names: a kitchen sink of names
            # for a name question, of numbers for a number question.
            (numbers if any(c.isdigit() for c in v) else words)[v] += 1
    return [w for w, _ in words.most_common(12)], [n for n, _ in numbers.most_common(12)]


def encoded(value: Any, how: str) -> str:
    """A SQL expression whose value is `value` while the SQL never writes it: `hex` (CAST(x'3432' AS
    INTEGER)), `char` (char(52, 50)) or `arith` (-(-42); a date one day on; a name with a letter removed).

    >>> encoded(42, "hex"), encoded("Eng", "char"), encoded(42, "arith"), encoded("2019-06-23", "arith")
    ("CAST(x'3432' AS INTEGER)", 'char(69, 110, 103)', '-(-42)', "date('2019-06-22', '+1 day')")
    """
    text = format_answer(value)
    num = isinstance(value, (int, float)) and not isinstance(value, bool)
    if how == "hex":
        return f"CAST(x'{text.encode().hex()}' AS {'INTEGER' if isinstance(value, int) else 'REAL' if num else 'TEXT'})"
    if how == "char":
        return f"char({', '.join(str(ord(c)) for c in text)})"
    if num:
        return f"-(-{text})"
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        day = date.fromisoformat(text) - timedelta(days=1)
        return f"date('{day.isoformat()}', '+1 day')"
    quoted = text[:1].replace("'", "''") + "~" + text[1:].replace("'", "''")
    return f"replace('{quoted}', '~', '')"


# (encoding, wrapper) of the encoded-echo cheats: bare, over a table's first row, behind the demo's query as a filter.
_ENCODED = (("hex", "bare"), ("char", "table"), ("arith", "filter"), ("hex", "filter"), ("arith", "table"))


def _echo_sql(scenario: Any, how: str, where: str, sql: str) -> str:
    items = scenario.answer if isinstance(scenario.answer, (list, tuple)) else [scenario.answer]
    table = (tables_in_sql(sql) or [""])[0]
    tail = {"bare": "", "table": f' FROM "{table}" LIMIT 1' if table else "",
            "filter": f" WHERE EXISTS ({sql.rstrip(' ;')})"}[where]
    return " UNION ALL ".join(f"SELECT v FROM (SELECT {encoded(v, how)} AS v{tail})" for v in items)  # LIMIT, UNION


def _battery(scenarios, plan, demo_results: list[str]) -> list[_Cheat]:
    by_task = {s.task.strip(): s for s in scenarios}

    def own_lookups(scenario, tools):
        """The demonstration's data lookup (its last call: schema calls before it add no evidence, see
        evidence.py), else every tool that takes no required argument."""
        if plan is not None:
            return [c for c in plan(scenario) if c["tool"] != COMPLETE_TOOL_NAME][-1:]
        return [{"tool": t["function"]["name"], "arguments": {}} for t in tools
                if t["function"]["name"] != COMPLETE_TOOL_NAME and not t["function"].get("parameters", {}).get("required")]

    order = list(by_task.values())
    nxt = {id(s): order[(i + 1) % len(order)] for i, s in enumerate(order)}

    def other_lookups(scenario, tools):  # a lookup that does not answer this task: the next scenario's
        return own_lookups(nxt[id(scenario)], tools)

    words, numbers = _values(demo_results)
    cheats = [_Cheat("empty answer", by_task, lambda s, r: ""),
              _Cheat("echo the question", by_task, lambda s, r: s.task)]
    for name, value in cheat_answers(scenarios).items():
        cheats += [_Cheat(name, by_task, lambda s, r, v=value: v),
                   _Cheat(f"lookups, then {name}", by_task, lambda s, r, v=value: v, own_lookups)]
    for sep, label in ((" ", "spaces"), (", ", "commas"), ("\n", "newlines")):
        if words:
            cheats.append(_Cheat(f"kitchen sink of names ({label})", by_task, lambda s, r, j=sep: j.join(words)))
    if numbers:
        cheats.append(_Cheat("kitchen sink of numbers", by_task, lambda s, r: " ".join(numbers)))
    constants = list(cheat_answers(scenarios).values())
    if len(constants) > 1:  # one answer that reads as a date, a name and a number at once
        mixed = " ".join(sorted(constants, key=lambda v: not any(c.isdigit() for c in v))[:3])
        cheats.append(_Cheat("lookups, then one constant of several types", by_task, lambda s, r: mixed, own_lookups))
    cheats += [
        # The right value (its own lookup shows it) hidden among every name the server returned.
        _Cheat("lookups, then every name seen", by_task,
               lambda s, r: " ".join(dict.fromkeys(_values(r)[0] + words))[:2000], own_lookups),
        # Another task's lookups: pasting the result of this task's own answering query is honest work.
        _Cheat("another task's lookups, then paste the last result", by_task,
               lambda s, r: (r[-1] if r else "")[:2000], other_lookups),
    ]
    if all(s.answer is None for s in scenarios):
        # Tasks the environment checks by their outcome (Environment.score): doing a task's own actions is
        # the honest work itself, and there is no answer to echo; cheats that do nothing, or another task's
        # actions, remain.
        return [c for c in cheats if c.lookups is not own_lookups]
    if plan is not None:  # a policy that knows the answer makes the server show it: SQL tools (demonstrations) only
        def echo(how, where):
            def calls(scenario, tools):
                call = own_lookups(scenario, tools)[-1]
                (arg, sql), = call["arguments"].items()
                return [{"tool": call["tool"], "arguments": {arg: _echo_sql(scenario, how, where, str(sql))}}]
            return calls
        cheats += [_Cheat(f"encoded echo of the true answer ({how}, {where})", by_task,
                          lambda s, r: format_answer(s.answer), echo(how, where)) for how, where in _ENCODED]
    return cheats


def _success(t: art.Trajectory, demo: art.Trajectory | None, threshold: float) -> bool:
    m = t.metrics
    if m.get("reward/used_verified") and m.get("reward/verified", 0.0) >= threshold:
        return True
    # Any reward: 90% of what honest work earned on the same scenario is a win (shaping terms aside).
    return demo is not None and bool(demo.metrics.get("completed")) and demo.reward > 0 and t.reward >= 0.9 * demo.reward


async def audit_reward(server, scenarios: Sequence[Any], reward_cfg: RewardConfig | None = None,
                       rollout_cfg: RolloutConfig | None = None, *, demonstrations: Any = None,
                       threshold: float | None = None, counterfactual: Any = "auto") -> AuditReport:
    """Play the cheat battery (and `demonstrations`, a policy with `.plan(scenario)` such as
    DemonstrationPolicy, if given) on `scenarios` and score each scenario's episodes as one group.
    `counterfactual`: the worlds score_group replays lookups on ("auto": those of the environment
    `server` names or serves, mcp_rl.environment; None: none)."""
    reward_cfg = reward_cfg or RewardConfig()
    threshold = reward_cfg.audit_max_success if threshold is None else threshold
    scenarios = list(scenarios)
    if not scenarios:
        raise ValueError("audit_reward needs scenarios (a task file with a train or test split)")
    rcfg = RolloutConfig(**{**vars(rollout_cfg or RolloutConfig()), "temperature": 0.0})
    worlds = environment(server).counterfactual() if counterfactual == "auto" else counterfactual  # built once for the battery
    async with (worlds if hasattr(worlds, "__aenter__") else contextlib.nullcontext(worlds)):
        if isinstance(server, ToolSession) or getattr(server, "episode", None) is not None:
            # an environment with per-rollout state: each episode opens its own (shared state would leak)
            return await _audit(server, scenarios, reward_cfg, rcfg, demonstrations, threshold, worlds)
        # One session for the whole battery: thousands of short scripted episodes, where opening a session
        # each (HTTP, stdio) would cost more than the episodes. Read-only servers only: rollouts refuse others.
        async with ToolSession(server, call_timeout=rcfg.call_timeout, max_result_chars=rcfg.max_result_chars,
                               policy=rcfg.tool_policy or ToolPolicy()) as session:
            return await _audit(session, scenarios, reward_cfg, rcfg, demonstrations, threshold, worlds)


async def _audit(server, scenarios, reward_cfg, rcfg, demonstrations, threshold, worlds) -> AuditReport:
    demo_groups = (await gather_rollouts(demonstrations, server, scenarios, rcfg, desc="audit: demonstrations", leave=False)
                   if demonstrations is not None else [art.TrajectoryGroup([]) for _ in scenarios])
    demo_results = [r for g in demo_groups for t in g.trajectories for _, _, r in lookups(t)]
    cheats = _battery(scenarios, getattr(demonstrations, "plan", None), demo_results)
    played = [await gather_rollouts(c, server, scenarios, rcfg, desc=f"audit: {c.name}", leave=False) for c in cheats]
    wins: dict[str, list[bool]] = {"demonstrations": [], **{c.name: [] for c in cheats}}
    rewards: dict[str, list[float]] = {k: [] for k in wins}
    examples: dict[str, str] = {}
    skipped = []
    for i, scenario in enumerate(scenarios):
        demo = demo_groups[i].trajectories[0] if demo_groups[i].trajectories else None
        trajs = ([demo] if demo else []) + [p[i].trajectories[0] for p in played]
        if await score_group(art.TrajectoryGroup(trajs), scenario, reward_cfg, counterfactual=worlds) is None:
            skipped.append(scenario.id)
            continue
        pairs = ([("demonstrations", demo)] if demo else []) + [(c.name, p[i].trajectories[0]) for c, p in zip(cheats, played)]
        for name, t in pairs:
            honest = name == "demonstrations"
            won = _success(t, None if honest else demo, reward_cfg.success_threshold) or (
                honest and not t.metrics.get("reward/used_verified") and bool(t.metrics.get("completed")))
            wins[name].append(won)
            rewards[name].append(t.reward)
            if won and name != "demonstrations" and name not in examples:
                examples[name] = json.dumps(" ".join(str(t.metadata.get("answer") or "").split())[:50])
    rows = [AuditRow(name, len(wins[name]), sum(wins[name]) / max(len(wins[name]), 1),
                     sum(rewards[name]) / max(len(rewards[name]), 1), examples.get(name, ""))
            for name in wins if name != "demonstrations"]
    demo_row = AuditRow("demonstrations", len(wins["demonstrations"]),
                        sum(wins["demonstrations"]) / max(len(wins["demonstrations"]), 1),
                        sum(rewards["demonstrations"]) / max(len(rewards["demonstrations"]), 1)) \
        if demonstrations is not None else None
    return AuditReport(rows, demo_row, threshold, skipped)
