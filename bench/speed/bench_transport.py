"""Benchmark 1: tool-call overhead per MCP transport, one session per rollout vs. a new session per call.

What it measures, on the real company server (mcp_server.py over a fresh build of its build_db.py):
  - long-lived: one `mcp_rl.mcp.connect.ToolSession` held open for all calls (what our rollout does);
    its connect (handshake), tool listing and close are timed separately from the calls.
  - per-call session: a new `fastmcp.Client` opened and closed around every call (the pattern of
    ART's MCP-RL notebooks and the tutorial: `async with Client(...)` inside the tool-call helper);
    each call is split into connect / call / close.
for three transports: in-process FastMCP, stdio (a subprocess per session) and streamable HTTP on
127.0.0.1 (one `python mcp_server.py --transport http` subprocess, shared by both modes). The tool
call is cheap (`run_query("SELECT 1")` by default) so that transport overhead dominates. Each mode
makes one untimed warm-up call first; every result is checked to be a successful tool result.

Run (about 1 min 45 s on 2 cores, most of it the 50 stdio per-call sessions):
    .venv/bin/python bench/speed/bench_transport.py
    .venv/bin/python bench/speed/bench_transport.py --out bench/results/transport.txt   # also save the report
    .venv/bin/python bench/speed/bench_transport.py --transports stdio,http --calls 200 --per-call-stdio 20
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # mcp_server.py is a top-level script, not a package
    sys.path.insert(0, str(ROOT))

from mcp_rl.mcp.connect import ToolSession, make_client  # noqa: E402
from mcp_rl.environments.company import command as company_server_command
from mcp_rl.mcp.launch import serve_http  # noqa: E402

TRANSPORTS = ("inprocess", "stdio", "http")
now = time.perf_counter


@dataclass
class Timing:
    """Seconds spent by one mode on one transport."""

    calls: list[float] = field(default_factory=list)    # per call (per-call mode: connect+call+close)
    connects: list[float] = field(default_factory=list)
    closes: list[float] = field(default_factory=list)
    list_tools: float | None = None

    @property
    def total(self) -> float:
        return sum(self.calls)

    @property
    def per_call_ms(self) -> float:
        return 1000 * self.total / len(self.calls)


def _build_db(directory: str) -> Path:
    # data/ is a folder of scripts, not a package: load the builder by path (as mcp_server.py does).
    from mcp_rl.environments.company import build_db as module
    return module.build_db(Path(directory) / "company.db")


def _check(text: str, is_error: bool, transport: str, mode: str) -> None:
    # A benchmark of failing calls would time error paths, not the transport: stop with the reason.
    if is_error:
        raise RuntimeError(f"{transport}/{mode}: the tool call failed, so timings would be meaningless: {text[:300]}")


async def long_lived(spec, n: int, tool: str, args: dict, transport: str) -> Timing:
    """One ToolSession for all `n` calls; connect, list_tools and close timed apart from the calls."""
    t = Timing()
    session = ToolSession(spec)
    t0 = now()
    await session.__aenter__()
    t.connects.append(now() - t0)
    try:
        t0 = now()
        await session.openai_tools()  # a rollout lists tools once, right after connecting
        t.list_tools = now() - t0
        warm = await session.call(tool, args)
        _check(warm.text, warm.is_error, transport, "long-lived")
        for _ in range(n):
            t0 = now()
            result = await session.call(tool, args)
            t.calls.append(now() - t0)
            _check(result.text, result.is_error, transport, "long-lived")
    finally:
        t0 = now()
        await session.__aexit__(None, None, None)
        t.closes.append(now() - t0)
    return t


async def per_call_session(spec, n: int, tool: str, args: dict, transport: str, log_file) -> Timing:
    """A new client per call, opened and closed around it: the notebooks' pattern."""
    t = Timing()
    for i in range(n + 1):  # iteration 0 is the warm-up
        client = make_client(spec, log_file=log_file)
        t0 = now()
        async with client:
            t1 = now()
            result = await client.call_tool_mcp(tool, args)
            t2 = now()
        t3 = now()
        text = " ".join(getattr(b, "text", "") for b in result.content)
        _check(text, result.is_error, transport, "per-call session")
        if i:
            t.calls.append(t3 - t0)
            t.connects.append(t1 - t0)
            t.closes.append(t3 - t2)
    return t


def _ms(xs: list[float]) -> str:
    return f"{1000 * statistics.median(xs):9.2f}" if xs else f"{'-':>9}"


def machine_lines() -> list[str]:
    cpu = "unknown"
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), cpu)
    except OSError:
        pass
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("fastmcp", "mcp"))
    return [f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
            f"machine: {platform.node()} | nproc {os.cpu_count()} | cpu {cpu} | {platform.platform()}",
            f"python {platform.python_version()} | {versions}"]


