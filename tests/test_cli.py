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
from mcp_rl.policies.policy import ScriptedPolicy
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
    from mcp_rl.tasks import generate
    from mcp_rl.tasks import scenarios as scenarios_module

    seen = []

    async def fake_llm_scenarios(context, n, out_path, seed, **kw):  # stands in for the LLM (a network call)
        seen.append([t["function"]["name"] for t in context.tools])
        scenarios_module.save_scenarios(out_path, [scenarios_module.Scenario(id="g-0", task="Look up k.")])

    monkeypatch.setattr(generate, "llm_scenarios", fake_llm_scenarios)
    out = tmp_path / "s.jsonl"
    code = cli.main(["scenarios", "--server", server, "--generator", "llm", "--n", "1", "--out", str(out),
                     "--base-url", "ollama", *flags])  # a local endpoint: no key needed
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
    import mcp_rl.runs.run

    seen = []

    async def fake_run(cfg, resume=False):
        seen.append(cfg)
        return {"base": None, "trained": None, "report": None}

    monkeypatch.setattr(mcp_rl.runs.run, "run", fake_run)
    assert cli.main(["train", "--tools", "list_tables,run_query", "--deny-tools", "x", "--allow-side-effects"]) == 0
    cfg = seen[-1]
    assert (cfg.server_tools, cfg.deny_tools, cfg.allow_side_effects) == (["list_tables", "run_query"], ["x"], True)
    assert cfg.rollout.tool_policy.allow == ("list_tables", "run_query")
    assert cli.main(["train", "--set", "allow_side_effects=true"]) == 0 and seen[-1].allow_side_effects
    assert cli.main(["train"]) == 0 and seen[-1].server_tools is None and not seen[-1].allow_side_effects


def test_train_worker_flags_set_the_config(monkeypatch):
    import mcp_rl.runs.run

    seen = []

    async def fake_run(cfg, resume=False):
        seen.append(cfg)

    monkeypatch.setattr(mcp_rl.runs.run, "run", fake_run)
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


# ---------------------------------------------------------------- one source of settings (mcp_rl/runs/flags.py)


@pytest.fixture
def recorded(monkeypatch):
    """What reached the (scripted) model: the Config and adapter `_policy` was built from, and each
    `complete` call's tools and sampling settings."""
    seen: dict[str, list] = {"policy": [], "complete": []}

    class Policy(ScriptedPolicy):
        async def complete(self, messages, tools, **kw):
            seen["complete"].append({"tools": [t["function"]["name"] for t in tools], **kw})
            return await super().complete(messages, tools, **kw)

    def script(messages):
        done = sum(m["role"] == "assistant" for m in messages)
        return {"tool": "lookup", "arguments": {"key": "k"}} if not done else \
            {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "1"}}

    def policy(*args, **kw):  # (cfg, a): the Config and the parsed flags
        seen["policy"].append(args)
        return Policy(script)

    monkeypatch.setattr(cli, "_policy", policy)
    return seen


def test_rollout_samples_at_the_rollout_configs_temperature(server, recorded):
    """The CLI said 0.0 and RolloutConfig 1.0; the dataclass's default is the one default now."""
    from mcp_rl.rollout import RolloutConfig

    assert cli.main(["rollout", "--server", server, "--task", "Look up k.", "--tools", "lookup"]) == 0
    assert {c["temperature"] for c in recorded["complete"]} == {RolloutConfig().temperature} == {1.0}
    assert cli.main(["rollout", "--server", server, "--task", "Look up k.", "--tools", "lookup",
                     "--temperature", "0.3", "--max-turns", "20"]) == 0  # 20 turns: no train.max_seq_len check
    assert recorded["complete"][-1]["temperature"] == 0.3


def test_eval_is_greedy_by_the_eval_sections_default(server, recorded, tmp_path):
    from mcp_rl.runs.config import TrainConfig

    scenarios = tmp_path / "s.jsonl"
    scenarios.write_text(json.dumps({"id": "s0", "task": "Look up k.", "answer": "1", "split": "test"}) + "\n")
    argv = ["eval", "--server", server, "--scenarios", str(scenarios), "--tools", "lookup"]
    assert cli.main(argv) == 0
    assert {c["temperature"] for c in recorded["complete"]} == {TrainConfig().eval_temperature} == {0.0}
    assert cli.main([*argv, "--temperature", "0.7"]) == 0 and recorded["complete"][-1]["temperature"] == 0.7


