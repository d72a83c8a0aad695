"""Tests for mcp_rl/tasks/scenarios.py, mcp_rl/tasks/context.py and mcp_rl/tasks/grounded.py.

    .venv/bin/python -m pytest tests/test_scenarios.py -q

Servers are real: the company server in-memory and over stdio, and the
third-party mcp-server-time over stdio. The one test double is the fake
OpenAI-compatible HTTP endpoint on 127.0.0.1 that stands in for the generator
model (a network boundary: no key, no internet in CI). Grounded answers are
re-checked by running each scenario's reference SQL with sqlite3 directly.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mcp_rl.tasks.balance import MAX_ANSWER_SHARE, answer_balance, answer_cap, balance_report
from mcp_rl.mcp.connect import ToolSession
from mcp_rl.tasks.context import collect_context, enrich_tools
from mcp_rl.environments.company.templates import company_templates
from mcp_rl.tasks.generate import ScenarioGenerationError, generate_to_file, llm_scenarios, resolve_generator
from mcp_rl.tasks.grounded import grounded_scenarios
from mcp_rl.tasks.scenarios import Scenario, append_scenarios, load_scenarios, save_scenarios, split_scenarios
from mcp_rl.rewards.verify import verify_answer

ROOT = Path(__file__).resolve().parents[1]
TIME_SERVER = f"{sys.executable} -m mcp_server_time"


@pytest.fixture
def company(company_db):
    from mcp_server import build_server
    return build_server(company_db)


def recheck(db: Path, s: Scenario) -> None:
    """The scenario's answer equals what its reference SQL returns, run by sqlite3 itself."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(s.reference).fetchall()
    if isinstance(s.answer, list):
        assert sorted(r[0] for r in rows) == sorted(s.answer), s
    else:
        assert len(rows) == 1 and len(rows[0]) == 1, s
        assert rows[0][0] == pytest.approx(s.answer) if isinstance(s.answer, float) else rows[0][0] == s.answer, s


# --- the Scenario type, JSONL, splits ------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"id": "", "task": "t"}, "id"),
    ({"id": "a", "task": "  "}, "task"),
    ({"id": "a", "task": "t", "difficulty": 0}, "difficulty"),
    ({"id": "a", "task": "t", "difficulty": 2.5}, "difficulty"),
    ({"id": "a", "task": "t", "split": "dev"}, "split"),
    ({"id": "a", "task": "t", "tags": "count"}, "tags"),
])
def test_scenario_rejects_bad_fields(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Scenario(**kwargs)


def test_save_then_load_round_trips(tmp_path):
    items = [Scenario("a", "How many?", 2, 42, "SELECT 42", ["count"], "train"),
             Scenario("b", "Which?", 3, ["x", "y"], None, [], None)]
    save_scenarios(tmp_path / "s.jsonl", items)
    assert load_scenarios(tmp_path / "s.jsonl") == items
    assert load_scenarios(tmp_path / "s.jsonl", split="train") == items[:1]


@pytest.mark.parametrize("text", [
    "a\u2028b", "a\u2029b", "a\x85b", "a\rb", "a\r\nb", "a\x00b", "a\x0bb", "a\x0cb", "a\x1cb", "a\x1db", "a\x1eb",
    "line one\nline two", "\u2028", "tab\there \ufeff bom",
])
@pytest.mark.parametrize("write", ["save", "append"])
def test_any_text_round_trips(tmp_path, text, write):
    # str.splitlines() breaks at U+2028, U+2029 and U+0085, which JSON leaves unescaped.
    items = [Scenario("a", f"Task {text}?", 2, text, f"SELECT '{text}'", [text], "train"),
             Scenario("b", "after", 1, [text, "y"], None, [], "test")]
    path = tmp_path / "s.jsonl"
    (save_scenarios if write == "save" else append_scenarios)(path, items)
    assert load_scenarios(path) == items


def test_save_is_atomic_on_failure(tmp_path):
    path = tmp_path / "s.jsonl"
    save_scenarios(path, [Scenario("a", "t")])
    before = path.read_text()
    with pytest.raises(TypeError):
        save_scenarios(path, [Scenario("b", "t"), Scenario("c", "t", answer=object())])
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s.jsonl"]  # no temp file left behind


def test_append_adds_lines_even_after_a_cut_off_file(tmp_path):
    path = tmp_path / "s.jsonl"
    append_scenarios(path, [Scenario("a", "t")])
    path.write_text(path.read_text().rstrip("\n"))  # as if a crash ate the newline
    append_scenarios(path, [Scenario("b", "u")])
    assert [s.id for s in load_scenarios(path)] == ["a", "b"]


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "task": "t"}', "", "{not json"], r"s\.jsonl:3: not valid JSON"),
    (['[1, 2]'], r":1: expected a JSON object"),
    (['{"task": "t"}'], r":1: missing fields \['id'\]"),
    (['{"id": "a", "task": "t", "answr": 1}'], r":1: .*unknown fields \['answr'\]"),
    (['{"id": "a", "task": "t", "difficulty": 9}'], r":1: .*difficulty must be an integer 1\.\.5"),
    (['{"id": "a", "task": "t"}', '{"id": "a", "task": "u"}'], r":2: duplicate id 'a' \(first on line 1\)"),
])
def test_load_errors_name_the_line(tmp_path, lines, message):
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=message):
        load_scenarios(path)


