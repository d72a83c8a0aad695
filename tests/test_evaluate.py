"""Held-out evaluation and the report. Run: pytest tests/test_evaluate.py"""

import json
import math

import pytest

from mcp_rl.runs.evaluate import (
    TRANSCRIPT_CHARS, EvalResult, _pass_at_k, clip, compare_transcripts, evaluate, load_eval, pick_scenarios, save_eval,
    summarize, write_report,
)
from mcp_rl.policies.policy import ScriptedPolicy, tool_call_text
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig
from mcp_rl.tasks.scenarios import Scenario


def row(sid, verified, **kw):
    return {"scenario_id": sid, "verified": verified, "reward": verified, "completed": True, "turns": 2,
            "tool_errors": 0, "fatal": False, **kw}


def test_summary_success_rate_and_standard_error():
    rows = [row("a", 1.0), row("b", 0.0), row("c", 1.0), row("d", 0.5)]
    r = summarize(rows, "x")
    assert r.n == 4 and r.success_rate == 0.5  # partial credit is not a success
    assert r.success_se == pytest.approx(math.sqrt(0.25 / 4))
    assert r.mean_reward == pytest.approx(0.625) and r.pass_at_k is None


def test_pass_at_k_unbiased_estimator():
    assert _pass_at_k(4, 0, 2) == 0.0 and _pass_at_k(4, 3, 2) == 1.0
    assert _pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    rows = [row("a", 1.0), row("a", 0.0), row("b", 0.0), row("b", 0.0)]
    r = summarize(rows, "k")
    assert r.k == 2 and r.pass_at_k == pytest.approx(0.5) and r.success_rate == 0.5
    assert r.pass_hat_k == 0.0  # no task succeeded in both of its rollouts


def test_pass_hat_k_counts_tasks_solved_every_time():
    rows = [row("a", 1.0), row("a", 1.0), row("a", 1.0), row("b", 1.0), row("b", 1.0), row("b", 0.0)]
    r = summarize(rows, "k")  # a: 3 of 3, b: 2 of 3; pass^3 = (1 + 0) / 2
    assert r.k == 3 and r.pass_hat_k == pytest.approx(0.5) and r.pass_at_k == pytest.approx(1.0)
    assert r.line().endswith("| pass@3 100.0% | pass^3 50.0%")


def test_k_rollouts_a_scenario_need_sampling():
    from mcp_rl.runs.config import TrainConfig

    assert TrainConfig(eval_k=4, eval_temperature=0.7).eval_k == 4
    with pytest.raises(ValueError, match="k > 1 needs train.eval_temperature > 0"):
        TrainConfig(eval_k=4)


def test_empty_rows_is_a_clear_error():
    with pytest.raises(ValueError, match="no evaluation rows"):
        summarize([], "x")


async def test_evaluate_then_report_recomputes_from_saved_rows(tmp_path):
    import fastmcp
    server = fastmcp.FastMCP("none")
    scenarios = [Scenario(id=f"s{i}", task=f"Say {i}", answer=i) for i in range(6)]

    def script(messages):  # right on even numbers, wrong on odd ones
        i = int(messages[1]["content"].split()[1])
        return tool_call_text(COMPLETE_TOOL_NAME, {"answer": str(i if i % 2 == 0 else i + 100)})

    result, groups = await evaluate(ScriptedPolicy(script), server, scenarios, label="base", rollout_cfg=RolloutConfig())
    assert result.success_rate == pytest.approx(0.5) and result.n == 6 and len(groups) == 6
    save_eval(tmp_path, result)
    again = load_eval(tmp_path, "base")
    assert (again.success_rate, again.success_se, again.mean_reward) == (result.success_rate, result.success_se, result.mean_reward)
    report = write_report(tmp_path, [result], [{"step": 1, "reward_mean": 0.4, "success_rate": 0.5}]).read_text()
    # no lookups: right answers, none grounded
    assert "| base | 6 | 0.0% | 0.0% | 50.0% |" in report and result.grounded_rate == 0.0
    assert (tmp_path / "eval_bars.png").stat().st_size > 1000 and (tmp_path / "reward_curve.png").exists()
    assert json.loads((tmp_path / "summary.json").read_text())[0]["success_rate"] == 0.5


async def test_eval_rows_keep_task_and_transcript_through_a_reload(tmp_path):
    import fastmcp
    scenarios = [Scenario(id="s1", task="Say 1", answer=1)]
    script = lambda m: tool_call_text(COMPLETE_TOOL_NAME, {"answer": "1"})  # noqa: E731
    result, _ = await evaluate(ScriptedPolicy(script), fastmcp.FastMCP("none"), scenarios, label="base")
    save_eval(tmp_path, result)
    saved = load_eval(tmp_path, "base").rows[0]
    assert saved["task"] == "Say 1"
    assert "[user] Say 1" in saved["transcript"] and "-- answer: '1'" in saved["transcript"]


