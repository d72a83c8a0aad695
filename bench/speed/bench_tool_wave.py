"""Benchmark: a wave of simultaneous MCP calls, as a GRPO step makes after each batched decode.

In the GPU learning runs every rollout (192 of them) calls the company server at once after each
decode, and the audit logs showed 600-940 ms per call. This bench opens N `ToolSession`s over
streamable HTTP to the company server (`mcp_server.py`), then times W waves in which every session
makes one `run_query` call at the same moment (after one untimed wave), and reports per setting:
the median and fastest wave, and CPU per call in this (client) process and in the server
processes. Settings, side by side in one run: 1 or 2 server processes (sessions spread round
robin), and the server answering with SSE streams (fastmcp's default) or plain JSON
(`FASTMCP_JSON_RESPONSE`). CPU only:

    .venv/bin/python bench/speed/bench_tool_wave.py --out bench/results/tool_wave.txt
    .venv/bin/python bench/speed/bench_tool_wave.py --sessions 64 --waves 3 --settings 1:sse,2:sse
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mcp_rl.mcp.connect import ToolSession  # noqa: E402
from mcp_rl.environments.company import command as company_server_command
from mcp_rl.mcp.launch import HttpServer  # noqa: E402

SQL = "SELECT e.name, d.name FROM employees e JOIN departments d ON e.department_id = d.id LIMIT 5"


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def wave_setting(servers_n: int, json_response: bool, sessions_n: int, waves: int) -> dict:
    os.environ["FASTMCP_JSON_RESPONSE"] = "true" if json_response else "false"  # read by the server processes
    servers = [HttpServer(company_server_command()).start() for _ in range(servers_n)]
    try:
        procs = [psutil.Process(s.proc.pid) for s in servers]
        sessions = [ToolSession(servers[i % servers_n].url) for i in range(sessions_n)]
        await asyncio.gather(*(s.__aenter__() for s in sessions))
        try:
            await asyncio.gather(*(s.call("run_query", {"sql": SQL}) for s in sessions))  # untimed
            me = psutil.Process()
            client0, server0, times = cpu(me), [cpu(p) for p in procs], []
            for _ in range(waves):
                t = time.perf_counter()
                results = await asyncio.gather(*(s.call("run_query", {"sql": SQL}) for s in sessions))
                times.append(time.perf_counter() - t)
                bad = [r.kind for r in results if r.kind]
                if bad:
                    raise RuntimeError(f"{len(bad)} calls failed: {bad[:3]}")
            calls = sessions_n * waves
            return {"servers": servers_n, "response": "json" if json_response else "sse", "sessions": sessions_n,
                    "waves": waves, "median_s": statistics.median(times), "min_s": min(times),
                    "client_ms_per_call": (cpu(me) - client0) / calls * 1e3,
                    "server_ms_per_call": sum(cpu(p) - c for p, c in zip(procs, server0)) / calls * 1e3}
        finally:
            await asyncio.gather(*(s.__aexit__(None, None, None) for s in sessions), return_exceptions=True)
    finally:
        for s in servers:
            s.stop()


def table(rows: list[dict]) -> str:
    out = ["| servers | response | sessions | wave median s | fastest s | client CPU ms/call | server CPU ms/call |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['servers']} | {r['response']} | {r['sessions']} | {r['median_s']:.2f} | {r['min_s']:.2f} | "
            f"{r['client_ms_per_call']:.2f} | {r['server_ms_per_call']:.2f} |" for r in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=192)
    p.add_argument("--waves", type=int, default=6)
    p.add_argument("--settings", default="1:sse,1:json,2:sse,2:json", help="servers:sse|json, comma separated")
    p.add_argument("--out")
    a = p.parse_args(argv)
    try:
        settings = [(int(n), kind) for n, kind in (s.split(":") for s in a.settings.split(","))]
        assert all(n >= 1 and kind in ("sse", "json") for n, kind in settings) and a.sessions >= 1 and a.waves >= 1
    except (ValueError, AssertionError):
        p.error(f"--settings like 1:sse,2:json; --sessions, --waves >= 1 (got {a.settings[:60]!r})")
    rows = []
    for n, kind in settings:
        rows.append(asyncio.run(wave_setting(n, kind == "json", a.sessions, a.waves)))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    report = (f"# MCP call waves, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"{platform.machine()} {os.cpu_count()} cores, company server over streamable HTTP\n\n{table(rows)}\n")
    print(report)
    if a.out:
        Path(a.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