def test_load_missing_file_and_bad_split_are_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m mcp_rl scenarios"):
        load_scenarios(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="split must be one of"):
        load_scenarios(tmp_path / "nope.jsonl", split="dev")


def test_splits_are_deterministic_and_stable_under_additions():
    make = lambda k: [Scenario(f"s{i}", "t") for i in range(k)]  # noqa: E731
    first = [s.split for s in split_scenarios(make(500), seed=0)]
    assert first == [s.split for s in split_scenarios(make(500), seed=0)]
    assert first == [s.split for s in split_scenarios(make(800), seed=0)][:500]
    assert first != [s.split for s in split_scenarios(make(500), seed=1)]
    share = {k: first.count(k) / 500 for k in ("train", "val", "test")}
    assert share["test"] == pytest.approx(0.2, abs=0.06) and share["val"] == pytest.approx(0.1, abs=0.05)
    with pytest.raises(ValueError, match="val \\+ test <= 1"):
        split_scenarios(make(1), val=0.6, test=0.6)


# --- enrichment ----------------------------------------------------------------

async def test_collect_context_reads_the_company_schema_in_memory(company):
    async with ToolSession(company) as s:
        ctx = await collect_context(s)
    assert ctx.is_sql and ctx.sql_tool == ("run_query", "sql")
    tables = {t.name: t for t in ctx.tables}
    assert set(tables) == {"departments", "employees", "projects"}
    assert ("hire_date", "TEXT") in tables["employees"].columns and tables["employees"].rows == 150
    assert len(tables["projects"].samples) == 3 and "status" in tables["projects"].samples[0]
    assert [r["uri"] for r in ctx.resources] == ["schema://company"] and "CREATE TABLE" in ctx.resources[0]["text"]
    assert "employees(id INTEGER, name TEXT" in ctx.as_text()


async def test_collect_context_over_stdio(company_db):
    async with ToolSession(f"python {ROOT / 'mcp_server.py'} --db {company_db}") as s:
        ctx = await collect_context(s)
    assert sorted(t.name for t in ctx.tables) == ["departments", "employees", "projects"]


async def test_collect_context_for_a_non_sql_server():
    async with ToolSession(TIME_SERVER) as s:
        ctx = await collect_context(s)
    assert not ctx.is_sql and ctx.tables == []
    assert {t["function"]["name"] for t in ctx.tools} == {"get_current_time", "convert_time"}
    assert "convert_time(source_timezone, time, target_timezone)" in ctx.as_text()
    assert enrich_tools(ctx.tools, ctx) == ctx.tools


async def test_enrich_tools_folds_schema_into_the_sql_tool_only(company):
    async with ToolSession(company) as s:
        ctx = await collect_context(s)
    enriched = {t["function"]["name"]: t["function"]["description"] for t in enrich_tools(ctx.tools, ctx)}
    assert "Database schema: departments(" in enriched["run_query"]
    assert "Database schema" not in enriched["list_tables"]
    assert all("Database schema" not in t["function"]["description"] for t in ctx.tools)  # inputs untouched


@pytest.mark.parametrize("task, bad", [
    ("How many employees were hired in 2020 according to hire_date?", None),
    ("How many projects are on_hold?", None),           # a value from the schema's CHECK, not an invented name
    ("How many people work in the employee table?", None),
    ("List everything in the following table of results.", None),
    ("What is the average salary_band?", "salary_band"),
    ("Which employee_skills are most common?", "employee_skills"),
    ("How many orders are in the customers table?", "customers"),
    ("Use the list_customers tool to count customers.", "list_customers"),
    ("Look up `headcount_history` for 2020.", "headcount_history"),
])
async def test_validate_task_rejects_invented_names(company, task, bad):
    async with ToolSession(company) as s:
        ctx = await collect_context(s)
    reason = ctx.validate_task(task)
    assert (reason is None) if bad is None else (bad in reason)


# --- grounded generation ---------------------------------------------------------

