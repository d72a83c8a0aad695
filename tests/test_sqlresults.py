"""Tests for mcp_rl/tasks/sqlresults.py: reading SQL results in the formats real MCP servers return.

    .venv/bin/python -m pytest tests/test_sqlresults.py -q

Table-driven: each case is a server's text and the (header, rows) it must give.
The Python-repr cases are what mcp-server-sqlite really printed (see
tests/test_sql_servers.py, which runs it); the pipe-table cases include
mcp_server.py's own format_table output.
"""

from __future__ import annotations

import pytest

from mcp_rl.tasks.sqlresults import TruncatedResult, error_text, number_or_text, parse_table
from mcp_server import format_table

CASES = {
    # mcp_server.py's own table text
    "ours": (format_table(["id", "name", "bonus"], [(1, "Ada", 1.5), (2, "Bo, Jr.", None)], 200),
             ["id", "name", "bonus"], [[1, "Ada", 1.5], [2, "Bo, Jr.", None]]),
    "ours, one column": (format_table(["COUNT(*)"], [(150,)], 200), ["COUNT(*)"], [[150]]),
    "ours, empty": (format_table(["name"], [], 200), ["name"], []),
    "ours, empty strings": (format_table(["a", "b"], [("x", ""), ("", "")], 200), ["a", "b"], [["x", ""], ["", ""]]),
    "ours, one empty cell": (format_table(["n"], [("",), (3,)], 200), ["n"], [[""], [3]]),
    "psql": (" id | name \n----+------\n  1 | Ada\n  2 | Bo\n(2 rows)", ["id", "name"], [[1, "Ada"], [2, "Bo"]]),
    # Markdown: alignment rows, empty cells as NULL, escaped pipes, with and without the outer pipes
    "markdown": ("| id | name | score |\n|:---|:----:|------:|\n| 1 | Ada | 9.5 |\n| 2 |  | NULL |",
                 ["id", "name", "score"], [[1, "Ada", 9.5], [2, None, None]]),
    "markdown, escaped pipe": ("| expr |\n| --- |\n| a \\| b |", ["expr"], [["a | b"]]),
    "markdown, no outer pipes": ("a | b\n--- | ---\n1 | x", ["a", "b"], [[1, "x"]]),
    "markdown, empty": ("| a | b |\n|---|---|", ["a", "b"], []),
    "grid": ("+----+------+\n| id | name |\n+====+======+\n|  1 | Ada  |\n+----+------+\n|  2 | Bo   |\n+----+------+",
             ["id", "name"], [[1, "Ada"], [2, "Bo"]]),
    # JSON
    "json objects": ('[{"id": 1, "name": "Ada", "email": null}, {"id": 2, "name": "Bo", "email": "b@x"}]',
                     ["id", "name", "email"], [[1, "Ada", None], [2, "Bo", "b@x"]]),
    "json, numbers as strings stay strings": ('[{"n": "5", "m": 5, "f": 2.50}]', ["n", "m", "f"], [["5", 5, 2.5]]),
    "json, empty": ("[]", [], []),
    "json, sparse objects": ('[{"a": 1, "b": 2}, {"a": 3}]', ["a", "b"], [[1, 2], [3, None]]),
    "json columns/rows": ('{"columns": ["id", "name"], "rows": [[1, "Ada"], [2, null]], "row_count": 2}',
                          ["id", "name"], [[1, "Ada"], [2, None]]),
    "json column objects": ('{"columns": [{"name": "n", "type": "int"}], "rows": [[7]]}', ["n"], [[7]]),
    "json columns, object rows": ('{"fields": ["a"], "data": [{"a": 1}]}', ["a"], [[1]]),
    "json columns, no rows": ('{"columns": ["a", "b"], "rows": []}', ["a", "b"], []),
    "json nested result": ('{"result": [{"x": 1}, {"x": 2}]}', ["x"], [[1], [2]]),
    "json nested twice": ('{"success": true, "data": {"rows": [{"x": "a, b"}]}}', ["x"], [["a, b"]]),
    "json nested, empty": ('{"result": []}', [], []),
    "json one object": ('{"count": 150}', ["count"], [[150]]),
    "json list of lists": ("[[1, 2], [3, 4]]", ["column1", "column2"], [[1, 2], [3, 4]]),
    "json list of values": ('["a", "b"]', ["value"], [["a"], ["b"]]),
    "json lines": ('{"id": 1}\n{"id": 2}', ["id"], [[1], [2]]),
    # Python repr, as str(list_of_dicts) prints it (mcp-server-sqlite)
    "repr": ("[{'name': 'departments'}, {'name': 'employees'}]", ["name"], [["departments"], ["employees"]]),
    "repr, NULL and numbers": ("[{'id': 1, 'budget': 4200000, 'avg': 85000.0, 'email': None}]",
                               ["id", "budget", "avg", "email"], [[1, 4200000, 85000.0, None]]),
    "repr, quotes and commas": ("[{'s': 'a, b', 't': 'it\\'s \"q\"', 'b': b'\\x01'}]", ["s", "t", "b"],
                                [["a, b", "it's \"q\"", b"\x01"]]),
    "repr, empty": ("[]", [], []),
    "repr, negative": ("[{'d': -3, 'e': -0.5}]", ["d", "e"], [[-3, -0.5]]),
    "repr, tuples": ("[(1, 'Ada'), (2, None)]", ["column1", "column2"], [[1, "Ada"], [2, None]]),
    "repr, Decimal and dates": ("[{'p': Decimal('12.50'), 'q': Decimal('3'), 'd': datetime.date(2020, 1, 2), "
                                "'t': datetime.datetime(2020, 1, 2, 3, 4, 5)}]", ["p", "q", "d", "t"],
                                [[12.5, 3, "2020-01-02", "2020-01-02 03:04:05"]]),
    "repr nested": ("{'result': [{'n': 1}]}", ["n"], [[1]]),
    # CSV and TSV
    "csv": ('id,name,city\n1,"Smith, J",Oslo\n2,"say ""hi""",\n', ["id", "name", "city"],
            [[1, "Smith, J", "Oslo"], [2, 'say "hi"', None]]),
    "csv, NULL and codes": ("code,n,x\n007,1.25,NULL\n", ["code", "n", "x"], [["007", 1.25, None]]),
    "csv, one column": ("COUNT(*)\n150", ["COUNT(*)"], [[150]]),
    "csv, one column of names": ("name\nAda\nBo", ["name"], [["Ada"], ["Bo"]]),
    "csv, CRLF": ("a,b\r\n1,2\r\n", ["a", "b"], [[1, 2]]),
    "tsv": ("a\tb\n1\tx, y", ["a", "b"], [[1, "x, y"]]),
    # numbered records of `key: value` lines: mcp-alchemy (SQLAlchemy) prints "N. row" records, NULL, a footer
    "records": ("1. row\nid: 1\nname: Engineering\nbudget: 1200000\n\n2. row\nid: 2\nname: Sales\nbudget: NULL\n\n"
                "Result: 2 rows", ["id", "name", "budget"], [[1, "Engineering", 1200000], [2, "Sales", None]]),
    "records, values with colons and spaces": ("1. row\nstarted: 2024-03-15T14:30:00\nurl: http://x/y\nnote: \n"
                                               "avg: 85000.0\nCOUNT(*): 3\n\nResult: 1 rows",
                                               ["started", "url", "note", "avg", "COUNT(*)"],
                                               [["2024-03-15T14:30:00", "http://x/y", "", 85000.0, 3]]),
    "records, a link after the footer": ("1. row\nn: 7\n\nResult: 1 rows\nFull result set url: https://x/f.json",
                                         ["n"], [[7]]),
    "records, no rows": ("No rows returned", [], []),
    "records, Row N: indented, None": ("Row 1:\n  id: 1\n  name: Ada\n\nRow 2:\n  id: 2\n  name: None",
                                       ["id", "name"], [[1, "Ada"], [2, None]]),
    "records, duplicate keys": ("1. row\nid: 1\nid: 10", ["id", "id"], [[1, 10]]),
    "records, MySQL \\G": ("*************************** 1. row ***************************\n    id: 1\n"
                           "  name: Ada\n1 row in set (0.00 sec)", ["id", "name"], [[1, "Ada"]]),
    # no content at all
    "empty result": ("(empty result)", [], []),
}


