"""Reading SQL results out of the text that MCP servers return.

    >>> parse_table("[{'id': 1, 'name': 'Ada'}, {'id': 2, 'name': None}]")   # mcp-server-sqlite
    (['id', 'name'], [[1, 'Ada'], [2, None]])
    >>> parse_table("n | city\\n--+-----\\n3 | Oslo\\n(1 row)")               # mcp_server.py
    (['n', 'city'], [[3, 'Oslo']])
    >>> parse_table("1. row\\nid: 1\\nname: Ada\\n\\n2. row\\nid: 2\\nname: NULL\\n\\nResult: 2 rows")  # mcp-alchemy
    (['id', 'name'], [[1, 'Ada'], [2, None]])
    >>> error_text("Database error: no such column: x")
    'Database error: no such column: x'

Servers answer SQL in many shapes and few mark failures as errors, so
`parse_table` reads, in this order: JSON (a list of objects, rows/columns
objects, results nested under keys such as "result" or "data", one object per
line), Python-repr rows (`str()` of a list of dicts, as the reference
mcp-server-sqlite prints, with Decimal/date values), pipe tables (mcp_server.py's
`format_table`, Markdown with alignment rows, psql/grid borders), CSV (or TSV) and
numbered records of `key: value` lines ("1. row" / "Row 1:" / MySQL's `\\G`, as the
SQLAlchemy-based mcp-alchemy prints, with its "Result: N rows" footer and "No rows returned").
Typed formats keep their types; text formats turn NULL into None (records: None too)
and plain numerals into numbers. Anything else is a ValueError that says what is wrong
and quotes the first lines of the result (a prefix, `mcp_rl.quote.short`).
`error_text` spots the error messages servers return as ordinary results.
"""

from __future__ import annotations

import ast
import csv
import datetime as dt
import decimal
import io
import json
import re
import uuid
from typing import Any

from mcp_rl.quote import short

Table = tuple[list[str], list[list[Any]]]


class TruncatedResult(ValueError):
    """The server or the client cut the result short; page it (LIMIT/OFFSET) or aggregate."""


_ROW_KEYS = ("rows", "data", "records", "results", "result", "items", "values", "output")
_COL_KEYS = ("columns", "column_names", "fields", "headers", "header")
_ERROR_LINE = re.compile(r"^[\w .'-]{0,40}?(?:error|exception|failed|failure)\b[^:\n]{0,40}:|^traceback \(most recent",
                         re.I)
_INT = re.compile(r"[-+]?(?:0|[1-9]\d*)")           # "007" stays text: a code, not a number
_FLOAT = re.compile(r"[-+]?(?:(?:0|[1-9]\d*)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_RULE = re.compile(r"[|+]?[\s:=|+-]*[-=][\s:=|+-]*[|+]?")
_FOOTER = re.compile(r"\((\d+) rows?\)")
# A record's first line: "1. row" (mcp-alchemy), "Row 1:", "Record 1", "*** 1. row ***" (MySQL \G).
_RECORD = re.compile(r"\**\s*(?:(\d+)\s*\.\s*row|(?:row|record)\s*#?\s*(\d+)\s*:?)\s*\**", re.I)
_KEY_VALUE = re.compile(r"\s*([^:\s][^:]*?)\s*:\s?(.*)")
_RECORDS_FOOTER = re.compile(r"(?:result:\s*)?\(?(\d+) rows?(?: in set(?: \([\d.]+ sec\))?)?\)?"
                             r"( \(output truncated\))?\.?", re.I)
_NO_ROWS = re.compile(r"no rows(?: returned| found)?|no results?(?: found)?|empty set|\(?0 rows\)?\.?", re.I)
QUOTE_CHARS = 120  # what an error quotes of a result it cannot read: its first lines, at most this much
_COLUMN_NAME = re.compile(r"[\w$.\"`\[\]]+|\w+\(.*\)")  # what a one-column CSV header may look like


_ERROR_KEYS = {"error", "errors", "message", "detail", "status", "code"}


def error_text(text: str) -> str | None:
    """The error message in a tool result that is an error in disguise, else None.

    Covers "Error: ...", "Database error: ...", "sqlite3.OperationalError: ...",
    "Query failed: ...", tracebacks, and JSON such as {"error": "..."}, [{"error": "..."}],
    {"detail": "..."}, {"status": "error", ...} or {"success": false}.
    """
    text = text.strip()
    if _ERROR_LINE.match(text):
        return text
    if text[:1] in "{[":
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict) \
                and set(data[0]) <= _ERROR_KEYS:  # [{"error": "..."}]: one row that is only an error
            data = data[0]
        if isinstance(data, dict) and (data.get("error") or data.get("errors") or data.get("isError")
                                       or data.get("success") is False or data.get("ok") is False
                                       or str(data.get("status", "")).lower() in ("error", "fail", "failed")
                                       or (data and set(data) <= {"message", "detail"})):
            return str(data.get("error") or data.get("errors") or data.get("message") or data.get("detail") or text)
    return None