async def test_grounded_scenarios_are_verified_unique_and_varied(company, company_db):
    async with ToolSession(company) as s:
        scenarios = await grounded_scenarios(s, 150, seed=3, templates=company_templates)
    assert len(scenarios) == 150
    assert len({s.task for s in scenarios}) == 150 and len({s.id for s in scenarios}) == 150
    assert {s.difficulty for s in scenarios} == {1, 2, 3, 4, 5}
    assert {"join", "null", "top-k", "date", "group-by", "nested", "three-tables"} <= {t for s in scenarios for t in s.tags}
    assert all(len(s.answer) <= 5 for s in scenarios if isinstance(s.answer, list))
    for s in scenarios:
        recheck(company_db, s)


async def test_grounded_scenarios_are_deterministic_by_seed(company):
    async with ToolSession(company) as s:
        a = await grounded_scenarios(s, 40, seed=0, templates=company_templates)
        b = await grounded_scenarios(s, 40, seed=0, templates=company_templates)
        c = await grounded_scenarios(s, 40, seed=1, templates=company_templates)
    assert a == b
    assert [x.task for x in a] != [x.task for x in c]


async def test_grounded_needs_a_sql_server():
    async with ToolSession(TIME_SERVER) as s:
        with pytest.raises(ValueError, match="use the llm generator"):
            await grounded_scenarios(s, 5)


async def test_generate_to_file_grounded_sets_splits(company, company_db, tmp_path):
    out = tmp_path / "g.jsonl"
    written = await generate_to_file(company, "grounded", 30, out, seed=0)
    loaded = load_scenarios(out)
    assert loaded == written and len(loaded) == 30 and all(s.split for s in loaded)


async def test_generate_to_file_caps_every_answer_per_split(company, tmp_path):
    written = await generate_to_file(company, "grounded", 60, tmp_path / "g.jsonl", seed=0)
    assert len(written) == 60
    for split, rows in balance_report(written).items():
        n = sum(s.split == split for s in written)
        assert rows[0][1] <= answer_cap(n) == 1, (split, rows)


# Constants a policy could answer without looking anything up, from the reward audit (issue
# [reward-integrity]) and from the shapes of the committed answers.
CONSTANTS = ["0", "1", "2", "3", "4", "5", "yes", "no", "Engineering", "Sales", "New York", "300%", "about 100000"]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_committed_scenarios_cap_every_constant_answer(split):
    """No constant answer passes over 2% of the train or test split (one task per value under 50 tasks)."""
    scenarios = load_scenarios(ROOT / "data" / "scenarios.jsonl", split=split)
    answers = [s.answer for s in scenarios]
    cap = answer_cap(len(scenarios), MAX_ANSWER_SHARE)
    assert cap / len(scenarios) <= MAX_ANSWER_SHARE or cap == 1
    value, count, _ = answer_balance(scenarios)[0]
    assert count <= cap, (value, count)
    # The real verifier agrees, for the audit's constants and for every answer given back as one.
    for constant in CONSTANTS + sorted({str(a) for a in answers}) + [v for v, _, _ in answer_balance(scenarios, top=None)]:
        assert sum(verify_answer(constant, a) >= 0.999 for a in answers) <= cap, constant


def test_committed_scenarios_check_out_against_a_fresh_db(company_db):
    scenarios = load_scenarios(ROOT / "data" / "scenarios.jsonl")
    assert len(scenarios) >= 300
    assert len({s.task.lower() for s in scenarios}) == len(scenarios)
    assert [s.split for s in scenarios] == [s.split for s in split_scenarios([Scenario(s.id, s.task) for s in scenarios], seed=0)]
    assert {s.split for s in scenarios} == {"train", "val", "test"}
    for s in scenarios:
        recheck(company_db, s)


# --- LLM generation against a fake OpenAI-compatible endpoint (the only test double) ---

