"""Issue 17's targets over seeds, per model family, from the committed learning runs, on grounded success.

Every number is rescored from the runs' saved eval rows under the fixed reward of [reward-integrity]
(hedges refused, credit only when the episode's tool results showed the value: bench/experiments/rescore.py); what
each run reported under the old reward stands beside it.

Reads every `<run>/proof.json` (with its `config.json`) under the folder and prints, per model: each
seed's gains (trained over base, trained over its own warm start, paired s.e.) and the family's
targets: every seed >= +5 over its warm start and >= +15 over base; the mean gain over the warm start
>= +8 with more than 3 standard errors of the mean (sqrt(sum of squared per-seed paired s.e.) / seeds).
A run folder without proof.json is listed as unfinished, so no run is left out silently.

Issue 40's runs (bench/results/learning_v2, PREREGISTRATION.md section 3): rows that carry the live
`grounded` score use it (the rescore rebuilds it from clipped transcripts: a lower bound); a run's
imitation baseline, the folder `<run>-imitation` with its `eval_imitation` rows, is compared with the
run's RL-trained policy on the same scenarios, and the family's deciding target is checked: the mean
of RL - imitation >= +3 points with more than 2 standard errors of the mean.

    python3 bench/experiments/learning_summary.py                      # bench/results/learning
    python3 bench/experiments/learning_summary.py bench/results/learning_v2 --seeds 3
    python3 bench/experiments/learning_summary.py DIR --json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "experiments")]
PER_SEED_WARM, PER_SEED_BASE, MEAN_WARM, MEAN_SES = 0.05, 0.15, 0.08, 3.0
MEAN_IMIT, IMIT_SES = 0.03, 2.0  # issue 40: RL over the equal-time imitation baseline, on the mean over seeds
IMITATION = "-imitation"  # a run's imitation baseline lives in <run>-imitation (bench/experiments/imitation_baseline.py)
SEEDS_ASKED = {"smollm2": 3, "gemma3-270m": 2}  # issue 17: at least 3 seeds on SmolLM2, 2 on Gemma 3 270M


def runs(folder: Path) -> tuple[list[dict], list[str]]:
    """(finished runs: {name, model, seed, steps, base, warm, trained, over_base, over_warm, se_warm}, unfinished names)."""
    done, unfinished = [], []
    for d in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not (d / "config.json").is_file() or d.name.endswith(IMITATION):
            continue  # not a run folder (logs of runs that never started training), or a baseline: read with its run
        if not (d / "proof.json").is_file():
            unfinished.append(d.name)
            continue
        try:  # a half-copied or hand-edited file: name it rather than a traceback
            cfg, proof = json.loads((d / "config.json").read_text()), json.loads((d / "proof.json").read_text())
            base, warm = proof["comparisons"]["base"], proof["comparisons"]["warm_start"]
            row = {"name": d.name, "model": cfg["model"], "seed": cfg.get("train", {}).get("seed"),
                   "steps": proof["steps"], "stored_trained": warm["final"], "stored_over_warm": warm["gap"],
                   # as the run reported them, where its eval rows are not there to re-score
                   "base": base["other"], "warm": warm["other"], "trained": warm["final"], "over_base": base["gap"],
                   "over_warm": warm["gap"], "se_warm": warm["se_paired"], "wins": "?", "losses": "?"}
            row.update(_grounded(d))
            row.update(_imitation(d, folder / f"{d.name}{IMITATION}"))
            done.append(row)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{d.name}: config.json or proof.json is not a finished run's ({type(e).__name__}: "
                             f"{str(e)[:80]})") from None
    return done, unfinished


def _grounded(run: Path) -> dict:
    """base / warm / trained grounded success and the paired gains, rescored from the eval rows under the
    fixed reward ([reward-integrity]: hedges refused, credit only with evidence; bench/experiments/rescore.py)."""
    from rescore import _eval_file, _firsts, grounded, paired

    files = {lab: _eval_file(run, lab) for lab in ("base", "warm_start", "trained")}
    if not all(files.values()):
        return {}
    ev = {lab: _firsts(f) for lab, f in files.items()}
    rate = lambda rows: sum(key(r) >= 0.999 for r in rows.values()) / len(rows)  # noqa: E731
    over_warm, se_warm, wins, losses = paired(ev["warm_start"], ev["trained"], key)
    over_base, _, _, _ = paired(ev["base"], ev["trained"], key)
    return {"base": rate(ev["base"]), "warm": rate(ev["warm_start"]), "trained": rate(ev["trained"]),
            "over_base": over_base, "over_warm": over_warm, "se_warm": se_warm, "wins": wins, "losses": losses}


def key(row: dict) -> float:
    """A row's grounded score: as the run scored it live where it has one (issue 40's runs), else rescored."""
    from rescore import grounded

    return float(row["grounded"]) if "grounded" in row else grounded(row)[1]


def _imitation(run: Path, imit: Path) -> dict:
    """The run's imitation baseline: its grounded success and RL-trained - imitation on the same scenarios;
    {"imitation_state": ...} where the baseline is missing or unfinished (so it is never silently absent)."""
    from rescore import _eval_file, _firsts, paired

    if not imit.is_dir():
        return {"imitation_state": "none"}
    files = {"imitation": _eval_file(imit, "imitation"), "trained": _eval_file(run, "trained")}
    if not all(files.values()):
        return {"imitation_state": "unfinished"}
    ev = {lab: _firsts(f) for lab, f in files.items()}
    gap, se, wins, losses = paired(ev["imitation"], ev["trained"], key)
    rows = ev["imitation"].values()
    return {"imitation_state": "done", "imitation": sum(key(r) >= 0.999 for r in rows) / len(rows),
            "over_imit": gap, "se_imit": se, "wins_imit": wins, "losses_imit": losses}


def family(rows: list[dict]) -> dict:
    """The targets over one model's seeds."""
    k = len(rows)
    mean = sum(r["over_warm"] for r in rows) / k
    se = math.sqrt(sum(r["se_warm"] ** 2 for r in rows)) / k
    out = {"seeds": k, "mean_over_warm": mean, "se_mean": se, "ses": mean / se if se else float("inf"),
           "every_seed_warm": all(r["over_warm"] >= PER_SEED_WARM - 1e-9 for r in rows),
           "every_seed_base": all(r["over_base"] >= PER_SEED_BASE - 1e-9 for r in rows),
           "mean_met": mean >= MEAN_WARM - 1e-9 and mean > MEAN_SES * se}
    imit = [r for r in rows if r.get("imitation_state") == "done"]
    if imit:  # the deciding comparison, over the seeds whose baseline finished (the others are named)
        m = sum(r["over_imit"] for r in imit) / len(imit)
        se_i = math.sqrt(sum(r["se_imit"] ** 2 for r in imit)) / len(imit)
        out.update({"imitation_seeds": len(imit), "mean_over_imit": m, "se_mean_imit": se_i,
                    "imit_met": m >= MEAN_IMIT - 1e-9 and m > IMIT_SES * se_i})
    return out


