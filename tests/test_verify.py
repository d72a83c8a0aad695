"""Tests for mcp_rl/rewards/verify.py: verify_answer's rules as one large table, tolerances, and
clear errors for expected answers it cannot check. (Its doctests run in test_rewards.py,
together with rewards.py's.)

    .venv/bin/python -m pytest tests/test_verify.py -q
"""

import json
from datetime import date

import pytest

from mcp_rl.rewards.evidence import values_of
from mcp_rl.rewards.verify import verify_answer

VERIFY_CASES = [
    # numbers: formatting
    ("42", 42, 1.0),
    ("42.", 42, 1.0),
    ("1,234", 1234, 1.0),
    ("$1,234.50", 1234.5, 1.0),
    ("$1,234.50", "1234.50", 1.0),
    ("-3.5", -3.5, 1.0),
    ("−3.5", -3.5, 1.0),
    ("1.2M", 1_200_000, 1.0),
    ("12.3 million", 12_345_000, 1.0),
    ("85k", 85000, 1.0),
    ("three", 3, 1.0),
    ("Three.", 3, 1.0),
    ("about 42", 42, 1.0),
    ("approximately 1,000", 1003, 1.0),        # "about" opts into the tolerance
    ("1,000", 1003, 0.0),                      # plain integers must be exact
    # numbers: tolerance
    ("42.3", 42.0, 1.0),                       # 0.7% < 1%
    ("43", 42.0, 0.0),
    ("43", 42, 0.0),
    ("0.00005", 0.0, 1.0),                     # abs_tol near zero
    ("0.01", 0.0, 0.0),
    ("85123.456", 85123.46, 1.0),
    # numbers: a plain answer is held to the coarser stated digit (found by review: ".0" bypassed exactness)
    ("149.0", 148, 0.0),
    ("1,640,000.0", 1631000, 0.0),
    ("148.0", 148, 1.0),
    ("41.3", 41.7, 0.0),                       # one decimal asked: 1% (0.4) was too loose
    ("42.1", 41.7, 0.0),
    ("41.66", 41.7, 1.0),
    ("42", 41.7, 1.0),                         # a coarser rounding of the right value
    ("40", 41.7, 0.0),
    ("22.22%", 22.2, 1.0),
    ("0.3", 0.1 + 0.2, 1.0),                   # a float's binary noise is not a stated digit
    # numbers: percent
    ("12.5%", 0.125, 1.0),
    ("12.5%", 12.5, 1.0),
    ("0.125", "12.5%", 1.0),
    ("12.5 percent", "12.5%", 1.0),
    ("25%", 0.125, 0.0),
    # numbers in sentences: the whole string, else the last number
    ("There are 42 employees.", 42, 1.0),
    ("Of the 5 departments, Engineering has 42 employees", 42, 0.0),  # two numbers, one asked: a hedge
    ("42 employees in 5 departments", 42, 0.0),
    ("As of 2024-01-05 there are 42 open tickets", 42, 1.0),
    ("no number here", 42, 0.0),
    ("Q3", 3, 0.0),
    ("", 0, 0.0),
    (None, 42, 0.0),
    # strings
    ("Engineering", "engineering", 1.0),
    ("  The Engineering department. ", "Engineering", 1.0),
    ("Alice Smith", "alice   smith", 1.0),
    ("Café Noir", "cafe noir", 1.0),
    ("O'Brien", "OBrien", 1.0),
    ("Alice Johnson", "Alice Smith", 0.0),
    ("Engineering or Sales", "Engineering", 0.0),   # hedges get nothing
    ("not Engineering", "Engineering", 0.0),
    ("Sales", "Engineering", 0.0),
    ("Sales and Marketing", "Sales", 0.0),          # several names where one is asked: nothing
    ("Engineering, Sales, Marketing, Finance, Operations", "Sales", 0.0),
    # booleans
    ("Yes, it does.", True, 1.0),
    ("true", True, 1.0),
    ("No", True, 0.0),
    ("no.", False, 1.0),
    # dates
    ("2024-01-15", "2024-01-15", 1.0),
    ("January 15, 2024", "2024-01-15", 1.0),
    ("15 Jan 2024", "2024-01-15", 1.0),
    ("Jan 15th, 2024", date(2024, 1, 15), 1.0),
    ("01/15/2024", "2024-01-15", 1.0),
    ("15/01/2024", "2024-01-15", 1.0),
    ("He was hired on 2024/01/15.", "2024-01-15T09:30:00", 1.0),
    ("2024-01-16", "2024-01-15", 0.0),
    ("sometime in 2024", "2024-01-15", 0.0),
    ("Marketing 2 2019", "2019-03-02", 0.0),                 # "Mar..." inside a word is no month
    ("Mayor 5 2020", "2020-05-05", 0.0),
    ("Mar 2 2019", "2019-03-02", 1.0),
    # lists and sets: order-insensitive F1
    ("Alice, Bob", ["Bob", "Alice"], 1.0),
    ('["Alice", "Bob"]', ["alice", "bob"], 1.0),
    ("['Alice', 'Bob']", ["Alice", "Bob"], 1.0),          # str() of a Python list
    ("Alice and Bob", {"Alice", "Bob"}, 1.0),
    ("- Alice\n- Bob\n- Carol", ["Alice", "Bob"], 0.8),    # one extra: 2*2/(2+3)
    ("Alice", ["Alice", "Bob"], 2 / 3),                    # one missing: 2*1/(2+1)
    ("Sales, Bob", ["Alice", "Bob"], 0.5),
    ("1,234; 5,678", [1234, 5678], 1.0),                   # thousands commas survive
    ("1, 2, 3", [3, 2, 1], 1.0),
    ("Alice, Alice", ["Alice", "Bob"], 0.5),               # one-to-one matching
    ("", [], 1.0),                                         # nothing listed, nothing expected
    ("[]", [], 1.0),
    ("Alice", [], 0.0),
]


