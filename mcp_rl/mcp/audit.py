"""The audit log: every tool call rollouts make, one JSON line each, in `<run>/tool_calls.jsonl`.

    with log_tool_calls("runs/demo/tool_calls.jsonl", phase="eval base"):
        await evaluate(policy, server, scenarios, label="base")   # every call appended
    rows = read_tool_calls("runs/demo/tool_calls.jsonl")
    print(tool_call_table(rows))                                    # calls per tool (report.md)

A row: {"time": ISO-8601 UTC, "phase", "scenario", "tool", "args": the arguments as JSON cut
to `ARG_CHARS`, "args_chars": their full length, "error": None or the ToolResult kind,
"ms": duration}. The run folder (`mcp_rl.runs.run`) opens the log around its evaluations, the warm
start and training; rollouts find it through a context variable, so nothing in between passes it
on. Each row is one write, flushed; a process killed mid-write leaves at most a partial last line,
which readers skip and the next writer ends with a newline first. Rows are written from the
event loop: a few microseconds a call against ~1 ms for the cheapest (in-process) tool call
(bench/speed/bench_audit.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

__all__ = ["log_tool_calls", "record_tool_call", "read_tool_calls", "tool_call_table", "TOOL_CALLS", "ARG_CHARS"]

TOOL_CALLS = "tool_calls.jsonl"  # its name in a run folder
ARG_CHARS = 200  # of each call's arguments, as JSON: enough to see what was asked, not a whole blob


class _Writer:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.users, self.lock = path, 0, threading.Lock()
        self.file = open(path, "a+", encoding="utf-8")
        # A killed writer may have left a partial last line; start ours on a line of its own.
        if self.file.tell():
            self.file.seek(self.file.tell() - 1)
            ends_open = self.file.read(1) != "\n"
            self.file.seek(0, 2)
            if ends_open:
                self.file.write("\n")
                self.file.flush()

    def write(self, row: dict) -> None:
        line = json.dumps(row, ensure_ascii=False, default=str) + "\n"
        with self.lock:
            self.file.write(line)
            self.file.flush()


@dataclass(frozen=True)
class _Audit:
    writer: _Writer
    phase: str | None


_CURRENT: contextvars.ContextVar[_Audit | None] = contextvars.ContextVar("mcp_rl_audit", default=None)
_OPEN: dict[Path, _Writer] = {}  # one file handle per path while any context holds it
_OPEN_LOCK = threading.Lock()


@contextlib.contextmanager
def log_tool_calls(path: str | Path | None = None, *, phase: str | None = None) -> Iterator[None]:
    """Append every tool call a rollout makes inside this block to `path`, rows tagged `phase`.

    `path=None` keeps the enclosing block's file and only changes the phase (no-op without one),
    so a pipeline step can name itself without knowing where the run folder is."""
    current = _CURRENT.get()
    if path is None:
        if current is None:
            yield
            return
        token = _CURRENT.set(_Audit(current.writer, phase or current.phase))
        try:
            yield
        finally:
            _CURRENT.reset(token)
        return
    key = Path(path).resolve()
    with _OPEN_LOCK:
        writer = _OPEN.get(key) or _Writer(key)
        _OPEN[key] = writer
        writer.users += 1
    token = _CURRENT.set(_Audit(writer, phase))
    try:
        yield
    finally:
        _CURRENT.reset(token)
        with _OPEN_LOCK:
            writer.users -= 1
            if not writer.users:
                del _OPEN[key]
                writer.file.close()


def _cut(arguments: Any) -> tuple[str, int]:
    try:
        text = json.dumps(arguments, ensure_ascii=False, default=str, separators=(",", ":"))
    except (TypeError, ValueError):
        text = str(arguments)
    return (text if len(text) <= ARG_CHARS else text[:ARG_CHARS] + "…"), len(text)


def record_tool_call(scenario: str | None, tool: str, arguments: Any, error: str | None, seconds: float) -> None:
    """Append one row to the log of the enclosing `log_tool_calls` block (nothing outside one)."""
    audit = _CURRENT.get()
    if audit is None:
        return
    args, n = _cut(arguments)
    audit.writer.write({
        "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "phase": audit.phase, "scenario": None if scenario is None else str(scenario)[:200], "tool": tool[:200], "args": args, "args_chars": n,
        "error": error, "ms": round(seconds * 1000, 2),
    })


def read_tool_calls(path: str | Path) -> list[dict]:
    """The rows of a tool-call log; lines that do not parse (a write cut short) are skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "tool" in row:
                rows.append(row)
    return rows


def tool_call_table(rows: list[dict]) -> str:
    """Markdown: calls per tool (most called first), errors by kind, mean and slowest duration.

    >>> print(tool_call_table([{"tool": "q", "error": None, "ms": 2.0}, {"tool": "q", "error": "timeout", "ms": 4.0}]))
    | tool | calls | errors | error kinds | mean ms | max ms |
    |---|---|---|---|---|---|
    | q | 2 | 1 | timeout 1 | 3.0 | 4.0 |
    | **all** | **2** | **1** |  | 3.0 | 4.0 |
    """
    by_tool: dict[str, list[dict]] = {}
    for r in rows:
        by_tool.setdefault(str(r.get("tool")), []).append(r)
    lines = ["| tool | calls | errors | error kinds | mean ms | max ms |", "|---|---|---|---|---|---|"]

    def line(name: str, rs: list[dict], bold: bool = False) -> str:
        kinds: dict[str, int] = {}
        for r in rs:
            if r.get("error"):
                kinds[r["error"]] = kinds.get(r["error"], 0) + 1
        ms = [float(r.get("ms") or 0) for r in rs]
        b = "**" if bold else ""
        kinds_text = "" if bold else ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
        return (f"| {b}{name}{b} | {b}{len(rs)}{b} | {b}{sum(kinds.values())}{b} | {kinds_text} "
                f"| {sum(ms) / len(ms):.1f} | {max(ms):.1f} |")

    for name, rs in sorted(by_tool.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        lines.append(line(name.replace("|", "\\|"), rs))
    if rows:
        lines.append(line("all", rows, bold=True))
    return "\n".join(lines)
