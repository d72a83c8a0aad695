"""Tests for mcp_rl/runs/demo.py: the lines `python -m mcp_rl demo` (`make demo`) ends with.

A 2-step CPU run cannot show learning: its last lines must say what it checked (every stage, the
tool-call format, verified and, where recorded, grounded success) and what it cannot show, so that
"base 0.0% -> trained 0.0%" does not read as "nothing worked". Run: pytest tests/test_demo.py
"""

from types import SimpleNamespace as NS

import pytest

from mcp_rl import cli
from mcp_rl.runs.demo import summary

CFG = NS(train=NS(steps=2, groups_per_step=2, group_size=4, warm_start_scenarios=32))


def result(success, completed, errors=1.0, **extra):
    return NS(n=12, success_rate=success, success_se=0.0, completed_rate=completed, mean_tool_errors=errors, **extra)


@pytest.mark.parametrize("base, trained, says, never", [
    # the demo's usual outcome: no verified success either side, but the format was learned
    (result(0.0, 0.0), result(0.0, 0.92), ["(taught by the warm start): 92%", "base 0.0% -> trained 0.0%",
                                            "one scenario is 8.3 points", "cannot show: whether RL improves"],
     ["grounded"]),
    # the format was not learned: no claim that the warm start taught it
    (result(0.0, 0.0), result(0.0, 0.0), ["the tool-call format: 0% of held-out episodes"], ["taught"]),
    # an evaluation that records grounded success gets its column
    (result(0.0, 0.0, grounded_rate=0.0), result(1 / 12, 0.67, grounded_rate=1 / 12),
     ["grounded success 0.0% -> 8.3%", "base 0.0% -> trained 8.3%"], []),
])
def test_the_demo_says_what_it_checked_and_what_it_cannot_show(base, trained, says, never):
    text = summary({"base": base, "trained": trained, "report": "runs/d/report.md"}, CFG, 14.2, "runs/d")
    for s in says:
        assert s in text, (s, text)
    for s in never:
        assert s not in text, (s, text)
    assert text.splitlines()[0] == "demo done in 14.2 min | report runs/d/report.md"
    assert "README.md" in text and "GPU" in text  # where the measured learning result is


def test_the_demo_command_ends_with_the_summary(monkeypatch, capsys, tmp_path):
    import mcp_rl.runs.run

    async def fake_run(cfg, resume=False):  # the pipeline itself: tests/test_pipeline.py, test_runs.py
        return {"base": result(0.0, 0.0), "trained": result(0.0, 0.92), "report": tmp_path / "report.md"}

    monkeypatch.setattr(mcp_rl.runs.run, "run", fake_run)
    assert cli.main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "What this CPU run checked:" in out and "What it cannot show" in out
    assert f"python -m mcp_rl serve --adapter {tmp_path}" in out.splitlines()[-2]