def report(folder: Path, seeds_asked: int | None = None) -> tuple[str, dict]:
    done, unfinished = runs(folder)
    lines, out = [], {}
    for model in sorted({r["model"] for r in done}):
        rows = sorted((r for r in done if r["model"] == model), key=lambda r: (r["seed"] is None, r["seed"] or 0, r["name"]))
        f = out[model] = family(rows)
        lines += [f"## {model}", "", "Grounded success under the fixed reward (rescored from the saved eval rows); "
                  "the last column is what the run reported under the old, gameable reward.", "",
                  "| run | seed | GRPO steps | base | warm start | trained | over base | "
                  "over warm start (paired s.e., wins/losses) | as reported: trained, over warm start |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['name']} | {r['seed']} | {r['steps']} | {100 * r['base']:.1f}% | {100 * r['warm']:.1f}% | "
                  f"{100 * r['trained']:.1f}% | {100 * r['over_base']:+.1f} | {100 * r['over_warm']:+.1f} "
                  f"({100 * r['se_warm']:.1f}, {r['wins']}/{r['losses']}) | {100 * r['stored_trained']:.1f}%, "
                  f"{100 * r['stored_over_warm']:+.1f} |" for r in rows]
        yes = lambda ok: "met" if ok else "missed"  # noqa: E731
        lines += ["", f"- every seed >= +5 over its warm start: {yes(f['every_seed_warm'])}",
                  f"- every seed >= +15 over base: {yes(f['every_seed_base'])}",
                  f"- mean over warm start {100 * f['mean_over_warm']:+.1f} (s.e. of the mean {100 * f['se_mean']:.1f}, "
                  f"{f['ses']:.1f} s.e.; target >= +8 and > 3 s.e.) over {f['seeds']} seed(s): {yes(f['mean_met'])}"]
        if "imitation_seeds" in f:
            lines += [f"- RL over the equal-time imitation baseline: mean {100 * f['mean_over_imit']:+.1f} (s.e. of the "
                      f"mean {100 * f['se_mean_imit']:.1f}; target >= +3 and > 2 s.e.) over {f['imitation_seeds']} "
                      f"seed(s): {yes(f['imit_met'])}"]
            lines += [f"  - {r['name']}: imitation {100 * r['imitation']:.1f}%, RL - imitation {100 * r['over_imit']:+.1f} "
                      f"(paired s.e. {100 * r['se_imit']:.1f}, {r['wins_imit']}/{r['losses_imit']})"
                      for r in rows if r.get("imitation_state") == "done"]
        v2 = seeds_asked is not None or any(r.get("imitation_state") != "none" for r in rows)
        missing = [r["name"] for r in rows if r.get("imitation_state") != "done"]
        if v2 and missing:  # issue 40's runs: a seed without its baseline is named, never dropped silently
            lines.append(f"- imitation baseline missing or unfinished: {', '.join(missing)}")
        asked = seeds_asked or SEEDS_ASKED.get(model, 1)
        if f["seeds"] < asked:
            lines.append(f"- seeds finished: {f['seeds']} of the {asked} asked for")
        lines.append("")
    if unfinished:
        lines.append("Unfinished (no proof.json): " + ", ".join(unfinished))
    return "\n".join(lines), {"families": out, "runs": done, "unfinished": unfinished}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=ROOT / "bench" / "results" / "learning")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON instead of markdown")
    ap.add_argument("--seeds", type=int, default=None, help="seeds asked per family (issue 40: 3; default issue 17's)")
    args = ap.parse_args()
    if not args.folder.is_dir():
        raise SystemExit(f"no such folder: {str(args.folder)[:200]}")
    try:
        text, data = report(args.folder, args.seeds)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(json.dumps(data, indent=1) if args.json else text)


if __name__ == "__main__":
    main()
