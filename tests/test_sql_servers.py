"""Grounded scenarios through SQL servers other than ours (mcp_rl/tasks/context.py, grounded.py, sqlresults.py).

    .venv/bin/python -m pytest tests/test_sql_servers.py -q

Two kinds of server, both real MCP servers over a copy of the company database:
the reference `mcp-server-sqlite` (PyPI) over stdio, which needs `mcp<2` and so
lives in a venv of its own that `make install` builds (tests/sqlite_server.txt); and small in-memory FastMCP
servers, one per result format (JSON, rows/columns JSON, nested JSON, Python
repr, Markdown, CSV, mcp-alchemy's numbered `key: value` records), that return errors as plain text and accept only SELECT,
as many real servers do. Every answer is re-checked by sqlite3 on the copy, and
the copy must be byte-identical afterwards: nothing is ever written.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import re
import shutil
import sqlite3
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from fastmcp import FastMCP

from mcp_rl.mcp.connect import ToolSession
from mcp_rl.tasks.context import collect_context, find_sql_tool
from mcp_rl.environments.company.templates import company_templates
from mcp_rl.tasks.generate import generate_to_file
from mcp_rl.tasks.grounded import grounded_scenarios
from mcp_rl.mcp.guard import SideEffectsRefused, ToolPolicy
from mcp_rl.tasks.scenarios import Scenario, load_scenarios

# mcp-server-sqlite 2025.4.25 fails to start on mcp 2 ('Server' object has no attribute 'list_resources').
SQLITE_SERVER_PACKAGES = ["mcp-server-sqlite==2025.4.25", "mcp>=1.2,<2"]
log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def sqlite_server_exe() -> Path:
    """bin/mcp-server-sqlite of the venv `make install` builds beside this one from tests/sqlite_server.txt."""
    exe = Path(sys.prefix) / "mcp-server-sqlite" / "bin" / "mcp-server-sqlite"
    assert exe.is_file(), f"{exe} is missing: run `make install` (it builds that venv from tests/sqlite_server.txt)"
    return exe


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def db_copy(company_db, tmp_path):
    """A private copy of the company database; afterwards it must be byte-identical and alone in its folder."""
    copy = tmp_path / "db" / "company.db"
    copy.parent.mkdir()
    shutil.copyfile(company_db, copy)
    before = digest(copy)
    yield copy
    assert digest(copy) == before, "the server wrote to the database"
    assert [p.name for p in copy.parent.iterdir()] == ["company.db"]  # no journal or WAL left either


def recheck(db: Path, s: Scenario) -> None:
    """The answer equals what sqlite3 itself returns for the scenario's reference SQL."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute(s.reference).fetchall()
    if isinstance(s.answer, list):
        assert sorted(r[0] for r in rows) == sorted(s.answer), s
    else:
        assert len(rows) == 1 and len(rows[0]) == 1, s
        assert rows[0][0] == (pytest.approx(s.answer) if isinstance(s.answer, float) else s.answer), s


class CallLog:
    """The real session, recording which tools are called."""

    def __init__(self, session):
        self.session, self.called = session, []

    def __getattr__(self, name):
        return getattr(self.session, name)

    async def call(self, name, arguments=None):
        self.called.append(name)
        return await self.session.call(name, arguments)


def key(scenarios):
    return [(s.id, s.task, s.answer) for s in scenarios]


_OURS: dict = {}


async def ours(db: Path, n: int, seed: int, share: float = 0.02) -> list[Scenario]:
    """What our own server gives (cached: every copy of the database is the same)."""
    from mcp_server import build_server
    if (n, seed, share) not in _OURS:
        async with ToolSession(build_server(db)) as s:
            _OURS[n, seed, share] = await grounded_scenarios(s, n, seed=seed, max_answer_share=share, templates=company_templates)
    return _OURS[n, seed, share]


# --- mcp-server-sqlite over stdio ---------------------------------------------------

