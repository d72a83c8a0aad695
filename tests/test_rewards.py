"""Tests for mcp_rl/rewards/score.py: shaping, config checks, the doctests, and
RULER plumbing through ART's ruler_score_group with litellm's mock_response (or a fake
judge endpoint on 127.0.0.1 for timeouts and retries).

    .venv/bin/python -m pytest tests/test_rewards.py -q
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: no cost-map fetch

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import art
import litellm
import pytest
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from mcp_rl.rewards.score import RewardConfig, efficiency_reward, format_reward, score_group, score_trajectory

litellm.suppress_debug_info = True
# litellm's mock and OpenAI responses trip pydantic's serializer checks inside ART's ruler: noise.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")




# ---------------------------------------------------------------- shaping
@pytest.mark.parametrize("calls,value", [(0, 1.0), (2, 1.0), (4, 0.75), (10, 0.0), (50, 0.0)])
def test_efficiency_reward(calls, value):
    assert efficiency_reward(calls, free_calls=2, max_calls=10) == value


@pytest.mark.parametrize("metrics,value", [
    ({"completed": True}, 0.0),
    ({"completed": True, "tool_errors": 1}, -0.1),
    ({"completed": True, "malformed_calls": 2}, -0.5),
    ({"completed": False, "ran_out_of_turns": True}, -0.5),
    ({"completed": False, "fatal": True, "malformed_calls": 9}, -1.0),   # floor at -1
    ({}, -0.5),                                                          # no metrics: not completed
])
def test_format_reward(metrics, value):
    assert format_reward(metrics) == value


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs,match", [
    ({"verified_weight": -1}, "verified_weight must be"),
    ({"ruler_weight": float("inf")}, "ruler_weight must be"),
    ({"rel_tol": -0.1}, "rel_tol must be"),
    ({"success_threshold": 0}, "success_threshold"),
    ({"efficiency_free_calls": 10, "efficiency_max_calls": 10}, "efficiency_free_calls"),
    ({"judge_retries": -1}, "judge_retries"),
    ({"judge_timeout_s": 0}, "judge_timeout_s"),
    ({"judge_model": " "}, "litellm model string"),
    ({"judge_base_url": "localhost:8000"}, "http://"),
    ({"rubric": ""}, "rubric is empty"),
    ({"judge_params": ["x"]}, "judge_params"),
    ({"on_judge_failure": "zero"}, "'verified' or 'skip'"),
])
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(**kwargs)


def test_config_fields_have_help():
    import dataclasses
    assert all(f.metadata.get("help") for f in dataclasses.fields(RewardConfig))


# ---------------------------------------------------------------- composite
def make_traj(answer, *, tool_calls=2, tool_errors=0, malformed=0, completed=True, text=None, shown="42"):
    """A finished episode; `shown` is what its one successful lookup returned (None: no lookup)."""
    choice = Choice(finish_reason="stop", index=0, message=ChatCompletionMessage(
        role="assistant", content=text or f"<tool_call>{{\"name\": \"complete_task\", \"arguments\": "
                                           f"{{\"answer\": \"{answer}\"}}}}</tool_call>"))
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You answer questions about a company database."},
            {"role": "user", "content": "How many employees are there?"},
            choice,
        ],
        reward=0,
        metrics={"turns": 2, "tool_calls": tool_calls, "tool_errors": tool_errors,
                 "malformed_calls": malformed, "completed": completed, "ran_out_of_turns": False,
                 "fatal": False, "latency_s": 0.1},
        metadata={"scenario_id": "s1", "answer": answer, "policy": "test", "policy_step": 0,
                  **({"lookups": json.dumps([["run_query", '{"sql": "SELECT COUNT(*) FROM employees"}',
                                             f"COUNT(*)\n--------\n{shown}\n(1 row)"]])} if shown is not None else {})},
    )


SCENARIO = SimpleNamespace(id="s1", answer=42)         # duck-typed Scenario
UNVERIFIABLE = SimpleNamespace(id="s2", answer=None)


@pytest.mark.parametrize("shown,require,paid", [
    ("42", True, 1.0),     # the lookup showed 42: grounded
    (None, True, 0.0),     # no lookup: a right guess earns nothing
    ("41", True, 0.0),     # the lookup showed something else
    ("1", True, 0.0),      # "(1 row)" is a footer, not a value: no evidence of 1 either
    (None, False, 1.0),    # require_evidence=False pays correctness alone
])
def test_verified_credit_needs_evidence(shown, require, paid):
    t = make_traj("42", shown=shown)
    score_trajectory(t, SCENARIO, RewardConfig(require_evidence=require))
    assert t.metrics["reward/verified"] == paid
    assert t.metrics["answer_correct"] == 1.0
    assert t.metrics["grounded"] == float(shown == "42")


def test_score_trajectory_sums_weighted_components():
    t = make_traj("42", tool_calls=6, tool_errors=1)
    reward = score_trajectory(t, SCENARIO, RewardConfig())
    # verified 1.0, efficiency 0.5 (6 calls), format -0.1 (one tool error)
    assert reward == pytest.approx(1.0 + 0.1 * 0.5 + 0.2 * -0.1)
    assert t.reward == reward
    assert (t.metrics["reward/verified"], t.metrics["reward/efficiency"], t.metrics["reward/format"]) == (1.0, 0.5, -0.1)
    assert t.metrics["reward/used_ruler"] == 0.0 and "reward/ruler" not in t.metrics


def test_efficiency_bonus_only_when_correct():
    t = make_traj("41", tool_calls=1)
    assert score_trajectory(t, SCENARIO) == 0.0
    assert t.metrics["reward/efficiency"] == 0.0


def test_zero_weight_logs_but_does_not_reward():
    t = make_traj("42", tool_errors=3)
    reward = score_trajectory(t, SCENARIO, RewardConfig(format_weight=0, efficiency_weight=0))
    assert reward == 1.0
    assert t.metrics["reward/format"] == pytest.approx(-0.3) and t.metrics["reward/used_format"] == 0.0


def test_score_trajectory_without_answer_uses_shaping_only():
    t = make_traj("42", completed=False)
    assert score_trajectory(t, UNVERIFIABLE) == pytest.approx(0.2 * -0.5)
    assert t.metrics["reward/used_verified"] == 0.0


def test_unverifiable_expected_type_is_logged_not_raised(caplog):
    t = make_traj("42")
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        score_trajectory(t, SimpleNamespace(id="bad", answer={"x": 1}))
    assert "cannot verify" in caplog.text and "reward/verified" not in t.metrics


async def test_score_group_without_judge_scores_in_place():
    group = art.TrajectoryGroup([make_traj("42"), make_traj("7")], exceptions=[RuntimeError("one rollout died")])
    out = await score_group(group, SCENARIO, RewardConfig())
    assert out is group and len(out.exceptions) == 1
    assert [t.reward for t in out] == [pytest.approx(1.1), 0.0]
    assert out.trajectories[0].metrics["tool_calls"] == 2      # rollout metrics kept
    assert "reward/judge_failed" not in out.trajectories[0].metrics


@pytest.mark.parametrize("group,scenario,cfg,reason", [
    (art.TrajectoryGroup([make_traj("42")]), UNVERIFIABLE, RewardConfig(), "no verified answer and no judge"),
    (art.TrajectoryGroup([]), SCENARIO, RewardConfig(), "no trajectories"),
    (art.TrajectoryGroup([make_traj("42")]), SCENARIO, RewardConfig(verified_weight=0), "no verified answer and no judge"),
])
async def test_score_group_skips_unscorable_groups(group, scenario, cfg, reason, caplog):
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        assert await score_group(group, scenario, cfg) is None
    assert reason in caplog.text



# ---------------------------------------------------------------- custom (user) rewards
def says_42(traj, scenario):
    return float("42" in (traj.metadata.get("answer") or ""))


def explodes(traj, scenario):
    raise KeyError("no such field")


@pytest.mark.parametrize("custom,reward,value,error", [
    ([("says_42", says_42, 0.5)], 1.1 + 0.5, 1.0, 0.0),                       # weighted and added
    ([("says_42", says_42, 0)], 1.1, 1.0, 0.0),                               # weight 0: logged only
    ([("says_42", explodes, 2.0)], 1.1, 0.0, 1.0),                            # raises: a logged 0
    ([("says_42", lambda t, s: "high", 1.0)], 1.1, 0.0, 1.0),                 # not a number: a logged 0
    ([("says_42", lambda t, s: float("nan"), 1.0)], 1.1, 0.0, 1.0),           # not finite: a logged 0
])
def test_custom_reward_is_combined_like_the_others(custom, reward, value, error):
    t = make_traj("42")
    assert score_trajectory(t, SCENARIO, RewardConfig(custom=custom)) == pytest.approx(reward)
    assert (t.metrics["reward/says_42"], t.metrics["reward/says_42_error"]) == (value, error)
    assert t.metrics["reward/used_says_42"] == float(custom[0][2] > 0)
    assert any("custom reward 'says_42' failed" in line for line in t.logs) == bool(error)


def test_custom_reward_gets_the_scenario():
    seen = []
    score_trajectory(make_traj("42"), SCENARIO, RewardConfig(custom=[("spy", lambda t, s: seen.append(s) or 0.0, 1)]))
    assert seen == [SCENARIO]


async def test_custom_reward_makes_unverifiable_group_scorable():
    group = art.TrajectoryGroup([make_traj("42"), make_traj("7"), make_traj("x")])
    cfg = RewardConfig(custom=[("says_42", says_42, 1.0), ("boom", explodes, 1.0)])
    out = await score_group(group, UNVERIFIABLE, cfg)
    assert out is group
    assert [t.reward for t in out] == [pytest.approx(1.0), 0.0, 0.0]   # format 0 (completed); boom scores 0
    assert all(t.metrics["reward/boom_error"] == 1.0 for t in out)


@pytest.mark.parametrize("custom,match", [
    (["says_42"], r"\(name, fn, weight\)"),
    ([("verified", says_42, 1)], "identifier other than"),
    ([("my reward", says_42, 1)], "identifier other than"),
    ([("r", "not callable", 1)], "must be callable"),
    ([("r", says_42, -1)], "weight must be"),
    ([("r", says_42, True)], "weight must be"),
    ([("r", says_42, 1), ("r", explodes, 1)], "unique"),
])
def test_custom_reward_config_rejects_bad_entries(custom, match):
    with pytest.raises(ValueError, match=match):
        RewardConfig(custom=custom)


# ---------------------------------------------------------------- RULER
def judge_json(*scores):
    return json.dumps({"scores": [{"trajectory_id": str(i), "explanation": f"e{i}", "score": s}
                                  for i, s in enumerate(scores, start=1)]})


def mock_cfg(mock_response, **kw):
    return RewardConfig(judge_model="openai/gpt-4o-mini", judge_backoff_s=0,
                        judge_params={"mock_response": mock_response}, **kw)


def group_of_two():
    return art.TrajectoryGroup([make_traj("42"), make_traj("41", tool_errors=1)])


async def test_good_judge_scores_are_added():
    out = await score_group(group_of_two(), SCENARIO, mock_cfg(judge_json(0.9, 0.2)))
    good, bad = out.trajectories
    assert (good.metrics["reward/ruler"], bad.metrics["reward/ruler"]) == (0.9, 0.2)
    assert good.reward == pytest.approx(1.0 + 0.9 + 0.1)
    assert bad.reward == pytest.approx(0.2 + 0.2 * -0.1)
    assert good.metrics["reward/judge_failed"] == 0.0 and good.metrics["reward/used_ruler"] == 1.0
    assert good.metrics["turns"] == 2 and "RULER explanation: e1" in good.logs


async def test_judge_scores_unverifiable_group():
    out = await score_group(group_of_two(), UNVERIFIABLE, mock_cfg(judge_json(0.9, 0.2)))
    assert [t.reward for t in out] == [pytest.approx(0.9), pytest.approx(0.2 - 0.02)]
    assert out.trajectories[0].metrics["reward/used_verified"] == 0.0


async def test_out_of_range_scores_are_clamped(caplog):
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), SCENARIO, mock_cfg(judge_json(1.7, -0.4)))
    assert [t.metrics["reward/ruler"] for t in out] == [1.0, 0.0]
    assert "clamped" in caplog.text


@pytest.mark.parametrize("mock_response,reason", [
    ("this is not json", "ValidationError"),
    (judge_json(0.9), "wrong number of scores"),
    (judge_json(0.9, 0.5, 0.1), "wrong number of scores"),
    (json.dumps({"scores": [{"trajectory_id": "1", "explanation": "", "score": "high"}] * 2}), "ValidationError"),
    (RuntimeError("judge exploded"), "judge exploded"),
    ("litellm.RateLimitError", "RateLimitError"),
])
async def test_failed_judge_falls_back_to_verified(mock_response, reason, caplog):
    cfg = mock_cfg(mock_response, judge_retries=1)
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), SCENARIO, cfg)
    good, bad = out.trajectories
    assert good.metrics["reward/judge_failed"] == 1.0 and "reward/ruler" not in good.metrics
    # The verified reward stands in for the judge at both weights.
    assert good.reward == pytest.approx(2.0 + 0.1) and bad.reward == pytest.approx(-0.02)
    assert caplog.text.count("RULER attempt") == 2 and reason in caplog.text


async def test_failed_judge_with_skip_policy_skips(caplog):
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), SCENARIO, mock_cfg("garbage", on_judge_failure="skip", judge_retries=0))
    assert out is None and "on_judge_failure='skip'" in caplog.text


async def test_failed_judge_without_answer_skips(caplog):
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), UNVERIFIABLE, mock_cfg("garbage", judge_retries=0))
    assert out is None and "no verified answer to fall back on" in caplog.text


async def test_failed_log_only_judge_does_not_skip():
    out = await score_group(group_of_two(), SCENARIO,
                            mock_cfg("garbage", ruler_weight=0, on_judge_failure="skip", judge_retries=0))
    assert out is not None and out.trajectories[0].reward == pytest.approx(1.1)


# A fake OpenAI-compatible judge on 127.0.0.1: the network boundary, the only place a
# test double belongs. It plays a script of replies: ("sleep", s) or ("json", content).
class FakeJudge:
    def __init__(self, script):
        self.script, self.requests, self.release = list(script), [], threading.Event()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.requests.append({"auth": self.headers.get("Authorization"), "body": body})
                kind, value = judge.script.pop(0) if len(judge.script) > 1 else judge.script[0]
                if kind == "sleep":
                    judge.release.wait(value)
                    return
                reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": value}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(reply).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_judge():
    judges = []

    def start(script):
        judges.append(FakeJudge(script))
        return judges[-1]
    yield start
    for j in judges:
        j.close()


def endpoint_cfg(judge, **kw):
    return RewardConfig(judge_model="openai/local-judge", judge_base_url=judge.url,
                        judge_api_key="local-key", judge_backoff_s=0, **kw)


async def test_local_endpoint_judge_gets_base_url_and_key(fake_judge):
    judge = fake_judge([("json", judge_json(0.3, 0.6))])
    out = await score_group(group_of_two(), SCENARIO, endpoint_cfg(judge))
    assert [t.metrics["reward/ruler"] for t in out] == [0.3, 0.6]
    assert judge.requests[0]["auth"] == "Bearer local-key"
    assert judge.requests[0]["body"]["model"] == "local-judge"


async def test_judge_retry_recovers(fake_judge):
    judge = fake_judge([("json", "{broken"), ("json", judge_json(0.8, 0.1))])
    out = await score_group(group_of_two(), SCENARIO, endpoint_cfg(judge, judge_retries=2))
    assert len(judge.requests) == 2
    assert out.trajectories[0].metrics["reward/judge_failed"] == 0.0
    assert out.trajectories[0].metrics["reward/ruler"] == 0.8


async def test_judge_timeout_falls_back_quickly(fake_judge, caplog):
    judge = fake_judge([("sleep", 30)])
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), SCENARIO, endpoint_cfg(judge, judge_timeout_s=0.5, judge_retries=1))
    assert time.monotonic() - start < 10
    assert len(judge.requests) == 2                                  # no hidden client retries
    assert out.trajectories[0].metrics["reward/judge_failed"] == 1.0
    assert out.trajectories[0].reward == pytest.approx(2.1)
    assert "Timeout" in caplog.text or "timed out" in caplog.text


async def test_wait_for_backstops_a_judge_that_ignores_its_timeout(fake_judge, caplog):
    judge = fake_judge([("sleep", 30)])
    # judge_params override litellm's timeout to 60 s; asyncio.wait_for must still end it.
    cfg = endpoint_cfg(judge, judge_timeout_s=0.5, judge_retries=0, judge_params={"timeout": 60})
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="mcp_rl.rewards.score"):
        out = await score_group(group_of_two(), SCENARIO, cfg)
    assert time.monotonic() - start < 5
    assert "timed out" in caplog.text and out.trajectories[0].metrics["reward/judge_failed"] == 1.0


def test_wrong_count_is_caught_under_python_O():
    # ART checks the score count with a bare assert; under -O zip() would silently drop
    # trajectories. Run a real interpreter with -O to show the check here still holds.
    import subprocess
    import sys
    code = (
        "import asyncio, json, art\n"
        "from types import SimpleNamespace\n"
        "from mcp_rl.rewards.score import RewardConfig, score_group\n"
        "t = lambda a: art.Trajectory(messages_and_choices=[{'role': 'user', 'content': 'q'}], reward=0,"
        " metrics={'completed': True, 'tool_calls': 2}, metadata={'answer': a})\n"
        "one = json.dumps({'scores': [{'trajectory_id': '1', 'explanation': '', 'score': 0.9}]})\n"
        "cfg = RewardConfig(judge_model='openai/x', judge_retries=0, judge_params={'mock_response': one})\n"
        "g = asyncio.run(score_group(art.TrajectoryGroup([t('42'), t('41')]), SimpleNamespace(id='s', answer=42), cfg))\n"
        "print([x.metrics['reward/judge_failed'] for x in g])\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 1.0]"


@pytest.mark.parametrize("completed, require, expected_verified", [
    (True, True, 1.0), (False, True, 0.0), (False, False, 1.0)])
def test_prose_answers_are_not_verified_unless_allowed(completed, require, expected_verified):
    """A plain-text reply ending '... 1' must not match an expected 1 by accident."""
    traj = art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=0.0,
                          metrics={"completed": completed, "turns": 1, "tool_calls": 1, "tool_errors": 0,
                                   "malformed_calls": 0, "ran_out_of_turns": False, "fatal": False},
                          metadata={"answer": "I think it is 1"})
    score_trajectory(traj, SimpleNamespace(id="s", answer=1),
                     RewardConfig(require_complete_task=require, require_evidence=False))  # this rule alone
    assert traj.metrics["reward/verified"] == expected_verified


def test_a_function_where_the_custom_list_goes_gets_a_message():
    """Probe, round 2: custom=my_fn was a TypeError ("'function' object is not iterable")."""
    with pytest.raises(ValueError, match=r"custom must be a list of \(name, fn, weight\) tuples"):
        RewardConfig(custom=lambda traj, scenario: 1.0)
