"""company-db: a read-only MCP server over the company SQLite database.

Tools: ``list_tables``, ``describe_table``, ``run_query``; resource
``schema://company`` (every CREATE statement). The database (data/company.db) is built by
``build_db.py`` beside this file on first use when the file is missing. The repository's top-level
``mcp_server.py`` runs this module.

Run:
    python mcp_server.py                                   # stdio
    python mcp_server.py --transport http --port 8000      # streamable HTTP on 127.0.0.1:8000/mcp
    MCP_RL_TOKEN=s3cret python mcp_server.py --transport http   # clients must send "Authorization: Bearer s3cret"

Read-only is enforced by SQLite itself, in three layers: the file is opened
with ``mode=ro``, ``PRAGMA query_only=ON``, and an authorizer that allows only
reads. String checks on the SQL would be easy to get around, so there are none.
Each tool is annotated ``readOnlyHint`` (MCP tool annotations), so clients that guard
against side effects (mcp_rl's rollouts do) offer them without an opt-in.

Error messages quote what a client sent only as a short prefix (``SAID_CHARS``): a model
pays in tokens for every character that comes back.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError

DEFAULT_DB = Path(__file__).resolve().parents[3] / "data" / "company.db"  # the repository's data/

TOKEN_ENV = "MCP_RL_TOKEN"
MAX_SQL_CHARS = 20_000
# A result is text sent to an agent that reads at most a few thousand characters: one cell is cut
# at MAX_CELL_CHARS and the table at MAX_RESULT_CHARS, so no query makes the server build gigabytes.
MAX_VALUE_BYTES = 100_000  # SQLite's own limit on one string or blob (it refuses anything longer)
MAX_CELL_CHARS = 1_000
MAX_RESULT_CHARS = 50_000
# PRAGMAs that only describe the schema; they take an object name, never a new value.
READ_ONLY_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"})
_WRITE_ACTIONS = {getattr(sqlite3, n): n.removeprefix("SQLITE_").lower().replace("_", " ") for n in (
    "SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_INDEX",
    "SQLITE_CREATE_VIEW", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_INDEX",
    "SQLITE_CREATE_TEMP_VIEW", "SQLITE_CREATE_TEMP_TRIGGER", "SQLITE_CREATE_VTABLE", "SQLITE_DROP_TABLE",
    "SQLITE_DROP_INDEX", "SQLITE_DROP_VIEW", "SQLITE_DROP_TRIGGER", "SQLITE_DROP_TEMP_TABLE",
    "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_VIEW", "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_VTABLE",
    "SQLITE_ALTER_TABLE", "SQLITE_REINDEX", "SQLITE_ANALYZE")}
_HINT = "run_query takes one read-only SQLite statement: SELECT ... or WITH ... SELECT ..."
SAID_CHARS = 60  # of a name or SQL fragment a client sent, quoted back in an error
# MCP tool annotations: nothing here writes, a call can be repeated, and the world is one file.
READ_ONLY = {"readOnlyHint": True, "destructiveHint": False, "idempotentHint": True, "openWorldHint": False}


def said(text: object, limit: int = SAID_CHARS) -> str:
    """What a client sent, cut for an error message.

    >>> said("staff"), said("x" * 1000, 3)
    ('staff', 'xxx… (1000 chars)')
    """
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


class AgentError(ToolError):
    """A refused or failed request, sent to the client as a tool error.

    Logged at DEBUG only: agents make these mistakes all the time, and they are
    not server faults worth an ERROR line on stderr.
    """

    def __init__(self, message: str):
        super().__init__(message, log_level=logging.DEBUG)


class _Guard:
    """Per-connection authorizer and clock; remembers why it stopped a statement."""

    def __init__(self, timeout_s: float, sql: str = ""):
        self.pragma_table = bool(re.search(r"\bpragma_\w", sql, re.I))  # a table-valued PRAGMA is named
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.denied: str | None = None
        self.timed_out = False

    def authorize(self, action: int, arg1, arg2, _db, _trigger) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and self.pragma_table:
            # SQLite reports a table-valued PRAGMA (SELECT * FROM pragma_table_info('t')) as updates of
            # its catalog while it prepares the function; nothing is written (the connection is mode=ro
            # and query_only, and writable_schema is refused), and the PRAGMA itself is checked below.
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() != "load_extension":
                return sqlite3.SQLITE_OK
            self.denied = "read-only: load_extension() is not allowed"
        elif action == sqlite3.SQLITE_PRAGMA:
            if (arg1 or "").lower() in READ_ONLY_PRAGMAS:
                return sqlite3.SQLITE_OK
            self.denied = (f"read-only: PRAGMA {said(arg1)} is not allowed (allowed: "
                           f"{', '.join(sorted(READ_ONLY_PRAGMAS))}; or use describe_table)")
        elif action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            # VACUUM (and VACUUM INTO) attach a database internally, so they land here too.
            self.denied = "read-only: ATTACH, DETACH and VACUUM are not allowed"
        elif action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            self.denied = "read-only: transactions (BEGIN/COMMIT/SAVEPOINT) are not allowed; each call runs alone"
        else:
            what = _WRITE_ACTIONS.get(action, f"action {action}")
            target = f" on {said(arg1)}" if arg1 else ""
            if str(arg1).startswith("sqlite_"):  # CREATE/DROP write SQLite's own catalog tables
                target = " on the schema"
            self.denied = f"read-only: writes are not allowed ({what}{target}); {_HINT}"
        return sqlite3.SQLITE_DENY

    def progress(self) -> int:
        if time.monotonic() > self.deadline:
            self.timed_out = True
            return 1  # non-zero interrupts the statement
        return 0


class CompanyDB:
    """The database file plus the read-only query machinery (thread-safe)."""

    def __init__(self, path: str | os.PathLike | None = None, *, timeout_s: float = 2.0, max_rows: int = 200):
        if timeout_s <= 0 or max_rows < 1:
            raise ValueError(f"need timeout_s > 0 and max_rows >= 1, got {timeout_s} and {max_rows}")
        self.path = Path(path) if path is not None else DEFAULT_DB
        self.timeout_s = timeout_s
        self.max_rows = max_rows
        self._build_lock = threading.Lock()

    def _ensure(self) -> None:
        if self.path.exists():
            return
        with self._build_lock:
            if not self.path.exists():
                print(f"company-db: building {self.path}", file=sys.stderr)
                from mcp_rl.environments.company.build_db import build_db  # sqlite-utils: only when building

                build_db(self.path)

    def connect(self, guard: _Guard | None = None) -> sqlite3.Connection:
        """A fresh read-only connection (one per call, so concurrent calls share nothing)."""
        self._ensure()
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                               check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA query_only=ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)  # no gigabyte zeroblob()s
        if guard is not None:
            conn.set_authorizer(guard.authorize)
            conn.set_progress_handler(guard.progress, 1000)
        return conn

    def _meta(self, sql: str, args: tuple = ()) -> list[tuple]:
        conn = self.connect()
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def tables(self) -> list[str]:
        return [r[0] for r in self._meta(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self._meta("SELECT * FROM pragma_table_info(?)", (table,))]

    def count(self, table: str) -> int:
        return self._meta(f'SELECT COUNT(*) FROM "{table}"')[0][0]  # table comes from tables()

    def schema(self) -> str:
        rows = self._meta("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                          "ORDER BY type = 'index', rowid")
        return "\n\n".join(r[0].strip() + ";" for r in rows)

    def describe(self, table_name: str) -> str:
        tables = self.tables()
        match = {t.lower(): t for t in tables}.get(table_name.strip().strip('"`[]').lower())
        if match is None:
            raise AgentError(f"no such table: {said(table_name)}; tables are: {', '.join(tables)}")
        cols = self._meta("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?)", (match,))
        fks = {r[3]: (r[2], r[4]) for r in self._meta("SELECT * FROM pragma_foreign_key_list(?)", (match,))}
        lines = [f"table {match}: {self.count(match)} rows", "columns:"]
        for name, ctype, notnull, default, pk in cols:
            bits = [ctype or "ANY", "PRIMARY KEY" if pk else "", "NOT NULL" if notnull and not pk else "",
                    f"DEFAULT {default}" if default is not None else "",
                    f"-> {fks[name][0]}.{fks[name][1]}" if name in fks else ""]
            lines.append(f"  {name} {' '.join(b for b in bits if b)}")
        referenced = [f"{t}.{r[3]}" for t in tables for r in self._meta("SELECT * FROM pragma_foreign_key_list(?)", (t,))
                      if r[2] == match]
        if referenced:
            lines.append(f"referenced by: {', '.join(referenced)}")
        lines.append("definition:\n" + self._meta("SELECT sql FROM sqlite_master WHERE name=?", (match,))[0][0])
        return "\n".join(lines)

    def query(self, sql: str) -> str:
        if not sql or not sql.strip():
            raise AgentError(f"empty SQL: {_HINT}, e.g. SELECT name FROM departments")
        if len(sql) > MAX_SQL_CHARS:
            raise AgentError(f"SQL is {len(sql)} characters; the limit is {MAX_SQL_CHARS}")
        guard = _Guard(self.timeout_s, sql)
        try:
            conn = self.connect(guard)
        except Exception as exc:  # a missing/corrupt file or a failed build: a server fault, said plainly
            raise ToolError(f"cannot open the database {self.path}: {exc}") from None
        try:
            cur = conn.execute(sql)
            if cur.description is None:
                raise AgentError(f"the SQL ran nothing that returns rows (empty or only comments?); {_HINT}")
            header = [d[0] for d in cur.description]
            rows = cur.fetchmany(self.max_rows + 1)
        except sqlite3.Error as exc:
            raise AgentError(self._explain(exc, sql, guard)) from None
        finally:
            conn.close()
        return format_table(header, rows, self.max_rows)

    def _explain(self, exc: sqlite3.Error, sql: str, guard: _Guard) -> str:
        """Turn a SQLite error into a message that says what to fix."""
        # SQLite quotes the offending token ('near "...": syntax error', 'no such column: ...'),
        # which may be most of a 20,000-character statement.
        full = str(exc)
        msg = said(full, 2 * SAID_CHARS)
        if guard.timed_out:
            return (f"query took longer than {guard.timeout_s} s and was stopped; add a LIMIT, "
                    "narrow the joins, or give a recursive CTE a stopping condition")
        if guard.denied:
            return guard.denied
        if "one statement at a time" in full:
            return "only one statement per call: send each statement in its own run_query call"
        if "readonly" in full or "read-only" in full:
            return f"read-only: writes are not allowed; {_HINT}"
        if full.startswith("no such table"):
            return f"{msg}; tables are: {', '.join(self.tables())}"
        if full.startswith("no such column"):
            tables = self.tables()
            used = [t for t in tables if re.search(rf"\b{t}\b", sql, re.I)] or tables
            return msg + " (" + "; ".join(f"columns of {t}: {', '.join(self.columns(t))}" for t in used) + ")"
        if "syntax error" in full or "incomplete input" in full:
            return f"{msg}; {_HINT}"
        return f"SQLite error: {msg}"


def format_table(header: list[str], rows: list[tuple], max_rows: int) -> str:
    """Rows as an aligned ``a | b`` text table, ending with the row count.

    >>> print(format_table(["n"], [(1,), (None,)], 200))
    n
    ----
    1
    NULL
    (2 rows)
    """
    shown = rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [min(40, max([len(h)] + [len(r[i]) for r in cells] + [4 * bool(cells)])) for i, h in enumerate(header)]
    lines = [" | ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(), "-+-".join("-" * w for w in widths)]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    if len(rows) > max_rows:
        lines.append(f"[truncated: showing {max_rows} of at least {len(rows)} rows; add LIMIT/OFFSET or aggregate]")
    else:
        lines.append(f"({len(rows)} row{'s' * (len(rows) != 1)})")
    kept, size = [], 0
    for k, line in enumerate(lines[:-1]):
        if size + len(line) + 1 > MAX_RESULT_CHARS:
            return "\n".join(kept + [f"[truncated at {MAX_RESULT_CHARS} characters: {k - 2} of {len(shown)} rows "
                                      "shown; select fewer columns or rows]"])
        kept.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    text = str(value)
    return text if len(text) <= MAX_CELL_CHARS else f"{text[:MAX_CELL_CHARS]}... [{len(text)} characters]"


def build_server(db_path: str | os.PathLike | None = None, *, timeout_s: float = 2.0, max_rows: int = 200,
                 token: str | None = None) -> FastMCP:
    """The company-db FastMCP server over ``db_path`` (default data/company.db, built if missing).

    ``token``: when set, HTTP clients must send ``Authorization: Bearer <token>``
    (stdio and in-memory clients are not affected: they have no HTTP layer).
    """
    db = CompanyDB(db_path, timeout_s=timeout_s, max_rows=max_rows)
    auth = None
    if token:
        from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
        auth = StaticTokenVerifier(tokens={token: {"client_id": "mcp-rl", "scopes": []}})
    mcp = FastMCP("company-db", auth=auth, instructions=(
        "A read-only SQLite database of a company: departments, employees, projects. "
        "Use list_tables and describe_table to learn the schema, then run_query with one SELECT."))
    mcp.company_db = db.path  # mcp_rl.rewards.counterfactual replays lookups against perturbed copies of this file

    @mcp.tool(annotations=READ_ONLY)
    def list_tables() -> str:
        """List the tables of the company database with their row counts."""
        return "\n".join(f"{t} ({db.count(t)} rows)" for t in db.tables())

    @mcp.tool(annotations=READ_ONLY)
    def describe_table(table_name: str) -> str:
        """Describe one table: its columns with types, primary and foreign keys, row count and CREATE statement.

        Args:
            table_name: a name returned by list_tables, e.g. "employees".
        """
        return db.describe(table_name)

    @mcp.tool(annotations=READ_ONLY, description=(
        "Run ONE read-only SQLite query (SELECT, or WITH ... SELECT) and return the rows as a text table.\n\n"
        "Joins, GROUP BY, window functions and CTEs work. The result is a header line, one line per row "
        f"(NULL for missing values) and a row count. At most {max_rows} rows come back (more are marked "
        f"\"[truncated: ...]\"), and a query is stopped after {timeout_s} s. Writes, ATTACH, PRAGMAs that "
        "change state and several statements in one call are refused with an error saying why."))
    def run_query(sql: str) -> str:
        """Run one read-only query (the tool description above is built with the configured limits).

        Args:
            sql: a single SQLite SELECT statement, e.g. "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 5".
        """
        return db.query(sql)

    @mcp.resource("schema://company", mime_type="text/plain")
    def schema() -> str:
        """The full schema of the company database: every CREATE TABLE and CREATE INDEX statement."""
        return db.schema()

    return mcp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="company-db MCP server (read-only SQLite)")
    parser.add_argument("--db", default=None, help=f"database file, built if missing (default: {DEFAULT_DB})")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default: %(default)s)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV) or None,
                        help=f"bearer token HTTP clients must send (default: ${TOKEN_ENV})")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds one query may run (default: %(default)s)")
    parser.add_argument("--max-rows", type=int, default=200, help="rows returned per query (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        server = build_server(args.db, timeout_s=args.timeout, max_rows=args.max_rows,
                              token=args.token if args.transport == "http" else None)
    except ValueError as exc:
        parser.error(str(exc))
    if args.transport == "stdio":
        server.run(show_banner=False)
    else:
        server.run(transport="http", host=args.host, port=args.port, show_banner=False)


if __name__ == "__main__":
    main()