async def test_mcp_server_sqlite_schema_discovery(sqlite_server_exe, db_copy):
    async with ToolSession(f"{sqlite_server_exe} --db-path {db_copy}") as s:
        ctx = await collect_context(s)
    assert ctx.sql_tool == ("read_query", "query") and ctx.is_sql
    with closing(sqlite3.connect(f"file:{db_copy}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        for t in ctx.tables:
            assert t.columns == [(r["name"], r["type"]) for r in conn.execute(f"PRAGMA table_info({t.name})")]
            assert t.rows == conn.execute(f"SELECT COUNT(*) FROM {t.name}").fetchone()[0]
            assert t.samples == [dict(r) for r in conn.execute(f"SELECT * FROM {t.name} LIMIT 3")]
    assert sorted(t.name for t in ctx.tables) == ["departments", "employees", "projects"]


async def test_mcp_server_sqlite_grounded_answers_recheck(sqlite_server_exe, db_copy):
    start = time.monotonic()
    async with ToolSession(f"{sqlite_server_exe} --db-path {db_copy}") as s:
        spy = CallLog(s)
        got = await grounded_scenarios(spy, 2000, seed=0, templates=company_templates)  # more than there are: every template instance
    log.warning("%d grounded scenarios through mcp-server-sqlite in %.1f s", len(got), time.monotonic() - start)
    assert set(spy.called) == {"read_query"}  # never write_query, create_table or append_insight
    assert len(got) > 800 and {"dept_best", "top_paid", "table_rows"} <= {s.id.rsplit("-", 1)[0] for s in got}
    for sc in got:
        recheck(db_copy, sc)
    assert key(got) == key(await ours(db_copy, 2000, seed=0))  # the same questions and answers as our server


async def test_generate_to_file_against_mcp_server_sqlite(sqlite_server_exe, db_copy, tmp_path):
    # What `python -m mcp_rl scenarios --server "<venv>/bin/mcp-server-sqlite --db-path copy.db"
    # --generator grounded` runs: refused (its write tools are not annotated), then with the allowlist.
    spec = f"{sqlite_server_exe} --db-path {db_copy}"
    with pytest.raises(SideEffectsRefused, match="write_query") as refused:
        await generate_to_file(spec, "grounded", 40, tmp_path / "s.jsonl", seed=1, templates=company_templates)
    assert "--tools" in str(refused.value) and not (tmp_path / "s.jsonl").exists()
    written = await generate_to_file(spec, "grounded", 40, tmp_path / "s.jsonl", seed=1, templates=company_templates,
                                     policy=ToolPolicy(allow=["read_query", "list_tables", "describe_table"]))
    assert load_scenarios(tmp_path / "s.jsonl") == written and len(written) == 40
    for sc in written:
        recheck(db_copy, sc)


# --- in-memory servers answering in each format -----------------------------------

def _dicts(header, rows):
    return [dict(zip(header, r)) for r in rows]


def _markdown(header, rows):
    cell = lambda v: "" if v is None else str(v)  # noqa: E731 - tabulate's default for NULL
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows])


def _csv(header, rows):
    out = io.StringIO()
    csv.writer(out).writerows([header, *rows])  # csv writes None as an empty cell
    return out.getvalue()


def _records(header, rows):
    """mcp-alchemy's (SQLAlchemy) `execute_query` text: "N. row" records of `key: value` lines, NULL, a footer."""
    if not rows:
        return "No rows returned"
    cell = lambda v: "NULL" if v is None else str(v)  # noqa: E731
    records = [f"{i}. row\n" + "".join(f"{k}: {cell(v)}\n" for k, v in zip(header, r)) for i, r in enumerate(rows, 1)]
    return "\n".join(records) + f"\nResult: {len(rows)} rows"


def _rows_indented(header, rows):
    """The other record style seen: "Row N:" and indented `key: value` lines, None for NULL."""
    return "\n\n".join(f"Row {i}:\n" + "\n".join(f"  {k}: {v}" for k, v in zip(header, r))
                       for i, r in enumerate(rows, 1)) or "No rows returned"


FORMATS = {
    "json": lambda h, r: json.dumps(_dicts(h, r)),
    "json-columns": lambda h, r: json.dumps({"columns": h, "rows": r, "row_count": len(r)}),
    "json-nested": lambda h, r: json.dumps({"success": True, "result": _dicts(h, r)}),
    "repr": lambda h, r: str(_dicts(h, r)),
    "markdown": _markdown,
    "csv": _csv,
    "records": _records,
    "records-indented": _rows_indented,
}


def format_server(db: Path, fmt: str, refuse: str = r"^(?!\s*SELECT\b)") -> FastMCP:
    """A read-only SQL server that answers in `fmt` and, like many, sends errors back as plain results."""
    mcp = FastMCP(f"sql-{fmt}")

    @mcp.tool
    def execute_query(query: str) -> str:
        """Run one SELECT statement on the database."""
        if re.search(refuse, query, re.I):
            return "Error: this statement is not allowed"
        try:
            with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
                cur = conn.execute(query)
                return FORMATS[fmt]([d[0] for d in cur.description], cur.fetchall())
        except sqlite3.Error as e:
            return f"Database error: {e}"
    return mcp


@pytest.mark.parametrize("fmt", FORMATS)
async def test_grounded_through_a_server_answering_in(fmt, db_copy):
    async with ToolSession(format_server(db_copy, fmt)) as s:
        got = await grounded_scenarios(s, 300, seed=5, templates=company_templates)
    assert len(got) == 300 and key(got) == key(await ours(db_copy, 300, seed=5))
    for sc in got:
        recheck(db_copy, sc)


async def test_a_record_format_server_is_a_sql_server(db_copy):
    """mcp-alchemy-style results were read as no table, so the server was reported to have no SQL tool."""
    async with ToolSession(format_server(db_copy, "records")) as s:
        ctx = await collect_context(s)
    assert ctx.sql_tool == ("execute_query", "query") and ctx.is_sql and ctx.sql_problem is None
    assert sorted(t.name for t in ctx.tables) == ["departments", "employees", "projects"]
    with closing(sqlite3.connect(f"file:{db_copy}?mode=ro", uri=True)) as conn:
        conn.row_factory = sqlite3.Row
        departments = next(t for t in ctx.tables if t.name == "departments")
        assert departments.samples == [dict(r) for r in conn.execute("SELECT * FROM departments LIMIT 3")]


