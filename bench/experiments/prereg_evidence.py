"""The evidence behind bench/experiments/learning/PREREGISTRATION.md, from the committed v1 learning runs.

Per run of bench/results/learning/*-seed<k>/: GRPO steps and seconds per step, the rollouts' share of a step,
groups skipped for zero reward variance, training-rollout success, peak GPU memory; the held-out curve in
grounded success (every row re-scored under the fixed reward, bench/experiments/rescore.py); and the most
frequent held-out answer of each evaluated policy (constants and kitchen sinks are what the old reward paid).

    .venv/bin/python bench/experiments/prereg_evidence.py > bench/results/prereg_evidence.txt
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

from rescore import grounded, read_rows  # noqa: E402

RUNS = ROOT / "bench" / "results" / "learning"


def steps_line(run: Path) -> str:
    hist = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    cfg, steps = json.loads((run / "config.json").read_text()), [h for h in hist if "reward_mean" in h]
    t, sec = cfg["train"], [h["seconds"] for h in steps]
    groups = len(steps) * t["groups_per_step"]
    skipped = sum(h.get("groups_skipped", 0) for h in steps)
    succ = [h["success_rate"] for h in steps]
    peak = json.loads((run / "proof.json").read_text())["timings"]
    peak = peak.get("peak_gpu_gib") or max(c.get("peak_gpu_gib", 0) for c in peak.get("calls", []))
    return (f"lr {t['learning_rate']:g}, {t['groups_per_step']} x {t['group_size']}, T {cfg['rollout']['temperature']}; "
            f"{len(steps)} steps in {sum(sec):.0f} s, {sum(sec) / len(sec):.1f} s a step ({min(sec):.0f}-{max(sec):.0f}), "
            f"rollouts {sum(h['rollout_seconds'] for h in steps) / sum(sec):.0%}; zero-variance groups {skipped}/{groups} "
            f"({skipped / groups:.0%}); training success {min(succ):.0%}-{max(succ):.0%}; peak {peak:.1f} GiB")


def label_order(label: str) -> int:
    fixed = {"base": -2, "warm_start": -1, "trained": 10**6}
    return fixed[label] if label in fixed else int(label.removeprefix("test_step"))


def curve_and_answers(run: Path) -> list[str]:
    rows = {p.name[5:].split(".")[0]: read_rows(p) for p in run.glob("eval_*.jsonl.gz")}
    periodic = [k for k in rows if k.startswith("test_step")]
    ids = {r["scenario_id"] for r in rows[periodic[0]]} if periodic else {r["scenario_id"] for r in rows["warm_start"][:64]}
    curve, answers = [], []
    for label in sorted(rows, key=label_order):
        if label == "base":
            continue
        same = [r for r in rows[label] if r["scenario_id"] in ids]
        ok = sum(grounded(r)[1] >= 0.999 for r in same)
        curve.append(f"{label.removeprefix('test_')} {ok / len(same):.1%}")
        top, n = collections.Counter(str(r.get("answer"))[:30] for r in rows[label]).most_common(1)[0]
        sinks = sum("Engineering" in str(r.get("answer")) and "Finance" in str(r.get("answer")) for r in rows[label])
        answers.append(f"{label.removeprefix('test_')} {top!r} {n}/{len(rows[label])}" + (f", {sinks} kitchen sinks" if sinks else ""))
    return [f"  held-out curve, grounded, the same {len(ids)} scenarios: " + " -> ".join(curve),
            "  most frequent answer: " + "; ".join(answers)]


def main() -> None:
    for run in sorted(p for p in RUNS.iterdir() if (p / "proof.json").is_file()):
        print(f"{run.name}: {steps_line(run)}")
        print("\n".join(curve_and_answers(run)))


if __name__ == "__main__":
    main()
