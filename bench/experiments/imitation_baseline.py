"""Issue 40's imitation baseline for bench/experiments/learning_proof.py: the comparison RL must win.

For one seed, the GRPO run's own warm start continued with supervised training on the demonstrations of
the whole training split (not only its `train.warm_start_scenarios`), epoch after epoch, for the GRPO
phase's budget of seconds, then evaluated on the same held-out scenarios under the label "imitation".

    python bench/experiments/learning_proof.py --config C --seed K ...                        # the GRPO run: R
    python bench/experiments/learning_proof.py --config C --seed K ... --baseline imitation   # in R-imitation

The same warm start, not a second one like it: when the GRPO run in R has committed its warm start (and
evaluated it), its `ForkImitation` callback copies the folder as it stands then (config, state, the base
and warm-start evaluations, the step-0 checkpoint) to `R-imitation`, a run folder at its warm start that
the imitation mode resumes. Without a fork and with no R at all, the imitation mode warms up itself
(same config and seed; proof.json says `"warm_start_source": "own"`); with an R that has not reached its
warm start yet it refuses, rather than start from a second warm start. `Run.imitate` spends the budget
(mcp_rl/runs/imitation.py); `--deadline-s ... --pause` and `--resume` span device calls as for GRPO.

proof.json / proof.md compare imitation with base and warm start and, once R's final evaluation exists
(its folder or its results folder, `--rl-run`), RL-trained with imitation: the paired s.e. on the same
scenarios, wins and losses. Re-running the finished imitation run rewrites them from the saved rows.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from mcp_rl.scale import distributed
from mcp_rl.runs.callbacks import STARTED, TrainerCallback

FORK_FILES = ("config.json", "state.json", "metrics.jsonl", "eval_base.jsonl", "eval_warm_start.jsonl",
              "reward_audit.md")
TARGET_RL_OVER_IMITATION = 0.03  # issue 40: RL beats the equal-time imitation baseline by >= 3 points


def fork_dir(rl_dir: Path) -> Path:
    return rl_dir.with_name(rl_dir.name + "-imitation")


class ForkImitation(TrainerCallback):
    """On a GRPO run's first `on_train_begin` at step 0 (its warm start committed and evaluated), copy the
    run folder as it stands to `dest`: the imitation baseline's run, at the very same warm start."""

    def __init__(self, dest: Path):
        self.dest = Path(dest)

    async def on_train_begin(self, run) -> None:
        if run.step != 0 or self.dest.exists() or not distributed.is_main():
            return
        ckpt = run.dir / "checkpoints" / "step-0000"
        if not ckpt.is_dir():
            return
        tmp = self.dest.with_name(self.dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in FORK_FILES:
            if (run.dir / name).exists():
                shutil.copy2(run.dir / name, tmp / name)
        shutil.copytree(ckpt, tmp / "checkpoints" / "step-0000")
        (tmp / "forked_from.json").write_text(json.dumps({"run": str(run.dir), "step": 0}) + "\n")
        tmp.rename(self.dest)  # whole or not at all: a half-copied fork would be resumed as a run
        print(f"imitation baseline: the warm start forked to {self.dest}", flush=True)


def read_rows(run_dir: Path, label: str) -> list[dict] | None:
    """eval_<label>.jsonl of a run folder, or its gzipped copy in a results folder; None if neither."""
    for path, opener in ((run_dir / f"eval_{label}.jsonl", open), (run_dir / f"eval_{label}.jsonl.gz", gzip.open)):
        if path.exists():
            with opener(path, "rt") as f:
                return [json.loads(x) for x in f if x.strip()]
    return None


def imitation_tables(run_dir: Path, rl_dirs: list[Path], timings: dict, history: list[dict], compare) -> dict:
    """proof.json's content for an imitation run: imitation vs base and warm start, and RL-trained vs
    imitation where a GRPO run's final evaluation is found in `rl_dirs` ("table" is proof.md); `compare`
    is learning_proof's (gap, unpaired and paired s.e., wins and losses on the same scenarios)."""
    rows = {k: r for k in ("base", "warm_start", "imitation") if (r := read_rows(run_dir, k)) is not None}
    rl = next((d for d in rl_dirs if read_rows(d, "trained") is not None), None)
    sft = [h for h in history if h.get("phase") == "imitation"]
    warm = next((h for h in history if h.get("phase") == "warm_start"), {})
    forked = run_dir / "forked_from.json"
    proof = {"baseline": "imitation", "timings": timings,
             "warm_start_source": json.loads(forked.read_text())["run"] if forked.exists() else "own",
             "warm_start": {k: v for k, v in warm.items() if k not in ("step", "phase")},
             "imitation": {"budget_s": sft[-1]["budget_s"], "sft_seconds": sft[-1]["seconds"],
                           "epochs": sft[-1]["epochs_done"], "demonstrations": sft[-1]["demonstrations"],
                           "updates": sum(h["updates"] for h in sft), "calls": len(sft),
                           "stopped": sft[-1]["stopped"], "nll_last": sft[-1]["nll_last"],
                           "longest_update_s": max(h["longest_update_s"] for h in sft)} if sft else {},
             "comparisons": {k: compare(rows["imitation"], rows[k], 0.0) for k in ("base", "warm_start")
                             if k in rows and "imitation" in rows}}
    if rl is not None and "imitation" in rows:
        proof["rl_run"] = str(rl)
        proof["rl_vs_imitation"] = compare(read_rows(rl, "trained"), rows["imitation"], TARGET_RL_OVER_IMITATION)
    lines = ["| policy vs | n | policy | other | gap | s.e. unpaired | s.e. paired | wins/losses |", "|---|---|---|---|---|---|---|---|"]
    named = [(f"imitation vs {k}", c) for k, c in proof["comparisons"].items()]
    named += [("RL-trained vs imitation", proof["rl_vs_imitation"])] if "rl_vs_imitation" in proof else []
    for name, c in named:
        lines.append(f"| {name} | {c['n']} | {c['final']:.1%} | {c['other']:.1%} | {c['gap'] * 100:+.1f} pts | "
                     f"{c['se_unpaired'] * 100:.1f} | {c['se_paired'] * 100:.1f} | {c['wins']}/{c['losses']} |")
    i = proof["imitation"]
    if i:
        lines += ["", f"Imitation: {i['updates']} supervised updates on {i['demonstrations']} demonstrations of the "
                  f"training split ({i['epochs']:.2f} epochs) in {i['sft_seconds']:.0f} of {i['budget_s']:.0f} s "
                  f"(stopped at the {i['stopped']}); warm start {warm.get('demonstrations', '?')} demonstrations, "
                  f"from {proof['warm_start_source']}"]
    if "rl_vs_imitation" in proof:
        c = proof["rl_vs_imitation"]
        lines += ["", f"RL over imitation (target >= {c['target_gap'] * 100:.0f} pts on the mean over seeds, "
                  f"> 2 s.e.): this seed {c['gap'] * 100:+.1f} pts, paired s.e. {c['se_paired'] * 100:.1f}"]
    else:
        lines += ["", "RL-trained: no final evaluation of the GRPO run found yet (" + ", ".join(map(str, rl_dirs))
                  + "); re-run this command once it has one"]
    proof["table"] = "\n".join(lines)
    return proof


def stop_at(deadline_s: float, pause: bool, evals: dict[str, float]) -> float | None:
    """When the imitation phase must stop (time.monotonic()): before `deadline_s` from the process start,
    leaving the final evaluation's time (as `Deadline` estimates it) unless the run pauses there."""
    if not deadline_s:
        return None
    final = 0.0 if pause else 1.5 * max(evals.values(), default=60.0) + 20.0
    return STARTED + deadline_s - final


async def run_imitation(cfg, *, budget_s: float, pause: bool, resume: bool, trainer=None, callbacks=(),
                        evals: dict | None = None) -> dict:
    """learning_proof.py --baseline imitation: `mcp_rl.runs.run.run`'s phases with `Run.imitate` in place
    of the GRPO steps, and "imitation" as the final evaluation's label."""
    from mcp_rl.runs import parts, pipeline
    from mcp_rl.runs.evaluate import load_eval
    from mcp_rl.runs.run import open_run

    r = open_run(cfg, resume=resume, callbacks=callbacks)
    cfg, env = r.cfg, r.env
    train, _, test = pipeline.load_splits(cfg, env)
    with env.serve(cfg.server_token) as server:
        await parts.check_tools(server, cfg)
        if r.state.phase == "new":
            await pipeline.audit_before_training(server, train, cfg, r.dir, env)
        trainer = await r.trainer(trainer)
        await r.evaluate("base", server, test)
        if r.state.phase == "base_done":
            await r.warm_start(server, train)
        if r.step == 0 and "warm_start" not in r.state.evals:
            await r.evaluate("warm_start", server, test)
        elif (r.dir / "eval_warm_start.jsonl").exists():
            r.results["warm_start"] = load_eval(r.dir, "warm_start")
        rec = await r.imitate(server, train, budget_s, stop_at=stop_at(cfg.train.deadline_s, pause, evals or {}))
        if rec["stopped"] != "budget" and pause:
            reason = f"paused after {rec['seconds']:.0f} of {budget_s:.0f} s of imitation: resume with --resume"
            print(reason, flush=True)
            return r.end({**r.results, "paused": reason, "report": None, "trainer": trainer})
        await r.evaluate("imitation", server, test)
        r.finish()
    report = r.report(title=f"mcp-rl imitation baseline: {cfg.model}")
    print(f"report: {report}", flush=True)
    return r.end({**r.results, "report": report, "trainer": trainer})


def started_at_warm_start(rl_dir: Path, out: Path) -> str | None:
    """Why the imitation run in `out` may not start now, or None: its GRPO run in `rl_dir` exists but has not
    forked its warm start yet (a second warm start would not be the same one)."""
    if (out / "state.json").exists() or not (rl_dir / "state.json").exists():
        return None
    if json.loads((rl_dir / "state.json").read_text()).get("phase") in ("new", "base_done"):
        return (f"{rl_dir} has not committed its warm start yet (no {out.name}): run the imitation baseline once "
                f"its GRPO run is past the warm start, so both start from the same checkpoint")
    return (f"{rl_dir} is past its warm start but its fork {out.name} is missing (left on another machine?): "
            "bring that folder here, or give an --rl-run with no folder for a warm start of its own")


__all__ = ["ForkImitation", "fork_dir", "imitation_tables", "run_imitation", "read_rows", "stop_at", "started_at_warm_start"]
