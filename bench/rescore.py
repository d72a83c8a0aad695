"""Rescore stored evaluation rows with today's `verify_answer`: what a verifier change does to past runs.

Each `eval_*.jsonl` (or `.jsonl.gz`) row keeps the final answer, the expected one and the `verified`
score it got when it ran. A row counts as correct at `verified >= 0.999` and, as in the pipeline, only
if the episode completed (an answer given through complete_task); this prints, per file, the success
rate as stored and as rescored, and every row whose correctness flips:

    .venv/bin/python bench/rescore.py bench/results            # every eval file under the folder
    .venv/bin/python bench/rescore.py bench/results/learning/gemma3-270m-seed1/session10-attempt2/eval_test_step10.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mcp_rl.verify import verify_answer  # noqa: E402


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
    args = ap.parse_args(argv)
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