async def run(args: argparse.Namespace) -> list[str]:
    tool, tool_args = ("run_query", {"sql": args.sql}) if args.sql else ("list_tables", {})
    out: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.append(line)

    for line in machine_lines():
        say(line)
    say(f"tool call: {tool}({tool_args}) | long-lived calls {args.calls} | per-call-session calls "
        f"{args.per_call} (stdio {args.per_call_stdio}) | +1 untimed warm-up call per mode")
    results: dict[str, tuple[Timing, Timing]] = {}
    extra: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as devnull:
        db = _build_db(tmp)
        for transport in args.transports:
            t_start = now()
            if transport == "inprocess":
                from mcp_server import build_server
                spec, ctx = build_server(db), None
            elif transport == "stdio":
                spec, ctx = {"command": company_server_command(db)}, None
            else:
                ctx = serve_http(company_server_command(db))
                t0 = now()
                spec = await ctx.__aenter__()
                extra.append(f"http server subprocess start (until it listens): {1000 * (now() - t0):.0f} ms")
            try:
                n_per = args.per_call_stdio if transport == "stdio" else args.per_call
                lived = await long_lived(spec, args.calls, tool, tool_args, transport)
                fresh = await per_call_session(spec, n_per, tool, tool_args, transport, devnull)
            finally:
                if ctx is not None:
                    await ctx.__aexit__(None, None, None)
            results[transport] = (lived, fresh)
            print(f"  [{transport} done in {now() - t_start:.1f} s]", file=sys.stderr, flush=True)

    say()
    say(f"{'transport':<10} | {'mode':<16} | {'calls':>5} | {'total s':>8} | {'per-call ms':>11} | "
        f"{'p50 ms':>8} | {'ratio':>7}")
    say("-" * 84)
    for transport, (lived, fresh) in results.items():
        ratio = fresh.per_call_ms / lived.per_call_ms
        for mode, t, r in (("long-lived", lived, "1.0x"), ("per-call session", fresh, f"{ratio:.1f}x")):
            say(f"{transport:<10} | {mode:<16} | {len(t.calls):>5} | {t.total:8.3f} | {t.per_call_ms:11.2f} | "
                f"{1000 * statistics.median(t.calls):8.2f} | {r:>7}")
    say("ratio = per-call ms of per-call sessions / per-call ms of the long-lived session (target >= 10x)")

    say()
    say("connect / close, median ms (long-lived: its single session; per-call: over all its sessions)")
    say(f"{'transport':<10} | {'LL connect':>10} | {'LL list_tools':>13} | {'LL close':>9} | "
        f"{'PC connect':>10} | {'PC call':>9} | {'PC close':>9}")
    say("-" * 84)
    for transport, (lived, fresh) in results.items():
        pc_call = [c - a - b for c, a, b in zip(fresh.calls, fresh.connects, fresh.closes)]
        say(f"{transport:<10} | {_ms(lived.connects):>10} | {1000 * lived.list_tools:13.2f} | {_ms(lived.closes):>9} | "
            f"{_ms(fresh.connects):>10} | {_ms(pc_call)} | {_ms(fresh.closes)}")
    for line in extra:
        say(line)

    k = args.rollout_calls
    say()
    say(f"a rollout of {k} tool calls, connect+list_tools+close included "
        f"(long-lived: once; per-call: {k} sessions):")
    for transport, (lived, fresh) in results.items():
        ll = lived.connects[0] + lived.list_tools + lived.closes[0] + k * lived.per_call_ms / 1000
        pc = k * fresh.per_call_ms / 1000
        say(f"  {transport:<10} long-lived {1000 * ll:9.1f} ms | per-call sessions {1000 * pc:9.1f} ms | "
            f"{pc / ll:.1f}x")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--transports", default=",".join(TRANSPORTS),
                   help="comma-separated subset of %(default)s")
    p.add_argument("--calls", type=int, default=500, help="calls on the long-lived session (default: %(default)s)")
    p.add_argument("--per-call", type=int, default=200,
                   help="calls with a new session each, in-process and HTTP (default: %(default)s)")
    p.add_argument("--per-call-stdio", type=int, default=50,
                   help="calls with a new session each over stdio; each spawns a server (default: %(default)s)")
    p.add_argument("--sql", default="SELECT 1",
                   help="query for run_query; an empty string calls list_tables instead (default: %(default)r)")
    p.add_argument("--rollout-calls", type=int, default=10,
                   help="tool calls per rollout for the amortized comparison (default: %(default)s)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    args = p.parse_args(argv)
    args.transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    unknown = sorted(set(args.transports) - set(TRANSPORTS))
    if unknown or not args.transports:
        p.error(f"unknown transports {unknown}; choose from {', '.join(TRANSPORTS)}")
    for name in ("calls", "per_call", "per_call_stdio", "rollout_calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        lines = asyncio.run(run(args))
    except RuntimeError as e:  # a failing tool call or a server that will not start (ServerUnavailable)
        sys.exit(f"bench_transport: {e}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
