"""Held-out evaluation and the run report.

    result, groups = await evaluate(policy, server, test_scenarios, label="base")
    write_report(run_dir, [base, trained], history)
    print(compare_transcripts(run_dir, "base", "trained"))  # Markdown, side by side

The same scenarios are used for every model compared. A scenario counts as a
success when its verified reward is full credit; the standard error is that of
a proportion, sqrt(p(1-p)/n). With `k > 1` rollouts per scenario, pass@k is the
unbiased estimator of Chen et al. (2021). Each saved row keeps its episode's
task and (clipped) transcript, so the report's side-by-side comparison can be
rebuilt from the run folder alone.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

import art

from mcp_rl.mcp.audit import TOOL_CALLS, read_tool_calls, tool_call_table
from mcp_rl.rewards.evidence import lookups
from mcp_rl.rewards.score import RewardConfig, replay_group, score_trajectory
from mcp_rl.rollout import RolloutConfig, gather_rollouts, transcript

SUCCESS = 0.999  # verified score counted as a success (full credit)
TRANSCRIPT_CHARS = 4000  # per saved row: enough to read an episode, small enough for a 1,000-row eval file


@dataclass
class EvalResult:
    label: str
    n: int
    success_rate: float
    success_se: float
    mean_reward: float
    completed_rate: float
    mean_turns: float
    mean_tool_errors: float
    fatal_rate: float
    pass_at_k: float | None = None  # some of k rollouts succeed (the unbiased estimator over n >= k)
    k: int = 1
    pass_hat_k: float | None = None  # all k succeed: τ²-bench's pass^k, its consistency measure
    rows: list[dict] = field(default_factory=list, repr=False)
    # Correct AND shown by a successful tool result of the episode (mcp_rl.rewards.evidence): what the reward pays.
    grounded_rate: float = 0.0
    grounded_se: float = 0.0

    def line(self) -> str:
        return (f"{self.label}: grounded success {self.grounded_rate:.1%} ± {self.grounded_se:.1%} "
                f"| correct answers {self.success_rate:.1%} (n={self.n}) "
                f"| reward {self.mean_reward:.3f} | completed {self.completed_rate:.0%} "
                f"| turns {self.mean_turns:.1f} | tool errors {self.mean_tool_errors:.2f}"
                + (f" | pass@{self.k} {self.pass_at_k:.1%} | pass^{self.k} {self.pass_hat_k:.1%}"
                   if self.pass_at_k is not None and self.pass_hat_k is not None else ""))


def _pass_at_k(n: int, c: int, k: int) -> float:
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _pass_hat_k(n: int, c: int, k: int) -> float:
    """τ²-bench's pass^k for one task with c successes in n >= k rollouts: the chance that k of them drawn
    without replacement all succeed, C(c, k) / C(n, k) (its paper's estimator).

    >>> _pass_hat_k(4, 4, 4), _pass_hat_k(4, 3, 4), _pass_hat_k(4, 3, 2)
    (1.0, 0.0, 0.5)
    """
    return math.comb(c, k) / math.comb(n, k)


def clip(text: str, limit: int = TRANSCRIPT_CHARS) -> str:
    """Cut the middle out of a long text, keeping its start (the task) and its end (the answer).

    >>> clip("a" * 30 + "b" * 30, limit=40)
    'aaaaaa\\n[... 49 characters cut ...]\\nbbbbb'
    >>> clip("short")
    'short'
    """
    if len(text) <= limit:
        return text
    marker = lambda cut: f"\n[... {cut} characters cut ...]\n"  # noqa: E731
    keep = max(limit - len(marker(len(text))), 2)
    head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2:]
    return head + marker(len(text) - len(head) - len(tail)) + tail


def rows_from_groups(groups: list[art.TrajectoryGroup], scenarios, reward_cfg: RewardConfig) -> list[dict]:
    """One row per trajectory: what the summary is computed from (and saved beside it)."""
    rows = []
    for group, scenario in zip(groups, scenarios):
        for traj in group.trajectories:
            score_trajectory(traj, scenario, reward_cfg)
            rows.append({
                "scenario_id": scenario.id,
                "task": scenario.task,
                "expected": scenario.answer,
                "answer": traj.metadata.get("answer"),
                # answer correctness alone, and correct with evidence (what the reward pays by default)
                "verified": float(traj.metrics.get("answer_correct", traj.metrics.get("reward/verified", 0.0))),
                "grounded": float(traj.metrics.get("grounded", 0.0)),
                "lookups": len(lookups(traj)),
                "reward": float(traj.reward),
                "completed": bool(traj.metrics.get("completed")),
                "turns": int(traj.metrics.get("turns", 0)),
                "tool_errors": int(traj.metrics.get("tool_errors", 0)),
                "fatal": bool(traj.metrics.get("fatal")),
                "policy": traj.metadata.get("policy"),
                "policy_step": traj.metadata.get("policy_step"),
                "transcript": clip(transcript(traj)),
            })
    return rows


def summarize(rows: list[dict], label: str) -> EvalResult:
    """Aggregate per-trajectory rows; the first rollout of each scenario gives success@1."""
    if not rows:
        raise ValueError(f"no evaluation rows for {label!r}: were any scenarios evaluated?")
    by_id: dict[str, list[dict]] = {}
    for r in rows:
        by_id.setdefault(r["scenario_id"], []).append(r)
    firsts = [rs[0] for rs in by_id.values()]
    n = len(firsts)
    p = sum(r["verified"] >= SUCCESS for r in firsts) / n
    # Rows saved before the grounding rule have no "grounded": they count as ungrounded (bench/experiments/rescore.py
    # rebuilds it from their transcripts).
    g = sum(float(r.get("grounded", 0.0)) >= SUCCESS for r in firsts) / n
    k = min(len(rs) for rs in by_id.values())
    pass_k = pass_hat = None
    if k > 1:
        wins = [(len(rs), sum(r["verified"] >= SUCCESS for r in rs)) for rs in by_id.values()]
        pass_k = sum(_pass_at_k(m, c, k) for m, c in wins) / n
        pass_hat = sum(_pass_hat_k(m, c, k) for m, c in wins) / n
    mean = lambda key: sum(float(r[key]) for r in rows) / len(rows)  # noqa: E731
    return EvalResult(
        label=label, n=n, success_rate=p, success_se=math.sqrt(p * (1 - p) / n),
        mean_reward=mean("reward"), completed_rate=mean("completed"), mean_turns=mean("turns"),
        mean_tool_errors=mean("tool_errors"), fatal_rate=mean("fatal"), pass_at_k=pass_k, k=k, pass_hat_k=pass_hat, rows=rows,
        grounded_rate=g, grounded_se=math.sqrt(g * (1 - g) / n),
    )


async def evaluate(policy, server, scenarios, *, label: str, rollout_cfg: RolloutConfig | None = None,
                   reward_cfg: RewardConfig | None = None, k: int = 1,
                   counterfactual=None) -> tuple[EvalResult, list[art.TrajectoryGroup]]:
    """Roll out every scenario `k` times and score with the verifiable reward.

    `counterfactual` (worlds, Environment.counterfactual()): right answers' lookups are replayed on
    them first, as training's score_group does, so "grounded" means the same in both."""
    scored = getattr(server, "score", None) is not None  # an environment that checks its own tasks
    if not scored and any(s.answer is None for s in scenarios):
        raise ValueError("evaluation needs scenarios with verified answers (scenario.answer set), or an environment "
                         "that scores its own tasks (Environment.score)")
    reward_cfg = reward_cfg or RewardConfig()
    groups = await gather_rollouts(policy, server, scenarios, rollout_cfg, group_size=k, desc=f"eval {label}")
    if counterfactual is not None and reward_cfg.counterfactual:
        async with (counterfactual if hasattr(counterfactual, "__aenter__") else contextlib.nullcontext()):
            for group, s in ((g, s) for g, s in zip(groups, scenarios) if s.answer is not None):
                await replay_group(group.trajectories, s.answer, s, reward_cfg, counterfactual, s.id)
    return summarize(rows_from_groups(groups, scenarios, reward_cfg), label), groups


def write_json_atomic(path: Path, data) -> None:
    """Write-then-rename, so a killed process never leaves a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            if path.suffix == ".jsonl":
                f.writelines(json.dumps(row, default=str) + "\n" for row in data)
            else:
                json.dump(data, f, indent=2, default=str)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a crash must not leave an empty state.json in place
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_eval(run_dir: Path, result: EvalResult) -> None:
    write_json_atomic(Path(run_dir) / f"eval_{result.label}.jsonl", result.rows)


def _load_rows(run_dir: Path, label: str) -> list[dict]:
    path = Path(run_dir) / f"eval_{label}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_eval(run_dir: Path, label: str) -> EvalResult:
    return summarize(_load_rows(run_dir, label), label)


def _firsts(rows: list[dict]) -> dict[str, dict]:
    """The first row of each scenario, in file order: the rollout that success@1 counts."""
    firsts: dict[str, dict] = {}
    for r in rows:
        firsts.setdefault(r["scenario_id"], r)
    return firsts


def _solved(row: dict) -> bool:
    """Solved with evidence where the row records it (so a lucky guess is never shown as a win)."""
    return float(row.get("grounded", row.get("verified", 0.0))) >= SUCCESS


def pick_scenarios(before_rows: list[dict], after_rows: list[dict], n: int = 2) -> list[str]:
    """Ids of `n` scenarios in both evals, most informative first: failed -> solved, then
    solved -> failed, then the largest change in reward; ties keep the order of `before_rows`."""
    a, b = _firsts(before_rows), _firsts(after_rows)

    def key(item):
        i, sid = item
        x, y = a[sid], b[sid]
        rank = 0 if _solved(y) > _solved(x) else 1 if _solved(x) > _solved(y) else 2
        return rank, -abs(float(y.get("reward", 0)) - float(x.get("reward", 0))), i

    return [sid for _, sid in sorted(enumerate(s for s in a if s in b), key=key)[:n]]


WRAP = 60  # columns per side: two of them fit a GitHub page without a scroll bar
_NUMBERS = dict(enumerate("one two three four five six seven eight nine".split(), 1))
_CHANGE = {(False, True): "failed → solved", (True, False): "solved → failed", (True, True): "solved by both",
           (False, False): "failed by both"}


def _pre(row: dict) -> str:
    # Hard-wrapped here because GitHub strips style="white-space: pre-wrap". A blank line would end
    # the Markdown HTML block (CommonMark, type 6) in mid-table, so blank lines become &nbsp;.
    text = row.get("transcript") or "(no transcript saved: this eval predates transcripts in eval rows)"
    lines = [w for line in text.splitlines() for w in textwrap.wrap(line, WRAP, break_on_hyphens=False) or [""]]
    return "<pre>" + "\n".join(html.escape(w) if w.strip() else "&nbsp;" for w in lines) + "</pre>"


def _verdict(row: dict) -> str:
    turns, errors = int(row.get("turns", 0)), int(row.get("tool_errors", 0))
    answer = json.dumps(row.get("answer"), default=str, ensure_ascii=False)  # in full in the transcript below
    return (f"{'✓ solved' if _solved(row) else '✗ failed'} · reward {float(row.get('reward', 0)):.2f} · "
            f"{turns} turn{'s' * (turns != 1)} · {errors} tool error{'s' * (errors != 1)} · "
            f"answer {answer if len(answer) <= 80 else answer[:79] + '…'}" + (" · fatal" if row.get("fatal") else ""))


def _compare(before_rows: list[dict], after_rows: list[dict], before: str, after: str, n: int) -> str:
    # Side by side as a two-column HTML table of <pre> blocks: the one layout that GitHub and
    # Jupyter both render, and the eye finds the first turn where the two runs part ways.
    if n < 1:
        raise ValueError(f"n must be >= 1 scenarios to compare, got {n}")
    chosen = pick_scenarios(before_rows, after_rows, n)
    if not chosen:
        return ""
    a, b = _firsts(before_rows), _firsts(after_rows)
    common = [s for s in a if s in b]
    up = sum(_solved(b[s]) > _solved(a[s]) for s in common)
    down = sum(_solved(a[s]) > _solved(b[s]) for s in common)
    e = html.escape
    lines = [f"## What changed: {_NUMBERS.get(len(chosen), len(chosen))} held-out scenario{'s' * (len(chosen) > 1)}", "",
             f"{e(before)} → {e(after)}: {up} of {len(common)} scenarios went failed → solved, {down} solved → failed. "
             + ("Shown first: scenarios whose outcome changed (first rollout of each, as in success@1)." if up + down
                else "No outcome changed; shown: the first rollout of each (as in success@1).")]
    for i, sid in enumerate(chosen, 1):
        x, y = a[sid], b[sid]
        task = " ".join(str(x.get("task") or y.get("task") or "(task not saved)").split())
        expected = json.dumps(x.get("expected", y.get("expected")), default=str, ensure_ascii=False)
        lines += ["", f"### {i}. {e(sid)}: {_CHANGE[_solved(x), _solved(y)]}", "", "<table>",
                  f'<tr><td colspan="2"><b>Task:</b> {e(task)}<br><b>Expected answer:</b> {e(expected)}</td></tr>',
                  f"<tr><th>{e(before)}</th><th>{e(after)}</th></tr>",
                  f"<tr><td>{e(_verdict(x))}</td><td>{e(_verdict(y))}</td></tr>",
                  f'<tr><td valign="top">{_pre(x)}</td><td valign="top">{_pre(y)}</td></tr>', "</table>"]
    return "\n".join(lines) + "\n"


def compare_transcripts(run_dir: str | Path, before: str = "base", after: str = "trained", n: int = 2) -> str:
    """Markdown: `n` scenarios of two saved evals side by side (task, expected answer, each side's
    verdict and transcript), outcomes that changed first. "" if either eval file is missing."""
    if not all((Path(run_dir) / f"eval_{label}.jsonl").exists() for label in (before, after)):
        return ""
    return _compare(_load_rows(Path(run_dir), before), _load_rows(Path(run_dir), after), before, after, n)


def _plots(run_dir: Path, results: list[EvalResult], history: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    steps = [h for h in history if "reward_mean" in h]
    if steps:
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.plot([h["step"] for h in steps], [h["reward_mean"] for h in steps], marker="o", label="reward")
        ax.plot([h["step"] for h in steps], [h.get("grounded_rate", 0) for h in steps], marker="s", label="grounded success")
        ax.set_xlabel("step"), ax.set_ylim(0, 1.05), ax.legend(), ax.set_title("training rollouts")
        fig.tight_layout(), fig.savefig(run_dir / "reward_curve.png", dpi=110), plt.close(fig)
        names.append("reward_curve.png")
    if results:
        fig, ax = plt.subplots(figsize=(5, 3))
        xs = range(len(results))
        ax.bar(xs, [r.grounded_rate for r in results], yerr=[r.grounded_se for r in results], capsize=4)
        ax.set_xticks(list(xs), [r.label for r in results]), ax.set_ylim(0, 1.05)
        ax.set_ylabel("grounded success"), ax.set_title(f"held-out scenarios (n={results[0].n})")
        fig.tight_layout(), fig.savefig(run_dir / "eval_bars.png", dpi=110), plt.close(fig)
        names.append("eval_bars.png")
    return names


def _warm_start_lines(history: list[dict]) -> list[str]:
    """The warm start's row and, with a quality gate, each of its checks (pipeline.warm_start_gate)."""
    ws = next((h for h in history if h.get("phase") == "warm_start"), None)
    if ws is None:
        return []
    lines = ["", "## Warm start", "", f"{ws.get('demonstrations', 0)} demonstrations, {ws.get('epochs', 0):g} epoch(s), "
             f"nll {ws.get('nll_last_epoch', float('nan')):.3f}."]
    if ws.get("gate"):
        lines += ["", "| quality gate after epoch | tool errors / episode | completed | verified success | passed |",
                  "|---|---|---|---|---|"]
        lines += [f"| {c['epochs']} | {c['tool_errors']:.2f} | {c['completed_rate']:.0%} | {c['success_rate']:.1%} "
                  f"| {'yes' if c['passed'] else 'no'} |" for c in ws["gate"]]
    return lines


def write_report(run_dir: str | Path, results: list[EvalResult], history: list[dict], title: str = "mcp-rl run") -> Path:
    """report.md (+ PNG plots) in the run folder; numbers come from the saved rows. With a `base`
    result and another one (`trained`, else the last), two held-out transcripts side by side;
    with a tool-call log in the folder, calls per tool."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", "## Held-out evaluation (same scenarios for every model)", "",
             "Grounded success: the answer is right and a successful tool result of the episode showed it "
             "(what the reward pays); correct answers: right, however it was found.", "",
             "| model | n | grounded success | ± s.e. | correct answers | mean reward | completed | turns | tool errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.label} | {r.n} | {r.grounded_rate:.1%} | {r.grounded_se:.1%} | {r.success_rate:.1%} "
                     f"| {r.mean_reward:.3f} | {r.completed_rate:.0%} | {r.mean_turns:.1f} | {r.mean_tool_errors:.2f} |")
    lines += _warm_start_lines(history)
    if history:
        # off-policy gap: mean |trainer - sampler| logprob of the trained tokens before the update (0 when on-policy)
        lines += ["", "## Training steps", "", "Hack monitor: correct answers without any lookup, correct answers the "
                  "evidence rule refused, words per answer, answers copied from a tool result; a flag marks a "
                  "sudden rise (mcp_rl.rewards.evidence.monitor).", "",
                  "| step | reward | grounded success | correct answers | no lookup | refused | words | copied | "
                  "groups trained | skipped | loss | off-policy gap | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for h in history:
            if "reward_mean" in h:
                lines.append(f"| {h['step']} | {h['reward_mean']:.3f} | {h.get('grounded_rate', 0):.1%} | "
                             f"{h.get('success_rate', 0):.1%} | {h.get('hack/success_without_lookup', 0):.0%} | "
                             f"{h.get('hack/rejected_by_evidence', 0):.0%} | {h.get('hack/answer_words', 0):.1f} | "
                             f"{h.get('hack/copied', 0):.0%}{' ⚑ ' + ', '.join(h['hack_flags']) if h.get('hack_flags') else ''} | "
                             f"{h.get('groups_trained', 0)} | {h.get('groups_skipped', 0)} | {h.get('loss', float('nan')):.4f} | "
                             f"{h.get('logprob_gap', float('nan')):.3f} | {h.get('seconds', 0):.0f} |")
    if calls := read_tool_calls(run_dir / TOOL_CALLS):
        phases = len({c.get("phase") for c in calls})
        lines += ["", "## Tool calls", "", f"{len(calls)} calls to the server in {phases} phase{'s' * (phases != 1)} "
                  f"(evaluations, demonstrations, training steps), from [`{TOOL_CALLS}`]({TOOL_CALLS}).", "",
                  tool_call_table(calls)]
    try:
        lines += ["", *[f"![{n}]({n})" for n in _plots(run_dir, results, history)]]
    except ImportError:
        lines += ["", "(matplotlib is not installed: no plots)"]
    # From the results' rows (the saved ones after a reload), so the comparison matches the table above.
    by_label = {r.label: r for r in results}
    after = "trained" if "trained" in by_label else next((x for x in reversed(by_label) if x != "base"), None)
    if "base" in by_label and after and (section := _compare(by_label["base"].rows, by_label[after].rows, "base", after, 2)):
        lines += ["", section.rstrip()]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    write_json_atomic(run_dir / "summary.json", [{k: v for k, v in asdict(r).items() if k != "rows"} for r in results])
    return path
