"""Enrichment: what a live MCP server says about itself, for scenario generators.

    async with ToolSession("python mcp_server.py") as s:
        ctx = await collect_context(s)     # tools, resources, real schema + sample rows
        print(ctx.as_text())               # what a scenario generator is shown
        tools = enrich_tools(ctx.tools, ctx)   # SQL tool description + schema

Everything goes through the server's own tools (never a database file), so it
works for any MCP server that exposes SQL: a tool named like run_query /
execute_sql, or any tool with a `sql` / `query` argument. Servers without one
(e.g. mcp-server-time) get tools and resources only. The SQL helpers here
(`run_sql`, `query_table`) are also what mcp_rl/tasks/grounded.py computes answers with;
results are read by mcp_rl/tasks/sqlresults.py (JSON, Python-repr rows, pipe/Markdown
tables, CSV, numbered `key: value` records); a SQL-looking tool whose answers cannot be read is
no SQL tool, and `ServerContext.sql_problem` says why. A result that is an error in disguise
("Error: ...") counts as a refusal. On SQLite the schema comes from sqlite_master and PRAGMA table_info
(or SELECT ... FROM pragma_table_info for servers that only accept SELECT),
elsewhere from information_schema.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from mcp_rl.quote import short
from mcp_rl.tasks.sqlresults import TruncatedResult, error_text, number_or_text, parse_table

log = logging.getLogger(__name__)

SQL_TOOL_NAMES = ("run_query", "query", "execute_sql", "run_sql", "sql", "execute_query", "read_query")
SQL_ARG_NAMES = ("sql", "query")
# A tool named like these changes the database; never pick it to read (mcp-server-sqlite has
# write_query and create_table, both with a `query` argument, next to read_query).
_WRITES = re.compile(r"write|insert|update|delete|create|drop|alter|append|modify", re.I)
_SNAKE = re.compile(r"(?<![\w/.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/-])")
_TICKED = re.compile(r"`([A-Za-z_][\w.]*)`")
_THE_TABLE = re.compile(r"\bthe\s+[`'\"]?([A-Za-z_]\w*)[`'\"]?\s+table\b", re.I)
_TOOL_REF = re.compile(r"\b([A-Za-z]\w*_\w+)\s+(?:tool|function)\b|\b(?:tool|function)\s+[`'\"]?([A-Za-z]\w*_\w+)")
# Words that fill "the ___ table" in plain English without naming one.
_TABLE_FILLERS = {"following", "same", "above", "below", "resulting", "result", "results", "final", "summary",
                  "whole", "entire", "first", "second", "last", "other", "one", "each", "every", "that", "this",
                  "which", "right", "correct", "relevant", "appropriate", "main", "output", "pivot"}


class SQLToolError(RuntimeError):
    """The server's SQL tool refused a query; the message is the server's own text."""


@dataclass
class Table:
    name: str
    columns: list[tuple[str, str]]          # (name, declared type)
    rows: int | None = None
    samples: list[dict] = field(default_factory=list)


@dataclass
class ServerContext:
    """What a scenario generator should know about a server, read from the server itself."""

    tools: list[dict]                       # OpenAI function schemas
    resources: list[dict] = field(default_factory=list)   # {"uri", "name", "text"}
    tables: list[Table] = field(default_factory=list)     # [] for non-SQL servers
    sql_tool: tuple[str, str] | None = None               # (tool name, SQL argument name)
    sql_problem: str | None = None                        # why sql_tool was found but gave no schema

    @property
    def is_sql(self) -> bool:
        return self.sql_tool is not None and bool(self.tables)

    def schema_line(self, t: Table) -> str:
        cols = ", ".join(f"{c} {ty}".strip() for c, ty in t.columns)
        return f"{t.name}({cols})" + (f" -- {t.rows} rows" if t.rows is not None else "")

    def as_text(self, max_resource_chars: int = 1500) -> str:
        """A plain-text briefing for a generator prompt: tools, real schema, sample rows, resources."""
        out = ["TOOLS:"]
        for t in self.tools:
            f = t.get("function", t)
            args = ", ".join(f.get("parameters", {}).get("properties", {}))
            out.append(f"- {f['name']}({args}): {' '.join(str(f.get('description', '')).split())[:300]}")
        if self.tables:
            out.append("\nDATABASE SCHEMA (read from the server; these are the only tables and columns):")
            for t in self.tables:
                out.append("- " + self.schema_line(t))
                out += [f"    sample row: {json.dumps(r, ensure_ascii=False, default=str)}" for r in t.samples]
        for r in self.resources:
            out.append(f"\nRESOURCE {r['uri']} ({r.get('name', '')}):\n{r.get('text', '')[:max_resource_chars]}")
        return "\n".join(out)

    def vocabulary(self) -> set[str]:
        """Every identifier the server shows anywhere (tools, schema, samples, resources), lowercased."""
        text = json.dumps(self.tools) + "\n" + self.as_text(max_resource_chars=100_000)
        return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)}

    def validate_task(self, task: str) -> str | None:
        """Why a generated task names something the server lacks, or None if it looks fine.

        Conservative on purpose: only words that can only be identifiers are checked
        (snake_case words like `hire_date`, `backticked` names, "the X table", "the x_y tool"),
        and a word counts as real if it appears anywhere the server describes itself
        (so values such as 'on_hold' from a CHECK constraint pass). Plain English words
        ("salary", "projects") are never rejected: they may be ordinary language.
        """
        known = self.vocabulary()
        tables = {t.name.lower() for t in self.tables}
        for m in _TOOL_REF.finditer(task):
            name = (m.group(1) or m.group(2)).lower()
            if name not in known:
                return f"names a tool {name!r} the server does not have"
        for name in _TICKED.findall(task):
            if name.lower().split(".")[-1] not in known:
                return f"names {name!r}, which the server does not have"
        if not self.is_sql:
            return None
        for name in _SNAKE.findall(task):
            if name not in known:
                return f"names {name!r}, which is neither a table nor a column"
        for m in _THE_TABLE.finditer(task):
            word = m.group(1).lower()
            if word in _TABLE_FILLERS:
                continue
            if not {word, word + "s", word.rstrip("s"), word + "es"} & tables:
                return f"names a table {word!r}; the tables are {', '.join(sorted(tables))}"
        return None

    def focus_hint(self, rng) -> str:
        """A per-batch nudge (seeded) so successive generator batches cover different ground."""
        if self.is_sql:
            tables = rng.sample([t.name for t in self.tables], k=min(2, len(self.tables)))
            kind = rng.choice(["counts", "filters on specific values", "averages and totals", "rankings (top 3)",
                               "joins between tables", "date ranges", "missing (NULL) values", "group comparisons"])
            return f"In this batch, favour questions about {' and '.join(tables)} involving {kind}."
        names = [t.get("function", t)["name"] for t in self.tools]
        return f"In this batch, favour tasks that need {rng.choice(names)}." if names else ""


def enrich_tools(tools: list[dict], context: ServerContext) -> list[dict]:
    """Copies of `tools` whose SQL tool description lists the real schema.

    The MCP-RL tutorial's tip: a generator shown only "run_query(sql)" invents
    table names; shown the schema, it asks about tables that exist.
    """
    tools = copy.deepcopy(tools)
    if not context.is_sql:
        return tools
    schema = "; ".join(context.schema_line(t) for t in context.tables)
    for t in tools:
        f = t.get("function", t)
        if f.get("name") == context.sql_tool[0]:
            f["description"] = f"{f.get('description', '')}\nDatabase schema: {schema}".strip()
    return tools


def find_sql_tool(tools: list[dict]) -> tuple[str, str] | None:
    """(tool, argument) of the tool that runs SQL, by name first, then by a `sql`/`query` argument."""
    flat = [t.get("function", t) for t in tools]
    def arg(f):
        props = f.get("parameters", {}).get("properties", {})
        return next((a for a in SQL_ARG_NAMES if a in props), None) or (next(iter(props)) if len(props) == 1 else None)
    for name in SQL_TOOL_NAMES:
        for f in flat:
            if f["name"] == name and arg(f):
                return f["name"], arg(f)
    for f in flat:
        props = f.get("parameters", {}).get("properties", {})
        if _WRITES.search(f["name"]):
            continue
        for a in SQL_ARG_NAMES:
            if a in props:
                return f["name"], a
    return None


async def query_table(session, sql: str, sql_tool: tuple[str, str] = ("run_query", "sql")):
    """(header, rows) of `sql`, run through the server's own SQL tool; SQLToolError with the server's words."""
    result = await session.call(sql_tool[0], {sql_tool[1]: sql})
    if result.is_error or error_text(result.text):
        # Many servers (mcp-server-sqlite among them) return their errors as ordinary text.
        raise SQLToolError(f"{sql_tool[0]} refused {short(sql, 200)}: {result.text[:500]}")
    return parse_table(result.text)


async def run_sql(session, sql: str, sql_tool: tuple[str, str] = ("run_query", "sql")) -> list[list[Any]]:
    """Rows of `sql` (see query_table)."""
    return (await query_table(session, sql, sql_tool))[1]


async def run_sql_all(session, sql: str, sql_tool: tuple[str, str], page: int = 50,
                      max_pages: int = 1000) -> list[list[Any]]:
    """All rows of `sql`, fetched in pages so no result is cut by the server's or client's size limits
    (a page that still comes back cut is fetched again at half the size)."""
    rows: list[list[Any]] = []
    for _ in range(max_pages):
        try:
            chunk = await run_sql(session, f"SELECT * FROM ({sql}) LIMIT {page} OFFSET {len(rows)}", sql_tool)
        except TruncatedResult:
            if page == 1:
                raise
            page //= 2
            continue
        if len(chunk) > page:  # a tool that ignores LIMIT (a search tool) would page forever
            raise ValueError(f"{sql_tool[0]} returned {len(chunk)} rows for LIMIT {page}: it does not run SQL")
        rows += chunk
        if len(chunk) < page:
            return rows
    raise ValueError(f"{sql_tool[0]}: still more rows after {max_pages} pages of {sql[:60]!r}")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _columns(session, sql_tool, table: str) -> list[tuple[str, str]]:
    """(name, type) of a SQLite table's columns, by whichever form the server accepts."""
    # PRAGMA first: servers that guard SQLite with an authorizer (as mcp_server.py does)
    # see the table-valued pragma_table_info() as a schema write; servers that accept only
    # statements starting with SELECT (mcp-server-sqlite) refuse PRAGMA but take the other.
    last: Exception | None = None
    for sql in (f"PRAGMA table_info({quote_ident(table)})",
                "SELECT cid, name, type FROM pragma_table_info('" + table.replace("'", "''") + "')"):
        try:
            header, rows = await query_table(session, sql, sql_tool)
        except (SQLToolError, ValueError) as e:
            last = e
            continue
        n, ty = (header.index("name"), header.index("type")) if {"name", "type"} <= set(header) else (1, 2)
        return [(r[n], r[ty] or "") for r in rows]
    raise last