@pytest.mark.parametrize("text, header, rows", CASES.values(), ids=CASES.keys())
def test_parse_table_reads_each_format(text, header, rows):
    assert parse_table(text) == (header, rows)


UNREADABLE = {
    "prose": "The query ran fine.",
    "two lines of prose": "Query ran\nno rows came back",
    "broken json": '[{"id": 1}, {"id": ',
    "a set": "{1, 2}",
    "code, never run": "[__import__('os').system('echo pwned')]",
    "a bad Decimal": "[{'p': Decimal('twelve')}]",
    "a scalar": "42",
    "space-aligned columns": "  id  name\n----  ------\n   1  Ada",
    "ragged csv": "a,b\n1,2,3",
    "ragged pipe table": "a | b\n--+--\n1 | 2 | 3",
    "row count disagrees": "a\n-\n1\n(2 rows)",
    "long garbage": "x" * 10_000,
    "a record line that is no key: value": "1. row\nid: 1\nname",
    "records with different keys": "1. row\nid: 1\n\n2. row\nid: 2\nname: x",
    "records out of order": "1. row\nid: 1\n\n3. row\nid: 3",
    "records and a footer that disagree": "1. row\nid: 1\n\nResult: 2 rows",
}


@pytest.mark.parametrize("text", UNREADABLE.values(), ids=UNREADABLE.keys())
def test_parse_table_refuses_what_is_no_table_and_quotes_only_a_prefix(text):
    with pytest.raises(ValueError) as info:
        parse_table(text)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("text, problem", [
    ("The query ran fine.\nSee the log.\nthird\nfourth", "not JSON, Python-repr rows, a pipe/Markdown table, CSV or "
                                                          "numbered `key: value` records"),
    ('[{"id": 1}, {"id": \nmore\nthird\nfourth', "looks like JSON or a Python list but parses as neither"),
    ('{"data": [1, {"b": 2}]}', "JSON (or a Python literal) with no rows in it"),
    ("1. row\nid: 1\nname\nfourth", "in record 1, 'name' is not a `key: value` line"),
])
def test_an_unread_format_is_named_with_the_first_lines_of_what_came_back(text, problem):
    with pytest.raises(ValueError) as info:
        parse_table(text)
    message = str(info.value)
    assert message.startswith("cannot read this SQL result as a table: ") and problem in message
    first = "\n".join(text.strip().splitlines()[:3])
    assert message.endswith(f"it begins {first!r}") and "fourth" not in message