def number_or_text(cell: str) -> Any:
    """A text cell as int or float when it is a plain numeral, else the text itself.

    >>> [number_or_text(c) for c in ("42", "-1.5", "1e3", "007", "nan", "1,234")]
    [42, -1.5, 1000.0, '007', 'nan', '1,234']
    """
    if _INT.fullmatch(cell):
        return int(cell)
    if _FLOAT.fullmatch(cell):
        return float(cell)
    return cell


def parse_table(text: str) -> Table:
    """(header, rows) of a SQL tool's text result; ValueError (TruncatedResult if cut) otherwise."""
    text = text.strip()
    lines = text.splitlines()
    if lines and lines[-1].lstrip().startswith("[truncated"):
        raise TruncatedResult(f"the SQL result was truncated ({lines[-1].strip()[:80]}); "
                              "query fewer rows (LIMIT/OFFSET) or aggregate")
    if text == "(empty result)" or _NO_ROWS.fullmatch(text):  # no content at all, or a server's "No rows returned"
        return [], []
    if text[:1] in "[{":  # JSON or Python repr; broken JSON is never CSV
        data = _load(text)
        table = None if data is _NOTHING else _from_data(data)
        problem = ("it looks like JSON or a Python list but parses as neither" if data is _NOTHING else
                   "JSON (or a Python literal) with no rows in it: no list of objects, no columns and rows")
    else:
        try:
            table = _records(lines) or _pipe_table(lines) or _csv_table(text, lines)
        except TruncatedResult:
            raise
        except ValueError as e:  # records or a table that start well and then do not fit
            raise ValueError(f"cannot read this SQL result as a table: {e}; it begins {_begins(lines)}") from None
        problem = "not JSON, Python-repr rows, a pipe/Markdown table, CSV or numbered `key: value` records"
    if table is None:
        raise ValueError(f"cannot read this SQL result as a table: {problem}; it begins {_begins(lines)}")
    return table


def _begins(lines: list[str]) -> str:
    """The first lines of a result, quoted as a prefix, for an error that cannot read it."""
    return short("\n".join(lines[:3]), QUOTE_CHARS)


# --- typed formats: JSON and Python repr -------------------------------------

_NOTHING = object()


def _load(text: str) -> Any:
    for load in (json.loads, _python_literal):
        try:
            return load(text)
        except (ValueError, SyntaxError, TypeError, ArithmeticError, RecursionError, MemoryError):
            pass
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip()[:1] in "[{" for ln in lines):  # one row per line (or per block)
        try:
            rows = [_load(ln) for ln in lines]
        except RecursionError:
            return _NOTHING
        if all(isinstance(r, dict) for r in rows):
            return rows
    return _NOTHING


def _decimal(text: str) -> int | float:
    d = decimal.Decimal(text)
    return int(d) if d == d.to_integral_value() else float(d)


_CALLS = {  # the non-literal values that str() of database rows contains
    "Decimal": _decimal,
    "date": lambda *a: dt.date(*a).isoformat(),
    "datetime": lambda *a: dt.datetime(*a).isoformat(sep=" "),
    "time": lambda *a: dt.time(*a).isoformat(),
    "timedelta": lambda *a: str(dt.timedelta(*a)),
    "UUID": lambda s: str(uuid.UUID(s)),
}


def _python_literal(text: str) -> Any:
    """ast.literal_eval plus the constructor calls in _CALLS; nothing is ever executed."""
    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            if isinstance(v, (int, float)):
                return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Call) and not node.keywords:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in _CALLS:
                return _CALLS[name](*[value(a) for a in node.args])
        raise ValueError(f"not a literal: {ast.dump(node)[:60]}")
    return value(ast.parse(text, mode="eval").body)


def _pick(data: dict, keys) -> Any:
    return next((data[k] for k in keys if isinstance(data.get(k), (list, dict))), None)


def _from_data(data: Any, depth: int = 0) -> Table | None:
    if depth > 4:
        return None
    if isinstance(data, dict):
        cols, rows = _pick(data, _COL_KEYS), _pick(data, _ROW_KEYS)
        if isinstance(cols, list) and isinstance(rows, list):
            header = [c.get("name", c.get("column")) if isinstance(c, dict) else c for c in cols]
            if all(isinstance(r, dict) for r in rows):
                return [str(h) for h in header], [[r.get(h) for h in header] for r in rows]
            if all(isinstance(r, list) and len(r) == len(header) for r in rows):
                return [str(h) for h in header], [list(r) for r in rows]
            return None
        if rows is not None:
            return _from_data(rows, depth + 1)
        if len(data) == 1 and isinstance(next(iter(data.values())), (list, dict)):
            return _from_data(next(iter(data.values())), depth + 1)
        if data and all(not isinstance(v, (list, dict)) for v in data.values()):
            return [str(k) for k in data], [list(data.values())]  # one row as one object
        return None
    if not isinstance(data, list):
        return None
    if not data:
        return [], []
    if all(isinstance(r, dict) for r in data):
        header = list(dict.fromkeys(k for r in data for k in r))  # rows may leave out NULL columns
        return [str(h) for h in header], [[r.get(h) for h in header] for r in data]
    if all(isinstance(r, list) for r in data) and len({len(r) for r in data}) == 1:
        return [f"column{i + 1}" for i in range(len(data[0]))], [list(r) for r in data]
    if all(not isinstance(r, (list, dict)) for r in data):
        return ["value"], [[v] for v in data]
    return None


