"""Tests for mcp_rl/mcp/audit.py: the tool-call log rollouts append to, its reader, its report table.

Run: .venv/bin/python -m pytest tests/test_audit.py -q
An in-process FastMCP server and a scripted policy; the run-folder path (evaluations, warm
start, training steps) is covered in tests/test_pipeline.py.
"""

from __future__ import annotations

import json

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

from mcp_rl.mcp.audit import ARG_CHARS, log_tool_calls, read_tool_calls, record_tool_call, tool_call_table
from mcp_rl.runs.evaluate import EvalResult, write_report
from mcp_rl.policies.policy import ScriptedPolicy, play
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, gather_rollouts
from mcp_rl.tasks.scenarios import Scenario

READ_ONLY = {"readOnlyHint": True}


def server() -> FastMCP:
    mcp = FastMCP("audited")

    @mcp.tool(annotations=READ_ONLY)
    def echo(text: str) -> str:
        """Say it back."""
        return text[:10]

    @mcp.tool(annotations=READ_ONLY)
    def broken() -> str:
        """Always fails."""
        raise ToolError("broken")

    return mcp



def call(name, **args):
    return {"tool": name, "arguments": args}


TURNS = (call("echo", text="y" * 10_000), call("broken"), call("nope"), call("echo", wrong=1),
         call(COMPLETE_TOOL_NAME, answer="x"))


async def test_one_row_per_call_with_cut_arguments_and_error_kinds(tmp_path):
    log = tmp_path / "run" / "tool_calls.jsonl"
    scenarios = [Scenario(id="a", task="t"), Scenario(id="b", task="t")]
    with log_tool_calls(log, phase="eval base"):
        await gather_rollouts(ScriptedPolicy(play(*TURNS)), server(), scenarios, RolloutConfig(), group_size=2)
    await gather_rollouts(ScriptedPolicy(play(*TURNS)), server(), scenarios[:1])  # outside: not logged
    rows = read_tool_calls(log)
    assert len(rows) == 4 * 4  # 4 server calls in each of 4 rollouts; complete_task is not a server call
    assert sorted({r["scenario"] for r in rows}) == ["a", "b"] and {r["phase"] for r in rows} == {"eval base"}
    first = next(r for r in rows if r["tool"] == "echo" and r["error"] is None)
    assert len(first["args"]) == ARG_CHARS + 1 and first["args"].endswith("…") and first["args_chars"] > 10_000
    assert first["args"].startswith('{"text":"yyy') and first["ms"] >= 0 and first["time"].endswith("+00:00")
    kinds = {(r["tool"], r["error"]) for r in rows}
    assert kinds == {("echo", None), ("broken", "tool_error"), ("nope", "unknown_tool"), ("echo", "bad_arguments")}
    assert all(len(json.dumps(r)) < 600 for r in rows)


async def test_a_nested_block_changes_the_phase_and_keeps_the_file(tmp_path):
    log = tmp_path / "calls.jsonl"
    with log_tool_calls(log, phase="outer"):
        record_tool_call("s", "echo", {}, None, 0.001)
        with log_tool_calls(phase="step 1"):
            record_tool_call("s", "echo", {}, None, 0.001)
        with log_tool_calls(log):  # the same file opened again shares one handle
            record_tool_call("s", "echo", {}, None, 0.001)
    with log_tool_calls(phase="nowhere"):  # no file open: nothing happens
        record_tool_call("s", "echo", {}, None, 0.001)
    assert [r["phase"] for r in read_tool_calls(log)] == ["outer", "step 1", None]


def test_readers_skip_a_half_written_line_and_writers_start_a_new_one(tmp_path):
    log = tmp_path / "calls.jsonl"
    log.write_text(json.dumps({"tool": "a", "error": None, "ms": 1}) + "\n" + '{"tool": "b", "err')
    assert [r["tool"] for r in read_tool_calls(log)] == ["a"]
    with log_tool_calls(log):
        record_tool_call("s", "c", {"k": 1}, "timeout", 0.5)
    assert [r["tool"] for r in read_tool_calls(log)] == ["a", "c"]
    assert read_tool_calls(tmp_path / "missing.jsonl") == []


def test_report_counts_calls_per_tool(tmp_path):
    with log_tool_calls(tmp_path / "tool_calls.jsonl", phase="eval base"):
        for tool, error in [("run_query", None)] * 3 + [("run_query", "tool_error"), ("list_tables", None)]:
            record_tool_call("s", tool, {}, error, 0.002)
    result = EvalResult(label="base", n=1, success_rate=0.0, success_se=0.0, mean_reward=0.0, completed_rate=0.0,
                        mean_turns=1.0, mean_tool_errors=0.0, fatal_rate=0.0)
    text = write_report(tmp_path, [result], []).read_text()
    assert "## Tool calls" in text and "5 calls to the server in 1 phase " in text
    assert "| run_query | 4 | 1 | tool_error 1 |" in text and "| list_tables | 1 | 0 |  |" in text
    assert "| **all** | **5** | **1** |" in text


def test_table_of_no_calls_is_a_header():
    assert tool_call_table([]).count("\n") == 1
