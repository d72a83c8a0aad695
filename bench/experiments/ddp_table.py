"""Issue [multi-gpu]'s table: learning-proof runs on 1 and on N data-parallel ranks, side by side.

Each RUN is a run folder (or its copied results) of `bench/experiments/learning_proof.py`, the first the baseline.
Per run: ranks, groups per step, GRPO steps, mean step seconds (from step 2 on: step 1 warms the CUDA
graphs), steps per minute and the speedup over the first run, the peak GPU memory of each rank (the
trainer's per-step peaks, `train.gpu_peaks`), whether the ranks' LoRA weights were bitwise identical
after every step (`distributed.check_same`), and the trained policy's held-out success.

    # on two GPUs: the same config and seed, 1 rank then 2 (bench/RESULTS.md has the device commands)
    python3 bench/experiments/learning_proof.py --config bench/experiments/learning/smollm2.yaml --seed 0 --out /tmp/r1 ...
    torchrun --nproc-per-node 2 bench/experiments/learning_proof.py --config bench/experiments/learning/smollm2.yaml --seed 0 --out /tmp/r2 ...
    python3 bench/experiments/ddp_table.py /tmp/r1 /tmp/r2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def row(run: Path) -> dict:
    """One run's numbers; raises ValueError naming the run whose files are missing, unreadable or malformed."""
    try:
        return _row(run)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{run}: not a finished learning-proof run folder ({type(e).__name__}: {str(e)[:120]})") from e


def _row(run: Path) -> dict:
    steps = [h for h in _lines(run / "metrics.jsonl") if "reward_mean" in h]
    cfg = json.loads((run / "config.json").read_text())
    calls = sorted(run.glob("timings-call*.json"))
    ranks = json.loads(calls[0].read_text()).get("ranks", 1) if calls else 1
    proof = json.loads((run / "proof.json").read_text()) if (run / "proof.json").exists() else None
    timed = [h["seconds"] for h in steps[1:]] or [h["seconds"] for h in steps]
    mean = statistics.mean(timed) if timed else float("nan")
    peaks: list[float] = []
    for h in steps:  # a 1-process run logs its own two phase peaks; N ranks log each rank's largest
        own = [h[k] for k in ("gpu_peak_gib_before_update", "gpu_peak_gib_update") if k in h]
        per_rank = h.get("gpu_peak_gib_by_rank") or [max(own, default=0.0)]
        peaks = [max(a, b) for a, b in zip(peaks, per_rank)] if peaks else list(per_rank)
    return {"run": run.name, "ranks": ranks, "groups": cfg.get("train", {}).get("groups_per_step"), "steps": len(steps),
            "mean_step_s": mean, "steps_per_min": 60.0 / mean if mean == mean and mean > 0 else float("nan"),
            "peak_gib": peaks if any(peaks) else [],
            "identical": None if ranks == 1 else all(h.get("rank_lora_identical") is True for h in steps),
            "trained": proof["comparisons"]["base"]["final"] if proof is not None else None}


def table(rows: list[dict]) -> str:
    out = ["| run | ranks | groups / step | GRPO steps | mean step s (from step 2) | steps / min | speedup | "
           "peak GiB per GPU | LoRA identical after every step | trained held-out success |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = r["steps_per_min"] / rows[0]["steps_per_min"]
        identical = "-" if r["identical"] is None else ("yes" if r["identical"] else "**no**")
        trained = "-" if r["trained"] is None else f"{100 * r['trained']:.1f}%"
        out.append(f"| {r['run']} | {r['ranks']} | {r['groups']} | {r['steps']} | {r['mean_step_s']:.1f} | "
                   f"{r['steps_per_min']:.2f} | {speedup:.2f}x | "
                   f"{' / '.join(f'{p:.1f}' for p in r['peak_gib']) or 'n/a (no GPU)'} | {identical} | {trained} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders; the first is the baseline")
    ap.add_argument("--json", action="store_true", help="the rows as JSON instead of the table")
    args = ap.parse_args(argv)
    try:
        rows = [row(r) for r in args.runs]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