async def test_evaluate_refuses_unverified_scenarios():
    import fastmcp
    with pytest.raises(ValueError, match="verified answers"):
        await evaluate(ScriptedPolicy(lambda m: ""), fastmcp.FastMCP("x"), [Scenario(id="u", task="t")], label="x")


@pytest.mark.parametrize("length", [0, 10, TRANSCRIPT_CHARS])
def test_clip_leaves_short_text_alone(length):
    assert clip("x" * length) == "x" * length


@pytest.mark.parametrize("length", [TRANSCRIPT_CHARS + 1, 3 * TRANSCRIPT_CHARS, 100_000])
def test_clip_cuts_the_middle_with_a_marker(length):
    text = "START" + "x" * (length - 8) + "END"
    out = clip(text)
    assert len(out) <= TRANSCRIPT_CHARS and out.startswith("START") and out.endswith("END")
    cut = int(out.split("[... ")[1].split(" characters cut")[0])
    assert len(out) - len(out.split("\n")[1]) - 2 + cut == length  # head + tail + cut = the whole text


def two_evals(before, after, **kw):
    """Rows for scenarios s0, s1, ...: 1 = solved, 0 = failed, fractions = partial credit."""
    return ([row(f"s{i}", v, **kw) for i, v in enumerate(before)], [row(f"s{i}", v, **kw) for i, v in enumerate(after)])


@pytest.mark.parametrize("before, after, n, expected", [
    ([1, 1, 0, 0], [1, 0, 1, 0], 4, ["s2", "s1", "s0", "s3"]),  # failed -> solved, solved -> failed, then file order
    ([1, 0, 1, 0], [0, 1, 0, 1], 2, ["s1", "s3"]),              # the earliest of equal changes
    ([0, 0.2, 0], [0, 0.9, 0.3], 2, ["s1", "s2"]),              # no outcome changed: biggest reward change first
    ([1, 1], [1, 1], 5, ["s0", "s1"]),                          # n larger than the scenarios: all of them
])
def test_pick_scenarios_changed_outcomes_first(before, after, n, expected):
    assert pick_scenarios(*two_evals(before, after), n=n) == expected


def test_pick_scenarios_only_those_in_both_evals_and_first_rollout_counts():
    before = [row("a", 0.0), row("a", 1.0), row("b", 0.0), row("only_before", 0.0)]
    after = [row("b", 1.0), row("a", 0.0), row("only_after", 1.0)]
    assert pick_scenarios(before, after, n=5) == ["b", "a"]


def save_two(tmp_path, before, after, labels=("base", "trained"), **kw):
    results = [summarize(rows, label) for rows, label in zip(two_evals(before, after, **kw), labels)]
    for r in results:
        save_eval(tmp_path, r)
    return results


def test_compare_shows_task_expected_verdicts_and_both_transcripts(tmp_path):
    save_two(tmp_path, [0], [1], task="How many staff?", expected=42, answer=41, transcript="[user] How many staff?")
    md = compare_transcripts(tmp_path)
    assert md.startswith("## What changed: one held-out scenario\n")
    assert "### 1. s0: failed → solved" in md and "<b>Task:</b> How many staff?" in md and "<b>Expected answer:</b> 42" in md
    assert "✗ failed · reward 0.00 · 2 turns · 0 tool errors · answer 41" in md and "✓ solved · reward 1.00" in md
    assert md.count("<pre>[user] How many staff?</pre>") == 2 and "<th>base</th><th>trained</th>" in md


@pytest.mark.parametrize("before, after, says", [([0], [1], "Shown first: scenarios whose outcome changed"),
                                                 ([0], [0], "No outcome changed")])
def test_compare_says_whether_any_outcome_changed(tmp_path, before, after, says):
    save_two(tmp_path, before, after)
    assert says in compare_transcripts(tmp_path)


def test_compare_escapes_html_in_every_field(tmp_path):
    nasty = '<tool_call>{"q": "a < b & c > d"}</tool_call>'
    save_two(tmp_path, [0], [1], task=nasty, expected=nasty, answer=nasty, transcript=nasty, scenario_id="<s>")
    md = compare_transcripts(tmp_path)
    assert "<tool_call>" not in md and "<s>" not in md and "a < b" not in md
    assert "&lt;tool_call&gt;" in md and "a &lt; b &amp; c &gt; d" in md