# Hedges: several candidates where one is asked score 0 whatever the separator. The first rows are
# answers RL policies found (bench/results/learning/gemma3-270m-seed1, eval_trained and steps 10-30).
DEPTS = "Customer Support Engineering Finance Human Resources Legal Marketing Operations"
HEDGE_CASES = [
    (DEPTS, "Engineering", "In which department does Ava Hill work?", 0.0),
    (DEPTS, ["Legal"], "Which departments are located in Austin?", 0.0),
    ("Customer Support, Engineering, Finance, Legal, Research, Sales", "Sales",
     "In which department does the lead of Tempest Webinar Series work?", 0.0),
    ("Engineering\nFinance\nLegal", "Finance", "Which department has the largest budget?", 0.0),
    ("Engineering / Finance", "Finance", "Which department has the largest budget?", 0.0),
    ('["Engineering", "Finance"]', "Finance", "Which department has the largest budget?", 0.0),
    ("| name |\n|---|\n| Engineering |\n| Finance |", "Finance", "Which department has the largest budget?", 0.0),
    ("Finance or Legal", "Finance", "Which department has the largest budget?", 0.0),
    ("1 2 3 4 5 6 7 8 9 10", 7, "How many projects started in 2023?", 0.0),
    ("7 or 8", 7, "How many projects started in 2023?", 0.0),
    ("7, 8", 7, "How many projects started in 2023?", 0.0),
    ("yes no", True, "Is anyone in Legal remote?", 0.0),
    ("2024-01-15 2024-02-01", "2024-01-15", "When was Ava Hill hired?", 0.0),
    # one constant for several answer types (red-team, bench/checks/check_cheats.py)
    ("2019-10-23 Marketing 2", 2, "How many high-priority projects are on hold?", 1.0),  # the number path stays
    ("2019-10-23 Marketing 2", "Marketing", "Which department is the person leading Quartz Launch Campaign a member of?", 0.0),
    ("2019-10-23 Marketing 2", "2019-10-23", "What is the start date of Apollo CI Overhaul?", 0.0),
    ("Finance 7", "Finance", "Which department has the largest budget?", 0.0),
    ("2019-06-23 (407 days)", "2019-06-23", "What is the start date of Apollo CI Overhaul?", 0.0),
    ("Ines Lopez, hired in 2017", "Ines Lopez", "Which Research employee hired in 2017 has the earliest hire date?", 1.0),
    ("12.5%", 0.125, "What fraction of Legal is remote?", 1.0),
    # honest answers that restate the question keep their credit
    ("The lead of Tempest works in Sales.", "Sales", "In which department does the lead of Tempest work?", 1.0),
    ("The Finance department has the largest budget", "Finance", "Which department has the largest budget?", 1.0),
    ("7 projects started in 2023", 7, "How many projects started in 2023?", 1.0),
    ("Engineering has 42 employees", 42, "Of the 5 departments, how many employees has Engineering?", 1.0),
    ("Yes", True, "Is anyone in Legal remote?", 1.0),
    ("Alice, Bob", ["Alice", "Bob"], "Who leads two projects?", 1.0),    # list questions keep their F1
    ("Alice, Bob, Carol", ["Alice", "Bob"], "Who leads two projects?", 0.8),
]


