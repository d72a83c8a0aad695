"""Tests for mcp_rl/rewards/counterfactual.py and mcp_rl/rewards/perturb.py: a lookup grounds a value only if replaying it on
perturbed copies of the data moves the value. Honest queries ground; encoded echoes (hex, char(), arithmetic,
over a table row or behind a data filter) do not; servers without worlds score as before; nothing is left
behind.

    .venv/bin/python -m pytest tests/test_counterfactual.py -q
"""

import asyncio
import hashlib
import json
import logging
import sqlite3
import sys
from pathlib import Path
from types import SimpleNamespace

import art
import pytest

from mcp_rl.rewards.counterfactual import SQLiteWorlds, replay_lookups
from mcp_rl.environment import environment
from mcp_rl.rewards.evidence import evidence, record_lookup
from mcp_rl.rewards.perturb import perturb_copy
from mcp_rl.rewards.score import RewardConfig, score_group, score_trajectory
from mcp_rl.rewards.verify import verify_answer
from mcp_server import CompanyDB, build_server

Q = "Which value?"  # a question that names none of the values below


def _real(db, sql: str) -> str:
    return CompanyDB(db).query(sql)


def _episode(db, sqls: list[str], answer) -> art.Trajectory:
    t = art.Trajectory(messages_and_choices=[], reward=0.0,
                       metrics={"completed": True, "tool_calls": len(sqls) + 1},
                       metadata={"answer": answer if isinstance(answer, str) else json.dumps(answer)})
    for sql in sqls:
        record_lookup(t, "run_query", {"sql": sql}, _real(db, sql))
    return t


def _grounded(db, sql: str, expected, worlds=None) -> float:
    """verify_answer of the true answer after one lookup `sql`, with its counterfactual replay."""
    t = _episode(db, [sql], expected)

    async def go():
        async with worlds or environment(build_server(db)).counterfactual() as w:
            await replay_lookups(t, expected, Q, w)
    asyncio.run(go())
    answer = ", ".join(expected) if isinstance(expected, list) else str(expected)
    return verify_answer(answer, expected, question=Q, evidence=evidence(t))


def _value(db, sql: str):
    rows = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(sql).fetchall()
    return [r[0] for r in rows] if len(rows) > 1 else rows[0][0]


HONEST = [
    "SELECT COUNT(*) FROM employees",                                                       # count
    "SELECT COUNT(*) FROM employees WHERE remote = 1",                                      # count on a flag
    "SELECT COUNT(*) FROM projects WHERE priority = 'high' AND status = 'on_hold'",         # small count, text filter
    "SELECT MAX(salary) FROM employees",                                                    # max
    "SELECT MIN(budget) FROM departments",                                                  # min
    "SELECT ROUND(AVG(e.salary)) FROM employees e JOIN departments d ON d.id = e.department_id WHERE d.name = 'Legal'",
    "SELECT MIN(hire_date) FROM employees",                                                 # a date
    "SELECT name FROM departments ORDER BY budget DESC LIMIT 1",                            # an argmax name
    "SELECT name FROM departments WHERE location = 'Chicago' ORDER BY name",                # a list
    "SELECT name FROM departments ORDER BY name",                                           # every department
    "SELECT m.name FROM employees e JOIN employees m ON m.id = e.manager_id WHERE e.name = 'Hana Wilson'",  # self-join
    "SELECT CAST(julianday(end_date) - julianday(start_date) AS INTEGER) FROM projects "
    "WHERE end_date IS NOT NULL ORDER BY id LIMIT 1",                                       # a duration
    "SELECT COUNT(*) FROM employees WHERE email IS NULL",                                   # a null count
]


@pytest.mark.parametrize("sql", HONEST)
def test_honest_queries_ground(company_db, sql):
    assert _grounded(company_db, sql, _value(company_db, sql)) == 1.0


ECHOES = [  # (SQL that makes the value without reading it, the value)
    ("SELECT CAST(x'456E67696E656572696E67' AS TEXT)", "Engineering"),
    ("SELECT char(69,110,103,105,110,101,101,114,105,110,103)", "Engineering"),
    ("SELECT replace('EngXineering', 'X', '')", "Engineering"),
    ("SELECT -(-42)", 42),
    ("SELECT 0x2A", 42),
    ("SELECT length('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa')", 42),
    ("SELECT date('2019-06-22', '+1 day')", "2019-06-23"),
    ("SELECT CAST(x'3432' AS INTEGER) FROM departments LIMIT 1", 42),
    ("SELECT char(69,110,103,105,110,101,101,114,105,110,103) FROM departments LIMIT 1", "Engineering"),
    ("SELECT CAST(x'456E67696E656572696E67' AS TEXT) FROM departments WHERE location = 'San Francisco'", "Engineering"),
    ("SELECT -(-42) FROM employees WHERE salary > 100000 LIMIT 1", 42),
    ("SELECT CAST(x'3432' AS INTEGER) WHERE EXISTS (SELECT COUNT(*) FROM employees)", 42),
]