def test_compare_has_no_blank_line_inside_a_table(tmp_path):
    # A blank line ends a Markdown HTML block: the rest of the table would render as text.
    save_two(tmp_path, [0], [1], transcript="[user] hi\n\n   \n[assistant] " + "word " * 40)
    table = compare_transcripts(tmp_path).split("<table>")[1].split("</table>")[0]
    assert all(line.strip() for line in table.strip().splitlines())
    assert max(len(line) for line in table.split("<pre>")[1].splitlines()[1:-1]) <= 60  # wrapped to fit two columns


def test_compare_keeps_a_clipped_transcript_marker(tmp_path):
    save_two(tmp_path, [0], [1], transcript=clip("step " * 2000))
    assert compare_transcripts(tmp_path).count("characters cut ...]") == 2


def test_compare_says_when_a_row_has_no_transcript(tmp_path):
    save_two(tmp_path, [0], [1])  # rows saved before transcripts were kept
    assert compare_transcripts(tmp_path).count("(no transcript saved") == 2


@pytest.mark.parametrize("saved", [(), ("base",), ("trained",)])
def test_compare_without_both_eval_files_is_empty(tmp_path, saved):
    for label in saved:
        save_eval(tmp_path, summarize([row("s0", 1.0)], label))
    assert compare_transcripts(tmp_path) == ""


def test_compare_without_common_scenarios_is_empty(tmp_path):
    save_eval(tmp_path, summarize([row("a", 1.0)], "base"))
    save_eval(tmp_path, summarize([row("b", 1.0)], "trained"))
    assert compare_transcripts(tmp_path) == ""


@pytest.mark.parametrize("labels, after", [
    (["base", "trained"], "trained"),
    (["base", "trained", "warm_start"], "trained"),
    (["base", "warm_start"], "warm_start"),
    (["base"], None),
    (["warm_start", "trained"], None),  # no base: nothing to compare against
])
def test_report_compares_base_with_trained_else_the_last(tmp_path, labels, after):
    results = [summarize([row("s0", float(i > 0), transcript=f"[assistant] I am {label}")], label)
               for i, label in enumerate(labels)]
    report = write_report(tmp_path, results, []).read_text()
    assert ("## What changed: one held-out scenario" in report) == (after is not None)
    if after:
        assert f"<th>base</th><th>{after}</th>" in report and f"<pre>[assistant] I am {after}</pre>" in report


def test_report_comparison_survives_a_reload_from_files(tmp_path):
    save_two(tmp_path, [1, 0, 1], [1, 1, 0], transcript="[tool] rows: 3 & counting")
    reloaded = [load_eval(tmp_path, "base"), load_eval(tmp_path, "trained")]
    report = write_report(tmp_path, reloaded, []).read_text()
    section = report.split("## What changed: two held-out scenarios")[1]
    assert section.index("### 1. s1: failed → solved") < section.index("### 2. s2: solved → failed")
    assert "[tool] rows: 3 &amp; counting" in section
    assert section.strip() in compare_transcripts(tmp_path)


@pytest.mark.parametrize("sql, grounded", [
    ("SELECT CAST(x'3134' AS INTEGER) AS n FROM employees LIMIT 1", 0.0),  # an encoded echo of 14 over a row
    ("SELECT COUNT(*) FROM employees e JOIN departments d ON d.id = e.department_id WHERE d.name = 'Operations'", 1.0),
])
async def test_evaluate_replays_lookups_on_the_counterfactual_worlds(company_db, sql, grounded):
    """Held-out "grounded" means what training pays: an encoded echo grounds nothing, an honest count does."""
    from mcp_rl.environment import environment
    from mcp_server import build_server

    server = build_server(company_db)
    n = int(company_db_query(company_db, "SELECT COUNT(*) FROM employees e JOIN departments d ON d.id = "
                                         "e.department_id WHERE d.name = 'Operations'"))
    scenario = Scenario(id="ops", task="How many employees work in the Operations department?", answer=n)
    echo = sql.replace("3134", str(n).encode().hex())

    def script(messages):
        if not any(m.get("role") == "tool" for m in messages):
            return {"tool": "run_query", "arguments": {"sql": echo}}
        return tool_call_text(COMPLETE_TOOL_NAME, {"answer": str(n)})

    plain, _ = await evaluate(ScriptedPolicy(script), server, [scenario], label="plain")
    replayed, _ = await evaluate(ScriptedPolicy(script), server, [scenario], label="cf",
                                 counterfactual=environment(server).counterfactual())
    assert plain.success_rate == replayed.success_rate == 1.0
    assert plain.grounded_rate == 1.0 and replayed.grounded_rate == grounded  # the echo passes the cheap checks alone


def company_db_query(db, sql):
    import sqlite3
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(sql).fetchone()[0]
