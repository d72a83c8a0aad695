"""The agent loop, driven by scripted policies through every branch.

Run: pytest tests/test_rollout.py
"""

import asyncio
import json
import sys
import textwrap

import art
import fastmcp
import pytest
from fastmcp.exceptions import ToolError

from mcp_rl.environments.company import PLAN
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.policies.policy import PolicyError, ScriptedPolicy, choice_from_text, play, tool_call_text
from mcp_rl.rollout import COMPLETE_TOOL_NAME, RolloutConfig, gather_rollouts, rollout, transcript
from mcp_rl.tasks.scenarios import Scenario

TASK = Scenario(id="s1", task="What is 2 + 3?", answer=5)


READ_ONLY = {"readOnlyHint": True}  # rollouts refuse tools not annotated read-only (mcp_rl.mcp.guard)


def toy_server() -> fastmcp.FastMCP:
    mcp = fastmcp.FastMCP("toy")

    @mcp.tool(annotations=READ_ONLY)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @mcp.tool(annotations=READ_ONLY)
    def broken() -> str:
        """Always fails."""
        raise ToolError("broken is broken; try add")

    @mcp.tool(annotations=READ_ONLY)
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await asyncio.sleep(seconds)
        return "done"

    return mcp



def call(name, **args):
    return {"tool": name, "arguments": args}


async def run(*turns, cfg=None, server=None, scenario=TASK):
    return await rollout(ScriptedPolicy(play(*turns)), server or toy_server(), scenario, cfg or RolloutConfig())


async def test_success_records_answer_and_metrics():
    traj = await run(call("add", a=2, b=3), call(COMPLETE_TOOL_NAME, answer="5"))
    m = traj.metrics
    assert traj.metadata["answer"] == "5" and m["completed"] and not m["fatal"]
    assert m["turns"] == 2 and m["tool_calls"] == 2 and m["tool_calls/add"] == 1 and m["tool_errors"] == 0
    tool_msgs = [x for x in traj.messages() if x["role"] == "tool"]
    assert tool_msgs[0]["content"].strip() == "5"
    assert {t["function"]["name"] for t in traj.tools} == {"add", "broken", "slow", COMPLETE_TOOL_NAME}
    assert traj.metadata["scenario_id"] == "s1" and traj.metadata["policy"] == "scripted"
    assert isinstance(traj, art.Trajectory) and "answer: '5'" in transcript(traj)


async def test_max_turns_marks_ran_out():
    traj = await run(call("add", a=1, b=1), cfg=RolloutConfig(max_turns=3))
    assert traj.metrics["ran_out_of_turns"] and not traj.metrics["completed"]
    assert traj.metrics["turns"] == 3 and traj.metadata["answer"] is None


async def test_malformed_call_is_sent_back_and_counted():
    traj = await run('<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', call(COMPLETE_TOOL_NAME, answer="2"))
    assert traj.metrics["malformed_calls"] == 1 and traj.metrics["completed"]
    feedback = traj.messages()[3]
    assert feedback["role"] == "user" and "could not be read" in feedback["content"]


@pytest.mark.parametrize("turn, kind, text", [
    (call("nope"), "unknown_tools", "add"),          # the message lists the real tools
    (call("broken"), "tool_errors", "broken is broken"),
    (call("add", a="x", b=2), "tool_errors", "a"),    # argument validation by the server
    (call(COMPLETE_TOOL_NAME), "tool_errors", "answer"),
])
async def test_agent_errors_become_tool_messages(turn, kind, text):
    traj = await run(turn, call(COMPLETE_TOOL_NAME, answer="5"))
    assert traj.metrics[kind] == 1 and traj.metrics["completed"] and not traj.metrics["fatal"]
    reply = traj.messages()[3]
    assert reply["role"] == "tool" and text in reply["content"]


async def test_plain_text_reply_ends_episode_uncompleted():
    traj = await run("The answer is 5.")
    assert traj.metadata["answer"] == "The answer is 5." and not traj.metrics["completed"]
    assert traj.metrics["turns"] == 1