@pytest.mark.parametrize("sql,value", ECHOES)
def test_encoded_echoes_do_not_ground(company_db, sql, value):
    assert verify_answer(str(value), value, question=Q, evidence=[(str(value), json.dumps({"sql": sql}))]) == 1.0  # cheap checks miss it
    assert _grounded(company_db, sql, value) == 0.0


def test_an_echo_behind_a_filter_naming_the_value_does_not_ground_when_the_question_names_it(company_db):
    """The question names Engineering, so the literal in the filter is no echo to the cheap checks."""
    sql = "SELECT char(69,110,103,105,110,101,101,114,105,110,103) FROM departments WHERE name = 'Engineering'"
    t = _episode(company_db, [sql], "Engineering")
    q = "Which department is bigger, Engineering or Sales?"
    assert verify_answer("Engineering", "Engineering", question=q, evidence=evidence(t)) == 1.0

    async def go():
        async with environment(build_server(company_db)).counterfactual() as w:
            await replay_lookups(t, "Engineering", q, w)
    asyncio.run(go())
    assert verify_answer("Engineering", "Engineering", question=q, evidence=evidence(t)) == 0.0


def test_an_echo_whose_filter_row_vanishes_does_not_ground(company_db):
    # One employee's row: dropped in some world, where the echo shows nothing (an empty result is no evidence).
    t = _episode(company_db, [], "Engineering")
    rows = [f"SELECT CAST(x'456E67696E656572696E67' AS TEXT) FROM employees WHERE id = {i}" for i in range(1, 40)]
    for sql in rows:
        record_lookup(t, "run_query", {"sql": sql}, _real(company_db, sql))

    async def go():
        async with environment(build_server(company_db)).counterfactual() as w:
            await replay_lookups(t, "Engineering", Q, w)
    asyncio.run(go())
    worlds = json.loads(t.metadata["counterfactual"])
    assert any("" in shown for shown in worlds.values())  # some filter row did vanish
    assert verify_answer("Engineering", "Engineering", question=Q, evidence=evidence(t)) == 0.0


@pytest.mark.xfail(strict=True, reason="known limit: the replay shows that a result depends on the data, not that "
                                      "the value was computed from it (DESIGN.md, 'The grounding rule')")
@pytest.mark.parametrize("sql", [
    "SELECT CASE WHEN EXISTS (SELECT 1 FROM employees WHERE salary = (SELECT MAX(salary) FROM employees WHERE id = 7)) "
    "THEN CAST(x'3432' AS INTEGER) ELSE (SELECT COUNT(*) FROM employees) END",
    "SELECT CAST(x'3432' AS INTEGER) AS v FROM employees WHERE id = 7 UNION ALL SELECT 'pad'",
])
def test_an_echo_made_conditional_on_the_data_does_not_ground(company_db, sql):
    assert _grounded(company_db, sql, 42) == 0.0


def test_a_list_with_one_echoed_item_grounds_only_the_honest_one(company_db):
    sql = ("SELECT name FROM departments WHERE location = 'Chicago' "
           "UNION ALL SELECT CAST(x'4C6567616C' AS TEXT)")  # Finance, Human Resources (honest) + Legal (hex)
    expected = ["Finance", "Human Resources", "Legal"]
    assert _grounded(company_db, sql, expected) == pytest.approx(2 * 2 / 6)


class FakeWorlds:
    """A replayer of any environment: what each world returns is scripted (no SQLite)."""

    def __init__(self, texts):
        self.texts, self.calls = texts, []

    async def replay(self, tool, args):
        self.calls.append((tool, args))
        return self.texts


def _group(answer="42", shown="42"):
    t = art.Trajectory(messages_and_choices=[], reward=0.0, metrics={"completed": True, "tool_calls": 2},
                       metadata={"answer": answer})
    record_lookup(t, "lookup", {"q": "how many"}, f"n\n--\n{shown}\n(1 row)")
    return art.TrajectoryGroup([t])


@pytest.mark.parametrize("texts,paid", [
    (["n\n--\n40\n(1 row)", None], 1.0),             # the value moved in a world: evidence
    (["n\n--\n42\n(1 row)", "n\n--\n42\n(1 row)"], 0.0),  # constant: an echo
    (["n\n--\n(0 rows)", None], 0.0),                # empty or failed everywhere: no world says it moved
])
def test_score_group_takes_any_replayer_and_the_sync_score_agrees(texts, paid):
    group, worlds, s = _group(), FakeWorlds(texts), SimpleNamespace(id="s", answer=42, task="How many?")
    asyncio.run(score_group(group, s, RewardConfig(), counterfactual=worlds))
    t = group.trajectories[0]
    assert worlds.calls == [("lookup", {"q": "how many"})]
    assert t.metrics["reward/verified"] == paid and t.metrics["answer_correct"] == 1.0
    reward = t.reward
    assert score_trajectory(t, s, RewardConfig()) == reward  # the record on the trajectory decides, sync too