@pytest.mark.parametrize("predicted,expected,question,score", HEDGE_CASES)
def test_hedges_score_nothing(predicted, expected, question, score):
    assert verify_answer(predicted, expected, question=question) == pytest.approx(score)


# The grounding rule (verify.shown): (values a successful result showed, that call's arguments).
EVIDENCE_CASES = [
    ("42", 42, "How many?", [("42", "SELECT COUNT(*) FROM employees")], 1.0),
    ("42", 42, "How many?", [], 0.0),                                          # no lookup: a guess
    ("1", 1, "How many?", [("0", "SELECT COUNT(*) FROM employees WHERE x")], 0.0),  # the lookup said 0
    ("1", 1, "How many?", [("1", "SELECT 1")], 0.0),                            # echoed from the call
    ("Engineering", "Engineering", "Which department?", [("Engineering", "SELECT 'Engineering'")], 0.0),
    ("Engineering", "Engineering", "Which department?",
     [("Engineering", "SELECT d.name FROM departments d JOIN employees e ON ...")], 1.0),
    ("Engineering", "Engineering", "Engineering or Sales: which is larger?",  # the question names it
     [("Engineering", "SELECT name FROM departments WHERE name IN ('Engineering', 'Sales') ...")], 1.0),
    ("41.67", 41.67, "Average?", [("41.666666", "SELECT AVG(x) FROM t")], 1.0),
    ("2024-01-15", "2024-01-15", "When?", [("2024-01-15", "SELECT hire_date FROM employees ...")], 1.0),
    ("Yes", True, "Is anyone remote?", [("3", "SELECT COUNT(*) FROM employees WHERE remote")], 1.0),
    ("Yes", True, "Is anyone remote?", [], 0.0),
    ("Alice, Bob", ["Alice", "Bob"], "Who?", [("Alice", "q1")], 2 / 4),          # only Alice was seen
    # disguised echoes: the call computes the value from its own literals (red-team)
    ("42", 42, "How many?", [("42", "SELECT 40+2")], 0.0),
    ("42", 42, "How many?", [("42", "SELECT 55-13 FROM departments LIMIT 1")], 0.0),
    ("Engineering", "Engineering", "Which department?", [("Engineering", "SELECT 'E' || 'ngineering'")], 0.0),
    ("2019-06-23", "2019-06-23", "When?", [("2019-06-23", "SELECT '2019-06-' || '23'")], 0.0),
    # a coarser number is no evidence of a finer one
    ("41.7", 41.7, "To one decimal, what share?", [("departments (9 rows)\nemployees (150 rows)\nprojects (42 rows)", "{}")], 0.0),
    ("41.7", 41.7, "To one decimal, what share?",
     [("41.7", "SELECT ROUND(100.0 * SUM(remote) / COUNT(*), 1) FROM employees WHERE department_id = 4")], 1.0),
    # honest SQL that writes LIMIT 1 or remote = 1 keeps its credit for an answer of 1
    ("1", 1, "Of the projects owned by Research, how many are completed?",
     [("1", "SELECT COUNT(*) FROM projects p JOIN departments d ON d.id = p.department_id WHERE d.name = 'Research' "
            "AND p.status = 'completed' LIMIT 1")], 1.0),
    ("1", 1, "How many remote employees does Legal have?",
     [("1", "SELECT COUNT(*) FROM employees WHERE remote = 1 AND department_id = 9")], 1.0),
    # a time inside a timestamp (mcp-server-time's convert_time, notebook 02)
    ("18:30", "18:30", "It is 09:30 in Asia/Tokyo. What time is it in Asia/Kolkata? Answer as HH:MM.",
     [('{"target": {"datetime": "2026-12-06T18:30:00+05:30"}}', '{"time": "09:30"}')], 1.0),
    ("18:30", "18:30", "It is 09:30 in Asia/Tokyo. What time?", [('{"datetime": "2026-12-06T08:30:00"}', "{}")], 0.0),
]


@pytest.mark.parametrize("predicted,expected,question,evidence,score", EVIDENCE_CASES)
def test_credit_needs_evidence(predicted, expected, question, evidence, score):
    assert verify_answer(predicted, expected, question=question, evidence=evidence) == pytest.approx(score)


