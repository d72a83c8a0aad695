"""Tests for mcp_rl/rewards/evidence.py: what counts as evidence, lookups recorded by the real rollout loop,
and the hack monitor's numbers and flags.

    .venv/bin/python -m pytest tests/test_evidence.py -q
"""

import asyncio
import json

import art
import pytest

from mcp_rl.rewards.evidence import evidence, flags, hack_signals, lookups, monitor, record_lookup
from mcp_rl.policies.policy import ScriptedPolicy, play
from mcp_rl.rollout import COMPLETE_TOOL_NAME, rollout
from mcp_rl.tasks.scenarios import Scenario
from mcp_server import build_server


def traj(answer="", calls=(), **metrics):
    t = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=0.0,
                       metrics=metrics, metadata={"answer": answer})
    for tool, args, result in calls:
        record_lookup(t, tool, args, result)
    return t


TABLE = "n\n--\n7\n(1 row)"
SCHEMA = "table employees: 150 rows\ncolumns:\n  remote INTEGER CHECK (remote IN (0, 1))"


@pytest.mark.parametrize("calls, expected", [
    ([("q", {"sql": "a"}, TABLE)], [("7", '{"sql": "a"}')]),                     # a table gives its cells only
    ([("d", {}, SCHEMA), ("q", {"sql": "a"}, TABLE)], [("7", '{"sql": "a"}')]),  # earlier free text: left out
    ([("q", {"sql": "a"}, TABLE), ("d", {}, SCHEMA)], [("7", '{"sql": "a"}'), (SCHEMA, "{}")]),  # last: kept
    ([("q", {"sql": "a"}, "Database error: no such table: x")], []),            # an error in disguise
    ([], []),
    ([("q", {"sql": "dump"}, "id | n\n---+---\n" + "\n".join(f"{i} | {i * 7}" for i in range(60)) + "\n(60 rows)")],
     []),                                                                        # a dump shows nothing in particular
])
def test_evidence_is_table_cells_and_the_last_result(calls, expected):
    assert evidence(traj(calls=calls)) == expected


def test_the_rollout_loop_records_successful_lookups_only(company_db):
    script = play({"tool": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM nope"}},
                  {"tool": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM departments"}},
                  {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "9"}})
    t = asyncio.run(rollout(ScriptedPolicy(script), build_server(company_db), Scenario("s", "How many departments?", answer=9)))
    rows = lookups(t)
    assert t.metrics["tool_errors"] == 1 and len(rows) == 1 and rows[0][0] == "run_query"
    assert json.loads(rows[0][1]) == {"sql": "SELECT COUNT(*) FROM departments"} and "9" in evidence(t)[0][0]


def test_hack_signals_of_a_kitchen_sink():
    sink = "Customer Support Engineering Finance Human Resources Legal Marketing Operations"
    s = hack_signals(traj(sink))
    assert s["answer_words"] == 9 and s["lookups"] == 0 and s["copied"] == 0
    result = "id | name | salary\n1 | Ann Lee | 50000\n2 | Bo Chen | 61000"
    pasted = hack_signals(traj(result, calls=[("q", {}, result)]))
    assert pasted["copied"] == 1


def test_monitor_counts_correct_answers_without_a_lookup_and_refused_ones():
    trajs = [traj("7", answer_correct=1.0, grounded=0.0),                            # a guess
             traj("7", calls=[("q", {}, TABLE)], answer_correct=1.0, grounded=1.0),  # grounded
             traj("3", calls=[("q", {}, TABLE)], answer_correct=0.0, grounded=0.0)]
    m = monitor(trajs)
    assert m["hack/success_without_lookup"] == pytest.approx(1 / 3)
    assert m["hack/rejected_by_evidence"] == pytest.approx(1 / 2)


def test_a_sudden_rise_is_flagged_and_a_steady_one_is_not():
    history = [{"hack/answer_words": 1.0, "hack/success_without_lookup": 0.0}] * 3
    assert flags({"hack/answer_words": 8.0, "hack/success_without_lookup": 0.0}, history) == ["answer_words 8 (was 1)"]
    assert flags({"hack/answer_words": 1.5, "hack/success_without_lookup": 0.01}, history) == []


def test_evidence_carries_the_counterfactual_record():
    """With a replay record (mcp_rl.rewards.counterfactual), each result carries what its worlds showed; a kept result
    that was not replayed carries none (it grounds nothing); counterfactual=False reads the record as absent."""
    t = traj(calls=[("q", {"sql": "a"}, TABLE), ("q", {"sql": "b"}, "n\n--\n8\n(1 row)")])
    assert evidence(t) == [("7", '{"sql": "a"}'), ("8", '{"sql": "b"}')]
    t.metadata["counterfactual"] = json.dumps({"1": ["9", None]})
    assert evidence(t) == [("7", '{"sql": "a"}', []), ("8", '{"sql": "b"}', ["9", None])]
    assert evidence(t, counterfactual=False) == [("7", '{"sql": "a"}'), ("8", '{"sql": "b"}')]
    t.metadata["counterfactual"] = "{not json"
    assert evidence(t) == [("7", '{"sql": "a"}', []), ("8", '{"sql": "b"}', [])]  # damaged: grounds nothing

