"""Tests for mcp_rl/ship/ollama.py: the Modelfile's Go TEMPLATE renders what training rendered.

The template is rendered by Go's own text/template (tests/go/render_template.go, with Ollama's
`json` function), so these tests need `go` (`apt-get install golang-go`; .ci/run installs it,
and in CI a missing go fails them; elsewhere they are skipped with that reason).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mcp_rl.policies.local_policy import HERMES_TEMPLATE, load_local_tokenizer
from mcp_rl.ship.ollama import STOPS, TEMPLATE, modelfile, write_modelfile

GO = Path(__file__).parent / "go" / "render_template.go"
TOOLS = [
    {"type": "function", "function": {"name": "run_query", "description": "Run one read-only SQL query.",
                                      "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                                                     "required": ["sql"]}}},
    {"type": "function", "function": {"name": "complete_task", "description": "Give the final answer.",
                                      "parameters": {"type": "object",
                                                     "properties": {"answer": {"type": "string"}}}}},
]


def call(name, args):
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "tools, calls and results": [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "How many employees are in Sales & Support?"},
        {"role": "assistant", "content": "", "tool_calls": [call("run_query", {"sql": "SELECT COUNT(*) FROM e"})]},
        {"role": "tool", "content": "count\n42", "tool_call_id": "call_run_query"},
        {"role": "assistant", "content": "Two checks.", "tool_calls": [
            call("run_query", {"sql": "SELECT 1"}), call("run_query", {"sql": "SELECT 2 <> 3"})]},
        {"role": "tool", "content": "1", "tool_call_id": "a"},
        {"role": "tool", "content": "True", "tool_call_id": "b"},
        {"role": "assistant", "content": "", "tool_calls": [call("complete_task", {"answer": "42"})]},
        {"role": "tool", "content": "ok", "tool_call_id": "c"},
        {"role": "user", "content": "Thanks. And in Research?"},
    ],
    "no system prompt, last turn the assistant's": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call("run_query", {"limit": 5, "sql": "SELECT 1"})]},
    ],
}


def ollama_data(messages, tools):
    """What Ollama hands its template: .System, .Messages (Role, Content, ToolCalls), .Tools."""
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    return {"System": system, "Tools": tools, "Messages": [
        {"Role": m["role"], "Content": m.get("content") or "",
         "ToolCalls": [{"Function": {"Name": c["function"]["name"], "Arguments": c["function"]["arguments"]}}
                       for c in m.get("tool_calls", [])]} for m in messages]}


def render_go(tmp_path, data) -> str:
    if shutil.which("go") is None:
        if os.environ.get("CI"):
            pytest.fail("go is not installed: .ci/run installs golang-go")
        pytest.skip("needs go to render the template as Ollama does: apt-get install golang-go")
    (tmp_path / "t.tmpl").write_text(TEMPLATE)
    done = subprocess.run(["go", "run", str(GO), str(tmp_path / "t.tmpl")], input=json.dumps(data),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def split_tools(text):
    """(text with the <tools> lines blanked, the tool objects parsed)."""
    head, sep, rest = text.partition("<tools>\n")
    if not sep:
        return text, []
    listing, _, tail = rest.partition("\n</tools>")
    return head + "<tools>\n</tools>" + tail, [json.loads(line) for line in listing.splitlines()]


@pytest.fixture(scope="module")
def hermes():
    tok = load_local_tokenizer()
    tok.chat_template = HERMES_TEMPLATE
    return tok


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False])
def test_template_renders_what_training_rendered(name, with_tools, hermes, tmp_path):
    messages, tools = CONVERSATIONS[name], TOOLS if with_tools else []
    trained = hermes.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                         add_generation_prompt=messages[-1]["role"] != "assistant")
    served = render_go(tmp_path, ollama_data(messages, tools))
    # Ollama's `json` (Go's json.Marshal) writes <, > and & inside strings as \u003c, \u003e, \u0026.
    served = served.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")
    (t_text, t_tools), (s_text, s_tools) = split_tools(trained), split_tools(served)
    assert s_text == t_text
    assert s_tools == t_tools == tools  # same objects, keys sorted in both; only JSON spacing differs


def test_modelfile_has_from_template_stops_and_parameters():
    text = modelfile("agent.gguf")
    assert text.startswith("FROM ./agent.gguf\n") and f'TEMPLATE """{TEMPLATE}"""' in text
    assert all(f'PARAMETER stop "{s}"' in text for s in STOPS) and "PARAMETER temperature 0.0" in text


def test_write_modelfile_links_the_gguf_and_says_how_to_run_it(tmp_path):
    gguf = tmp_path / "out" / "agent.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    path = write_modelfile(tmp_path / "ollama", gguf, name="sql-agent")
    assert (tmp_path / "ollama" / "agent.gguf").read_bytes() == b"GGUF"
    assert path.read_text() == modelfile("agent.gguf")
    assert (tmp_path / "ollama" / "README.txt").read_text().splitlines() == [
        f"ollama create sql-agent -f {path}", "ollama run sql-agent"]


def test_write_modelfile_needs_the_gguf(tmp_path):
    with pytest.raises(FileNotFoundError, match="write the GGUF first"):
        write_modelfile(tmp_path, tmp_path / "missing.gguf")


def test_ollama_finds_the_tool_call_tag_and_stops_after_a_call():
    """Ollama takes a model's tool-call tag from the first text inside `{{ if .ToolCalls }}`; without
    that block the tag was "{" and every reply came back as plain text with no tool_calls (found by
    review, with Ollama's parseTag run in Go). And a turn must stop at `</tool_call>` as in training."""
    from mcp_rl.ship.ollama import STOPS, TEMPLATE

    block = TEMPLATE.split("{{- if .ToolCalls }}", 1)
    assert len(block) == 2 and block[1].startswith("{{ range $j, $c := .ToolCalls }}<tool_call>")
    assert "</tool_call>" in STOPS
