"""The multi-turn agent loop: one scenario, one MCP session, one `art.Trajectory`.

    traj = await rollout(policy, "python mcp_server.py", scenario, RolloutConfig())
    groups = await gather_rollouts(policy, server, scenarios, cfg, group_size=4)

The agent sees the server's tools plus `complete_task(answer)`, which ends the
episode. Everything the agent gets wrong (a malformed call, an unknown tool, bad
arguments, a tool error) goes back to it as a message it can learn from and is
counted; only a short list of fatal conditions ends a rollout early, marked
`fatal` with a reason: the policy endpoint down after retries, a context
overflow, a dead server, the rollout's own wall-clock limit.

Which server tools the agent sees is `cfg.tool_policy`'s (`mcp_rl.mcp.guard.ToolPolicy`; by default
read-only tools only): a server with tools that have side effects raises `SideEffectsRefused`
before any rollout runs, not a batch of failed ones. Inside `mcp_rl.mcp.audit.log_tool_calls(path)`
every server tool call is appended to that log.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import art
from tqdm.auto import tqdm

from mcp_rl.mcp.audit import record_tool_call
from mcp_rl.mcp.connect import ServerUnavailable, ToolSession
from mcp_rl.rewards.evidence import record_lookup
from mcp_rl.mcp.guard import ToolPolicy, ToolPolicyError
from mcp_rl.policies.policy import ContextOverflow, PolicyError, find_tool_calls
from mcp_rl.quote import short

COMPLETE_TOOL_NAME = "complete_task"
COMPLETE_TOOL: dict = {
    "type": "function",
    "function": {
        "name": COMPLETE_TOOL_NAME,
        "description": (
            "Finish the task. Call this exactly once, when you know the final answer, "
            "with the answer alone (a number, a name, or a comma-separated list)."
        ),
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "The final answer."}},
            "required": ["answer"],
        },
    },
}

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent with tools from an MCP server. The tools work: use them to find "
    "the facts the task needs, never guess. For a database, look at the tables and their "
    "columns before you query. When you know the answer, call complete_task with it."
)


@dataclass
class RolloutConfig:
    max_turns: int = field(default=8, metadata={"help": "assistant turns before the episode is cut off"})
    max_tokens: int = field(default=256, metadata={"help": "new tokens per assistant turn"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (0 = greedy)"})
    system_prompt: str = field(default=DEFAULT_SYSTEM_PROMPT, metadata={"help": "system message"})
    call_timeout: float = field(default=30.0, metadata={"help": "seconds per tool call"})
    max_result_chars: int = field(default=3000, metadata={"help": "tool result cap, in characters"})
    timeout: float = field(default=600.0, metadata={"help": "wall-clock limit of one rollout, seconds"})
    concurrency: int = field(default=16, metadata={"help": "rollouts in flight at once"})
    tool_policy: ToolPolicy | None = field(default=None, metadata={
        "help": "which server tools the agent is offered (None: ToolPolicy(), read-only tools only); "
                "a Config sets it from server_tools, deny_tools and allow_side_effects"})

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_tokens < 8:
            raise ValueError(f"max_tokens must be >= 8 (a tool call needs room), got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if isinstance(self.tool_policy, dict):
            self.tool_policy = ToolPolicy(**self.tool_policy)
        if self.tool_policy is not None and not isinstance(self.tool_policy, ToolPolicy):
            raise ValueError(f"tool_policy must be a ToolPolicy or None, got {type(self.tool_policy).__name__}")


def _new_trajectory(policy, scenario, cfg: RolloutConfig, tools: list[dict]) -> art.Trajectory:
    return art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": cfg.system_prompt},
            {"role": "user", "content": scenario.task},
        ],
        tools=tools,
        reward=0.0,
        metrics={
            "turns": 0, "tool_calls": 0, "tool_errors": 0, "malformed_calls": 0,
            "unknown_tools": 0, "completed": False, "ran_out_of_turns": False,
            "fatal": False, "latency_s": 0.0,
        },
        metadata={
            "scenario_id": scenario.id, "answer": None, "fatal_reason": None,
            "policy": getattr(policy, "name", type(policy).__name__),
            "policy_step": int(getattr(policy, "step", 0)),
        },
    )


# Fatal reasons that are no fault of the policy: such a rollout is left out of its GRPO group
# (pipeline.train_step) instead of being scored, and trained on, as the policy's mistake.
OUTSIDE_POLICY = ("policy failed", "server died", "server unavailable", "rollout exceeded", "environment score failed")


def failed_outside_policy(traj: art.Trajectory) -> bool:
    """The rollout was cut short by the endpoint, the server or the wall clock, not by the policy."""
    return bool(traj.metrics.get("fatal")) and str(traj.metadata.get("fatal_reason") or "").startswith(OUTSIDE_POLICY)


def _fatal(traj: art.Trajectory, reason: str) -> None:
    traj.metrics["fatal"] = True
    traj.metadata["fatal_reason"] = reason[:500]
    traj.log(f"fatal: {reason}")


async def _run_tool_call(session: ToolSession, traj: art.Trajectory, call) -> str | None:
    """Execute one OpenAI-shaped tool call; return the tool message text, or None
    when the call was complete_task (the answer is recorded on the trajectory)."""
    m = traj.metrics
    name = call.function.name
    try:
        args: Any = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        m["malformed_calls"] += 1
        return f"Error: the arguments of {short(name)} are not valid JSON ({e}). Send a JSON object."
    if not isinstance(args, dict):
        m["malformed_calls"] += 1
        return f"Error: the arguments of {short(name)} must be a JSON object, got {type(args).__name__}."
    m["tool_calls"] += 1
    key = f"tool_calls/{name[:100]}"  # a model-made name: no 100,000-character metric keys
    m[key] = m.get(key, 0) + 1
    if name == COMPLETE_TOOL_NAME:
        if "answer" not in args:
            m["tool_errors"] += 1
            return "Error: complete_task needs an `answer` argument."
        traj.metadata["answer"] = str(args["answer"])
        m["completed"] = True
        return None
    t0 = time.perf_counter()
    result = await session.call(name, args)
    record_tool_call(traj.metadata["scenario_id"], name, args, result.kind, time.perf_counter() - t0)
    if not result.is_error:
        record_lookup(traj, name, args, result.text)  # the evidence a grounded answer needs (evidence.py)
    else:
        m["tool_errors"] += 1
        if result.kind == "unknown_tool":
            m["unknown_tools"] += 1
        if result.kind == "server_dead":
            _fatal(traj, f"server died: {result.text}")
    return result.text


async def _loop(policy, session: ToolSession, traj: art.Trajectory, cfg: RolloutConfig) -> None:
    m = traj.metrics
    for _ in range(cfg.max_turns):
        try:
            # A token-in policy (LocalPolicy) gets earlier turns as the Choices sampled, others as messages.
            history = list(traj.messages_and_choices) if getattr(policy, "token_in", False) else traj.messages()
            choice = await policy.complete(history, traj.tools, max_tokens=cfg.max_tokens, temperature=cfg.temperature)
        except ContextOverflow as e:
            return _fatal(traj, f"context overflow: {e}")
        except PolicyError as e:
            return _fatal(traj, f"policy failed: {e}")
        traj.messages_and_choices.append(choice)
        m["turns"] += 1
        if m["turns"] == 1:
            # A served policy may learn its step on a call (OpenAIPolicy.from_art asks ART's
            # backend); the first turn's step, not the one before it, names the weights sampled.
            traj.metadata["policy_step"] = int(getattr(policy, "step", 0))
        text = choice.message.content or ""
        calls = choice.message.tool_calls or []
        # Text-format policies put unparseable <tool_call> blocks in the content only.
        errors = find_tool_calls(text)[1] if "<tool_call>" in text else []
        if errors:
            m["malformed_calls"] += len(errors)
            traj.messages_and_choices.append({"role": "user", "content": (
                "Your tool call could not be read: " + "; ".join(errors) + '. Write it as '
                '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>.')})
        if not calls:
            if errors:
                continue
            # A plain reply ends the episode; it is kept as the answer but not `completed`.
            traj.metadata["answer"] = text.strip() or None
            return
        for call in calls:
            reply = await _run_tool_call(session, traj, call)
            if reply is None:  # complete_task
                traj.messages_and_choices.append(
                    {"role": "tool", "tool_call_id": call.id, "content": "Task completed."})
                return
            traj.messages_and_choices.append({"role": "tool", "tool_call_id": call.id, "content": reply})
            if m["fatal"]:
                return
    m["ran_out_of_turns"] = True


async def rollout(policy, server, scenario, cfg: RolloutConfig | None = None) -> art.Trajectory:
    """Run one episode of `scenario` with `policy` against `server`.

    `server` is a ServerSpec (a session is opened and closed for this rollout; an Environment with
    per-rollout episodes opens one for `scenario` and scores it before tearing it down) or
    an open `ToolSession` (one opened without a policy gets `cfg.tool_policy`). Never raises for
    anything the agent, policy or server does: failures come back as a trajectory with
    `metrics["fatal"] = True`. Raises ToolPolicyError (SideEffectsRefused, a ValueError) when
    the server's tools do not fit `cfg.tool_policy`: that is a setting to fix, not a rollout.
    """
    cfg = cfg or RolloutConfig()
    tool_policy = cfg.tool_policy or ToolPolicy()
    if hasattr(policy, "for_scenario"):  # a scripted policy that plays each task's own plan (DemonstrationPolicy)
        policy = policy.for_scenario(scenario)
    start = time.monotonic()
    traj = _new_trajectory(policy, scenario, cfg, [COMPLETE_TOOL])
    try:
        async with asyncio.timeout(cfg.timeout):
            if isinstance(server, ToolSession):
                if server.policy is None:
                    await server.restrict(tool_policy)
                traj.tools = [*(await server.openai_tools()), COMPLETE_TOOL]
                await _loop(policy, server, traj, cfg)
            else:
                async with ToolSession(
                    server, call_timeout=cfg.call_timeout, max_result_chars=cfg.max_result_chars,
                    policy=tool_policy, scenario=scenario,  # an environment's episode is opened for this task
                ) as session:
                    traj.tools = [*(await session.openai_tools()), COMPLETE_TOOL]
                    await _loop(policy, session, traj, cfg)
                    await session.score(traj, scenario)  # the environment's own check, before its teardown
    except ToolPolicyError:
        raise
    except TimeoutError:
        _fatal(traj, f"rollout exceeded its {cfg.timeout:.0f} s limit")
    except ServerUnavailable as e:
        _fatal(traj, f"server unavailable: {e}")
    except Exception as e:  # a bug in a policy or server must fail this rollout, not the batch
        _fatal(traj, f"{type(e).__name__}: {e}")
    traj.metrics["latency_s"] = round(time.monotonic() - start, 3)
    return traj.finish()


async def gather_rollouts(
    policy, server, scenarios, cfg: RolloutConfig | None = None, *,
    group_size: int = 1, desc: str = "rollouts", leave: bool = True,
) -> list[art.TrajectoryGroup]:
    """`group_size` rollouts of every scenario, at most `cfg.concurrency` in flight,
    each with its own MCP session. Returns one TrajectoryGroup per scenario, in order.
    A ToolPolicyError (the side-effect guard) from the first session stops the rest and is raised."""
    cfg = cfg or RolloutConfig()
    gate = asyncio.Semaphore(cfg.concurrency)
    bar = tqdm(total=len(scenarios) * group_size, desc=desc, leave=leave)  # stays by default: a record of each step

    async def one(scenario) -> art.Trajectory:
        async with gate:
            traj = await rollout(policy, server, scenario, cfg)
        bar.update(1)
        return traj

    try:
        # A TaskGroup, not gather: a refused session cancels the rollouts still waiting, so the
        # guard's message comes once instead of once per rollout.
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(s)) for s in scenarios for _ in range(group_size)]
    except BaseExceptionGroup as eg:  # rollout() raises only ToolPolicyError (and interrupts)
        raise eg.exceptions[0] from None
    finally:
        bar.close()
    trajs = [t.result() for t in tasks]
    return [
        art.TrajectoryGroup(trajs[i * group_size:(i + 1) * group_size])
        for i in range(len(scenarios))
    ]


def transcript(traj: art.Trajectory) -> str:
    """A readable transcript of a trajectory (for the CLI and notebooks)."""
    lines = []
    for msg in traj.messages():
        role = msg["role"]
        content = (msg.get("content") or "").strip()
        if role == "system":
            continue
        if role == "assistant" and msg.get("tool_calls") and "<tool_call>" not in content:
            calls = "; ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in msg["tool_calls"])
            content = (content + "\n" if content else "") + f"-> {calls}"
        lines.append(f"[{role}] {content}")
    m, md = traj.metrics, traj.metadata
    lines.append(
        f"-- answer: {md.get('answer')!r} | turns {m.get('turns')} | tool calls {m.get('tool_calls')} "
        f"| errors {m.get('tool_errors')} | completed {m.get('completed')} | reward {traj.reward:.3f}"
        + (f" | fatal: {md.get('fatal_reason')}" if m.get("fatal") else "")
    )
    return "\n".join(lines)