async def test_tool_timeout_is_an_error_not_a_hang():
    traj = await run(call("slow", seconds=30), call(COMPLETE_TOOL_NAME, answer="x"),
                     cfg=RolloutConfig(call_timeout=0.5))
    assert traj.metrics["tool_errors"] == 1 and traj.metrics["completed"]
    assert traj.metrics["latency_s"] < 10


async def test_rollout_wall_clock_limit_is_fatal():
    traj = await run(call("slow", seconds=5), cfg=RolloutConfig(timeout=0.5, call_timeout=30))
    assert traj.metrics["fatal"] and "limit" in traj.metadata["fatal_reason"]


async def test_policy_failure_is_fatal_for_that_rollout_only():
    class Down(ScriptedPolicy):
        async def complete(self, *a, **k):
            raise PolicyError("endpoint down after 3 retries")

    traj = await rollout(Down(lambda m: ""), toy_server(), TASK, RolloutConfig())
    assert traj.metrics["fatal"] and "endpoint down" in traj.metadata["fatal_reason"]


async def test_server_killed_mid_rollout(tmp_path):
    script = tmp_path / "die.py"
    script.write_text(textwrap.dedent("""
        import os
        import fastmcp
        mcp = fastmcp.FastMCP("dies")

        @mcp.tool
        def die() -> str:
            "Kill this server."
            os._exit(1)

        @mcp.tool
        def ok() -> str:
            "Fine."
            return "fine"

        mcp.run()
    """))
    traj = await run(call("ok"), call("die"), call("ok"), call(COMPLETE_TOOL_NAME, answer="x"),
                     server=f"{sys.executable} {script}",
                     cfg=RolloutConfig(call_timeout=10, tool_policy=ToolPolicy(allow_side_effects=True)))
    assert traj.metrics["fatal"] and "server" in traj.metadata["fatal_reason"]
    assert traj.metrics["tool_calls/ok"] == 1 and not traj.metrics["completed"]


async def test_unreachable_server_fails_rollout_not_batch():
    groups = await gather_rollouts(ScriptedPolicy(play(call(COMPLETE_TOOL_NAME, answer="5"))),
                                   "http://127.0.0.1:9/mcp", [TASK], RolloutConfig(), group_size=2)
    assert len(groups) == 1 and len(groups[0].trajectories) == 2
    assert all(t.metrics["fatal"] for t in groups[0].trajectories)


async def test_gather_groups_in_order_with_concurrency_limit():
    scenarios = [Scenario(id=f"s{i}", task=f"Add {i} and 1", answer=i + 1) for i in range(5)]
    in_flight = peak = 0

    class Counting:
        name, step = "counting", 0

        async def complete(self, messages, tools, **kw):
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            i = int(messages[1]["content"].split()[1])
            return choice_from_text(tool_call_text(COMPLETE_TOOL_NAME, {"answer": str(i + 1)}))

    groups = await gather_rollouts(Counting(), toy_server(), scenarios,
                                   RolloutConfig(concurrency=2), group_size=3)
    assert [g.trajectories[0].metadata["scenario_id"] for g in groups] == [s.id for s in scenarios]
    assert all(len(g.trajectories) == 3 for g in groups) and peak <= 2
    assert [g.trajectories[0].metadata["answer"] for g in groups] == ["1", "2", "3", "4", "5"]


async def test_company_server_demonstration_end_to_end(company_db):
    """The demonstration policy answers a real scenario through the real company server."""
    from mcp_rl.policies.policy import DemonstrationPolicy
    from mcp_server import build_server

    s = Scenario(id="c1", task="How many departments are there?",
                 reference="SELECT COUNT(*) FROM departments", answer=None)
    import sqlite3
    s.answer = sqlite3.connect(company_db).execute(s.reference).fetchone()[0]
    traj = await rollout(DemonstrationPolicy([s], PLAN), build_server(company_db), s, RolloutConfig())
    assert traj.metrics["completed"] and traj.metrics["tool_errors"] == 0, transcript(traj)
    assert traj.metadata["answer"] == str(s.answer)
    assert json.loads(traj.messages()[-2]["tool_calls"][0]["function"]["arguments"]) == {"answer": str(s.answer)}