async def _answers_sql(session, sql_tool) -> str | None:
    """None when the tool runs SQL (`SELECT 1 AS mcp_rl_probe` comes back as exactly that one cell), else why not.
    A `query` argument alone does not make a database (search tools have one too)."""
    try:
        header, rows = await query_table(session, "SELECT 1 AS mcp_rl_probe", sql_tool)
    except Exception as e:  # noqa: BLE001 - whatever a non-SQL tool does with SQL, it is no database
        log.info("%s does not answer SQL (%s)", sql_tool[0], str(e)[:200])
        return f"{sql_tool[0]}'s answer to SELECT 1: {str(e)[:300]}"
    if header == ["mcp_rl_probe"] and len(rows) == 1 and str(rows[0][0]).strip() == "1":
        return None
    return (f"{sql_tool[0]} answered SELECT 1 AS mcp_rl_probe with {short(str(rows[:2]), 80)} "
            f"under {short(str(header), 80)}")


async def _schema(session, sql_tool) -> list[Table]:
    tables = await _schema_rows(session, sql_tool)
    if not all(isinstance(t.name, str) and all(isinstance(c, str) for c, _ in t.columns) for t in tables):
        raise ValueError("the schema query returned names that are not text")
    return tables


async def _schema_rows(session, sql_tool) -> list[Table]:
    try:  # SQLite
        names = [r[0] for r in await run_sql_all(session, "SELECT name FROM sqlite_master WHERE type = 'table' "
                                                          "AND name NOT LIKE 'sqlite_%' ORDER BY name", sql_tool)]
    except (SQLToolError, ValueError):  # Postgres, MySQL, DuckDB ...
        rows = await run_sql_all(session, "SELECT table_name, column_name, data_type FROM information_schema.columns "
                                          "WHERE table_schema NOT IN ('information_schema', 'pg_catalog') "
                                          "ORDER BY table_name, ordinal_position", sql_tool)
        by: dict[str, list] = {}
        for t, c, ty in rows:
            by.setdefault(t, []).append((c, ty or ""))
        return [Table(t, cols) for t, cols in by.items()]
    if not all(isinstance(n, str) for n in names):
        raise ValueError("the schema query returned table names that are not text")
    tables = []
    for n in names:
        try:
            tables.append(Table(n, await _columns(session, sql_tool, n)))
        except (SQLToolError, ValueError) as e:  # one table the server refuses: the others stay
            log.warning("table %s left out of the context: %s", n, str(e)[:200])
    return tables


