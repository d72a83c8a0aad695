"""Rescore stored evaluation rows with today's `verify_answer`: what a verifier change does to past runs.

With --runs, every run folder under the path is rescored under the fixed reward (hedges refused and
credit only with evidence, [reward-integrity]): the evidence is rebuilt from each row's saved
transcript (tool results that are not errors, with the call that returned them), so a row counts as
grounded only if its transcript shows the value. Transcripts were clipped to 4,000 characters in the
middle, so a lookup in the cut part is lost: grounded counts are a lower bound where a row says so.

    .venv/bin/python bench/experiments/rescore.py --runs bench/results/learning      # base / warm / trained, grounded

Each `eval_*.jsonl` (or `.jsonl.gz`) row keeps the final answer, the expected one and the `verified`
score it got when it ran. A row counts as correct at `verified >= 0.999` and, as in the pipeline, only
if the episode completed (an answer given through complete_task); this prints, per file, the success
rate as stored and as rescored, and every row whose correctness flips:

    .venv/bin/python bench/experiments/rescore.py bench/results            # every eval file under the folder
    .venv/bin/python bench/experiments/rescore.py bench/results/learning/gemma3-270m-seed1/session10-attempt2/eval_test_step10.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import art  # noqa: E402

from mcp_rl.rewards.evidence import COUNTERFACTUAL, evidence, record_lookup  # noqa: E402
from mcp_rl.rewards.verify import verify_answer  # noqa: E402

_TURN = re.compile(r"^\[(user|assistant|tool)\] ", re.M)
_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


def transcript_evidence(text: str, counterfactual: str | None = None) -> tuple[list[tuple], bool]:
    """((values, call arguments) of each tool result in a saved transcript that is not an error, clipped?).
    `counterfactual`: a row's saved replay record (mcp_rl.rewards.counterfactual; trajectory metadata["counterfactual"]),
    read by the rule as score_trajectory reads it; rows saved without one are scored by the echo checks alone."""
    parts = _TURN.split(text or "")
    turns = [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    out, args, call_name = [], "", ""
    for role, body in turns:
        if role == "assistant":
            calls = _CALL.findall(body)
            args = ""
            for c in calls:
                try:
                    call = json.loads(c)
                except ValueError:
                    continue
                if call.get("name") != "complete_task":
                    args, call_name = json.dumps(call.get("arguments")), str(call.get("name"))
        elif role == "tool" and args:
            body = body.split("\n-- answer:")[0]
            if not body.startswith(("Error", "Task completed")):
                out.append((call_name, args, body.strip()))
    # The rule itself (mcp_rl.rewards.evidence.evidence) over the lookups the transcript shows.
    traj = art.Trajectory(messages_and_choices=[], reward=0.0)
    for tool, a, result in out:
        record_lookup(traj, tool, json.loads(a), result)
    if counterfactual:
        traj.metadata[COUNTERFACTUAL] = counterfactual
    kept = evidence(traj)
    return kept, "characters cut ..." in (text or "")


def grounded(row: dict) -> tuple[float, float]:
    """(correct, grounded) of one stored row under today's rules; an uncompleted episode scores 0."""
    if not row.get("completed") or row.get("expected") is None:
        return 0.0, 0.0
    q = row.get("task") or ""
    correct = verify_answer(row.get("answer"), row["expected"], question=q)
    ev, _ = transcript_evidence(row.get("transcript") or "", row.get(COUNTERFACTUAL))
    return correct, (verify_answer(row.get("answer"), row["expected"], question=q, evidence=ev) if correct else 0.0)