class FakeGenerator:
    """An OpenAI-compatible /chat/completions on 127.0.0.1 that plays a script of replies."""

    def __init__(self, script):
        self.script, self.prompts = list(script), []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.prompts.append(body["messages"][0]["content"])
                step = outer.script.pop(0) if outer.script else ("status", 500)
                if step[0] == "sleep":
                    time.sleep(step[1])
                    step = ("tasks", step[2])
                if step[0] == "status":
                    return self._send(step[1], {"error": {"message": "scripted failure"}})
                # "tasks" answers with as many as were asked for (the schema's minItems); "wrong" with all.
                asked = body["response_format"]["json_schema"]["schema"]["properties"]["scenarios"]["minItems"]
                items = step[1][:asked] if step[0] == "tasks" else step[1]
                content = json.dumps({"scenarios": [{"task": t, "difficulty": 2} for t in items]})
                self._send(200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": content}}]})

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
async def company_ctx(company):
    async with ToolSession(company) as s:
        return await collect_context(s)


@pytest.fixture
def fake():
    made = []
    yield lambda script: made.append(FakeGenerator(script)) or made[-1]
    for f in made:
        f.close()


def tasks(*words):
    return [f"How many employees work in {w}?" for w in words]


async def llm(ctx, gen, n, **kw):
    return await llm_scenarios(ctx, n, generator_model="fake-model", base_url=gen.url, api_key="k",
                               batch_size=2, **kw)


async def test_llm_generation_feeds_the_schema_and_saves_each_batch(company_ctx, fake, tmp_path):
    gen = fake([("tasks", tasks("Sales", "Legal")), ("tasks", tasks("Finance", "Research"))])
    out = tmp_path / "llm.jsonl"
    got = await llm(company_ctx, gen, 4, out_path=out)
    assert [s.task for s in got] == tasks("Sales", "Legal", "Finance", "Research")
    assert all(s.answer is None and s.tags == ["llm"] for s in got) and load_scenarios(out) == got
    assert "employees(id INTEGER" in gen.prompts[0] and "Override requirement 6" in gen.prompts[0]


@pytest.mark.parametrize("first, why", [
    (("wrong", tasks("Sales")), "wrong count"),
    (("wrong", tasks("Sales", "Legal", "Finance")), "wrong count"),
    (("status", 400), "failed call"),
    (("tasks", ["How many rows are in the customers table?", "What is the average salary_band?"]), "invented names"),
    (("tasks", tasks("Sales", "Sales")), "duplicates"),  # one duplicate within the batch: one kept
])
async def test_llm_generation_retries_bad_batches(company_ctx, fake, first, why):
    gen = fake([first, ("tasks", tasks("Finance", "Legal")), ("tasks", tasks("Research", "Ops"))])
    got = await llm(company_ctx, gen, 2, retries=2)
    assert len(got) == 2 and len(gen.prompts) >= 2, why
    assert not any("customers" in s.task or "salary_band" in s.task for s in got)


async def test_llm_generation_retries_after_a_timeout(company_ctx, fake):
    gen = fake([("sleep", 2.0, tasks("Sales", "Legal")), ("tasks", tasks("Finance", "Research"))])
    got = await llm(company_ctx, gen, 2, timeout=0.5)
    assert [s.task for s in got] == tasks("Finance", "Research")


async def test_llm_failure_keeps_earlier_batches_on_disk_and_resumes(company_ctx, fake, tmp_path):
    out = tmp_path / "llm.jsonl"
    gen = fake([("tasks", tasks("Sales", "Legal")), ("status", 400), ("status", 400)])
    with pytest.raises(ScenarioGenerationError, match="got 2 of 4.*rerun to resume") as info:
        await llm(company_ctx, gen, 4, out_path=out, retries=1)
    assert [s.task for s in info.value.scenarios] == tasks("Sales", "Legal")
    assert [s.task for s in load_scenarios(out)] == tasks("Sales", "Legal")
    gen2 = fake([("tasks", tasks("Sales", "Finance")), ("tasks", tasks("Research", "Marketing"))])
    got = await llm(company_ctx, gen2, 4, out_path=out)  # resumes: 2 on disk, 2 new, no repeats
    assert [s.task for s in load_scenarios(out)] == tasks("Sales", "Legal", "Finance", "Research")
    assert [s.task for s in got] == tasks("Finance", "Research")


async def test_llm_generation_for_a_non_sql_server(fake):
    async with ToolSession(TIME_SERVER) as s:
        ctx = await collect_context(s)
    gen = fake([("tasks", ["What time is it in Tokyo?", "Convert 9:00 from Europe/London to America/New_York."])])
    got = await llm(ctx, gen, 2)
    assert len(got) == 2 and "convert_time" in gen.prompts[0]


@pytest.mark.parametrize("base_url, key, env, expect", [
    ("openrouter", None, {"OPENROUTER_API_KEY": "or"}, ("https://openrouter.ai/api/v1", "or")),
    ("https://openrouter.ai/api/v1", None, {"OPENROUTER_API_KEY": "or"}, ("https://openrouter.ai/api/v1", "or")),
    ("openai", None, {"OPENAI_API_KEY": "oa"}, ("https://api.openai.com/v1", "oa")),
    ("ollama", None, {}, ("http://localhost:11434/v1", "EMPTY")),
    ("http://127.0.0.1:8000/v1", "k", {}, ("http://127.0.0.1:8000/v1", "k")),
    ("openrouter", None, {}, "set OPENROUTER_API_KEY"),
    ("localhost:8000", "k", {}, "http\\(s\\):// URL"),
])
def test_resolve_generator(monkeypatch, base_url, key, env, expect):
    for var in ("OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if isinstance(expect, str):
        with pytest.raises(ValueError, match=expect):
            resolve_generator(base_url, key)
    else:
        assert resolve_generator(base_url, key) == expect