async def collect_context(session, *, sample_rows: int = 3, max_resource_chars: int = 8000) -> ServerContext:
    """Tools, resources and (for SQL servers) the real schema with row counts and sample rows."""
    tools = await session.openai_tools()
    resources = []
    try:
        listed = await session.list_resources()
    except Exception as e:  # noqa: BLE001 - resources are optional context; tools are what matters
        log.warning("could not list resources: %s", e)
        listed = []
    for r in listed:
        uri = str(getattr(r, "uri", None) or r.get("uri"))
        try:
            text = (await session.read_resource(uri))[:max_resource_chars]
        except Exception as e:  # noqa: BLE001
            log.warning("could not read resource %s: %s", uri, e)
            continue
        resources.append({"uri": uri, "name": getattr(r, "name", "") or "", "text": text})
    ctx = ServerContext(tools=tools, resources=resources, sql_tool=find_sql_tool(tools))
    if ctx.sql_tool is None:
        return ctx
    ctx.sql_problem = await _answers_sql(session, ctx.sql_tool)
    if ctx.sql_problem:
        return ctx
    try:
        tables = await _schema(session, ctx.sql_tool)
    except Exception as e:  # noqa: BLE001 - it ran SELECT 1 but not a schema query: no schema to give
        log.warning("%s runs SQL but its schema could not be read (%s); treating the server as non-SQL",
                    ctx.sql_tool[0], str(e)[:200])
        ctx.sql_problem = f"{ctx.sql_tool[0]} runs SQL but its schema could not be read: {str(e)[:300]}"
        return ctx
    for t in tables:  # one table the server refuses (permissions) is left out, not the whole schema
        try:
            n = (await run_sql(session, f"SELECT COUNT(*) FROM {quote_ident(t.name)}", ctx.sql_tool))[0][0]
        except (SQLToolError, ValueError, IndexError) as e:
            log.warning("table %s left out of the context: %s", t.name, str(e)[:200])
            continue
        t.rows = number_or_text(n.strip()) if isinstance(n, str) else n
        try:  # samples are a nicety: one odd value (a '|' inside a text cell) must not hide the schema
            header, rows = await query_table(session, f"SELECT * FROM {quote_ident(t.name)} LIMIT {sample_rows}",
                                             ctx.sql_tool)
            t.samples = [dict(zip(header, r)) for r in rows]
        except (SQLToolError, ValueError) as e:
            log.info("no sample rows for %s: %s", t.name, e)
        ctx.tables.append(t)
    return ctx