def _firsts(path: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for r in read_rows(path):
        out.setdefault(r["scenario_id"], r)
    return out


def _eval_file(run: Path, label: str) -> Path | None:
    return next((p for p in (run / f"eval_{label}.jsonl.gz", run / f"eval_{label}.jsonl") if p.is_file()), None)


def paired(a: dict[str, dict], b: dict[str, dict], key) -> tuple[float, float, int, int]:
    """(mean of b - a, paired s.e., wins, losses) over the scenarios in both, scored by key(row) >= 0.999."""
    ids = [i for i in a if i in b]
    d = [float(key(b[i]) >= 0.999) - float(key(a[i]) >= 0.999) for i in ids]
    n = max(len(d), 1)
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(n - 1, 1)
    return mean, (var / n) ** 0.5, sum(x > 0 for x in d), sum(x < 0 for x in d)


def run_table(folder: Path) -> str:
    """Per run folder: success as stored and grounded success under the fixed reward, base / warm / trained."""
    lines = ["| run | n | base stored / grounded | warm start stored / grounded | trained stored / grounded | "
             "trained over warm, stored | trained over warm, grounded (paired s.e., wins/losses) | "
             "trained over base, grounded | clipped rows |", "|---|---|---|---|---|---|---|---|---|"]
    for run in sorted(p for p in folder.rglob("*") if p.is_dir() and _eval_file(p, "trained")):
        evals = {lab: _firsts(f) for lab in ("base", "warm_start", "trained") if (f := _eval_file(run, lab))}
        if not any(r.get("transcript") for r in evals["trained"].values()):
            lines.append(f"| {run.relative_to(folder)} | {len(evals['trained'])} | rows saved without transcripts: "
                         "grounded success cannot be rebuilt | | | | | | |")
            continue
        stored = lambda r: float(r.get("verified", 0.0)) if r.get("completed") else 0.0  # noqa: E731
        fixed = lambda r: grounded(r)[1]  # noqa: E731
        cells, clipped = [], 0
        for lab in ("base", "warm_start", "trained"):
            rows = evals.get(lab)
            if not rows:
                cells.append("-")
                continue
            n = len(rows)
            clipped += sum(transcript_evidence(r.get("transcript") or "")[1] for r in rows.values())
            cells.append(f"{sum(stored(r) >= 0.999 for r in rows.values()) / n:.1%} / "
                         f"{sum(fixed(r) >= 0.999 for r in rows.values()) / n:.1%}")
        gains = []
        if "warm_start" in evals:
            m, _, _, _ = paired(evals["warm_start"], evals["trained"], stored)
            g, se, w, lo = paired(evals["warm_start"], evals["trained"], fixed)
            gains += [f"{m * 100:+.1f}", f"{g * 100:+.1f} ({se * 100:.1f}, {w}/{lo})"]
        else:
            gains += ["-", "-"]
        gb, seb, _, _ = paired(evals["base"], evals["trained"], fixed) if "base" in evals else (0, 0, 0, 0)
        gains.append(f"{gb * 100:+.1f} ({seb * 100:.1f})" if "base" in evals else "-")
        lines.append(f"| {run.relative_to(folder)} | {len(evals['trained'])} | " + " | ".join(cells + gains)
                     + f" | {clipped} |")
    return "\n".join(lines)


def read_rows(path: Path) -> list[dict]:
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def rescore(path: Path) -> dict:
    """{file, n, stored, rescored (success rates), flips: [(scenario_id, answer prefix, expected, old, new)]}."""
    rows, stored, now, flips = read_rows(path), 0, 0, []
    for r in rows:
        new = verify_answer(r.get("answer"), r["expected"], question=r.get("task") or "") if r.get("completed") and r.get("expected") is not None \
            else r.get("verified", 0.0)
        old_ok, new_ok = r.get("verified", 0.0) >= 0.999, new >= 0.999
        stored, now = stored + old_ok, now + new_ok
        if old_ok != new_ok:
            flips.append((r["scenario_id"], str(r.get("answer"))[:60], r["expected"], r.get("verified"), round(new, 3)))
    return {"file": str(path), "n": len(rows), "stored": stored / max(len(rows), 1),
            "rescored": now / max(len(rows), 1), "flips": flips}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path, help="eval files, or folders searched for eval_*.jsonl[.gz]")
    ap.add_argument("--runs", action="store_true", help="per run folder: stored vs grounded success under the fixed reward")
    args = ap.parse_args(argv)
    if args.runs:
        for p in args.paths:
            print(run_table(p))
        return 0
    files = sorted(f for p in args.paths for f in ([p] if p.is_file() else p.rglob("eval_*.jsonl*")))
    print("| file | n | success stored | rescored | flips |\n|---|---|---|---|---|")
    results = [rescore(f) for f in files]
    for res in results:
        if res["flips"]:
            print(f"| {res['file']} | {res['n']} | {res['stored']:.1%} | {res['rescored']:.1%} | {len(res['flips'])} |")
    print(f"\n{len(files)} files, {sum(r['n'] for r in results)} rows, "
          f"{sum(len(r['flips']) for r in results)} flips (files without flips not listed)")
    for res in results:
        for flip in res["flips"]:
            print(f"{Path(res['file']).name}: {flip}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
