"""Tests for mcp_rl/ship/serve.py: the OpenAI-compatible endpoint over a LocalPolicy.

    .venv/bin/python -m pytest tests/test_serve.py -q                 # all (slow ones load SmolLM2)
    .venv/bin/python -m pytest tests/test_serve.py -q -m "not slow"

Each server runs in-process (uvicorn in a thread) on a free 127.0.0.1 port and is
reached over real HTTP with the `openai` client, raw httpx, and mcp_rl's own
OpenAIPolicy (what `rollout --base-url` uses). Fast tests serve a tiny random Llama
with SmolLM2's tokenizer. Where a test needs a known reply (a tool call), the model is
`ScriptedLM`: a test double standing at the model boundary, whose logits spell a
scripted reply token by token, so the real LocalPolicy decode loop, stop handling and
Hermes parsing all run. Slow tests serve the embedded SmolLM2.
"""

import argparse
import asyncio
import json
import socket
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
import torch

from mcp_rl.runs import flags
from mcp_rl.runs.config import Config
from mcp_rl.environments.company import command as company_server_command
from mcp_rl.mcp.launch import HttpServer
from mcp_rl.policies.local_policy import LocalPolicy, load_local_model, load_local_tokenizer
from mcp_rl.policies.policy import OpenAIPolicy, ScriptedPolicy
from mcp_rl.rollout import RolloutConfig, rollout
from mcp_rl.tasks.scenarios import Scenario
from mcp_rl.ship.serve import ServerThread, add_serve_parser, openai_app, serve_policy