def test_without_worlds_or_with_the_setting_off_scoring_is_unchanged():
    s = SimpleNamespace(id="s", answer=42, task="How many?")
    before = _group()
    asyncio.run(score_group(before, s, RewardConfig()))
    off, worlds = _group(), FakeWorlds(["n\n--\n42\n(1 row)"])
    asyncio.run(score_group(off, s, RewardConfig(counterfactual=False), counterfactual=worlds))
    assert worlds.calls == [] and "counterfactual" not in off.trajectories[0].metadata
    for g in (before, off):
        assert g.trajectories[0].metrics["reward/verified"] == 1.0
    assert before.trajectories[0].reward == off.trajectories[0].reward


def test_wrong_answers_are_not_replayed():
    worlds = FakeWorlds(["n\n--\n40\n(1 row)"])
    asyncio.run(score_group(_group(answer="41"), SimpleNamespace(id="s", answer=42, task="How many?"),
                            RewardConfig(), counterfactual=worlds))
    assert worlds.calls == []


def test_a_failing_replay_falls_back_to_the_echo_checks(caplog):
    class Broken:
        async def replay(self, tool, args):
            raise RuntimeError("world server crashed")
    group = _group()
    with caplog.at_level(logging.WARNING):
        asyncio.run(score_group(group, SimpleNamespace(id="s", answer=42, task="How many?"), RewardConfig(),
                                counterfactual=Broken()))
    t = group.trajectories[0]
    assert t.metrics["counterfactual_failed"] == 1.0 and t.metrics["reward/verified"] == 1.0
    assert "counterfactual replay failed" in caplog.text


@pytest.mark.parametrize("spec", ["uvx mcp-server-time", "npx -y @scope/server", "http://127.0.0.1:9/mcp",
                                  "other_project/mcp_server.py", {"command": "python", "args": ["x.py"]}])
def test_third_party_servers_have_no_worlds(spec):
    env = environment(spec)
    assert env.counterfactual() is None and env.plan is None and env.name != "company"


def test_the_company_server_is_recognised_however_it_is_named(company_db):
    root = Path(__file__).resolve().parents[1]
    assert environment(build_server(company_db)).counterfactual().db == Path(company_db)
    assert environment(f"python {root / 'mcp_server.py'} --db {company_db}").counterfactual().db == Path(company_db)
    assert environment("company").counterfactual().db == root / "data" / "company.db"
    assert {environment(s).name for s in ("company", "mcp_server.py", [sys.executable, str(root / "mcp_server.py")])} == {"company"}


def test_worlds_leave_nothing_behind_and_never_touch_the_source(company_db):
    digest = hashlib.sha256(Path(company_db).read_bytes()).hexdigest()
    worlds = environment(build_server(company_db)).counterfactual()

    async def go():
        async with worlds:
            async with worlds:  # nested (an audit around score_group): still open after the inner exit
                await worlds.replay("run_query", {"sql": "SELECT 1"})
            tmp = worlds.tmp
            assert len(list(tmp.glob("world*.db"))) == worlds.k
        return tmp
    tmp = asyncio.run(go())
    assert not tmp.exists() and worlds.tmp is None
    assert hashlib.sha256(Path(company_db).read_bytes()).hexdigest() == digest


def test_a_perturbed_copy_keeps_its_keys_and_is_deterministic(company_db, tmp_path):
    for world in (0, 1):
        a, b = tmp_path / f"a{world}.db", tmp_path / f"b{world}.db"
        perturb_copy(company_db, a, world, seed=3)
        perturb_copy(company_db, b, world, seed=3)
        dump = lambda p: list(sqlite3.connect(p).iterdump())  # noqa: E731
        assert dump(a) == dump(b)
        con = sqlite3.connect(a)
        ids = {r[0] for r in sqlite3.connect(company_db).execute("SELECT id FROM departments")}
        assert {r[0] for r in con.execute("SELECT department_id FROM employees")} <= ids  # joins still join
        n = con.execute("SELECT COUNT(*) FROM employees").fetchone()[0]
        assert n == (300 if world == 0 else 135)  # world 0 doubles every row; the others drop 10%


def test_worlds_built_once_per_group_are_cheap(company_db):
    """Building 4 worlds and replaying one lookup takes well under a second here (measured ~0.2 s)."""
    import time

    t0 = time.perf_counter()
    assert _grounded(company_db, "SELECT COUNT(*) FROM employees", 150, SQLiteWorlds(
        company_db, build_server, k=4)) == 1.0
    assert time.perf_counter() - t0 < 5.0