def test_eval_run_uses_the_runs_config_and_checkpoint_with_flags_over_it(server, recorded, tmp_path):
    from mcp_rl.runs.config import Config, redacted

    scenarios = tmp_path / "s.jsonl"
    scenarios.write_text("".join(json.dumps({"id": f"s{i}", "task": "Look up k.", "answer": "1", "split": "test"}) + "\n"
                                 for i in range(5)))
    run = tmp_path / "run"
    run.mkdir()
    cfg = Config(server=server, server_token="s3cret", server_tools=["lookup"], scenarios=str(scenarios), model="m0",
                 rollout={"max_turns": 3, "max_tokens": 64}, train={"eval_scenarios": 2, "eval_temperature": 0.25})
    (run / "config.json").write_text(json.dumps({**redacted(cfg), "a_field_of_an_older_version": 1}))
    assert cli.main(["eval", "--run", str(run)]) == 0
    used, a = recorded["policy"][-1]
    assert a.run == str(run) and a.adapter is None  # _policy loads the run's newest checkpoint
    assert used.model == "m0" and used.server_token is None  # a secret is never recorded: pass it again
    assert len(recorded["complete"]) == 2 * 2  # the run's 2 eval scenarios, 2 turns each
    assert {(c["temperature"], c["max_tokens"]) for c in recorded["complete"]} == {(0.25, 64)}
    assert recorded["complete"][0]["tools"] == ["lookup", COMPLETE_TOOL_NAME]  # the run's tool policy
    assert cli.main(["eval", "--run", str(run), "--temperature", "0.5", "--n", "1", "--model", "m1"]) == 0
    assert recorded["policy"][-1][0].model == "m1" and recorded["complete"][-1]["temperature"] == 0.5
    assert len(recorded["complete"]) == 4 + 2


def test_every_config_field_a_flag_can_set_is_a_train_flag_with_its_help(capsys):
    import dataclasses

    from mcp_rl.runs import flags
    from mcp_rl.runs.config import Config, TrainConfig

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    help_of = {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}
    assert "--warm-start-gate-scenarios WARM_START_GATE_SCENARIOS " + help_of["warm_start_gate_scenarios"] in text
    paths = [p for section in ("", "rollout", "reward", "train") for p in flags.flags_of(section)]
    assert len(paths) > 70 and "reward.custom" not in paths and "rollout.tool_policy" not in paths
    actions = {a.dest: a for a in cli.parser()._subparsers._group_actions[0].choices["train"]._actions}
    assert [p for p in paths if "cfg:" + p not in actions] == []
    assert Config().train.steps == 3  # the help's default is the dataclass's
    assert "GRPO steps (default: 3)" in text


def test_train_flags_set_config_fields_over_the_preset_and_set(monkeypatch):
    import mcp_rl.runs.run

    seen = []

    async def fake_run(cfg, resume=False):
        seen.append(cfg)

    monkeypatch.setattr(mcp_rl.runs.run, "run", fake_run)
    assert cli.main(["train", "--preset", "cpu", "--steps", "7", "--no-gradient-checkpointing", "--judge-retries", "5",
                     "--max-turns", "4", "--set", "train.steps=9", "--set", "train.lora_r=4"]) == 0
    cfg = seen[-1]
    assert (cfg.train.steps, cfg.train.lora_r, cfg.train.gradient_checkpointing) == (7, 4, False)  # flags over --set
    assert (cfg.reward.judge_retries, cfg.rollout.max_turns, cfg.rollout.max_tokens) == (5, 4, 96)  # the rest: cpu's
    assert cli.main(["train", "--max-turns", "40"]) == 2  # training still checks an episode fits max_seq_len


def test_the_token_flags_default_to_the_environment(monkeypatch):
    from mcp_rl.runs import flags
    from mcp_rl.runs.config import Config

    monkeypatch.setenv("MCP_RL_TOKEN", "from-env")
    a = cli.parser().parse_args(["tools", "--server", "http://127.0.0.1:9/mcp"])
    assert flags.config(a, Config(), trains=False).server_token == "from-env"
    a = cli.parser().parse_args(["tools", "--server", "http://127.0.0.1:9/mcp", "--token", "t"])
    assert flags.config(a, Config(), trains=False).server_token == "t"