async def test_a_server_in_an_unread_format_is_named_with_what_came_back(db_copy):
    mcp = FastMCP("yaml-ish")

    @mcp.tool
    def execute_query(query: str) -> str:
        """Run one SELECT statement."""
        return "rows:\n  - mcp_rl_probe = 1\n  - (end)\n  - more"

    async with ToolSession(mcp) as s:
        with pytest.raises(ValueError) as e:
            await grounded_scenarios(s, 10, seed=0, templates=company_templates)
    message = str(e.value)
    assert "need a SQL server" in message and "execute_query's answer to SELECT 1: cannot read this SQL result" in message
    assert "not JSON, Python-repr rows, a pipe/Markdown table, CSV or numbered `key: value` records" in message
    assert "it begins 'rows:\\n  - mcp_rl_probe = 1\\n  - (end)'" in message and "more" not in message


async def test_a_refused_template_is_skipped_with_a_warning(db_copy, caplog):
    async with ToolSession(format_server(db_copy, "json", refuse=r"^(?!\s*SELECT\b)|\bWITH\b")) as s:
        with caplog.at_level(logging.WARNING, logger="mcp_rl.tasks.grounded"):
            # Uncapped (max_answer_share=1): under the answer cap, dept_best's missing answers would
            # let other templates' department names in, and the two lists would differ by more.
            got = await grounded_scenarios(s, 2000, seed=0, max_answer_share=1, templates=company_templates)
    assert "skipping template dept_best" in caplog.text
    expected = [k for k in key(await ours(db_copy, 2000, seed=0, share=1)) if not k[0].startswith("dept_best-")]
    assert key(got) == expected


@pytest.mark.parametrize("tools, found", [
    ([("write_query", "query"), ("read_query", "query")], ("read_query", "query")),
    ([("write_query", "query"), ("create_table", "query"), ("lookup", "sql")], ("lookup", "sql")),
    ([("write_query", "query"), ("insert_rows", "sql")], None),
    ([("search", "query")], ("search", "query")),   # a guess; collect_context then finds it answers no SQL
])
def test_find_sql_tool_never_picks_a_write_tool(tools, found):
    schemas = [{"type": "function", "function": {"name": n, "parameters": {"properties": {a: {"type": "string"}}}}}
               for n, a in tools]
    assert find_sql_tool(schemas) == found


async def test_an_unreadable_result_skips_one_question_not_the_run(db_copy, monkeypatch):
    """A server that answered one reference query with a notice ("Query interrupted; try a smaller
    query") aborted the whole run, losing every scenario computed so far (found by review)."""
    from mcp_rl.tasks import grounded

    real, calls = grounded._reference_rows, []

    async def flaky(session, sql, tool):
        calls.append(sql)
        if len(calls) == 1:
            raise ValueError("cannot read this SQL result as a table: 'Query interrupted; try a smaller query'")
        return await real(session, sql, tool)

    monkeypatch.setattr(grounded, "_reference_rows", flaky)
    async with ToolSession(format_server(db_copy, "json")) as s:
        got = await grounded_scenarios(s, 20, seed=0, templates=company_templates)
    assert len(got) == 20 and len(calls) > 20


async def test_a_search_tool_with_a_query_argument_is_no_database():
    """A `query` argument made `find_files` look like SQL: the schema query paged forever over its 60
    paths (found by review). `SELECT 1` must come back as one cell first."""
    mcp = FastMCP("files")
    calls = []

    @mcp.tool(annotations={"readOnlyHint": True})
    def find_files(query: str) -> list[str]:
        """Find files whose name matches a query."""
        calls.append(query)
        return [f"src/mod{i}.py" for i in range(60)]

    async with ToolSession(mcp, policy=ToolPolicy()) as s:
        ctx = await collect_context(s)
    assert not ctx.is_sql and len(calls) == 1


async def test_a_table_the_server_refuses_is_left_out_not_the_schema():
    """One table off limits made the whole server 'non-SQL' (found by review)."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.executescript("CREATE TABLE orders(id INTEGER PRIMARY KEY, item TEXT); INSERT INTO orders(item) VALUES ('pen');"
                     "CREATE TABLE api_keys(id INTEGER PRIMARY KEY, key TEXT);")
    mcp = FastMCP("shop")

    @mcp.tool(annotations={"readOnlyHint": True})
    def run_query(sql: str) -> str:
        """Run a read-only SQL query. The api_keys table is off limits."""
        if re.search(r"\bapi_keys\b", sql):
            return "Error: access to table api_keys is denied"
        cur = db.execute(sql)
        return json.dumps([dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()])

    async with ToolSession(mcp, policy=ToolPolicy()) as s:
        ctx = await collect_context(s)
    assert ctx.is_sql and [t.name for t in ctx.tables] == ["orders"] and ctx.tables[0].rows == 1
