"""How many HTTP MCP sessions die when calls come ~5 s apart, with the client's old and new pool expiry.

The company server over streamable HTTP (uvicorn, 5 s keep-alive); N concurrent ToolSessions, each
making CALLS calls GAP +- 0.15 s apart, as rollouts do while the policy generates. Run once with
httpx's default 5 s pool expiry and once with mcp_rl's 1 s (`mcp_rl.mcp.specs._http_client`), side by
side; prints a table. CPU only, about 2 minutes:

    .venv/bin/python bench/checks/check_http_keepalive.py --out bench/results/http_keepalive.txt
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import platform
import random
import time
from datetime import datetime, timezone

import mcp_rl.mcp.specs as specs
from mcp_rl.mcp.connect import ToolSession
from mcp_rl.environments.company import command as company_server_command
from mcp_rl.mcp.launch import HttpServer


async def sessions(url: str, n: int, calls: int, gap: float) -> collections.Counter:
    kinds: collections.Counter = collections.Counter()

    async def one() -> None:
        await asyncio.sleep(random.random() * 2)
        async with ToolSession(url) as s:
            for _ in range(calls):
                r = await s.call("run_query", {"sql": "SELECT count(*) FROM employees"})
                kinds[r.kind or "ok"] += 1
                if r.kind == "server_dead":
                    kinds["sessions_died"] += 1
                    return
                await asyncio.sleep(random.uniform(gap - 0.15, gap + 0.15))

    await asyncio.gather(*(one() for _ in range(n)))
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=192)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--gap-s", type=float, default=5.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.getLogger("mcp_rl.mcp.connect").setLevel(logging.ERROR)  # one warning per dead session otherwise
    new_factory = specs._http_client

    def with_expiry(expiry: float):
        def factory(*a, **k):
            client = new_factory(*a, **k)
            client._transport._pool._keepalive_expiry = expiry  # the only difference between the rows
            return client
        return factory

    lines = [f"date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
             f"machine: {platform.machine()} {platform.processor() or ''} | python {platform.python_version()}",
             f"{args.sessions} sessions x {args.calls} calls, {args.gap_s} +- 0.15 s apart, company server over HTTP",
             "", "pool expiry | calls ok | sessions died | seconds", "-" * 50]
    with HttpServer(company_server_command()) as server:
        for expiry in (5.0, 1.0):
            specs._http_client = with_expiry(expiry)
            start = time.perf_counter()
            kinds = asyncio.run(sessions(server.url, args.sessions, args.calls, args.gap_s))
            lines.append(f"{expiry:9.1f} s | {kinds['ok']:8d} | {kinds['sessions_died']:13d} | "
                         f"{time.perf_counter() - start:7.0f}")
    specs._http_client = new_factory
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
