"""What the tool-call audit log (mcp_rl.mcp.audit) costs rollouts: the same calls with and without it.

    .venv/bin/python bench/speed/bench_audit.py [--calls 1000] [--repeats 7] --out bench/results/audit.txt

The cheapest server there is, so the log's share is as large as it gets: the company server
in-process (no subprocess, no HTTP), `run_query("SELECT 1")`, driven by a scripted policy through
`gather_rollouts` (the real agent loop: 50 rollouts of 20 calls, 16 in flight). Each repeat runs
both ways, in alternating order; the table gives the median wall time of `--calls` calls, the
cost per call, the mean of the per-repeat differences, in wall and CPU time, the time spent
inside `record_tool_call` during those rollouts, and one row's cost alone (10,000 rows).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mcp_rl.mcp.audit import _CURRENT, log_tool_calls, read_tool_calls, record_tool_call  # noqa: E402
from mcp_rl.policies.policy import ScriptedPolicy  # noqa: E402
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, gather_rollouts  # noqa: E402
from mcp_rl.tasks.scenarios import Scenario  # noqa: E402
from mcp_server import build_server  # noqa: E402

PER_ROLLOUT = 20
INSIDE = [0.0, 0]  # seconds spent in record_tool_call during the rollouts, and its calls


def _timed_record(*args):
    if _CURRENT.get() is None:  # no log open: the no-op path, not what is measured here
        return record_tool_call(*args)
    t0 = time.perf_counter()
    record_tool_call(*args)
    INSIDE[0] += time.perf_counter() - t0
    INSIDE[1] += 1


sys.modules["mcp_rl.rollout"].record_tool_call = _timed_record  # the name the agent loop calls


def policy() -> ScriptedPolicy:
    def script(messages):
        done = sum(m["role"] == "assistant" for m in messages)
        if done < PER_ROLLOUT:
            return {"tool": "run_query", "arguments": {"sql": "SELECT 1"}}
        return {"tool": COMPLETE_TOOL_NAME, "arguments": {"answer": "1"}}
    return ScriptedPolicy(script)


async def timed(server, n_calls: int, log: Path | None) -> tuple[float, float]:
    scenarios = [Scenario(id=f"s{i}", task="t") for i in range(n_calls // PER_ROLLOUT)]
    cfg = RolloutConfig(max_turns=PER_ROLLOUT + 1, concurrency=16)
    t0, c0 = time.perf_counter(), time.process_time()
    if log is None:
        groups = await gather_rollouts(policy(), server, scenarios, cfg, desc="no log")
    else:
        with log_tool_calls(log, phase="bench"):
            groups = await gather_rollouts(policy(), server, scenarios, cfg, desc="log")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    calls = sum(t.metrics["tool_calls/run_query"] for g in groups for t in g.trajectories)
    assert calls == n_calls, calls
    return seconds, cpu


def row_cost(path: Path, rows: int = 10_000) -> float:
    with log_tool_calls(path, phase="bench"):
        t0 = time.perf_counter()
        for i in range(rows):
            record_tool_call(f"s{i}", "run_query", {"sql": "SELECT 1"}, None, 0.001)
        return (time.perf_counter() - t0) / rows


async def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=8, help="rounded up to an even number")
    p.add_argument("--out", help="also write the table here")
    a = p.parse_args(argv)
    a.repeats += a.repeats % 2  # even: each order runs equally often
    tmp = Path(tempfile.mkdtemp())
    server = build_server(tmp / "company.db")
    await timed(server, PER_ROLLOUT * 16, None)  # warm up: the database is built, imports are done
    off, on = [], []
    for r in range(a.repeats):
        for with_log in ((False, True) if r % 2 == 0 else (True, False)):
            log = tmp / f"calls-{r}.jsonl"
            (on if with_log else off).append(await timed(server, a.calls, log if with_log else None))
    assert len(read_tool_calls(tmp / "calls-0.jsonl")) == a.calls
    per_row = row_cost(tmp / "rows.jsonl")
    def row(name: str, i: int) -> list[str]:
        a_, b_ = [x[i] for x in off], [x[i] for x in on]
        m_a, m_b = statistics.median(a_), statistics.median(b_)
        # Each repeat ran both ways, in alternating order over an even number of repeats: the mean
        # of the differences cancels both machine load and any first-or-second-run effect.
        paired = statistics.mean(y - x for x, y in zip(a_, b_))
        return [f"| {name} without the log | {m_a:.3f} | {min(a_):.3f} .. {max(a_):.3f} | {1000 * m_a / a.calls:.3f} |",
                f"| {name} with the log | {m_b:.3f} | {min(b_):.3f} .. {max(b_):.3f} | {1000 * m_b / a.calls:.3f} |",
                f"| {name} difference, paired (mean over repeats) | {paired:+.3f} ({100 * paired / m_a:+.1f}%) | | "
                f"{1000 * paired / a.calls:+.3f} |"]

    m_off = statistics.median(x[1] for x in off)
    inside = INSIDE[0] / max(INSIDE[1], 1)
    lines = [
        f"# bench_audit: {a.calls} tool calls (company server in-process, run_query('SELECT 1'), "
        f"{a.calls // PER_ROLLOUT} rollouts x {PER_ROLLOUT}), median of {a.repeats}",
        f"# {time.strftime('%Y-%m-%d %H:%M')} | {platform.platform()} | Python {platform.python_version()} | "
        f"{__import__('os').cpu_count()} CPUs",
        "",
        "| | seconds (median) | min .. max | per call ms |",
        "|---|---|---|---|",
        *row("wall", 0), *row("CPU", 1),
        "",
        f"inside the rollouts, record_tool_call took {inside * 1e6:.1f} us per logged call ({INSIDE[1]} calls; wall time, "
        f"so any switch to the server's tool threads that lands in it counts too): {100 * inside / (m_off / a.calls):.2f}% "
        "of a call.",
        f"record_tool_call alone: {per_row * 1e6:.1f} us per row ({100 * per_row / (m_off / a.calls):.2f}% of an "
        "in-process call, CPU); rows are flushed one by one.",
        "CPU time is this process's alone, so it is less sensitive than wall time to other load on the machine.",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
