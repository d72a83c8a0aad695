"""Tests for mcp_rl/rewards/reward_audit.py: the cheat battery through the real rollout loop and reward, against
the company server in-process. The fixed reward passes on the committed test split; a weak custom
reward and a reward without the evidence rule are caught; training refuses a gameable reward.

    .venv/bin/python -m pytest tests/test_reward_audit.py -q
"""

import asyncio
import dataclasses

import pytest

from mcp_rl.environments.company import PLAN
from mcp_rl.runs.config import preset
from mcp_rl.runs.pipeline import audit_before_training
from mcp_rl.policies.policy import DemonstrationPolicy
from mcp_rl.rewards.reward_audit import RewardGameable, audit_reward
from mcp_rl.rewards.score import RewardConfig
from mcp_rl.tasks.scenarios import load_scenarios
from mcp_server import build_server


def _split(name):
    return [s for s in load_scenarios("data/scenarios.jsonl") if s.split == name and s.answer is not None]


def _audit(db, scenarios, reward):
    return asyncio.run(audit_reward(build_server(db), scenarios, reward, demonstrations=DemonstrationPolicy(scenarios, PLAN)))


def test_fixed_reward_passes_on_the_committed_test_split(company_db):
    report = _audit(company_db, _split("test"), RewardConfig())
    assert report.demonstrations.success == 1.0  # honest work still earns full credit
    assert not report.failed(), report.table()
    assert max(r.success for r in report.rows) <= 0.02
    names = " ".join(r.name for r in report.rows)
    for cheat in ("empty answer", "echo the question", "kitchen sink of names (spaces)", "constant 0",
                  "another task's lookups, then paste the last result", "lookups, then every name seen",
                  "encoded echo of the true answer (hex, bare)", "encoded echo of the true answer (arith, filter)"):
        assert cheat in names


def test_encoded_echoes_of_the_true_answer_earn_nothing_with_the_counterfactual(company_db):
    """A policy that knows the answer makes the server show it (hex, char(), arithmetic; bare, over a table row,
    behind the demonstration's query): the echo checks pay it, the counterfactual replay does not."""
    scenarios = _split("test")[:10]
    off = {r.name: r.success for r in _audit(company_db, scenarios, RewardConfig(counterfactual=False)).rows}
    report = _audit(company_db, scenarios, RewardConfig())
    on = {r.name: r.success for r in report.rows}
    echoes = [name for name in on if name.startswith("encoded echo")]
    assert len(echoes) == 5
    assert all(off[name] >= 0.5 for name in echoes), off  # without the replay, the audit catches them
    assert all(on[name] == 0.0 for name in echoes), on
    assert report.demonstrations.success == 1.0


def test_a_weak_custom_reward_is_refused(company_db):
    """A reward that pays any non-empty answer: every constant cheat earns what the demonstration earns."""
    nonempty = lambda traj, scenario: float(bool(str(traj.metadata.get("answer") or "").strip()))  # noqa: E731
    reward = RewardConfig(verified_weight=0.0, custom=[("nonempty", nonempty, 1.0)])
    report = _audit(company_db, _split("test")[:12], reward)
    assert report.failed()
    with pytest.raises(RewardGameable, match="succeeds on 100.0% of 12 scenarios") as e:
        report.check()
    assert len(str(e.value)) < 500


def test_the_evidence_rule_stops_guesses_and_balance_stops_lookups_then_constant(company_db):
    ones = [s for s in _split("train") if s.answer == 1][:4] + [s for s in _split("train") if s.answer != 1][:4]
    without = {r.name: r.success for r in _audit(company_db, ones, RewardConfig(require_evidence=False)).rows}
    with_evidence = {r.name: r.success for r in _audit(company_db, ones, RewardConfig()).rows}
    assert without["constant int 1"] == 0.5           # half the tasks answer 1: a guess pays without evidence
    assert with_evidence["constant int 1"] == 0.0     # no lookup, no credit
    # Honest lookups followed by the constant still find the 1 in the result: only balanced tasks cap this.
    assert with_evidence["lookups, then constant int 1"] == 0.5


def test_training_refuses_a_gameable_reward_and_writes_the_table(company_db, tmp_path):
    nonempty = lambda traj, scenario: float(bool(traj.metadata.get("answer")))  # noqa: E731
    cfg = preset("cpu")
    cfg = dataclasses.replace(cfg, reward=RewardConfig(verified_weight=0.0, custom=[("nonempty", nonempty, 1.0)]))
    train = _split("train")[:10]
    with pytest.raises(RewardGameable, match="audit_max_success=1.0"):
        asyncio.run(audit_before_training(build_server(company_db), train, cfg, tmp_path))
    assert "FAILED" in (tmp_path / "reward_audit.md").read_text()
    off = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, audit_max_success=1.0))
    assert asyncio.run(audit_before_training(build_server(company_db), train, off, tmp_path)) is None


def test_cli_audit_reward_prints_the_table(capsys):
    from mcp_rl.cli import main

    assert main(["audit-reward", "--split", "test", "--n", "6"]) in (0, 1)
    out = capsys.readouterr().out
    assert "| demonstrations (honest) | 6 | 100.0% |" in out and "kitchen sink" in out


def _judge(scores):
    import json

    return json.dumps({"scores": [{"trajectory_id": str(i), "explanation": "x", "score": s}
                                  for i, s in enumerate(scores, start=1)]})


@pytest.mark.parametrize("lazy, refused", [(True, True), (False, False)])
def test_ruler_rewards_are_audited_too(company_db, lazy, refused):
    """A judge that likes every episode is refused; one that ranks the demonstration first passes.
    (litellm's mock_response stands in for the judge at the network boundary.)"""
    scenarios = _split("test")[:6]
    n = len(_audit(company_db, scenarios, RewardConfig()).rows) + 1  # the group: demonstration + every cheat
    scores = [1.0] * n if lazy else [1.0] + [0.0] * (n - 1)
    reward = RewardConfig(verified_weight=0.0, judge_model="openai/judge", judge_backoff_s=0, judge_retries=0,
                          judge_params={"mock_response": _judge(scores)})
    report = _audit(company_db, scenarios, reward)
    assert bool(report.failed()) == refused and not report.skipped


def test_a_run_with_a_gameable_reward_stops_before_its_model_loads(tmp_path, monkeypatch):
    """Through `mcp_rl.run` (the company server over HTTP): the audit refuses, no trainer is built."""
    from mcp_rl.runs import parts
    from mcp_rl.runs.config import apply_overrides
    from mcp_rl.runs.run import run

    monkeypatch.setattr(parts, "build_trainer", lambda cfg: pytest.fail("the model loaded before the audit"))
    nonempty = lambda traj, scenario: float(bool(traj.metadata.get("answer")))  # noqa: E731
    cfg = apply_overrides(preset("cpu", server="company"), [f"out={tmp_path / 'run'}", "reward.audit_scenarios=8"])
    cfg = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, verified_weight=0.0,
                                                              custom=[("nonempty", nonempty, 1.0)]))
    with pytest.raises(RewardGameable):
        asyncio.run(run(cfg))
    assert "FAILED" in (tmp_path / "run" / "reward_audit.md").read_text()
