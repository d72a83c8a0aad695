"""Grounded scenarios: questions over a SQL server's live schema, answers computed by the server.

    async with ToolSession("python mcp_server.py") as s:
        scenarios = await grounded_scenarios(s, 300, seed=0)

Each template has a difficulty (1-5), tags, several phrasings and a reference
SQL query; its parameters (department names, cities, roles, years, people,
projects) are read live from the database, and each answer is what the
reference query returns through the server's own SQL tool (read by
mcp_rl/tasks/sqlresults.py in whatever format the server answers), never a hard-coded
value. Instances whose answer would be ambiguous (ties for "the highest ...",
NULL, empty or over-long lists) are skipped, so every answer is checkable. Any
SQL server gets the generic templates (row counts, distinct values, extremes);
a database with the company tables and columns adds the rest. A refused query
is retried once as `SELECT * FROM (...)` (mcp-server-sqlite, for one, takes only
statements that start with SELECT), then its template is skipped with a warning.
Instances are drawn round-robin across templates in a seeded order, so a
smaller `n` still covers every kind of question. An instance whose answer is
already common in the split it will land in (`max_answer_share`, mcp_rl/tasks/balance.py)
is passed over, so no constant answer ("1", "Engineering") earns much of a split.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from mcp_rl.tasks.balance import MAX_ANSWER_SHARE, AnswerCap, answer_cap
from mcp_rl.tasks.context import ServerContext, SQLToolError, collect_context, quote_ident, run_sql
from mcp_rl.tasks.scenarios import TEST_SHARE, VAL_SHARE, Scenario, normalize_task, split_of
from mcp_rl.tasks.sqlresults import number_or_text

log = logging.getLogger(__name__)

MAX_LIST = 5

@dataclass
class Template:
    name: str
    difficulty: int
    tags: list[str]
    phrasings: list[str]   # str.format templates over a params dict
    sql: str               # str.format template; string params arrive SQL-quoted as {q_<name>}
    params: list[dict]
    shape: str = "scalar"  # "scalar": one value | "one": one row, a tie means skip | "list": 1..5 rows


def q(value) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def quoted_params(**kw) -> dict:
    """A params dict plus SQL-quoted copies of its strings, as q_<name>."""
    return {**kw, **{f"q_{k}": q(v) for k, v in kw.items() if isinstance(v, str)}}


_NULLS = {"", "none", "null", "nan"}  # how servers print SQL NULL as text (str(None), psql's empty cell)


def _answer(rows: list[list], shape: str, expect: int | None):
    """The checkable answer of a result, or None when it would be ambiguous or empty (a NULL included)."""
    rows = [[None if isinstance(v, str) and v.strip().lower() in _NULLS else v for v in r] for r in rows]
    if shape == "list":
        items = [r[0] for r in rows]
        ok = 0 < len(items) <= MAX_LIST and None not in items and (expect is None or len(items) == expect)
        return items if ok else None
    if len(rows) != 1 or len(rows[0]) != 1 or rows[0][0] is None:
        return None  # "one": several rows means a tie; "scalar": the query was not an aggregate
    v = rows[0][0]
    if shape == "scalar" and isinstance(v, str):  # an aggregate some server sent as text ("150", "85000.00")
        v = number_or_text(v.strip())
    return int(v) if isinstance(v, float) and v.is_integer() else v


def generic_templates(ctx) -> list[Template]:
    """Questions any SQL database supports, from its schema alone."""
    count, distinct, extreme = [], [], []
    for t in ctx.tables:
        count.append(quoted_params(table=t.name, qt=quote_ident(t.name)))
        for c, ty in t.columns:
            base = dict(table=t.name, column=c, qt=quote_ident(t.name), qc=quote_ident(c))
            if "TEXT" in ty.upper() or "CHAR" in ty.upper():
                distinct.append(base)
            elif any(k in ty.upper() for k in ("INT", "REAL", "NUM", "DEC", "FLOAT", "DOUBLE")) and c != "id" and not c.endswith("_id"):
                extreme += [{**base, "fn": "MAX", "word": "largest"}, {**base, "fn": "MIN", "word": "smallest"}]
    return [
        Template("table_rows", 1, ["count"], ["How many rows does the {table} table have?",
                                              "How many records are stored in the {table} table?"],
                 "SELECT COUNT(*) FROM {qt}", count),
        Template("distinct_values", 2, ["count", "distinct"],
                 ["How many distinct values of {column} appear in the {table} table?",
                  "In the {table} table, how many different {column} values are there (ignoring missing ones)?"],
                 "SELECT COUNT(DISTINCT {qc}) FROM {qt}", distinct),
        Template("column_extreme", 2, ["aggregate"], ["What is the {word} {column} in the {table} table?",
                                                      "In {table}, what is the {word} value of {column}?"],
                 "SELECT {fn}({qc}) FROM {qt}", extreme),
    ]


def _id(template: Template, params: dict) -> str:
    # From the template and its parameters, not the phrasing: one question keeps its id,
    # and so its split, however it is worded, so no rewording leaks from train into test.
    key = json.dumps({k: v for k, v in params.items() if not k.startswith("q_")}, sort_keys=True, default=str)
    return f"{template.name}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


async def _reference_rows(session, sql: str, tool) -> tuple[list[list], str]:
    """Rows of a reference query and the SQL that produced them (wrapped in SELECT if it had to be)."""
    try:
        return await run_sql(session, sql, tool), sql
    except SQLToolError:
        if sql.lstrip()[:6].upper() == "SELECT":
            raise
    wrapped = f"SELECT * FROM ({sql})"
    return await run_sql(session, wrapped, tool), wrapped


async def grounded_scenarios(session, n: int, seed: int = 0, max_answer_share: float = MAX_ANSWER_SHARE,
                             templates: Callable[[Any, ServerContext], Awaitable[list[Template]]] | None = None
                             ) -> list[Scenario]:
    """`n` unique scenarios (fewer, with a warning, if the templates run out) with verified answers:
    the generic templates, after an environment's own (`templates(session, ctx)`, e.g.
    mcp_rl.environments.company.templates.company_templates) when given.

    An instance is skipped when, in the split its id will get (`split_of`), it would let one
    constant answer pass more than `max_answer_share` of that split's expected size
    (`mcp_rl.tasks.balance`; at least one task per value), so `n` is filled with other answers.
    """
    ctx = await collect_context(session)
    if not ctx.is_sql:
        raise ValueError("grounded scenarios need a SQL server (a run_query-like tool that answers SELECT); "
                         + (f"none found here ({ctx.sql_problem})" if ctx.sql_problem else "this server has none")
                         + ": use the llm generator instead")
    tool = ctx.sql_tool
    templates = (await templates(session, ctx) if templates else []) + generic_templates(ctx)
    rng = random.Random(seed)
    queues = []
    for t in templates:
        params = list(t.params)
        rng.shuffle(params)
        queues.append((t, params))
    rng.shuffle(queues)
    # Caps from 85% of each split's expected size: common answers are turned away more in the small
    # splits, which so come out below their share, and the final pass (balance_answers, on the real
    # sizes) would otherwise drop what a looser cap let in.
    expected = {"train": n * (1 - VAL_SHARE - TEST_SHARE), "val": n * VAL_SHARE, "test": n * TEST_SHARE}
    cap = AnswerCap({split: answer_cap(int(0.85 * size), max_answer_share) for split, size in expected.items()})
    out: list[Scenario] = []
    seen: set[str] = set()
    refused: set[str] = set()
    failed: set[str] = set()
    while len(out) < n and any(qs for _, qs in queues):
        for t, qs in queues:
            if not qs or len(out) >= n:
                continue
            params = qs.pop()
            task = rng.choice(t.phrasings).format(**params)
            sql = t.sql.format(**params)
            if normalize_task(task) in seen or t.name in refused:
                continue
            try:
                rows, sql = await _reference_rows(session, sql, tool)
            except SQLToolError as e:  # refused twice: the template itself does not suit this server
                if t.name in failed:
                    log.warning("skipping template %s: the server refused its queries twice (%s)", t.name, e)
                    refused.add(t.name)
                else:
                    log.warning("skipping one %s question: the server refused its query (%s)", t.name, e)
                    failed.add(t.name)
                continue
            except ValueError as e:  # a result that reads as no table (a timeout notice, a truncated page)
                log.warning("skipping one %s question: its result could not be read (%s)", t.name, str(e)[:200])
                continue
            answer = _answer(rows, t.shape, params.get("expect"))
            if answer is None or not cap.admit(split_of(_id(t, params)), answer):
                continue
            seen.add(normalize_task(task))
            out.append(Scenario(id=_id(t, params), task=task, difficulty=t.difficulty, answer=answer,
                                reference=sql, tags=list(t.tags)))
    if cap.refused:
        log.info("skipped %d instances whose answer was already common in their split: %s", sum(cap.refused.values()),
                 ", ".join(f"{k!r} x{c}" for k, c in cap.refused.most_common()))
    if len(out) < n:
        log.warning("only %d grounded scenarios available (asked for %d)", len(out), n)
    return out
