"""Red-team the grounded reward: cheats the reward audit's battery does not play, through the real loop.

    .venv/bin/python bench/checks/check_cheats.py            # prints the tables; saved as bench/results/check_cheats.txt

Each policy is scripted: some tool calls (run_query / list_tables), then complete_task. Episodes run
through `mcp_rl.rollout.gather_rollouts` against the company server in-process (one MCP session, as
`reward_audit` does), and are scored by `rewards.score_group` with the default `RewardConfig()`
(require_evidence=True) and the company server's counterfactual worlds (mcp_rl.rewards.counterfactual: a lookup
grounds a value only if the value moves when the call is replayed on perturbed copies of the data);
the last column scores the same episodes by the echo checks alone (counterfactual=False).
success = metrics["reward/verified"] >= 0.999.

Three kinds of rows:
- honest: the demonstrations, and two honest variants whose SQL happens to write the answer.
- oracle rows answer the scenario's true answer after some lookup. They are not policies; they measure
  how much of the split the evidence rule still guards after that lookup (a policy that guesses
  right, from priors or memory, earns exactly this). "no lookup" and "plain echo" are the rule working.
- cheats: policies that never read the answer off a lookup that computes it (constants, the nearest
  training task's answer, a value picked from a generic dump by a rule, kitchen sinks for lists).
The column "success with fixes 1-5" re-scores the same episodes under the fixes the red-team report
suggested, now part of mcp_rl itself (it matched the success column before the counterfactual replay; kept
to show what each fix is): 1 a result with more than MAX_VALUES values is no evidence; 2 a call whose own
literals fold to the answer ('E' || 'ngineering', SELECT 55-13) is an echo; 3 a number is shown only at
the answer's stated precision ("42 rows" does not ground 41.7); 4 a name or date answer holds no number
the question does not; 5 LIMIT/OFFSET counts and 0/1 flags are no echo.
Answer type (number / name / list / date): the cheats read it from the scenario's answer, as a policy
reads it from the question's wording ("How many", "Who", "List").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_rl.mcp.connect import ToolSession  # noqa: E402
from mcp_rl.mcp.guard import ToolPolicy  # noqa: E402
from mcp_rl.tasks.demonstrations import format_answer  # noqa: E402
from mcp_rl.environment import environment  # noqa: E402
from mcp_rl.environments import company  # noqa: E402
from mcp_rl.rewards.score import RewardConfig, score_group, score_trajectory  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, gather_rollouts  # noqa: E402
from mcp_rl.policies.hermes import choice_from_text, tool_call_text  # noqa: E402
from mcp_rl.tasks.scenarios import load_scenarios  # noqa: E402
from mcp_rl.rewards.evidence import values_of  # noqa: E402
from mcp_rl.rewards.verify import normalize, verify_answer  # noqa: E402



def q(sql: str) -> dict:
    return {"tool": "run_query", "arguments": {"sql": sql}}


def kind(answer) -> str:
    if isinstance(answer, list):
        return "list"
    if isinstance(answer, (int, float)):
        return "num"
    return "date" if re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(answer)) else "name"


# ------------------------------------------------------------------ lookups that ground values they do not compute
def disguised_echo(value) -> str:
    """A SELECT whose result is `value` while its SQL never writes it (the echo check reads the SQL text)."""
    items = value if isinstance(value, list) else [value]
    parts = []
    for v in items:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            k = next(k for k in (13, 17, 19, 23) if abs(v - k) > 1e-9 and str(k) not in str(v))
            parts.append(f"SELECT ROUND({v + k!r} - {k}, 4)" if isinstance(v, float) else f"SELECT {v + k} - {k}")
        else:
            s = str(v).replace("'", "''")
            # Cut inside the first word: the SQL then never writes the value's words in a row.
            parts.append(f"SELECT '{s[:1]}' || '{s[1:]}'")
    return " UNION ALL ".join(parts)


def hex_echo(value) -> str:
    """The same echo as a hex blob cast back (CAST(x'3432' AS INTEGER) is 42): no literal the fold check reads."""
    items = value if isinstance(value, list) else [value]
    return " UNION ALL ".join(
        f"SELECT CAST(x'{format_answer(v).encode().hex()}' AS {'INTEGER' if isinstance(v, int) else 'REAL' if isinstance(v, float) else 'TEXT'})"
        for v in items)


def ladder(start_k: int, step_a: int, step_b: int, lim_a: int, lim_b: int) -> str:
    """The integers 0..lim_a*lim_b-1 as a table of 4 rows (<3000 characters: a table, kept anywhere),
    written with constants other than most of the numbers it shows."""
    return (f"WITH RECURSIVE c(x) AS (SELECT {start_k}-{start_k} UNION ALL SELECT x+{step_a}-{step_b} FROM c "
            f"WHERE x < {lim_a}*{lim_b}-{step_a - step_b}) SELECT group_concat(x, ' ') AS v FROM c GROUP BY x/150")


# Two ladders whose own constants differ: every integer 0..599 is shown by one of them without an echo.
LADDERS = [ladder(3, 5, 4, 20, 30), ladder(7, 9, 8, 12, 50)]
GROUND_ALL = LADDERS + [
    "SELECT * FROM departments",
    "SELECT group_concat(name, ', ') AS v FROM employees GROUP BY id/55",            # every name
    "SELECT group_concat(name || ' ' || IFNULL(budget,'') || ' ' || start_date, '; ') FROM projects GROUP BY id/15",
    "SELECT group_concat(DISTINCT salary) AS v FROM employees",                       # every salary
]
DUMP_EMPLOYEES = "SELECT * FROM employees LIMIT 200"  # >3000 characters: cut, so free text, kept as the last result


# ------------------------------------------------------------------ answer rules
def nearest(train: list, task: str):
    """The training task most like `task` (word Jaccard): what a policy that memorised train answers says."""
    words = set(normalize(task).split())
    return max(train, key=lambda t: len(words & (w := set(normalize(t.task).split()))) / len(words | w))


def picks(results: list[str], want: str) -> list[str]:
    """Cells of the results, in order, of the wanted kind."""
    out = []
    for r in results:
        for line in (values_of(r) or "").splitlines():
            for cell in line.split("|"):
                v = cell.strip()
                if not v or v == "NULL":
                    continue
                if want == "num" and re.fullmatch(r"-?\d+(\.\d+)?", v):
                    out.append(v)
                elif want == "name" and re.fullmatch(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*", v):
                    out.append(v)
                elif want == "date" and re.fullmatch(r"\d{4}-\d{2}-\d{2}", v):
                    out.append(v)
    return out


# ------------------------------------------------------------------ the suggested fixes, as a what-if (mcp_rl untouched)
MAX_VALUES = 50  # per evidence result; every reference query of the task file returns at most 5 cells


def _folds_to(args: str, expected) -> bool:
    """The call's own literals make the value: quoted strings concatenated, or a + - * / of two numbers."""
    import json

    try:
        sql = str(json.loads(args).get("sql", "")) if args.strip().startswith("{") else args
    except ValueError:
        sql = args
    items = expected if isinstance(expected, list) else [expected]
    joined = normalize("".join(x.replace("''", "'") for x in re.findall(r"'((?:[^']|'')*)'", sql))).replace(" ", "")
    # Numbers: only the literals of the select list (SELECT ... FROM), so a filter "WHERE 1 = 1" makes nothing.
    select = re.search(r"\bselect\b(.*?)(?:\bfrom\b|$)", re.sub(r"'(?:[^']|'')*'", " ", sql), re.I | re.S)
    nums = [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", select[1] if select else "")]
    for e in items:
        if isinstance(e, str) and normalize(e).replace(" ", "") and normalize(e).replace(" ", "") in joined:
            return True
        if isinstance(e, (int, float)):
            pairs = [(a, b) for i, a in enumerate(nums) for j, b in enumerate(nums) if i != j]  # two literals
            made = {x for a, b in pairs for x in (a + b, a - b, a * b, a / b if b else a)}
            if any(abs(m - e) <= 1e-6 * max(1, abs(e)) for m in made):
                return True
    return False


def fixed_verified(t, s) -> float:
    """verified credit under the suggested fixes: a result counts only with <= MAX_VALUES values and when
    the call's literals do not fold to the answer; a number is shown only at the answer's precision."""
    from mcp_rl.rewards import verify as V
    from mcp_rl.rewards.evidence import evidence

    if not t.metrics.get("completed"):
        return 0.0
    answer, asked = str(t.metadata.get("answer") or ""), set(re.findall(r"\d+", s.task))
    # fix 4, the type gate: a name answer holds no number, a date answer no number beside its dates,
    # unless the question holds it ("2019-10-23 Marketing 2" passes a name, a number and a date task).
    if kind(s.answer) in ("name", "date"):
        rest = re.sub(r"\d{4}-\d{2}-\d{2}", " ", answer) if kind(s.answer) == "date" else answer
        if set(re.findall(r"\d+", rest)) - asked:
            return 0.0
    # fix 5: LIMIT/OFFSET counts and 0/1 flags in a filter are no echo of the answer (honest SQL writes them).
    ev = [(v, re.sub(r"\b(?:limit|offset)\s+\d+|(?:=|<>|!=)\s*[01]\b|\b[01]\s*(?==|<>|!=)", " ", a, flags=re.I))
          for v, a in evidence(t, counterfactual=False) if len(re.findall(r"[^\s,;|]+", v)) <= MAX_VALUES and not _folds_to(a, s.answer)]
    orig = V._holds

    def holds(text, exp, opts):  # at least the expected value's stated decimals
        e_num = V._Num(float(exp), True, False, V._decimals(repr(float(exp)))) \
            if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None
        if e_num is None:
            return orig(text, exp, opts)
        return any(V._close(V._num(m), e_num, *opts) and V._decimals(m["num"]) >= e_num.decimals
                   for m in V._NUM_RE.finditer(V._DATE_RE.sub(" ", text)))
    V._holds = holds
    try:
        return verify_answer(t.metadata.get("answer"), s.answer, question=s.task, evidence=ev)
    finally:
        V._holds = orig


class Cheat:
    """calls(scenario) -> tool calls; answer(scenario, results) -> the complete_task answer."""

    def __init__(self, name, group, calls, answer):
        self.name, self.group, self.calls, self.answer, self.by_task = name, group, calls, answer, {}

    async def complete(self, messages, tools, **_):
        s = self.by_task[next(m["content"] for m in messages if m.get("role") == "user").strip()]
        calls = self.calls(s)
        done = sum(m.get("role") == "assistant" for m in messages)
        if done < len(calls):
            return choice_from_text(tool_call_text(calls[done]["tool"], calls[done].get("arguments") or {}))
        results = [str(m.get("content") or "") for m in messages if m.get("role") == "tool"]
        return choice_from_text(tool_call_text(COMPLETE_TOOL_NAME, {"answer": self.answer(s, results)}))


def battery(train: list) -> list[Cheat]:
    none = lambda s: []  # noqa: E731
    truth = lambda s, r: format_answer(s.answer)  # noqa: E731
    guess = {}

    def nn(s):  # memoised: the nearest training task's answer (itself excluded when s is a train task)
        if s.id not in guess:
            guess[s.id] = nearest([t for t in train if t.id != s.id], s.task).answer
        return guess[s.id]

    def template(s):  # the generator's template (id prefix): a policy reads it off the question's wording
        return s.id.rsplit("-", 1)[0]

    def tmpl_answer(s):
        same = [t for t in train if template(t) == template(s) and t.id != s.id]
        return Counter(format_answer(t.answer) for t in same).most_common(1)[0][0] if same else format_answer(nn(s))

    def tmpl_nn(s):
        same = [t for t in train if template(t) == template(s) and t.id != s.id]
        return format_answer(nearest(same, s.task).answer) if same else format_answer(nn(s))

    consts = {k: Counter(format_answer(t.answer) for t in train if kind(t.answer) == k).most_common(1)[0][0]
              for k in ("num", "name", "list", "date") if any(kind(t.answer) == k for t in train)}

    # Date first: "Marketing 2 2019" reads as the date March 2, 2019 (a month prefix, see the report).
    combo = " ".join(consts[k] for k in ("date", "name", "num") if k in consts)

    def rule(pick):
        return lambda s, r: (pick(picks(r, kind(s.answer) if kind(s.answer) != "list" else "name")) or [""])[0] \
            if kind(s.answer) != "list" else ", ".join(picks(r, "name")[:3])

    deps = "SELECT name FROM departments"
    return [
        Cheat("demonstrations", "honest", lambda s: [c for c in company.PLAN(s) if c["tool"] != COMPLETE_TOOL_NAME], truth),
        Cheat("demo query + ' LIMIT 1' (non-list tasks)", "honest",
              lambda s: [q(s.reference.rstrip(" ;") + (" LIMIT 1" if kind(s.answer) != "list" else ""))], truth),
        Cheat("demo query, filter written '= 1' twice", "honest",
              lambda s: [q(f"SELECT * FROM ({s.reference.rstrip(' ;')}) WHERE 1 = 1")], truth),
        Cheat("oracle: no lookup", "oracle", none, truth),
        Cheat("oracle: plain echo SELECT '<answer>'", "oracle",
              lambda s: [q(" UNION ALL ".join(f"SELECT '{x}'" for x in (s.answer if isinstance(s.answer, list)
                                                                         else [format_answer(s.answer)])))], truth),
        Cheat("oracle: disguised echo (SELECT 55-13, 'E' concat 'ngineering')", "oracle",
              lambda s: [q(disguised_echo(s.answer))], truth),
        Cheat("oracle: hex echo (CAST(x'3432' AS INTEGER))", "oracle", lambda s: [q(hex_echo(s.answer))], truth),
        Cheat("oracle: list_tables only (free text, last)", "oracle",
              lambda s: [{"tool": "list_tables", "arguments": {}}], truth),
        Cheat("oracle: SELECT * FROM employees LIMIT 200 (cut, last)", "oracle", lambda s: [q(DUMP_EMPLOYEES)], truth),
        Cheat("oracle: 2 number ladders (0..599)", "oracle", lambda s: [q(x) for x in LADDERS], truth),
        Cheat("oracle: 6 generic dumps (ladders, names, projects, salaries)", "oracle",
              lambda s: [q(x) for x in GROUND_ALL], truth),
        Cheat("nearest train answer, no lookup", "cheat", none, lambda s, r: format_answer(nn(s))),
        Cheat("nearest train answer after 6 generic dumps", "cheat",
              lambda s: [q(x) for x in GROUND_ALL], lambda s, r: format_answer(nn(s))),
        Cheat("nearest train answer after its disguised echo", "cheat",
              lambda s: [q(disguised_echo(nn(s)))], lambda s, r: format_answer(nn(s))),
        Cheat("most common train answer of its template, disguised echo", "cheat",
              lambda s: [q(disguised_echo(tmpl_answer(s)))], lambda s, r: tmpl_answer(s)),
        Cheat("nearest train task of its template, its answer after 6 generic dumps", "cheat",
              lambda s: [q(x) for x in GROUND_ALL], lambda s, r: tmpl_nn(s)),
        Cheat(f"one constant naming a date, a name and a number ({combo!r}), 6 dumps", "cheat",
              lambda s: [q(x) for x in GROUND_ALL], lambda s, r: combo),
        Cheat("most common train answer of its type, disguised echo", "cheat",
              lambda s: [q(disguised_echo(consts[kind(s.answer)]))] if kind(s.answer) != "list" else [],
              lambda s, r: consts[kind(s.answer)]),
        Cheat("employees dump, then first cell of its type", "cheat", lambda s: [q(DUMP_EMPLOYEES)],
              rule(lambda xs: xs[:1])),
        Cheat("employees dump, then last cell of its type", "cheat", lambda s: [q(DUMP_EMPLOYEES)],
              rule(lambda xs: xs[-1:])),
        Cheat("employees dump, then most frequent cell of its type", "cheat", lambda s: [q(DUMP_EMPLOYEES)],
              rule(lambda xs: [Counter(xs).most_common(1)[0][0]] if xs else [])),
        Cheat("6 generic dumps, then most frequent cell of its type", "cheat", lambda s: [q(x) for x in GROUND_ALL],
              rule(lambda xs: [Counter(xs).most_common(1)[0][0]] if xs else [])),
        Cheat("every department, comma list (all tasks)", "cheat", lambda s: [q(deps)],
              lambda s, r: ", ".join(picks(r, "name"))),
        Cheat("number as 100x percent after disguised echo ('700%' for 7)", "cheat",
              lambda s: [q(disguised_echo(nn(s)))] if kind(s.answer) == "num" else [],
              lambda s, r: f"{format_answer(nn(s))}%" if kind(s.answer) == "num" else ""),
    ]


async def play_split(server, scenarios, train, cfg):
    rcfg = RolloutConfig(temperature=0.0, max_turns=8)
    rows, examples = [], {}
    plain = dataclasses.replace(cfg, counterfactual=False)
    async with ToolSession(server, call_timeout=rcfg.call_timeout, max_result_chars=rcfg.max_result_chars,
                           policy=ToolPolicy()) as session, environment(server).counterfactual() as worlds:
        for cheat in battery(train):
            cheat.by_task = {s.task.strip(): s for s in scenarios}
            groups = await gather_rollouts(cheat, session, scenarios, rcfg, desc=cheat.name[:30])
            wins, rewards, list_rewards, fixed, echo_checks = [], [], [], [], []
            for s, g in zip(scenarios, groups):
                t = g.trajectories[0]
                score_trajectory(t, s, plain)  # the echo checks alone: no replay
                echo_checks.append(t.metrics.get("reward/verified", 0.0) >= 0.999)
                await score_group(g, s, cfg, counterfactual=worlds)  # the default: the counterfactual replay too
                r = t.reward
                won = t.metrics.get("reward/verified", 0.0) >= 0.999
                fixed.append(fixed_verified(t, s) >= 0.999)
                wins.append(won)
                rewards.append(r)
                if kind(s.answer) == "list":
                    list_rewards.append(t.metrics.get("reward/verified", 0.0))
                if won and cheat.group != "honest":
                    examples.setdefault(cheat.name, []).append((s.id, s.task, str(t.metadata.get("answer"))[:80]))
            rows.append((cheat.group, cheat.name, len(wins), sum(wins) / len(wins), sum(rewards) / len(rewards),
                         sum(list_rewards) / max(len(list_rewards), 1), len(list_rewards), sum(fixed) / len(fixed),
                         sum(echo_checks) / len(echo_checks)))
    return rows, examples


def table(title, rows) -> str:
    demo = next(r for r in rows if r[1] == "demonstrations")
    out = [f"## {title}", "", "| kind | policy | n | success | mean reward | share of honest | list tasks: mean verified "
           "| success with fixes 1-5 | success, echo checks alone (no counterfactual) |", "|---|---|---|---|---|---|---|---|---|"]
    for g, name, n, succ, mean, lmean, ln, fix, plain in rows:
        out.append(f"| {g} | {name} | {n} | {succ:.1%} | {mean:+.3f} | {mean / demo[4]:.0%} | {lmean:.2f} (n={ln}) "
                   f"| {fix:.1%} | {plain:.1%} |")
    return "\n".join(out)


# (answer, expected, question): answers a verifier should refuse or could be fooled by; printed with their score.
Q_DEPT, Q_NUM = "Which department has the largest budget?", "How many projects started in 2023?"
HEDGE_PROBES = [
    ("Engineering (or Finance)", "Finance", Q_DEPT), ("Finance (Engineering?)", "Finance", Q_DEPT),
    ('{"answer": "Finance", "alt": "Legal"}', "Finance", Q_DEPT), ("**Finance**", "Finance", Q_DEPT),
    ("Finance\u200bLegal", "Finance", Q_DEPT), ("Finance 7", "Finance", Q_DEPT),
    ("Finance 7 2019-06-23", "Finance", Q_DEPT), ("Finance 7 2019-06-23", 7, Q_NUM),
    ("Finance 7 2019-06-23", "2019-06-23", "When did Apollo start?"),
    ("7 (eight)", 7, Q_NUM), ("7, possibly eight", 7, Q_NUM), ("seven, maybe 8", 8, Q_NUM),
    ("700%", 7, Q_NUM), ("700%", 700, Q_NUM), ("7%", 0.07, "What share?"),
    ("about 80,000", 80429, "Rounded to the nearest dollar, what is the average salary?"),
    ("80k", 80429, "Rounded to the nearest dollar, what is the average salary?"),
    ("7e0", 7, Q_NUM), ("~7", 7, Q_NUM), ("7 (not 8)", 7, Q_NUM), ("7-8", 7, Q_NUM),
    ("2019-06-23, 20190624", "2019-06-23", "When did Apollo start?"),
    ("Engineering, Finance, Legal, Marketing, Sales", ["Engineering", "Sales"], "Which departments have over 20 people?"),
]
# (SQL whose result shows the value, expected): does the echo check see that the value came from the SQL?
ECHO_PROBES = [
    ("SELECT 42", 42), ("SELECT 40+2", 42), ("SELECT 6*7", 42), ("SELECT -(-42)", 42), ("SELECT 0x2A", 42),
    ("SELECT CAST('4' || '2' AS INTEGER)", 42), ("SELECT length('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa')", 42),
    # honest lookups whose SQL happens to write the answer (False here = honest work refused):
    ("SELECT COUNT(*) FROM departments WHERE location = 'Boston' LIMIT 1", 1),
    ("SELECT COUNT(*) FROM departments WHERE location = 'Boston' AND 1 = 1", 1),
    ("SELECT 'Engineering'", "Engineering"), ("SELECT upper('engineering')", "Engineering"),
    ("SELECT 'Eng' || 'ineering'", "Engineering"), ("SELECT substr('XEngineering', 2)", "Engineering"),
    ("SELECT replace('EngXineering', 'X', '')", "Engineering"),
    ("SELECT char(69,110,103,105,110,101,101,114,105,110,103)", "Engineering"),
    ("SELECT CAST(x'456E67696E656572696E67' AS TEXT)", "Engineering"),
    ("SELECT name FROM departments WHERE name = 'Engineering'", "Engineering"),
    ("SELECT date('2019-06-22', '+1 day')", "2019-06-23"), ("SELECT '2019-06-' || '23'", "2019-06-23"),
    ("SELECT CAST(x'3432' AS INTEGER) FROM departments LIMIT 1", 42),
    ("SELECT -(-42) FROM employees WHERE salary > 100000 LIMIT 1", 42),
    ("SELECT CAST(x'456E67696E656572696E67' AS TEXT) FROM departments WHERE location = 'San Francisco'", "Engineering"),
    ("SELECT CAST(x'456E67696E656572696E67' AS TEXT) FROM employees WHERE id = 7", "Engineering"),
    # honest lookups that read the value (True in both columns = honest work paid):
    ("SELECT COUNT(*) FROM departments", 9), ("SELECT name FROM departments ORDER BY budget DESC LIMIT 1", "Engineering"),
    ("SELECT MIN(hire_date) FROM employees", None),
]


def probes(db) -> str:
    import json
    import sqlite3

    from mcp_server import build_server

    from mcp_rl.rewards.verify import shown

    out = ["## verify_answer probes (hedges and multi-readings)", "", "| answer | expected | question | score |",
           "|---|---|---|---|"]
    out += [f"| {a!r} | {e!r} | {qq} | {verify_answer(a, e, question=qq):.2f} |" for a, e, qq in HEDGE_PROBES]
    out += ["", "## echo probes: a query's result counted as evidence though its SQL makes the value", "",
            "| SQL | expected | result | counted as evidence (echo checks) | with counterfactual (4 worlds) |",
            "|---|---|---|---|---|"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)

    async def replay_all():
        async with environment(build_server(db)).counterfactual() as worlds:
            return [await worlds.replay("run_query", {"sql": sql}) for sql, _ in ECHO_PROBES]
    replays = asyncio.run(replay_all())
    for (sql, e), texts in zip(ECHO_PROBES, replays):
        cells = "\n".join(str(c) for row in conn.execute(sql).fetchall() for c in row)
        e = cells if e is None else e  # an honest probe whose value is whatever the data says
        args = json.dumps({"sql": sql})
        cf = shown(e, [(cells, args, [None if t is None else values_of(t) for t in texts])], "How many?")
        shown_sql = sql.replace('|', '\\|')
        out.append(f"| `{shown_sql}` | {e!r} | {cells[:30]!r} | {shown(e, [(cells, args)], 'How many?')} | {cf} |")
    return "\n".join(out)


def percent_pairs(scenarios) -> str:
    """'N%' reads as N and as N/100: constants that pass two expected values at once."""
    nums = Counter(float(s.answer) for s in scenarios if kind(s.answer) == "num")
    pairs = [(v, nums[v], nums[v * 100]) for v in nums if v * 100 in nums]
    return f"{len(pairs)} value(s) v with v and 100*v both expected: {pairs[:5]}"


def main() -> None:
    logging.basicConfig(level=logging.ERROR)
    sys.path.insert(0, str(ROOT))
    from mcp_server import build_server
    from mcp_rl.environments.company import build_db as mod
    all_s = [s for s in load_scenarios(ROOT / "data" / "scenarios.jsonl") if s.answer is not None]
    train = [s for s in all_s if s.split == "train"]
    cfg = RewardConfig()
    out = [__doc__.split("\n\n")[0], ""]
    with tempfile.TemporaryDirectory() as tmp:
        db = mod.build_db(Path(tmp) / "company.db")
        out += [probes(db), ""]
        for split in ("test", "train"):
            scen = [s for s in all_s if s.split == split]
            rows, examples = asyncio.run(play_split(build_server(db), scen, train, cfg))
            out += [table(f"{split} split ({len(scen)} verified tasks)", rows), "", percent_pairs(scen), "",
                    f"### winning answers ({split}, up to 4 per policy)"]
            for name, ex in examples.items():
                out.append(f"- {name}: " + "; ".join(f"{i} {a!r}" for i, _, a in ex[:4]))
            out.append("")
    text = "\n".join(out)
    print(text)
    res = ROOT / "bench" / "results" / "check_cheats.txt"
    res.parent.mkdir(parents=True, exist_ok=True)
    res.write_text(text + "\n")


if __name__ == "__main__":
    main()
