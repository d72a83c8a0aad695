"""Held-out evaluation and the report. Run: pytest tests/test_evaluate.py"""

import json
import math

import pytest

from mcp_rl.evaluate import _pass_at_k, evaluate, load_eval, save_eval, summarize, write_report
from mcp_rl.policy import ScriptedPolicy, tool_call_text
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig
from mcp_rl.scenarios import Scenario


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
    assert "| base | 6 | 50.0% |" in report
    assert (tmp_path / "eval_bars.png").stat().st_size > 1000 and (tmp_path / "reward_curve.png").exists()
    assert json.loads((tmp_path / "summary.json").read_text())[0]["success_rate"] == 0.5


async def test_evaluate_refuses_unverified_scenarios():
    import fastmcp
    with pytest.raises(ValueError, match="verified answers"):
        await evaluate(ScriptedPolicy(lambda m: ""), fastmcp.FastMCP("x"), [Scenario(id="u", task="t")], label="x")