def test_the_quote_of_what_came_back_is_a_short_prefix():
    with pytest.raises(ValueError) as info:
        parse_table("word " * 1000)
    assert "…' (4999 chars)" in str(info.value) and len(str(info.value)) < 300


@pytest.mark.parametrize("text", [
    "1. row\nn: 1\n\n2. row\nn: 2\n\nResult: 40 rows (output truncated)",  # mcp-alchemy's own cap
    format_table(["n"], [(i,) for i in range(5)], 2),      # mcp_server.py's own row cap
    "[{'n': 1}, {'n': 2}, {'n'\n[truncated 120 chars]",    # the client's max_result_chars
])
def test_parse_table_flags_cut_results(text):
    with pytest.raises(TruncatedResult, match="LIMIT/OFFSET"):
        parse_table(text)


@pytest.mark.parametrize("text, is_error", [
    ("Error: Only SELECT queries are allowed for read_query", True),   # mcp-server-sqlite
    ("Database error: no such column: nosuch", True),                  # mcp-server-sqlite
    ("sqlite3.OperationalError: no such table: x", True),
    ('ERROR:  relation "x" does not exist', True),
    ("Query failed: syntax error near FROM", True),
    ("Traceback (most recent call last):\n  File ...", True),
    ('{"error": "no such table: x"}', True),
    ('{"success": false, "message": "denied"}', True),
    (format_table(["error"], [("disk",)], 200), False),               # a column named error
    ("error_count,n\n1,2", False),
    ("[{'error': 'none'}]", False),
    ('{"error": null, "rows": []}', False),
    (format_table(["status"], [("failed: 3",)], 200), False),
    # found by review: these became verified answers ("interrupted", "permission denied ...")
    ('[{"error": "interrupted"}]', True),
    ('{"detail": "permission denied for table orders"}', True),
    ('{"message": "Query timed out"}', True),
    ('{"status": "error", "message": "x"}', True),
    ('[{"status": "active"}]', False),                                 # one row of a status column
    ('[{"id": 1, "message": "hi"}]', False),
])
def test_error_text_spots_errors_sent_as_results(text, is_error):
    assert (error_text(text) is not None) is is_error


@pytest.mark.parametrize("rows, shape, answer", [
    ([["None"]], "scalar", None), ([[""]], "scalar", None), ([["NULL"]], "one", None),
    ([["a"], ["null"]], "list", None), ([["42"]], "scalar", 42), ([["Sales"]], "one", "Sales"),
])
def test_a_null_printed_as_text_is_no_answer(rows, shape, answer):
    """An all-NULL aggregate printed as 'None' or an empty cell was stored as the verified answer, and
    the model then rewarded for repeating it (found by review)."""
    from mcp_rl.tasks.grounded import _answer

    assert _answer(rows, shape, None) == answer


@pytest.mark.parametrize("cell, value", [
    ("42", 42), ("-7", -7), ("0", 0), ("3.25", 3.25), ("1e3", 1000.0), ("0.5", 0.5),
    ("007", "007"), ("1,234", "1,234"), ("nan", "nan"), ("Infinity", "Infinity"), ("2020-01-02", "2020-01-02"),
])
def test_number_or_text(cell, value):
    got = number_or_text(cell)
    assert got == value and type(got) is type(value)