# ---------------------------------------------------------------- real policies, real transports

TIME_SERVER = f"{sys.executable} -m mcp_server_time --local-timezone UTC"


class FakeChatEndpoint:
    """An OpenAI-compatible chat endpoint on 127.0.0.1: the network boundary, the one place
    a test double belongs. It replies with the next canned message of `turns`."""

    def __init__(self, turns):
        import http.server
        import threading

        self.turns, self.requests = list(turns), []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                message = outer.turns[min(len(outer.requests) - 1, len(outer.turns) - 1)]
                reply = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                    "choices": [{"index": 0, "message": message, "finish_reason": "stop",
                                                 "logprobs": None}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


def openai_call(name, args, k=0):
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]}


async def test_openai_policy_against_third_party_server_over_stdio():
    from mcp_rl.policies.policy import OpenAIPolicy

    endpoint = FakeChatEndpoint([openai_call("get_current_time", {"timezone": "Asia/Tokyo"}),
                                 openai_call(COMPLETE_TOOL_NAME, {"answer": "it is morning in Tokyo"}, 1)])
    try:
        policy = OpenAIPolicy("agent", base_url=endpoint.url, api_key="none")
        traj = await rollout(policy, TIME_SERVER, Scenario(id="t", task="What time is it in Tokyo?"), RolloutConfig())
    finally:
        endpoint.close()
    assert traj.metrics["completed"] and traj.metrics["tool_errors"] == 0, transcript(traj)
    assert "Asia/Tokyo" in traj.messages()[3]["content"]  # the real server's answer came back
    sent_tools = {t["function"]["name"] for t in endpoint.requests[0]["tools"]}
    assert {"get_current_time", "convert_time", COMPLETE_TOOL_NAME} <= sent_tools


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_policy_step_is_the_one_its_first_completion_saw():
    class LearnsItsStepOnACall:  # as OpenAIPolicy.from_art: the step comes back with the first call
        name, step = "served", 1

        async def complete(self, messages, tools, **kw):
            self.step = 2
            return choice_from_text(tool_call_text(COMPLETE_TOOL_NAME, {"answer": "5"}))

    traj = await rollout(LearnsItsStepOnACall(), toy_server(), TASK)
    assert traj.metadata["policy_step"] == 2


async def test_local_smollm2_rollouts_over_stdio_train_with_art(company_db):
    """The embedded model against mcp_server.py over stdio; ART tokenizes the group with
    assistant masks exactly on the sampled tokens and the sampled logprobs beside them."""
    from art.preprocessing.tokenize import tokenize_trajectory_groups

    from mcp_rl.policies.local_policy import LocalPolicy, art_tokenizer, load_local_model

    model, tok = load_local_model()
    torch_seed(0)
    policy = LocalPolicy(model, tok, tool_prefix=True)
    scenario = Scenario(id="n", task="How many employees are there?", answer=150)
    [group] = await gather_rollouts(policy, f"{sys.executable} mcp_server.py --db {company_db}", [scenario],
                                    RolloutConfig(max_turns=2, max_tokens=48, temperature=1.0), group_size=2)
    for traj in group.trajectories:
        assert not traj.metrics["fatal"], traj.metadata["fatal_reason"]
        assert traj.metrics["turns"] >= 1 and traj.metadata["policy_step"] == 0
    group.trajectories[0].reward = 1.0  # any two rewards: ART skips zero-advantage trajectories
    results = list(tokenize_trajectory_groups(art_tokenizer(tok), [group], False, False, False))
    assert len(results) == 2
    for traj, result in zip(group.trajectories, results):
        choices = [c for c in traj.messages_and_choices if not isinstance(c, dict)]
        want = [int(t.token.split(":")[1]) for c in choices for t in c.logprobs.content]
        masked = [i for i, m in enumerate(result.assistant_mask) if m]
        assert [result.token_ids[i] for i in masked] == want
        assert [result.logprobs[i] for i in masked] == pytest.approx(
            [t.logprob for c in choices for t in c.logprobs.content])


def torch_seed(n):
    import torch
    torch.manual_seed(n)
