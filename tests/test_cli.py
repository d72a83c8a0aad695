"""Tests for mcp_rl/cli.py: the `tools` listing and the tool-filter flags of the rollout commands.

Run: .venv/bin/python -m pytest tests/test_cli.py -q
The server is a small script run over stdio (as `--server` names it); the model is replaced by a
scripted policy (`cli._policy` patched), since what is tested is what reaches it.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from mcp_rl import cli
from mcp_rl.policy import ScriptedPolicy
from mcp_rl.rollout import COMPLETE_TOOL_NAME

SERVER = textwrap.dedent('''
    """A server with one read-only tool and two with side effects (tests/test_cli.py)."""
    from fastmcp import FastMCP

    mcp = FastMCP("mixed")

    @mcp.tool(annotations={"readOnlyHint": True, "idempotentHint": True})
    def lookup(key: str) -> str:
        """Look a key up."""
        return "1"

    @mcp.tool
    def write_note(text: str) -> str:
        """Write a note."""
        return "written"

    @mcp.tool(annotations={"destructiveHint": True})
    def drop_all() -> str:
        """Delete everything."""
        return "dropped"

    if __name__ == "__main__":
        mcp.run(show_banner=False)
''')


@pytest.fixture
def server(tmp_path):
    path = tmp_path / "mixed_server.py"
    path.write_text(SERVER)
    return str(path)


@pytest.fixture
def offered(monkeypatch):
    """The tool names the (scripted) model was offered; it looks up once, then answers."""
    seen: list[list[str]] = []

    class Policy(ScriptedPolicy):
        async def complete(self, messages, tools, **kw):
            seen.append([t["function"]["name"] for t in tools])
            return await super().complete(messages, tools, **kw)

    def script(messages):
        done = sum(m["role"] == "assistant" for m in messages)
        return {"tool": "lookup", "arguments": {"key": "k"}} if not done else \
            {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "1"}}

    monkeypatch.setattr(cli, "_policy", lambda *a, **kw: Policy(script))
    return seen


def test_tools_shows_each_class_and_what_rollouts_would_do(server, capsys):
    assert cli.main(["tools", "--server", server]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[2:5]}
    assert "read-only" in rows["lookup"] and "readOnly, idempotent" in rows["lookup"]
    assert "side effects" in rows["write_note"] and "(none)" in rows["write_note"]
    assert "side effects" in rows["drop_all"] and "destructive" in rows["drop_all"]
    assert "rollouts: refused: refusing to offer the agent tools with side effects: write_note, drop_all" in out


def test_tools_with_filters_marks_and_prints_the_offered_schemas(server, capsys):
    assert cli.main(["tools", "--server", server, "--deny-tools", "write_note,drop_all"]) == 0
    out = capsys.readouterr().out
    assert "no (filtered)" in out and "rollouts: offer 1 tool, all read-only" in out
    assert cli.main(["tools", "--server", server, "--json", "--tools", "lookup"]) == 0
    assert [t["function"]["name"] for t in json.loads(capsys.readouterr().out)] == ["lookup"]


def test_rollout_is_refused_by_default_with_one_error_line(server, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_policy", lambda *a, **kw: pytest.fail("the model loads only after the check"))
    assert cli.main(["rollout", "--server", server, "--task", "Look up k."]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("error: refusing to offer the agent tools with side effects: write_note, drop_all")
    assert "--tools lookup" in err and "--allow-side-effects" in err


@pytest.mark.parametrize("flags, tools", [
    (["--tools", "lookup"], ["lookup"]),
    (["--tools", "lookup,write_note"], ["lookup", "write_note"]),
    (["--allow-side-effects"], ["lookup", "write_note", "drop_all"]),
    (["--allow-side-effects", "--deny-tools", "drop_all"], ["lookup", "write_note"]),
])
def test_rollout_flags_choose_the_tools(server, offered, capsys, flags, tools):
    assert cli.main(["rollout", "--server", server, "--task", "Look up k.", *flags]) == 0
    assert offered[0] == [*tools, COMPLETE_TOOL_NAME]
    assert "-- answer: '1'" in capsys.readouterr().out


@pytest.mark.parametrize("flags, tools", [
    ([], None),  # refused, as a rollout would be
    (["--tools", "lookup"], ["lookup"]),
    (["--allow-side-effects", "--deny-tools", "drop_all"], ["lookup", "write_note"]),
])
def test_scenarios_writers_see_only_the_tools_rollouts_offer(server, tmp_path, capsys, monkeypatch, flags, tools):
    from mcp_rl import scenarios as scenarios_module

    seen = []

    async def fake_llm_scenarios(context, n, out_path, seed, **kw):  # stands in for the LLM (a network call)
        seen.append([t["function"]["name"] for t in context.tools])
        scenarios_module.save_scenarios(out_path, [scenarios_module.Scenario(id="g-0", task="Look up k.")])

    monkeypatch.setattr(scenarios_module, "llm_scenarios", fake_llm_scenarios)
    out = tmp_path / "s.jsonl"
    code = cli.main(["scenarios", "--server", server, "--generator", "llm", "--n", "1", "--out", str(out), *flags])
    if tools is None:
        assert code == 2 and not seen and not out.exists()
        assert "refusing to offer the agent tools with side effects" in capsys.readouterr().err
    else:
        assert code == 0 and seen == [tools] and out.exists()


def test_a_filter_naming_a_missing_tool_is_one_error_line(server, capsys):
    assert cli.main(["rollout", "--server", server, "--task", "t", "--tools", "read_query,lookup"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not have: 'read_query'" in err


def test_eval_with_out_logs_every_tool_call_and_counts_them(server, offered, tmp_path, capsys):
    scenarios = tmp_path / "s.jsonl"
    scenarios.write_text("".join(json.dumps({"id": f"s{i}", "task": "Look up k.", "answer": "1", "split": "test"}) + "\n"
                                 for i in range(3)))
    out = tmp_path / "eval"
    assert cli.main(["eval", "--server", server, "--scenarios", str(scenarios), "--out", str(out),
                     "--tools", "lookup"]) == 0
    rows = [json.loads(line) for line in (out / "tool_calls.jsonl").read_text().splitlines()]
    assert [(r["tool"], r["phase"], r["error"]) for r in rows] == [("lookup", "eval base", None)] * 3
    assert "| lookup | 3 | 0 |" in (out / "report.md").read_text()


def test_train_and_demo_flags_set_the_config(monkeypatch):
    import mcp_rl.runs

    seen = []

    async def fake_run(cfg, resume=False):
        seen.append(cfg)
        return {"base": None, "trained": None, "report": None}

    monkeypatch.setattr(mcp_rl.runs, "run", fake_run)
    assert cli.main(["train", "--tools", "list_tables,run_query", "--deny-tools", "x", "--allow-side-effects"]) == 0
    cfg = seen[-1]
    assert (cfg.server_tools, cfg.deny_tools, cfg.allow_side_effects) == (["list_tables", "run_query"], ["x"], True)
    assert cfg.rollout.tool_policy.allow == ("list_tables", "run_query")
    assert cli.main(["train", "--set", "allow_side_effects=true"]) == 0 and seen[-1].allow_side_effects
    assert cli.main(["train"]) == 0 and seen[-1].server_tools is None and not seen[-1].allow_side_effects


def test_train_worker_flags_set_the_config(monkeypatch):
    import mcp_rl.runs

    seen = []

    async def fake_run(cfg, resume=False):
        seen.append(cfg)

    monkeypatch.setattr(mcp_rl.runs, "run", fake_run)
    monkeypatch.delenv("MCP_RL_WORKER_TOKEN", raising=False)
    assert cli.main(["train", "--workers", "http://127.0.0.1:8101, http://127.0.0.1:8102", "--worker-token", "t",
                     "--policy-port", "8200"]) == 0
    cfg = seen[-1]
    assert (cfg.rollout_workers, cfg.worker_token, cfg.policy_port) == (
        ["http://127.0.0.1:8101", "http://127.0.0.1:8102"], "t", 8200)
    assert cli.main(["train"]) == 0 and seen[-1].rollout_workers == [] and seen[-1].worker_token is None
    assert cli.main(["train", "--workers", "127.0.0.1:8101"]) == 2  # a URL without http:// is one error line


def test_rollout_worker_refuses_a_bad_port(capsys):
    assert cli.main(["rollout-worker", "--server", "company", "--port", "0"]) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err


@pytest.mark.parametrize("preset, code", [("t4-unsloth", 0), ("t5", 2)])
def test_train_takes_every_preset_the_config_has(preset, code, capsys):
    """The README advertises `t4-unsloth`; the parser once offered only cpu and t4 (found by review)."""
    from mcp_rl.cli import main

    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", preset, "--help"])
    assert e.value.code == code
