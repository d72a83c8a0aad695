"""Tests for mcp_rl/policies/policy.py: the Hermes parser, Choices, OpenAIPolicy, scripted policies.

    .venv/bin/python -m pytest tests/test_policy.py -q
"""

import json
import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from openai.types.chat.chat_completion import Choice

from mcp_rl.environments.company import PLAN
from mcp_rl.policies.policy import (
    ContextOverflow, DemonstrationPolicy, OpenAIPolicy, Policy, PolicyError, ScriptedPolicy,
    choice_from_text, find_tool_calls, format_answer,
)

# ---------------------------------------------------------------- find_tool_calls

PARSE_CASES = [
    ("plain text", "The answer is 4.", [], []),
    ("one call", '<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>',
     [{"name": "list_tables", "arguments": {}}], []),
    ("text around", 'Let me look.\n<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\nDone.',
     [{"name": "f", "arguments": {"x": 1}}], []),
    ("two calls", '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", '
     '"arguments": {"q": "s"}}</tool_call>', [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"q": "s"}}], []),
    ("unclosed at end", '<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 1"}}',
     [{"name": "run_query", "arguments": {"sql": "SELECT 1"}}], []),
    ("arguments as string", '<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>',
     [{"name": "f", "arguments": {"a": 2}}], []),
    ("no arguments", '<tool_call>{"name": "f"}</tool_call>', [{"name": "f", "arguments": {}}], []),
    ("json fence", '<tool_call>\n```json\n{"name": "f", "arguments": {"a": 1}}\n```\n</tool_call>',
     [{"name": "f", "arguments": {"a": 1}}], []),
    ("bad json", '<tool_call>{"name": "f", "arguments": {</tool_call>', [], ["tool call 1 is not valid JSON"]),
    ("missing name", '<tool_call>{"arguments": {}}</tool_call>', [], ['tool call 1 has no "name"']),
    ("not an object", "<tool_call>[1, 2]</tool_call>", [], ["tool call 1 must be a JSON object"]),
    ("empty block", "<tool_call></tool_call>", [], ["tool call 1 is empty"]),
    ("arguments not object", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', [],
     ['tool call 1 (f): "arguments" must be a JSON object']),
    ("bad string arguments", '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', [],
     ['tool call 1 (f): "arguments" is a string that is not valid JSON']),
    ("good then bad", '<tool_call>{"name": "a"}</tool_call> <tool_call>{nope}</tool_call>',
     [{"name": "a", "arguments": {}}], ["tool call 2 is not valid JSON"]),
]


@pytest.mark.parametrize("text,calls,error_prefixes", [c[1:] for c in PARSE_CASES], ids=[c[0] for c in PARSE_CASES])
def test_find_tool_calls(text, calls, error_prefixes):
    got_calls, got_errors = find_tool_calls(text)
    assert got_calls == calls
    assert len(got_errors) == len(error_prefixes)
    for error, prefix in zip(got_errors, error_prefixes):
        assert error.startswith(prefix), error


# ---------------------------------------------------------------- choice_from_text