TOOLS = [{"type": "function", "function": {"name": "run_query", "description": "Run one SQL query",
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


def tiny_config(tok):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


@pytest.fixture(scope="module")
def tiny(tok):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    policy = LocalPolicy(LlamaForCausalLM(tiny_config(tok)).eval(), tok, name="tiny")
    with ServerThread(openai_app(policy)) as server:
        yield SimpleNamespace(policy=policy, url=server.base_url,
                              client=openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0))


class ScriptedLM:
    """Builds a tiny Llama whose k-th batched decode spells `replies[k]` (the last one repeats)."""

    @staticmethod
    def build(tok, replies):
        from transformers import LlamaForCausalLM

        scripts = [tok.encode(r, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")] for r in replies]

        class Scripted(LlamaForCausalLM):
            batches = 0

            def forward(self, input_ids=None, position_ids=None, logits_to_keep=1, **_):
                n, width = input_ids.shape
                if width > 1:  # a prefill starts a new batch
                    self.script = torch.tensor(scripts[min(Scripted.batches, len(scripts) - 1)])
                    self.start, Scripted.batches = position_ids[:, -1].clone(), Scripted.batches + 1
                k = (position_ids[:, -1] - self.start).clamp(max=len(self.script) - 1)
                logits = torch.full((n, logits_to_keep, self.config.vocab_size), -1e4)
                logits[:, -1].scatter_(1, self.script[k][:, None], 1e4)
                return SimpleNamespace(logits=logits)

        return Scripted(tiny_config(tok)).eval()


def scripted_server(tok, replies, **policy_kw):
    policy = LocalPolicy(ScriptedLM.build(tok, replies), tok, name="scripted", **policy_kw)
    return ServerThread(openai_app(policy))


# ---------------------------------------------------------------- the openai client


def test_models_list_and_retrieve_name_the_served_model(tiny):
    assert [m.id for m in tiny.client.models.list()] == ["tiny"]
    assert tiny.client.models.retrieve("tiny").owned_by == "mcp-rl"
    with pytest.raises(openai.NotFoundError, match="use .tiny."):
        tiny.client.models.retrieve("gpt-4")


@pytest.mark.parametrize("tools", [None, TOOLS])
def test_chat_is_a_chat_completion_and_deterministic_at_temperature_0(tiny, tools):
    kw = dict(model="tiny", messages=HI, max_tokens=6, temperature=0, **({"tools": tools} if tools else {}))
    first, second = tiny.client.chat.completions.create(**kw), tiny.client.chat.completions.create(**kw)
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-") and first.model == "tiny"
    assert first.choices[0].message.role == "assistant" and first.choices[0].finish_reason in ("stop", "length")
    assert first.choices[0].message.content == second.choices[0].message.content
    u = first.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 6 and u.total_tokens == u.prompt_tokens + u.completion_tokens


def test_tools_reach_the_prompt(tiny):
    plain = tiny.client.chat.completions.create(model="tiny", messages=HI, max_tokens=1, temperature=0)
    tooled = tiny.client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, max_tokens=1, temperature=0)
    none = tiny.client.chat.completions.create(model="tiny", messages=HI, tools=TOOLS, tool_choice="none",
                                               max_tokens=1, temperature=0)
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens == none.usage.prompt_tokens


def test_logprobs_come_back_as_token_ids(tiny):
    r = tiny.client.chat.completions.create(model="tiny", messages=HI, max_tokens=4, temperature=0, logprobs=True)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens and all(t.token.startswith("token_id:") for t in content)
    assert tiny.client.chat.completions.create(model="tiny", messages=HI, max_tokens=4).choices[0].logprobs is None


async def test_concurrent_requests_share_one_batched_decode(tiny, monkeypatch):
    monkeypatch.setattr(tiny.policy, "batch_wait_s", 1.0)  # a loaded CI machine may spread the requests out
    client = openai.AsyncOpenAI(base_url=tiny.url, api_key="x", max_retries=0)
    calls = tiny.policy.generate_calls
    replies = await asyncio.gather(*(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=3, temperature=0) for i in range(4)))
    assert len(replies) == 4 and tiny.policy.generate_calls - calls < 4 and tiny.policy.last_batch_size > 1


# ---------------------------------------------------------------- tool calls


def test_a_hermes_tool_call_comes_out_as_tool_calls(tok):
    reply = 'Checking.\n<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 1"}}\n</tool_call>'
    with scripted_server(tok, [reply]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="scripted", messages=HI, tools=TOOLS, max_tokens=64, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "run_query"
    assert isinstance(call.function.arguments, str) and json.loads(call.function.arguments) == {"sql": "SELECT 1"}


def test_an_unparseable_tool_call_stays_in_content(tok):
    reply = '<tool_call>\n{"name": "run_query", "arguments": {"sql": }\n</tool_call>'
    with scripted_server(tok, [reply]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        r = client.chat.completions.create(model="scripted", messages=HI, tools=TOOLS, max_tokens=64, temperature=0)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content == reply
    assert r.choices[0].finish_reason == "stop"


def test_stream_sends_the_turn_as_chunks(tok):
    reply = '<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 2"}}\n</tool_call>'
    with scripted_server(tok, [reply]) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        chunks = list(client.chat.completions.create(model="scripted", messages=HI, tools=TOOLS, max_tokens=64,
                                                     stream=True, stream_options={"include_usage": True}))
    calls = [c for ch in chunks for choice in ch.choices for c in choice.delta.tool_calls or []]
    assert [c.function.name for c in calls] == ["run_query"] and json.loads(calls[0].function.arguments) == {"sql": "SELECT 2"}
    assert [choice.finish_reason for ch in chunks for choice in ch.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0


# ---------------------------------------------------------------- bad requests

GOOD = {"model": "tiny", "messages": HI, "max_tokens": 2}
BAD = [  # (body, status, words the error message must contain)
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    ([1, 2], 400, "JSON object"),
    ({"model": "tiny"}, 400, "messages"),
    ({**GOOD, "messages": []}, 400, "messages"),
    ({**GOOD, "messages": "hi"}, 400, "messages"),
    ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({**GOOD, "messages": [{"role": "user"}]}, 400, "needs content"),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400, "text"),
    ({**GOOD, "messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]}, 400, "name"),
    ({**GOOD, "tools": {"name": "run_query"}}, 400, "tools"),
    ({**GOOD, "tools": [{"type": "function", "function": {}}]}, 400, "tools.0.function.name"),
    ({**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": -5}, 400, "max_tokens"),
    ({**GOOD, "max_tokens": "many"}, 400, "max_tokens"),
    ({**GOOD, "temperature": 7}, 400, "temperature"),
    ({**GOOD, "n": 3}, 400, "n"),
    ({**GOOD, "tool_choice": "required"}, 400, "tool_choice"),
    ({**GOOD, "model": "gpt-4o"}, 404, "use 'tiny'"),
    ({**GOOD, "messages": [{"role": "user", "content": "x" * (5 << 20)}]}, 413, "over"),
    # found by review: these were 500s (which OpenAIPolicy retries), or silently ignored
    ({**GOOD, "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}, 400, "arguments"),
    ({**GOOD, "stream_options": "yes"}, 400, "stream_options"),
    ({**GOOD, "stop": ["<tool_call>"]}, 400, "stop sequences are not supported"),
]


@pytest.mark.parametrize("body,status,words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_a_4xx_with_a_short_clear_message(tiny, body, status, words):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(f"{tiny.url}/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    message = r.json()["error"]["message"]
    assert words in message and len(message) < 400, message
    assert tiny.client.chat.completions.create(**GOOD).choices[0].message.role == "assistant"  # still serving


@pytest.mark.parametrize("method,path,status", [("GET", "/chat/completions", 405), ("POST", "/completions", 404),
                                                ("GET", "/", 404)])
def test_wrong_routes_get_json_errors(tiny, method, path, status):
    r = httpx.request(method, tiny.url + path, timeout=30, **({"json": {}} if method == "POST" else {}))
    assert r.status_code == status and r.json()["error"]["message"]


def test_the_openai_client_sees_bad_requests_as_bad_request_errors(tiny):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        tiny.client.chat.completions.create(model="tiny", messages=HI, max_tokens=0)


async def test_a_context_overflow_is_a_400_that_openai_policy_reads_as_context_overflow(tok):
    from mcp_rl.policies.policy import ContextOverflow

    policy = LocalPolicy(ScriptedLM.build(tok, ["hi"]), tok, name="small", max_context=32)
    with ServerThread(openai_app(policy)) as server:
        client = OpenAIPolicy("small", base_url=server.base_url, retries=1)
        with pytest.raises(ContextOverflow):
            await client.complete([{"role": "user", "content": "word " * 100}], [], max_tokens=8, temperature=0)


def test_a_failure_inside_generation_is_a_500_and_the_server_keeps_serving(tok):
    def script(messages):
        if messages[-1]["content"] == "boom":
            raise RuntimeError("the model fell over")
        return "fine"

    with ServerThread(openai_app(ScriptedPolicy(script, tok))) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.InternalServerError, match="the model fell over"):
            client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "boom"}])
        assert client.chat.completions.create(model="scripted", messages=HI).choices[0].message.content == "fine"


# ---------------------------------------------------------------- our own rollout through the endpoint


async def test_openai_policy_rollout_through_the_endpoint_against_the_company_server(tok, company_db):
    replies = ['<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "complete_task", "arguments": {"answer": "3"}}\n</tool_call>']
    with scripted_server(tok, replies) as served, HttpServer(company_server_command(company_db)) as company:
        policy = OpenAIPolicy("scripted", base_url=served.base_url)  # what `rollout --base-url` builds
        traj = await rollout(policy, company.spec, Scenario(id="s", task="How many tables are there?"),
                             RolloutConfig(max_turns=4, temperature=0))
    m = traj.metrics
    assert not m["fatal"], traj.metadata["fatal_reason"]
    assert m["completed"] and m["tool_calls"] == 2 and m["tool_errors"] == 0 and traj.metadata["answer"] == "3"
    tool_results = [msg["content"] for msg in traj.messages() if msg["role"] == "tool"]
    assert "employees" in tool_results[0]
    assert traj.messages_and_choices[2].logprobs.content  # token ids came back, so ART could train on it


def test_the_rollout_command_with_base_url_uses_the_endpoint(tok, capsys):
    from mcp_rl.cli import main

    replies = ['<tool_call>\n{"name": "describe_table", "arguments": {"table_name": "employees"}}\n</tool_call>',
               '<tool_call>\n{"name": "complete_task", "arguments": {"answer": "yes"}}\n</tool_call>']
    with scripted_server(tok, replies) as served:
        rc = main(["rollout", "--server", "company", "--base-url", served.base_url, "--model", "scripted",
                   "--task", "Is there an employees table?", "--max-turns", "3"])
    out = capsys.readouterr().out
    assert rc == 0 and "completed True" in out and "answer: 'yes'" in out and "fatal" not in out, out


# ---------------------------------------------------------------- the CLI wiring


def test_serve_parser_and_a_taken_port(tok):
    sub = argparse.ArgumentParser().add_subparsers(dest="cmd")
    add_serve_parser(sub)
    a = sub.choices["serve"].parse_args(["--adapter", "runs/demo", "--port", "9001"])
    cfg = flags.config(a, Config(), trains=False)  # the model section is the Config fields'
    assert (flags.given(a), a.adapter, a.port, a.name, cfg.tool_prefix, cfg.policy_batch) == (
        {}, "runs/demo", 9001, None, False, 8)
    assert a.fn.__name__ == "cmd_serve"
    a = sub.choices["serve"].parse_args(["--max-batch", "32", "--tool-prefix", "--model", "m"])  # older name kept
    assert flags.given(a) == {"policy_batch": 32, "tool_prefix": True, "model": "m"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(RuntimeError, match="pass another --port"):
            serve_policy(ScriptedPolicy(lambda m: "x"), port=s.getsockname()[1])
    with pytest.raises(ValueError, match="port"):
        serve_policy(ScriptedPolicy(lambda m: "x"), port=0)


# ---------------------------------------------------------------- the embedded SmolLM2


@pytest.fixture(scope="module")
def smollm2():
    model, tok = load_local_model("smollm2")
    return model, tok


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_answers_in_prose_and_forced_tool_calls_parse(smollm2):
    model, tok = smollm2
    for tool_prefix, tools in ((False, None), (True, TOOLS)):
        policy = LocalPolicy(model, tok, name="smollm2", tool_prefix=tool_prefix)
        with ServerThread(openai_app(policy)) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
            kw = dict(model="smollm2", messages=[{"role": "user", "content": "What is the capital of France?"}],
                      max_tokens=48, temperature=0, **({"tools": tools} if tools else {}))
            first, second = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
        def turn(r):  # call ids are fresh per reply; the rest is greedy, so the same twice
            return r.choices[0].message.model_dump(exclude={"tool_calls": {"__all__": {"id"}}})
        assert turn(first) == turn(second)
        if tool_prefix:
            assert first.choices[0].finish_reason == "tool_calls", first.choices[0].message
            json.loads(first.choices[0].message.tool_calls[0].function.arguments)
        else:
            assert first.choices[0].message.content.strip() and not first.choices[0].message.tool_calls


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_smollm2_rollout_through_the_endpoint_against_the_company_server(smollm2, company_db):
    model, tok = smollm2
    policy = LocalPolicy(model, tok, name="smollm2", tool_prefix=True)
    with ServerThread(openai_app(policy)) as served, HttpServer(company_server_command(company_db)) as company:
        traj = await rollout(OpenAIPolicy("smollm2", base_url=served.base_url, timeout=300), company.spec,
                             Scenario(id="s", task="How many employees are there?"),
                             RolloutConfig(max_turns=3, max_tokens=64, temperature=0))
    assert not traj.metrics["fatal"], traj.metadata["fatal_reason"]
    assert traj.metrics["turns"] >= 1 and traj.metrics["tool_calls"] + traj.metrics["malformed_calls"] >= 1


def test_tool_choice_none_returns_a_call_as_text(tok):
    """`tool_choice: "none"` only left the tools out of the prompt: a trained agent still wrote a call,
    and the reply came back with tool_calls and finish_reason "tool_calls" (found by review)."""
    call = '<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>'
    with ServerThread(openai_app(ScriptedPolicy(lambda m: call, tok))) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        auto = client.chat.completions.create(model="scripted", messages=HI, tools=TOOLS)
        none = client.chat.completions.create(model="scripted", messages=HI, tools=TOOLS, tool_choice="none")
    assert auto.choices[0].finish_reason == "tool_calls" and auto.choices[0].message.tool_calls
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls
    assert none.choices[0].message.content == call


# ---------------------------------------------------------------- limits: one client cannot hold the others


class Babbler:
    """A tiny Llama that says the same word forever (never end-of-turn): a request runs to its max_tokens."""

    @staticmethod
    def build(tok):
        from transformers import LlamaForCausalLM

        word = tok.encode(" a", add_special_tokens=False)[0]

        class Babble(LlamaForCausalLM):
            def forward(self, input_ids=None, logits_to_keep=1, **_):
                logits = torch.full((input_ids.shape[0], logits_to_keep, self.config.vocab_size), -1e4)
                logits[:, -1, word] = 1e4
                return SimpleNamespace(logits=logits)

        return Babble(tiny_config(tok)).eval()


def test_max_tokens_over_the_servers_cap_is_clamped(tok):
    """max_tokens: 1e9 held every other client for minutes (issue "hardening"): it is cut to the cap."""
    policy = LocalPolicy(Babbler.build(tok), tok, name="babble")
    with ServerThread(openai_app(policy, max_tokens=5)) as server:
        r = httpx.post(f"{server.base_url}/chat/completions", timeout=60,
                       json={"model": "babble", "messages": HI, "max_tokens": 1e9})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 5 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_client_that_goes_away_stops_its_generation(tok):
    """Generation went on after the client disconnected: the row is now dropped from the decode."""
    policy = LocalPolicy(Babbler.build(tok), tok, name="babble", max_context=100_000)
    with ServerThread(openai_app(policy, max_tokens=50_000)) as server:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{server.base_url}/chat/completions", timeout=httpx.Timeout(60, read=1.5),
                       json={"model": "babble", "messages": HI, "max_tokens": 50_000, "temperature": 0})
        deadline = time.monotonic() + 30
        while policy.generate_calls == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert policy.generate_calls == 1, "the decode was still running 30 s after the client left"
    assert policy.decode_stats["decode_steps"] < 50_000


def test_a_generation_past_the_time_budget_is_a_504(tok):
    class Slow:
        name, tokenizer = "slow", None

        async def complete(self, messages, tools, **kw):
            await asyncio.sleep(30)

    with ServerThread(openai_app(Slow(), request_timeout=0.5)) as server:
        start = time.monotonic()
        r = httpx.post(f"{server.base_url}/chat/completions", json={"model": "slow", "messages": HI}, timeout=60)
    assert r.status_code == 504 and "request-timeout" in r.json()["error"]["message"]
    assert time.monotonic() - start < 10


def test_prompts_are_tokenised_off_the_event_loop(tiny, monkeypatch):
    """A 3.9 MB prompt was tokenised on the event loop: /v1/models waited 2.5 s behind it."""
    import threading

    import mcp_rl.policies.local_policy as lp
    import mcp_rl.ship.serve as serve

    threads = []

    def recording(real):
        def wrapped(*a, **k):
            threads.append(threading.current_thread().name)
            return real(*a, **k)
        return wrapped

    monkeypatch.setattr(lp, "prompt_ids", recording(lp.prompt_ids))
    monkeypatch.setattr(serve, "_usage", recording(serve._usage))
    tiny.client.chat.completions.create(model="tiny", messages=HI, max_tokens=2)
    # The event loop runs on the server's thread (mcp-rl-serve-PORT); the work went to other threads.
    assert len(threads) == 2 and not any(t.startswith("mcp-rl-serve-") for t in threads), threads


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000,
                                  json.dumps({**GOOD, "messages": [{"role": "user", "content": [
                                      {"type": "text", "text": "x", "deep": json.loads("[" * 900 + "]" * 900)}]}]}).encode()],
                         ids=["100k", "900"])
def test_deeply_nested_json_is_a_400(tiny, body):
    r = httpx.post(f"{tiny.url}/chat/completions", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "nests deeper" in r.json()["error"]["message"]


@pytest.mark.parametrize("headers, status", [({"content-type": "text/plain"}, 415),
                                             ({"content-type": "application/x-www-form-urlencoded"}, 415),
                                             ({"content-type": "application/json", "host": "evil.test"}, 403),
                                             ({"content-type": "application/json", "host": "localhost:1"}, 200)])
def test_only_json_posts_to_a_loopback_host_are_served(tiny, headers, status):
    """A web page may POST text/plain to 127.0.0.1 cross-site, or reach it under its own host name."""
    r = httpx.post(f"{tiny.url}/chat/completions", content=json.dumps(GOOD).encode(), headers=headers, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"] if status != 200 else r.json()["choices"]


def test_serve_flags_set_the_limits():
    sub = argparse.ArgumentParser().add_subparsers(dest="cmd")
    add_serve_parser(sub)
    a = sub.choices["serve"].parse_args(["--max-tokens", "64", "--request-timeout", "30"])
    assert (a.max_tokens, a.request_timeout) == (64, 30.0)
    assert sub.choices["serve"].parse_args([]).max_tokens == 1024
