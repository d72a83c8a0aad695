"""The company environment: questions about a read-only SQLite company database, answered through the
tools of its FastMCP server.

    env = environment("company")        # server.py over streamable HTTP on a free local port, per use
    env = environment("python mcp_server.py --db X")   # the same environment over stdio, on database X

What it holds (mcp_rl.environment.Environment): the server (server.py; the repository's mcp_server.py
runs it), its database builder (build_db.py, data/company.db), the grounded question templates
(templates.py) and their tasks (data/scenarios.jsonl), demonstrations that replay a task's reference
query with the server's tool names, and counterfactual worlds: perturbed copies of the database
served by the same server code, on which a right answer's lookups are replayed (mcp_rl.rewards.counterfactual).
"""

from __future__ import annotations

import functools
import shlex
import sys
from pathlib import Path
from typing import Any

from mcp_rl.tasks.demonstrations import sql_plan
from mcp_rl.environment import Environment

NAME = "company"
HERE = Path(__file__).resolve().parent
SCRIPT = HERE.parents[2] / "mcp_server.py"  # the repository's entry point: it runs server.py
SCENARIOS = HERE.parents[2] / "data" / "scenarios.jsonl"
# A task's demonstration with the server's tool names: look at the tables, run the reference query, answer.
PLAN = sql_plan(("run_query", "sql"), list_tables="list_tables", describe=("describe_table", "table_name"))


def command(db: str | Path | None = None) -> list[str]:
    """argv that runs the company server (add --transport/--port for HTTP; HttpServer does)."""
    if not SCRIPT.exists():
        raise FileNotFoundError(f"{SCRIPT} is missing: install mcp-rl from a checkout (pip install -e .)")
    return [sys.executable, str(SCRIPT), *(["--db", str(db)] if db else [])]


def worlds(db: str | Path | None = None, *, k: int = 4, seed: int = 0):
    """K counterfactual worlds of the database `db` (data/company.db), each served by server.py's code."""
    from mcp_rl.rewards.counterfactual import SQLiteWorlds

    from .build_db import DEFAULT_PATH
    from .server import CompanyDB, build_server

    path = Path(db) if db else DEFAULT_PATH
    if not path.exists():
        CompanyDB(path).tables()  # builds the file, as the server would on first use
    return SQLiteWorlds(path, build_server, k=k, seed=seed)


def environment(db: str | Path | None = None, *, server: Any = None) -> Environment:
    """The company environment on database `db`, its server started over HTTP per use; `server`: the
    same server already given as a spec (a stdio command line, its FastMCP object), used as it is."""
    from .templates import company_templates

    return Environment(NAME, server=server, command=None if server is not None else command(db),
                       scenarios=SCENARIOS, plan=PLAN, worlds=functools.partial(worlds, db),
                       templates=company_templates)


def _db_of(argv: list[str]) -> str | None:
    """The --db of a command line that runs this repository's mcp_server.py; "" for its default; None
    for any other command (another project's mcp_server.py is another server)."""
    script = next((a for a in argv if a.endswith("mcp_server.py")), None)
    if script is None or not SCRIPT.exists() or Path(script).resolve() != SCRIPT:
        return None
    return next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--db"), "")


def recognise(spec: Any) -> Environment | None:
    """This environment when `spec` names it ('company') or serves it: a command line (str or argv)
    running mcp_server.py, or the FastMCP object server.build_server made; else None."""
    spec = getattr(spec, "spec", spec)  # a ToolSession
    if spec == NAME:
        return environment()
    db = getattr(spec, "company_db", None)  # a FastMCP object made by server.build_server
    if db is not None:
        return environment(db, server=spec)
    argv = spec
    if isinstance(spec, str):
        try:
            argv = shlex.split(spec)
        except ValueError:
            return None
    if not isinstance(argv, (list, tuple)):
        return None
    db = _db_of([str(a) for a in argv])
    return None if db is None else environment(db or None, server=spec)


__all__ = ["NAME", "PLAN", "command", "worlds", "environment", "recognise"]
