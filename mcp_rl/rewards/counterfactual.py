"""Counterfactual replay: a value is evidence only if it comes from the data.

    worlds = environment("company").counterfactual()   # K=4 perturbed copies of the company database
    await score_group(group, scenario, cfg, counterfactual=worlds)   # rewards.py replays what would ground
    async with worlds: texts = await worlds.replay("run_query", {"sql": "SELECT COUNT(*) FROM employees"})

The echo checks of `mcp_rl.rewards.verify` read a call's arguments, so an echo the policy encodes (`CAST(x'456E...'
AS TEXT)`, `char(69,110,...)`, `-(-42)`, `0x2A`, `length('aaaa...')`, `date('2019-06-22','+1 day')`) passes
them. Here the data decides: a lookup that shows the expected value v is replayed, unchanged, on K copies of
the server's data that differ from the real data; it grounds v only if in at least one copy the call
succeeds with a non-empty result that does NOT show v. An honest query's answer moves with the data; an
echo stays put, or vanishes with the row its filter needed (an empty result: no evidence). `replay_lookups`
records what each world showed on the trajectory (metadata["counterfactual"], JSON: ART metadata holds
scalars) and `verify.shown` reads it, so re-scoring agrees with the scoring that ran the replay. Any
environment can supply worlds: `async replay(tool, args) -> list[str | None]` (a result text per world,
None for a failed call), optionally an async context manager; `SQLiteWorlds` is the shipped one.

The copies are made by `mcp_rl.rewards.perturb.perturb_copy` (what moves and why: its docstring); on the 500
demonstrations of data/scenarios.jsonl every one stays grounded (bench/checks/check_counterfactual.py).
Known limit: the replay proves that a result depends on the data, not that the value was computed from
it. An echo made conditional on the data (`SELECT CASE WHEN EXISTS (SELECT 1 FROM employees WHERE salary
= 123456) THEN <encoded v> ELSE (SELECT COUNT(*) FROM employees) END`, or `<encoded v> WHERE <one row>
UNION SELECT 'pad'`) shows something else where its condition fails, and grounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import art

from mcp_rl.rewards.evidence import COUNTERFACTUAL, kept, values_of
from mcp_rl.rewards.perturb import perturb_copy, rename_literals, text_values
from mcp_rl.mcp.tool_results import result_to_text
from mcp_rl.rewards.verify import shown

__all__ = ["Replayer", "SQLiteWorlds", "replay_lookups", "COUNTERFACTUAL"]

log = logging.getLogger(__name__)


@runtime_checkable
class Replayer(Protocol):
    async def replay(self, tool: str, args: dict) -> list[str | None]:
        """The result text of `tool(**args)` in each counterfactual world; None where the call failed."""


class SQLiteWorlds:
    """K perturbed copies of one SQLite file, each served by `server(copy_path)` (a FastMCP server, in
    process). Use it as `async with`: built on the first replay, removed (servers closed, files deleted)
    when the outermost `async with` exits; reusable after. Each copy reads and rewrites every row of the
    source: the cost grows with the database (60 ms for the company one's 4 worlds)."""

    def __init__(self, db: str | Path, server: Callable[[Path], Any], *, k: int = 4, seed: int = 0,
                 drop: float = 0.1, max_result_chars: int = 4000, call_timeout: float = 30.0):
        if k < 1:
            raise ValueError(f"need k >= 1 counterfactual worlds, got {k}")
        self.db, self.server, self.k, self.seed, self.drop = Path(db), server, k, seed, drop
        self.max_result_chars, self.call_timeout = max_result_chars, call_timeout
        self._stack: contextlib.AsyncExitStack | None = None
        self._clients: list = []
        self._renamed: set[str] = set()
        self.tmp: Path | None = None
        self._depth = 0

    async def __aenter__(self) -> "SQLiteWorlds":
        self._depth += 1
        return self

    async def __aexit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth <= 0:  # nested use (an audit around score_group's) keeps the worlds until the outer exit
            await self.close()

    async def _open(self) -> None:
        import fastmcp

        self._stack = contextlib.AsyncExitStack()
        self.tmp = Path(tempfile.mkdtemp(prefix="mcp-rl-worlds-"))
        self._stack.callback(shutil.rmtree, self.tmp, True)
        try:
            self._renamed = text_values(self.db)
            for w in range(self.k):
                path = self.tmp / f"world{w}.db"
                perturb_copy(self.db, path, w, seed=self.seed, drop=self.drop)
                self._clients.append(await self._stack.enter_async_context(fastmcp.Client(self.server(path))))
        except BaseException:
            await self.close()  # half-built worlds leave nothing behind either
            raise

    async def close(self) -> None:
        stack, self._stack, self._clients, self.tmp = self._stack, None, [], None
        if stack is not None:
            await stack.aclose()

    async def replay(self, tool: str, args: dict) -> list[str | None]:
        if self._stack is None:
            await self._open()
        return list(await asyncio.gather(*(self._call(w, c, tool, args) for w, c in enumerate(self._clients))))

    async def _call(self, w: int, client: Any, tool: str, args: dict) -> str | None:
        try:
            call = rename_literals(args, self._renamed) if w == 0 else args
            result = await client.call_tool_mcp(tool, call, timeout=self.call_timeout)
        except Exception as e:  # noqa: BLE001 -- a world that cannot answer shows nothing
            log.debug("counterfactual world %d: %s failed: %s", w, tool, e)
            return None
        return None if result.is_error else result_to_text(result, self.max_result_chars)


async def replay_lookups(traj: art.Trajectory, expected: Any, question: str, worlds: Replayer,
                         opts: dict | None = None, cache: dict | None = None) -> int:
    """Replay the lookups of `traj` that would ground an item of `expected` under the cheap rule, and
    record, per lookup, the values each world showed (metadata[COUNTERFACTUAL]). Returns the replays."""
    opts = opts or {}
    items = [e for e in (expected if isinstance(expected, (list, tuple, set, frozenset)) else [expected])
             if not isinstance(e, bool)]
    record, calls = {}, 0
    for i, tool, args, values in kept(traj):
        if not any(shown(e, [(values, args)], question, **opts) for e in items):
            continue
        key = (tool, args)
        if cache is None or key not in cache:
            texts = await worlds.replay(tool, json.loads(args))
            calls += 1
            if cache is not None:
                cache[key] = texts
        texts = cache[key] if cache is not None else texts
        record[str(i)] = [None if t is None else values_of(t) for t in texts]
    traj.metadata[COUNTERFACTUAL] = json.dumps(record, ensure_ascii=False)
    return calls