class CharTokenizer:
    """A tokenizer with one token per character: enough to check the token bookkeeping."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_choice_from_text_parses_tool_calls():
    choice = choice_from_text('ok <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>')
    assert isinstance(choice, Choice) and choice.message.role == "assistant"
    assert choice.message.content.startswith("ok <tool_call>")
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_0", "f", {"a": 1})
    assert choice.logprobs is None


def test_choice_from_text_encodes_tokens_with_zero_logprobs():
    choice = choice_from_text("hé", tokenizer=CharTokenizer())
    tokens = choice.logprobs.content
    assert [t.token for t in tokens] == ["token_id:104", "token_id:233"]
    assert [t.logprob for t in tokens] == [0.0, 0.0]
    assert bytes(tokens[1].bytes).decode("utf-8") == "é"


def test_choice_from_text_keeps_given_ids_and_logprobs():
    choice = choice_from_text("ab", token_ids=[7, 8], logprobs=[-0.5, -1.5], finish_reason="length")
    assert [(t.token, t.logprob) for t in choice.logprobs.content] == [("token_id:7", -0.5), ("token_id:8", -1.5)]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None


def test_choice_from_text_rejects_mismatched_logprobs():
    with pytest.raises(ValueError, match="one logprob per token"):
        choice_from_text("ab", token_ids=[1, 2], logprobs=[0.0])


# ---------------------------------------------------------------- OpenAIPolicy against a local HTTP server
# The fake OpenAI-compatible endpoint below is the one test double here: it stands at the
# network boundary, where the real policy talks HTTP to vLLM / OpenRouter / OpenAI.


class FakeOpenAI(BaseHTTPRequestHandler):
    replies: list = []  # (status, body) served in order; the last one repeats
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        status, reply = self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def completion(message: dict) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": message, "logprobs": None}]}


TOOL_REPLY = completion({"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "list_tables", "arguments": "{}"}}]})
ERROR_500 = {"error": {"message": "boom", "type": "server_error"}}
CONTEXT_400 = {"error": {"message": "This model's maximum context length is 8192 tokens.", "type": "invalid_request_error"}}
LOGPROBS_400 = {"error": {"message": "logprobs are not supported by this model", "type": "invalid_request_error"}}


@pytest.fixture
def fake_server():
    FakeOpenAI.replies, FakeOpenAI.requests = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield FakeOpenAI, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


MESSAGES = [{"role": "user", "content": "How many tables?"}]
TOOLS = [{"type": "function", "function": {"name": "list_tables", "description": "List tables",
                                           "parameters": {"type": "object", "properties": {}}}}]


async def test_openai_policy_returns_tool_calls_and_sends_tools(fake_server):
    handler, url = fake_server
    handler.replies = [(200, TOOL_REPLY)]
    policy = OpenAIPolicy("m", base_url=url, api_key="k")
    choice = await policy.complete(MESSAGES, TOOLS, max_tokens=64, temperature=0.5)
    assert choice.message.tool_calls[0].function.name == "list_tables"
    (sent,) = handler.requests
    assert sent["tools"] == TOOLS and sent["logprobs"] is True and sent["max_tokens"] == 64
    assert isinstance(policy, Policy) and policy.name == "m" and policy.step == 0


async def test_openai_policy_retries_a_500(fake_server):
    handler, url = fake_server
    handler.replies = [(500, ERROR_500), (200, TOOL_REPLY)]
    policy = OpenAIPolicy("m", base_url=url, backoff_s=0.01)
    choice = await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    assert choice.message.tool_calls and len(handler.requests) == 2


async def test_openai_policy_raises_after_retries_on_500(fake_server):
    handler, url = fake_server
    handler.replies = [(500, ERROR_500)]
    policy = OpenAIPolicy("m", base_url=url, retries=2, backoff_s=0.01)
    with pytest.raises(PolicyError, match="after 2 attempts"):
        await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    assert len(handler.requests) == 2


async def test_openai_policy_down_endpoint_is_policy_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    policy = OpenAIPolicy("m", base_url=f"http://127.0.0.1:{port}/v1", retries=2, backoff_s=0.01, timeout=2)
    with pytest.raises(PolicyError, match="APIConnectionError"):
        await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)


async def test_openai_policy_context_length_is_context_overflow(fake_server):
    handler, url = fake_server
    handler.replies = [(400, CONTEXT_400)]
    with pytest.raises(ContextOverflow):
        await OpenAIPolicy("m", base_url=url).complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    assert len(handler.requests) == 1


async def test_openai_policy_drops_logprobs_when_rejected(fake_server):
    handler, url = fake_server
    handler.replies = [(400, LOGPROBS_400), (200, TOOL_REPLY)]
    policy = OpenAIPolicy("m", base_url=url)
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    assert [("logprobs" in r) for r in handler.requests] == [True, False, False]


async def test_openai_policy_other_400_is_policy_error_without_retry(fake_server):
    handler, url = fake_server
    handler.replies = [(400, {"error": {"message": "unknown model m"}})]
    with pytest.raises(PolicyError, match="refused"):
        await OpenAIPolicy("m", base_url=url).complete(MESSAGES, TOOLS, max_tokens=16, temperature=0.0)
    assert len(handler.requests) == 1


class FakeArtModel:
    """Quacks like a registered art.TrainableModel; only its client is real."""

    trainable = True

    def __init__(self, url):
        import openai

        self.client, self.inference_name, self.step = openai.AsyncOpenAI(base_url=url, api_key="k"), "agent", 0

    def openai_client(self):
        return self.client

    def get_inference_name(self):
        return self.inference_name

    async def get_step(self):
        return self.step


async def test_from_art_asks_for_the_newest_name_and_step_every_call(fake_server):
    handler, url = fake_server
    handler.replies = [(200, TOOL_REPLY)]
    model = FakeArtModel(url)
    policy = OpenAIPolicy.from_art(model)
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=1.0)
    model.inference_name, model.step = "agent@3", 3
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=1.0)
    assert [r["model"] for r in handler.requests] == ["agent", "agent@3"]
    assert policy.step == 3 and policy.name == "agent@3"
    model.inference_name, model.step = "agent", 5  # ART 0.4.11 keeps the name: the step comes from get_step
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=1.0)
    assert policy.step == 5


async def test_a_trainer_can_tell_an_art_policy_its_step_before_a_call(fake_server):
    handler, url = fake_server
    handler.replies = [(200, TOOL_REPLY)]
    model = FakeArtModel(url)
    policy = OpenAIPolicy.from_art(model)
    model.step, policy.step = 2, 2  # ARTTrainer after an update: no completion has asked ART yet
    assert policy.step == 2 and handler.requests == []
    model.step = 3
    await policy.complete(MESSAGES, TOOLS, max_tokens=16, temperature=1.0)
    assert policy.step == 3  # a call still refreshes it
    assert OpenAIPolicy("agent@7", base_url=url).step == 7  # a served name@N is the step itself


# ---------------------------------------------------------------- scripted and demonstration policies


async def test_scripted_policy_accepts_text_and_dicts():
    replies = iter(["thinking", {"tool": "run_query", "arguments": {"sql": "SELECT 1"}}])
    policy = ScriptedPolicy(lambda messages: next(replies), tokenizer=CharTokenizer())
    first = await policy.complete(MESSAGES, TOOLS, max_tokens=8, temperature=0)
    second = await policy.complete(MESSAGES, TOOLS, max_tokens=8, temperature=0)
    assert first.message.content == "thinking" and first.message.tool_calls is None
    assert json.loads(second.message.tool_calls[0].function.arguments) == {"sql": "SELECT 1"}
    assert len(second.logprobs.content) == len(second.message.content)
    assert (policy.name, policy.step) == ("scripted", 0)


async def test_scripted_policy_rejects_a_dict_without_tool():
    with pytest.raises(ValueError, match="'tool' key"):
        await ScriptedPolicy(lambda m: {"name": "x"}).complete(MESSAGES, TOOLS, max_tokens=8, temperature=0)


@dataclass
class Scn:
    task: str
    reference: str | None
    answer: object


SCENARIO = Scn("Total salary in Sales?", "SELECT SUM(e.salary) FROM employees e JOIN departments d "
               "ON e.dept_id = d.id WHERE d.name = 'Sales'", 1234.5)


async def _demo_turns(replies_from_tools):
    policy = DemonstrationPolicy([SCENARIO], PLAN)
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": SCENARIO.task}]
    calls = []
    for _ in range(8):
        choice = await policy.complete(messages, TOOLS, max_tokens=64, temperature=0)
        call = choice.message.tool_calls[0]
        calls.append((call.function.name, json.loads(call.function.arguments)))
        if call.function.name == "complete_task":
            return calls
        messages += [{"role": "assistant", "content": choice.message.content},
                     {"role": "tool", "tool_call_id": call.id, "content": replies_from_tools(call.function.name)}]
    raise AssertionError(f"no complete_task in {calls}")


async def test_demonstration_policy_follows_the_reference():
    calls = await _demo_turns(lambda name: "ok")
    assert calls == [
        ("list_tables", {}), ("describe_table", {"table_name": "employees"}),
        ("describe_table", {"table_name": "departments"}),
        ("run_query", {"sql": SCENARIO.reference}), ("complete_task", {"answer": "1234.5"})]


async def test_demonstration_policy_completes_even_when_the_query_fails():
    calls = await _demo_turns(lambda name: "Error: no such table" if name == "run_query" else "ok")
    assert calls[-1] == ("complete_task", {"answer": "1234.5"})


async def test_demonstration_policy_unknown_task_is_policy_error():
    with pytest.raises(PolicyError, match="no demonstration"):
        await DemonstrationPolicy([SCENARIO], PLAN).complete([{"role": "user", "content": "other"}], [],
                                                       max_tokens=8, temperature=0)


@pytest.mark.parametrize("answer,text", [
    (3, "3"), (3.0, "3"), (2.345, "2.35"), (0.1, "0.1"), (["a", "b"], "a, b"), ([1.5, 2.0], "1.5, 2"),
    ("x", "x"), (None, ""),
])
def test_format_answer(answer, text):
    assert format_answer(answer) == text