def test_a_hex_encoded_echo_is_no_evidence(company_db):
    """The cheap checks read the SQL and miss the hex; the counterfactual replay (mcp_rl.rewards.counterfactual) sees
    the value stay put on perturbed copies of the data, and the evidence it records refuses it."""
    import asyncio

    from mcp_rl.environment import environment
    from mcp_server import build_server

    sql = json.dumps({"sql": "SELECT CAST(x'456E67696E656572696E67' AS TEXT)"})
    cheap = [("Engineering", sql)]
    assert verify_answer("Engineering", "Engineering", question="Which department?", evidence=cheap) == 1.0

    async def worlds_show():
        async with environment(build_server(company_db)).counterfactual() as worlds:
            return await worlds.replay("run_query", json.loads(sql))
    shown_in_worlds = asyncio.run(worlds_show())
    replayed = [("Engineering", sql, [values_of(t) for t in shown_in_worlds])]
    assert verify_answer("Engineering", "Engineering", question="Which department?", evidence=replayed) == 0.0


@pytest.mark.parametrize("worlds,score", [
    (None, 1.0),                        # no replay ran: the cheap checks alone
    (["41", None], 1.0),                # moved in one world
    (["42", "42"], 0.0),                # constant: an echo
    (["", None], 0.0),                  # empty or failed everywhere
    ([], 0.0),                          # recorded but not replayed: grounds nothing
])
def test_shown_reads_the_counterfactual_worlds(worlds, score):
    evidence = [("42", "SELECT COUNT(*) FROM t", worlds)] if worlds is not None else [("42", "SELECT COUNT(*) FROM t")]
    assert verify_answer("42", 42, evidence=evidence) == score


@pytest.mark.parametrize("predicted,expected,score", VERIFY_CASES)
def test_verify_answer_table(predicted, expected, score):
    assert verify_answer(predicted, expected) == pytest.approx(score)


def test_verify_answer_table_is_large():
    assert len(VERIFY_CASES) >= 40


@pytest.mark.parametrize("kwargs,score", [
    ({}, 0.0), ({"rel_tol": 0.1}, 1.0), ({"abs_tol": 5.0}, 1.0),
])
def test_tolerance_is_configurable(kwargs, score):
    assert verify_answer("about 45", 42.0, **kwargs) == score  # "about": the tolerance, not the stated digits


def test_exact_integers_can_be_turned_off():
    assert verify_answer("1,000", 1003, exact_integers=False) == 1.0


@pytest.mark.parametrize("expected,error,match", [
    (None, ValueError, "no verified answer"),
    ({"a": 1}, TypeError, "cannot verify"),
    (float("nan"), ValueError, "not a finite number"),
])
def test_verify_answer_rejects_bad_expected(expected, error, match):
    with pytest.raises(error, match=match):
        verify_answer("1", expected)


def test_rescore_flips_a_stored_row_the_verifier_now_refuses(tmp_path, monkeypatch):
    """bench/experiments/rescore.py: Gemma seed 1's step-10 evaluation listed every department and was scored
    correct."""
    import gzip
    import json
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench" / "experiments"))
    from rescore import rescore

    rows = [{"scenario_id": "a", "answer": "Engineering, Sales, Marketing", "expected": "Sales", "verified": 1.0,
             "completed": True},
            {"scenario_id": "b", "answer": "Sales", "expected": "Sales", "verified": 1.0, "completed": True},
            {"scenario_id": "c", "answer": "Sales", "expected": "Sales", "verified": 0.0, "completed": False}]
    path = tmp_path / "eval_x.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(map(json.dumps, rows)).encode()))
    res = rescore(path)
    assert (res["n"], res["stored"], res["rescored"]) == (3, 2 / 3, 1 / 3)
    assert [f[0] for f in res["flips"]] == ["a"]


@pytest.mark.parametrize("record,grounded", [(None, 1.0), ('{"0": ["42", "42"]}', 0.0), ('{"0": ["40", "42"]}', 1.0)])
def test_rescore_reads_a_rows_counterfactual_record(monkeypatch, record, grounded):
    """bench/experiments/rescore.py rebuilds evidence from the transcript and, where the row kept one, the replay
    record."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench" / "experiments"))
    from rescore import grounded as rescored

    sql = "SELECT CAST(x'3432' AS INTEGER)"
    transcript = ("[user] How many?\n[assistant] <tool_call>" + json.dumps({"name": "run_query", "arguments": {"sql": sql}})
                  + "</tool_call>\n[tool] v\n--\n42\n(1 row)\n[assistant] <tool_call>"
                  + json.dumps({"name": "complete_task", "arguments": {"answer": "42"}}) + "</tool_call>")
    row = {"answer": "42", "expected": 42, "completed": True, "task": "How many?", "transcript": transcript,
           **({"counterfactual": record} if record else {})}
    assert rescored(row) == (1.0, grounded)