def test_a_field_name_two_sections_share_gets_its_sections_flag():
    """A field added later under a taken name must not break every command (argparse refuses a clash)."""
    import argparse

    from mcp_rl.runs import flags

    p = argparse.ArgumentParser()
    p.add_argument("--temperature")  # as if another section had it first
    flags.add_flags(p, "rollout", ("rollout.temperature",))
    assert flags.given(p.parse_args(["--rollout-temperature", "0.5"])) == {"rollout.temperature": 0.5}


def test_scenarios_templates_must_name_a_shipped_environment(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    code = cli.main(["scenarios", "--server", "mcp_server.py", "--templates", "nope", "--n", "3", "--out", str(out)])
    assert code == 2 and not out.exists()
    err = capsys.readouterr().err
    assert "--templates names a shipped environment (company, " in err and "got 'nope'" in err


# ---------------------------------------------------------------- stateful servers ([environments] item 5)


def test_read_only_tools_flag_lets_an_unannotated_tool_pass(server, offered, capsys):
    argv = ["rollout", "--server", server, "--task", "Look up k.", "--deny-tools", "drop_all"]
    assert cli.main(argv) == 2 and "side effects: write_note" in capsys.readouterr().err
    assert cli.main([*argv, "--read-only-tools", "write_note"]) == 0
    assert offered[-1] == ["lookup", "write_note", COMPLETE_TOOL_NAME]
    assert cli.main(["tools", "--server", server, "--read-only-tools", "write_note"]) == 0
    out = capsys.readouterr().out
    assert "write_note  read-only (declared)" in out and "refused" in out  # drop_all is still offered


LONG_SERVER = textwrap.dedent('''
    from fastmcp import FastMCP

    mcp = FastMCP("long")

    @mcp.tool(annotations={"readOnlyHint": True})
    def lookup(key: str) -> str:
        """Look a key up: a long record."""
        return "x" * 5000

    if __name__ == "__main__":
        mcp.run(show_banner=False)
''')


@pytest.mark.parametrize("command", ["rollout", "eval"])
def test_max_result_chars_flag_reaches_the_rollout(command, tmp_path, monkeypatch):
    """`--max-result-chars` was already a generated flag of rollout and eval (RolloutConfig.max_result_chars);
    this proves it reaches what the model reads."""
    path = tmp_path / "long_server.py"
    path.write_text(LONG_SERVER)
    replies: list[str] = []

    def script(messages):
        replies.extend(m["content"] for m in messages[-1:] if m["role"] == "tool")
        done = sum(m["role"] == "assistant" for m in messages)
        return {"tool": "lookup", "arguments": {"key": "k"}} if not done else \
            {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "1"}}

    monkeypatch.setattr(cli, "_policy", lambda *a, **kw: ScriptedPolicy(script))
    scenarios = tmp_path / "s.jsonl"
    scenarios.write_text(json.dumps({"id": "s0", "task": "Look up k.", "answer": "1", "split": "test"}) + "\n")
    argv = {"rollout": ["rollout", "--server", str(path), "--task", "Look up k."],
            "eval": ["eval", "--server", str(path), "--scenarios", str(scenarios)]}[command]
    assert cli.main(argv) == 0
    assert cli.main([*argv, "--max-result-chars", "6000"]) == 0
    assert cli.main([*argv, "--max-result-chars", "100"]) == 0
    default, whole, cut = replies
    assert "[truncated 2000 chars]" in default and whole == "x" * 5000  # the default cap is 3000
    assert cut.startswith("x" * 100) and "[truncated 4900 chars]" in cut and len(cut) < 150


def test_no_key_names_the_local_endpoint_before_a_server_starts(server, capsys, monkeypatch):
    from mcp_rl.tasks import generate

    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    monkeypatch.setattr(cli, "_with_server", lambda *a: pytest.fail("the key is checked before the server starts"))
    monkeypatch.setattr(generate, "llm_scenarios", lambda *a, **kw: pytest.fail("no generation without a key"))
    code = cli.main(["scenarios", "--server", server, "--generator", "llm", "--n", "1", "--out", "x.jsonl"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "set OPENROUTER_API_KEY" in err
    assert "--base-url ollama" in err and "http://localhost:11434/v1" in err
    assert generate.resolve_generator("ollama", None) == ("http://localhost:11434/v1", "EMPTY")  # what it names works
