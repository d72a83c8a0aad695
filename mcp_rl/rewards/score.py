"""Rewards: verifiable answers, small shaping terms, hardened RULER, and their weighted sum.

    cfg = RewardConfig(judge_model="openrouter/qwen/qwen3-32b")   # or None: verified only
    group = await score_group(group, scenario, cfg)                # None = skipped (reason logged)
    reward = score_trajectory(traj, scenario, cfg)                 # sync, verified + shaping only

Components, each logged per trajectory as `metrics["reward/<name>"]`:
  verified    verify_answer(metadata["answer"], scenario.answer) from mcp_rl.rewards.verify, in
              [0, 1] (only when the scenario has an answer), paid only where a successful tool
              result showed the value (require_evidence, mcp_rl.rewards.evidence) and, where score_group has
              counterfactual worlds, still moved when replayed on perturbed data (mcp_rl.rewards.counterfactual,
              recorded on the trajectory so score_trajectory agrees); metrics["answer_correct"]
              and metrics["grounded"] keep the score without and with that rule;
  ruler       ART's RULER judge score, clamped to [0, 1] (only when judge_model is set);
  efficiency  a bonus in [0, 1] for few tool calls, only for a fully verified-correct answer
              (RULER's default rubric already ranks efficiency within a group);
  format      a penalty in [-1, 0] for malformed calls, tool errors and not completing;
  <custom>    your own functions, `RewardConfig(custom=[(name, fn, weight)])` with
              `fn(trajectory, scenario) -> float`; one that raises or returns a non-number
              scores 0.0, with the error in trajectory.logs and metrics["reward/<name>_error"].
The reward is sum(weight * value) over the components present; a weight of 0 logs a
component without rewarding it. `metrics["reward/used_<name>"]` is 1.0 when it counted and
`metrics["reward/judge_failed"]` is 1.0 when the judge was configured but gave no usable scores.
Run the doctests: `python -m doctest mcp_rl/rewards/score.py mcp_rl/rewards/verify.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import art
from art.rewards import ruler_score_group
from art.rewards.ruler import DEFAULT_RUBRIC

# Re-exported (`from mcp_rl.rewards.score import verify_answer`). Absolute, so that the doctest
# command above, which imports this file as a top-level module, still works.
from mcp_rl.rewards.counterfactual import Replayer, replay_lookups
from mcp_rl.rewards.evidence import evidence
from mcp_rl.fields import described as _f
from mcp_rl.rewards.verify import verify_answer

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- shaping
def efficiency_reward(tool_calls: int, *, free_calls: int = 2, max_calls: int = 10) -> float:
    """1.0 up to `free_calls` tool calls (complete_task counts), falling linearly to 0 at `max_calls`.

    >>> efficiency_reward(2), efficiency_reward(6), efficiency_reward(12)
    (1.0, 0.5, 0.0)
    """
    span = max(max_calls - free_calls, 1)
    return min(1.0, max(0.0, 1.0 - (tool_calls - free_calls) / span))


def format_reward(metrics: Mapping[str, Any], *, malformed_penalty: float = 0.25,
                  tool_error_penalty: float = 0.1, incomplete_penalty: float = 0.5) -> float:
    """A penalty in [-1, 0]: per malformed call, per tool error, and once for not calling
    complete_task (which covers running out of turns and fatal endings).

    >>> format_reward({"malformed_calls": 1, "tool_errors": 2, "completed": True})
    -0.45
    >>> format_reward({"completed": False}), format_reward({"completed": True})
    (-0.5, 0.0)
    """
    penalty = (malformed_penalty * metrics.get("malformed_calls", 0)
               + tool_error_penalty * metrics.get("tool_errors", 0)
               + (0.0 if metrics.get("completed", False) else incomplete_penalty))
    return 0.0 - round(min(1.0, penalty), 6)  # 0.0 - x: no -0.0 in logs


# ---------------------------------------------------------------- configuration


COMPONENTS = ("verified", "ruler", "efficiency", "format")


@dataclass
class RewardConfig:
    verified_weight: float = _f(1.0, "weight of verify_answer (0 = log only)")
    ruler_weight: float = _f(1.0, "weight of the RULER judge score (0 = log only; needs judge_model)")
    efficiency_weight: float = _f(0.1, "weight of the few-tool-calls bonus, paid only for verified-correct answers")
    format_weight: float = _f(0.2, "weight of the format penalty (malformed calls, tool errors, no complete_task)")
    rel_tol: float = _f(1e-2, "relative tolerance for numeric answers")
    abs_tol: float = _f(1e-4, "absolute tolerance for numeric answers near zero")
    exact_integers: bool = _f(True, "plainly written answers must match the ground truth to the coarser stated "
                                        "digit ('149.0' is not 148; '41.3' is not 41.7), not just within rel_tol")
    require_evidence: bool = _f(True, "pay verified credit only when a successful tool result of the episode shows "
                                       "the expected value (the grounding rule, mcp_rl.rewards.evidence): a right guess earns "
                                       "nothing; False pays answer correctness alone")
    counterfactual: bool = _f(True, "where the caller passes counterfactual worlds (score_group's `counterfactual`, "
                                    "e.g. Environment.counterfactual(): the shipped SQLite environment has them), a "
                                    "lookup grounds a value only if replaying it on perturbed copies of the data moves "
                                    "the value (encoded echoes such as CAST(x'3432' AS INTEGER) do not); other "
                                    "servers are scored as without it; False turns the replay off")
    require_complete_task: bool = _f(True, "verify only answers given through complete_task (a prose reply scores 0: "
                                            "otherwise the last number of a guess can match a small answer)")
    success_threshold: float = _f(1.0, "verified score that counts as correct (gates the efficiency bonus)")
    efficiency_free_calls: int = _f(2, "tool calls that cost nothing (a lookup plus complete_task)")
    efficiency_max_calls: int = _f(10, "tool calls at which the efficiency bonus reaches 0")
    malformed_penalty: float = _f(0.25, "format penalty per malformed tool call")
    tool_error_penalty: float = _f(0.1, "format penalty per tool error")
    incomplete_penalty: float = _f(0.5, "format penalty for ending without complete_task")
    judge_model: str | None = _f(None, "litellm model string for RULER, e.g. 'openrouter/qwen/qwen3-32b' "
                                       "or 'openai/NAME' with judge_base_url; None = no RULER")
    judge_base_url: str | None = _f(None, "OpenAI-compatible base URL of the judge (litellm api_base)")
    judge_api_key: str | None = _f(None, "judge API key; None = litellm reads the provider's env variable")
    judge_retries: int = _f(2, "extra judge attempts after a failure (bad JSON, wrong count, timeout, error)")
    judge_backoff_s: float = _f(2.0, "wait before retry k is judge_backoff_s * 2**k seconds")
    judge_timeout_s: float = _f(120.0, "limit of one judge call, seconds")
    judge_params: dict = _f({}, "extra litellm parameters for the judge (temperature, max_tokens, ...)")
    rubric: str | None = _f(None, "RULER grading rubric; None = ART's DEFAULT_RUBRIC")
    on_judge_failure: str = _f("verified", "'verified': score a failed-judge group by its verified answer "
                                           "(skipped when it has none); 'skip': skip the group")
    audit_max_success: float = _f(0.02, "the reward audit (mcp_rl.rewards.reward_audit) refuses training when a cheating policy "
                                        "succeeds on more than this share of the audited scenarios; 1.0 turns it off")
    audit_scenarios: int | None = _f(None, "training scenarios the reward audit plays before training (None = the "
                                           "whole split, as the 2% cap is set per split; 0 = no audit)")
    custom: list = field(default_factory=list, metadata={"help": (
        "your reward functions: a list of (name, fn, weight), fn(trajectory, scenario) -> float, "
        "added as weight * value (0 = log only)")})

    def __post_init__(self) -> None:
        for name in COMPONENTS:
            w = getattr(self, f"{name}_weight")
            if not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise ValueError(f"{name}_weight must be a finite number >= 0 (0 logs without rewarding), got {w!r}")
        for name in ("rel_tol", "abs_tol", "malformed_penalty", "tool_error_penalty",
                     "incomplete_penalty", "judge_backoff_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.audit_max_success <= 1:
            raise ValueError(f"audit_max_success must be in [0, 1] (1.0 turns the audit off), got {self.audit_max_success!r}")
        if self.audit_scenarios is not None and (isinstance(self.audit_scenarios, bool)
                                                 or not isinstance(self.audit_scenarios, int) or self.audit_scenarios < 0):
            raise ValueError(f"audit_scenarios must be None (all) or an integer >= 0 (0 = no audit), "
                             f"got {self.audit_scenarios!r}")
        if not 0 < self.success_threshold <= 1:
            raise ValueError(f"success_threshold must be in (0, 1], got {self.success_threshold!r}")
        if not 0 <= self.efficiency_free_calls < self.efficiency_max_calls:
            raise ValueError("need 0 <= efficiency_free_calls < efficiency_max_calls, got "
                             f"{self.efficiency_free_calls} and {self.efficiency_max_calls}")
        if not isinstance(self.judge_retries, int) or self.judge_retries < 0:
            raise ValueError(f"judge_retries must be an integer >= 0, got {self.judge_retries!r}")
        if not self.judge_timeout_s > 0:
            raise ValueError(f"judge_timeout_s must be > 0 seconds, got {self.judge_timeout_s!r}")
        if self.judge_model is not None and (not isinstance(self.judge_model, str) or not self.judge_model.strip()):
            raise ValueError("judge_model must be a litellm model string such as 'openrouter/qwen/qwen3-32b', "
                             "or None to turn RULER off")
        if self.judge_base_url is not None and not str(self.judge_base_url).startswith(("http://", "https://")):
            raise ValueError(f"judge_base_url must start with http:// or https://, got {self.judge_base_url!r}")
        if self.rubric is not None and not str(self.rubric).strip():
            raise ValueError("rubric is empty; give grading standards or None for ART's default rubric")
        if not isinstance(self.judge_params, dict):
            raise ValueError(f"judge_params must be a dict of litellm parameters, got {type(self.judge_params).__name__}")
        if self.on_judge_failure not in ("verified", "skip"):
            raise ValueError(f"on_judge_failure must be 'verified' or 'skip', got {self.on_judge_failure!r}")
        if self.custom is not None and (callable(self.custom) or not isinstance(self.custom, (list, tuple))):
            raise ValueError("custom must be a list of (name, fn, weight) tuples, e.g. "
                             "custom=[('my_reward', my_fn, 1.0)]; got " + type(self.custom).__name__)
        self.custom = [check_custom(item, i) for i, item in enumerate(self.custom or [])]
        names = [name for name, _, _ in self.custom]
        if len(set(names)) != len(names):
            raise ValueError(f"custom reward names must be unique, got {names}")


def check_custom(item: Any, i: int) -> tuple[str, Any, float]:
    if not isinstance(item, (tuple, list)) or len(item) != 3:
        raise ValueError(f"custom[{i}] must be a (name, fn, weight) tuple, got {item!r}")
    name, fn, weight = item
    if not isinstance(name, str) or not name.isidentifier() or name in COMPONENTS:
        raise ValueError(f"custom[{i}]: name must be an identifier other than {', '.join(COMPONENTS)}; got {name!r}")
    if not callable(fn):
        raise ValueError(f"custom[{i}] ({name}): fn must be callable as fn(trajectory, scenario) -> float")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
        raise ValueError(f"custom[{i}] ({name}): weight must be a finite number >= 0 (0 logs only), got {weight!r}")
    return name, fn, float(weight)


def _custom_value(fn: Any, traj: art.Trajectory, scenario: Any, name: str) -> tuple[float, str | None]:
    """(value, error) of one user reward function; an error never escapes (a step must not crash)."""
    try:
        value = fn(traj, scenario)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"returned {value!r}; it must return a finite number")
        return float(value), None
    except Exception as e:  # noqa: BLE001 -- user code: any failure is logged and scored 0
        return 0.0, f"custom reward {name!r} failed: {type(e).__name__}: {e}"


# ---------------------------------------------------------------- RULER, hardened
def _litellm_params(cfg: RewardConfig) -> dict:
    # max_retries=0: the retry loop below owns retries, so they do not multiply with
    # the OpenAI client's own; caller's judge_params win over these defaults.
    params: dict = {"timeout": cfg.judge_timeout_s, "max_retries": 0}
    if cfg.judge_base_url:
        params["api_base"] = cfg.judge_base_url
    if cfg.judge_api_key:
        params["api_key"] = cfg.judge_api_key
    return {**params, **cfg.judge_params}


def _read_scores(judged: art.TrajectoryGroup | None, n: int) -> list[float]:
    # ruler_score_group matches scores to trajectories by position, checks the count
    # with a bare `assert` (gone under python -O, where zip() would silently drop
    # trajectories) and does not clamp: check everything here.
    trajs = judged.trajectories if judged is not None else []
    raw = [t.metrics.get("ruler_score") for t in trajs]
    if len(raw) != n or any(not isinstance(x, (int, float)) for x in raw):
        raise ValueError(f"judge returned {sum(x is not None for x in raw)} usable scores for {n} trajectories")
    if not all(math.isfinite(x) for x in raw):
        raise ValueError(f"judge returned a non-finite score: {raw}")
    return [float(x) for x in raw]


async def _judge(group: art.TrajectoryGroup, cfg: RewardConfig, sid: str) -> tuple[list[float] | None, str]:
    """RULER scores in [0, 1] for the group (explanations logged on each trajectory),
    or (None, reason) after 1 + judge_retries failed attempts. Never raises (but lets
    cancellation through)."""
    params, rubric = _litellm_params(cfg), cfg.rubric or DEFAULT_RUBRIC
    # A backstop for calls that ignore litellm's timeout (a stuck connect, a provider bug).
    limit = cfg.judge_timeout_s + max(1.0, 0.25 * cfg.judge_timeout_s)
    attempts, reason = 1 + cfg.judge_retries, ""
    for k in range(attempts):
        try:
            judged = await asyncio.wait_for(ruler_score_group(
                group, cfg.judge_model, params, rubric, swallow_exceptions=False), timeout=limit)
            scores = _read_scores(judged, len(group.trajectories))
        except Exception as e:  # noqa: BLE001 -- any judge failure is retried, then reported
            reason = ("judge returned the wrong number of scores" if isinstance(e, AssertionError)
                      else f"judge timed out after {limit:.0f} s" if isinstance(e, TimeoutError)
                      else f"{type(e).__name__}: {str(e).strip()[:300]}")
            log.warning("RULER attempt %d/%d for scenario %s failed: %s", k + 1, attempts, sid, reason)
            if k + 1 < attempts:
                await asyncio.sleep(cfg.judge_backoff_s * 2 ** k)
            continue
        if any(not 0 <= x <= 1 for x in scores):
            log.warning("RULER scores for scenario %s outside [0, 1] clamped: %s", sid, scores)
        for orig, new in zip(group.trajectories, judged.trajectories):
            for line in new.logs[len(orig.logs):]:
                orig.log(line)
        return [min(1.0, max(0.0, x)) for x in scores], ""
    return None, reason


# ---------------------------------------------------------------- composite
def _apply(traj: art.Trajectory, expected: Any, cfg: RewardConfig, sid: str, *, scenario: Any = None,
           ruler: float | None = None, judge_failed: bool | None = None) -> float:
    """Compute, log and sum the components of one trajectory; sets traj.reward."""
    m = traj.metrics
    values: dict[str, float] = {}
    weights = {name: float(getattr(cfg, f"{name}_weight")) for name in COMPONENTS}
    if expected is not None:
        answer = _answer(traj, cfg)
        opts = dict(question=str(getattr(scenario, "task", "") or ""), rel_tol=cfg.rel_tol, abs_tol=cfg.abs_tol,
                    exact_integers=cfg.exact_integers)
        try:
            correct = verify_answer(answer, expected, **opts)
            ev = evidence(traj, counterfactual=cfg.counterfactual)
            grounded = verify_answer(answer, expected, evidence=ev, **opts) if correct else 0.0
        except (TypeError, ValueError) as e:
            log.warning("scenario %s: cannot verify its answer (%s); verified reward left out", sid, e)
        else:
            # Logged both ways: the hack monitor counts correct answers the evidence rule refused.
            m["answer_correct"], m["grounded"] = correct, grounded
            values["verified"] = grounded if cfg.require_evidence else correct
    elif "env_reward" in m:  # the environment's own check of the outcome (Environment.score) stands for it
        values["verified"] = float(m["env_reward"])
        m["answer_correct"] = m["grounded"] = float(values["verified"] >= cfg.success_threshold)
    if ruler is not None:
        values["ruler"] = ruler
    elif judge_failed and "verified" in values:
        # The verified reward stands in for the judge, at the judge's weight too.
        weights["verified"] += weights["ruler"]
    correct = values.get("verified", 0.0) >= cfg.success_threshold
    values["efficiency"] = efficiency_reward(
        int(m.get("tool_calls", 0)), free_calls=cfg.efficiency_free_calls,
        max_calls=cfg.efficiency_max_calls) if correct else 0.0
    values["format"] = format_reward(m, malformed_penalty=cfg.malformed_penalty,
                                     tool_error_penalty=cfg.tool_error_penalty,
                                     incomplete_penalty=cfg.incomplete_penalty)
    total = 0.0
    for name in COMPONENTS:
        if name in values:
            m[f"reward/{name}"] = values[name]
            total += weights[name] * values[name]
        m[f"reward/used_{name}"] = float(name in values and weights[name] > 0)
    for name, fn, weight in cfg.custom:
        value, error = _custom_value(fn, traj, scenario, name)
        if error:
            log.warning("scenario %s: %s (scored 0)", sid, error)
            traj.log(error)
        m[f"reward/{name}"], m[f"reward/used_{name}"] = value, float(weight > 0)
        m[f"reward/{name}_error"] = float(error is not None)
        total += weight * value
    if judge_failed is not None:
        m["reward/judge_failed"] = float(judge_failed)
    traj.reward = round(total, 6)
    return traj.reward


def score_trajectory(traj: art.Trajectory, scenario: Any, cfg: RewardConfig | None = None) -> float:
    """Verified + shaping reward of one trajectory, no judge (the evaluation path).
    Sets and returns traj.reward; with no scenario answer only shaping counts
    (metrics["reward/used_verified"] is 0.0)."""
    cfg = cfg or RewardConfig()
    return _apply(traj, getattr(scenario, "answer", None), cfg, str(getattr(scenario, "id", "?")), scenario=scenario)


def _answer(traj: art.Trajectory, cfg: RewardConfig) -> Any:
    return traj.metadata.get("answer") if traj.metrics.get("completed") or not cfg.require_complete_task else None


async def replay_group(trajs: list[art.Trajectory], expected: Any, scenario: Any, cfg: RewardConfig,
                  worlds: Replayer, sid: str) -> None:
    """Replay, on the counterfactual worlds, the lookups that would ground a (partly) right answer; the
    outcome goes on each trajectory (metadata["counterfactual"]) for `_apply` and any later re-scoring."""
    question = str(getattr(scenario, "task", "") or "")
    opts = dict(rel_tol=cfg.rel_tol, abs_tol=cfg.abs_tol, exact_integers=cfg.exact_integers)
    cache: dict = {}  # a group's episodes often send the same query
    todo: list[art.Trajectory] = []
    try:
        todo = [t for t in trajs if verify_answer(_answer(t, cfg), expected, question=question, **opts) > 0]
        if not todo:
            return
        async with (worlds if hasattr(worlds, "__aenter__") else contextlib.nullcontext(worlds)):
            for t in todo:
                t.metrics["counterfactual_replays"] = await replay_lookups(t, expected, question, worlds, opts, cache)
    except Exception as e:  # noqa: BLE001 -- a broken replay must not stop the step: the cheap rule stands
        log.warning("scenario %s: counterfactual replay failed (%s: %s); scored by the echo checks alone",
                    sid, type(e).__name__, str(e)[:200])
        for t in todo:
            t.metadata.pop("counterfactual", None)
            t.metrics["counterfactual_failed"] = 1.0


async def score_group(group: art.TrajectoryGroup, scenario: Any, cfg: RewardConfig | None = None, *,
                      counterfactual: Replayer | None = None) -> art.TrajectoryGroup | None:
    """Set every trajectory's reward and reward/<component> metrics; return the same group.

    `scenario` needs `.answer` (None when unverifiable) and `.id`. Returns None, with the
    reason logged, when nothing can score the group: no trajectories; the judge failed
    with on_judge_failure="skip"; or neither a verified answer nor a judge score is there
    to reward. Never raises for judge trouble. `counterfactual` (worlds with `async replay(tool, args)`,
    mcp_rl.rewards.counterfactual) replays the lookups behind right answers first, when cfg.counterfactual. RULER runs on ART's copies of the
    trajectories; only its scores and explanations are taken back, so rollout metrics,
    metadata and the group's exceptions stay as they were.
    """
    cfg = cfg or RewardConfig()
    sid = str(getattr(scenario, "id", "?"))
    expected = getattr(scenario, "answer", None)
    if not group.trajectories:
        log.warning("skipping group for scenario %s: it has no trajectories (all rollouts raised?)", sid)
        return None
    scores, judge_failed = None, None
    if cfg.judge_model:
        scores, reason = await _judge(group, cfg, sid)
        judge_failed = scores is None
        if judge_failed and cfg.ruler_weight > 0:
            if cfg.on_judge_failure == "skip":
                log.warning("skipping group for scenario %s: judge failed (%s); on_judge_failure='skip'", sid, reason)
                return None
            if not any("env_reward" in t.metrics for t in group.trajectories) and expected is None:
                log.warning("skipping group for scenario %s: judge failed (%s) and the scenario has no "
                            "verified answer to fall back on", sid, reason)
                return None
            log.warning("scenario %s: judge failed (%s); scoring by the verified answer", sid, reason)
    checked = expected is not None or any("env_reward" in t.metrics for t in group.trajectories)
    rewardable = (checked and cfg.verified_weight + (cfg.ruler_weight if judge_failed else 0) > 0
                  ) or (scores is not None and cfg.ruler_weight > 0) or any(w > 0 for _, _, w in cfg.custom)
    if not rewardable:
        log.warning("skipping group for scenario %s: no verified answer and no judge score or custom reward "
                    "to reward (set judge_model or a custom reward for unverifiable scenarios)", sid)
        return None
    if cfg.counterfactual and counterfactual is not None and expected is not None:
        await replay_group(group.trajectories, expected, scenario, cfg, counterfactual, sid)
    for i, traj in enumerate(group.trajectories):
        _apply(traj, expected, cfg, sid, scenario=scenario, ruler=None if scores is None else scores[i],
               judge_failed=judge_failed)
    return group