# --- text formats: pipe tables and CSV -----------------------------------------

def _text_cell(cell: str, empty_is_null: bool) -> Any:
    cell = cell.strip()
    if cell == "NULL" or (empty_is_null and cell == ""):
        return None
    return number_or_text(cell)


def _is_rule(line: str) -> bool:
    return bool(_RULE.fullmatch(line.strip()))


def _pipe_table(lines: list[str]) -> Table | None:
    """mcp_server.py's `a | b` / `--+--` / `(N rows)`, Markdown (`|:--|`), psql and grid tables."""
    while lines and _is_rule(lines[0]):  # a grid table's top border
        lines = lines[1:]
    if len(lines) < 2 or not _is_rule(lines[1]):
        return None
    if "|" not in lines[0] and re.search(r"-\s+-", lines[1].strip()):
        return None  # columns aligned by spaces alone cannot be split safely
    framed = lines[0].strip().startswith("|")  # Markdown / grid: | a | b |

    def cells(line: str) -> list[str]:
        line = line.strip()
        if framed:
            line = line[1:-1] if len(line) > 1 and line.endswith("|") else line[1:]
        return [p.replace("\\|", "|") for p in re.split(r"(?<!\\)\|", line)]
    header = [h.strip() for h in cells(lines[0])]
    rows: list[list[Any]] = []
    for line in lines[2:]:
        if _is_rule(line) or (framed and not line.strip()):
            continue
        footer = _FOOTER.fullmatch(line.strip())
        if footer:
            if int(footer.group(1)) != len(rows):
                raise ValueError(f"the table ends {line.strip()!r} but has {len(rows)} rows")
            break
        row = cells(line)
        if not framed:
            row += [""] * (len(header) - len(row))  # format_table right-strips trailing empty cells
        if len(row) != len(header):
            raise ValueError(f"row {short(line)} has {len(row)} cells, the header {len(header)}")
        rows.append([_text_cell(c, framed) for c in row])
    return header, rows


def _csv_table(text: str, lines: list[str]) -> Table | None:
    if len(lines) < 2:
        return None
    delimiter = "\t" if "\t" in lines[0] and "," not in lines[0] else ","
    try:
        rows = [r for r in csv.reader(io.StringIO(text), delimiter=delimiter, strict=True) if r]
    except csv.Error:
        return None
    header = [h.strip() for h in rows[0]]
    if any(len(r) != len(header) for r in rows) or not all(header):
        return None
    if len(header) == 1 and not _COLUMN_NAME.fullmatch(header[0]):
        return None  # one line of prose over another is not a one-column CSV
    return header, [[_text_cell(c, True) for c in r] for r in rows[1:]]


def _records(lines: list[str]) -> Table | None:
    """Numbered records of `key: value` lines (mcp-alchemy's "1. row", "Row 1:", MySQL's `\\G`), up to a
    "Result: N rows" footer; None when the text does not start with a record, ValueError when it does but
    a line or a record does not fit (a misread table must not become a verified answer)."""
    lines = [ln for ln in lines if ln.strip()]
    if not lines or not _RECORD.fullmatch(lines[0].strip()):
        return None
    records: list[list[tuple[str, Any]]] = []
    numbers: list[int] = []
    for line in lines:
        head = _RECORD.fullmatch(line.strip())
        if head:
            numbers.append(int(head.group(1) or head.group(2)))
            if numbers[-1] != numbers[0] + len(records):
                raise ValueError(f"record {short(line.strip())} is out of order: "
                                 f"expected number {numbers[0] + len(records)}")
            records.append([])
            continue
        footer = _RECORDS_FOOTER.fullmatch(line.strip())
        if footer:
            if footer.group(2):
                raise TruncatedResult(f"the SQL result was truncated ({line.strip()[:80]}); "
                                      "query fewer rows (LIMIT/OFFSET) or aggregate")
            if int(footer.group(1)) != len(records):
                raise ValueError(f"the records end {line.strip()!r} but there are {len(records)}")
            break  # what follows a footer (a link to the full result) is no row
        field = _KEY_VALUE.fullmatch(line)
        if not field:
            raise ValueError(f"in record {numbers[-1]}, {short(line.strip())} is not a `key: value` line")
        value = field.group(2).strip()
        records[-1].append((field.group(1), None if value in ("NULL", "None") else number_or_text(value)))
    header = [k for k, _ in records[0]]
    for n, record in zip(numbers, records):
        if [k for k, _ in record] != header or not header:
            raise ValueError(f"record {n} has the keys {short(', '.join(k for k, _ in record))}; the first "
                             f"has {short(', '.join(header))}")
    return header, [[v for _, v in record] for record in records]
