"""An Environment: what an agent is trained on, in one object (verifiers' Environment): the MCP server
and how to start it, its tasks, their reward, optional demonstrations and counterfactual worlds.

    env = environment("company")                  # a shipped one (mcp_rl/environments/), by name
    env = environment("uvx mcp-server-time@2026.10.19")   # any server spec: a stdio command, URL, FastMCP object
    env = Environment("time", server={"command": "uvx mcp-server-time@2026.10.19"}, rewards=[("t", fn, 0.5)])
    run = open_run(cfg, env=env)                  # the run, its evaluation and training use it
    with env.serve(token) as spec: ...            # the server while a block runs (started when it has to be)

Stateful servers: `episode(scenario)` gives each rollout its own server or state (an `Episode`: the spec
to talk to, the state, tool arguments bound and hidden from the model), torn down after the rollout;
`score(trajectory, scenario, episode)` is the environment's own check of the outcome, run before that.
`stdio_episodes(command)` makes one for a stdio server: a private temp folder and environment per rollout.

The library itself names no server: `environment(spec)` asks each environment shipped under
mcp_rl/environments/ whether it recognises the spec (its name, its script's command line, its FastMCP
object), and otherwise wraps the spec as it is, with no demonstrations and no counterfactual worlds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, AsyncContextManager, Awaitable, Callable


@dataclass
class Episode:
    """One rollout's own server: the spec its session talks to, the environment's state for it, and
    tool arguments bound for every call that takes them and hidden from the model's schemas."""

    spec: Any
    state: Any = None
    bind: dict[str, Any] = field(default_factory=dict)


@dataclass
class Environment:
    """A server, its tasks and their reward. Only `name` is required; what is left None is taken from
    the run's Config (`configure`) or is absent (no demonstrations: no warm start)."""

    name: str
    server: Any = None  # a ServerSpec: a .py file or shell command (stdio), an http(s) URL, a dict, a FastMCP object
    command: list[str] | None = None  # or: argv serving it over streamable HTTP on a free local port (started per use)
    scenarios: str | Path | None = None  # the tasks, a JSONL file with train/val/test splits
    system_prompt: str | None = None  # None: RolloutConfig's
    server_tools: list[str] | None = None  # the only tools offered (None: the Config's setting)
    max_turns: int | None = None  # assistant turns its tasks need (None: RolloutConfig's; its longest demonstration + 1 at least)
    rewards: list = field(default_factory=list)  # (name, fn(trajectory, scenario) -> float, weight), as RewardConfig.custom
    plan: Callable[[Any], list[dict]] | None = None  # a task's demonstration: its tool calls, then complete_task
    worlds: Callable[[], Any] | None = None  # counterfactual worlds (mcp_rl.rewards.counterfactual) for replaying lookups
    templates: Callable[..., Any] | None = None  # async (session, sql_tool) -> grounded question templates
    # per rollout (stateful servers): scenario (None: a session with no task, e.g. listing tools) -> Episode
    episode: Callable[[Any], AsyncContextManager[Episode]] | None = None
    # the environment's own reward, before the episode is torn down: a score in [0, 1], or
    # {"score": s, "<name>": sub-score, ...}; it stands where a verified answer would
    score: Callable[[Any, Any, Episode], Awaitable[float | dict]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"an Environment needs a name (a short label for reports), got {self.name!r}")
        if self.server is None and not self.command and self.episode is None:
            raise ValueError(f"environment {self.name!r} needs a server (a spec), a command that serves it over HTTP, "
                             "or an episode factory (a server or state per rollout)")
        from mcp_rl.rewards.score import check_custom

        self.rewards = [check_custom(item, i) for i, item in enumerate(self.rewards or [])]

    @contextlib.contextmanager
    def serve(self, token: str | None = None):
        """The ServerSpec rollouts use while the block runs: `command` started over HTTP on a free port
        (stopped after the block), an http(s) URL with a bearer `token` as {"url", "token"}, anything
        else as it is; an environment with `episode` is its own spec (each session opens an episode).

        >>> with Environment("x", server="http://127.0.0.1:9/mcp").serve("t") as spec: spec
        {'url': 'http://127.0.0.1:9/mcp', 'token': 't'}
        """
        if self.episode is not None:
            yield self
        elif self.command:
            from mcp_rl.mcp.launch import HttpServer

            with HttpServer(self.command, token=token) as started:
                yield started.spec
        elif token and isinstance(self.server, str) and self.server.startswith(("http://", "https://")):
            yield {"url": self.server, "token": token}
        else:
            yield self.server

    def start(self, token: str | None = None):
        """For notebooks: the server started now and kept up across cells (`.spec`, `.alive`, `.stop()`)."""
        from mcp_rl.mcp.launch import HttpServer, Running

        if self.episode is not None:
            return Running(self)
        return HttpServer(self.command, token=token).start() if self.command else Running(self.server)

    def configure(self, cfg):
        """`cfg` with this environment's settings: its server label, prompt, turns, tools, rewards (added to the
        Config's own custom rewards, replacing any of the same name) and tasks (where the Config names none).

        >>> from mcp_rl.runs.config import Config
        >>> Environment("t", server="x.py", scenarios="t.jsonl").configure(Config()).scenarios
        't.jsonl'
        >>> Environment("t", server="x.py", scenarios="t.jsonl").configure(Config(scenarios="mine.jsonl")).scenarios
        'mine.jsonl'
        """
        values: dict[str, Any] = {"server": self.server if isinstance(self.server, str) and not self.command else self.name}
        default = next(f.default for f in dataclasses.fields(cfg) if f.name == "scenarios")
        if self.scenarios is not None and cfg.scenarios == default and Path(default).resolve() != Path(self.scenarios).resolve():
            values["scenarios"] = str(self.scenarios)  # the environment's tasks, unless the Config names others
        if self.server_tools is not None:
            values["server_tools"] = list(self.server_tools)
        cfg = dataclasses.replace(cfg, **values)  # Config.__post_init__ checks them and remakes the tool policy
        if self.system_prompt is not None:
            cfg.rollout = dataclasses.replace(cfg.rollout, system_prompt=self.system_prompt)
        if self.max_turns is not None:
            from mcp_rl.runs.train_config import PROMPT_TOKENS, TrainConfig, check_episode_fits

            cfg.rollout = dataclasses.replace(cfg.rollout, max_turns=self.max_turns)
            need = PROMPT_TOKENS + cfg.rollout.max_turns * cfg.rollout.max_tokens
            if cfg.train.max_seq_len == TrainConfig.max_seq_len and need > cfg.train.max_seq_len:
                cfg.train = dataclasses.replace(cfg.train, max_seq_len=need)  # the default, not the user's: make room
            check_episode_fits(cfg.rollout, cfg.train)  # set after Config's own checks ran: check again
        if self.rewards:
            mine = {name for name, _, _ in self.rewards}
            custom = [c for c in cfg.reward.custom if c[0] not in mine] + list(self.rewards)
            cfg.reward = dataclasses.replace(cfg.reward, custom=custom)
        return cfg

    def demonstrations(self, scenarios, tokenizer: Any = None):
        """A policy that plays `plan` for each of `scenarios` (mcp_rl.policies.policy.DemonstrationPolicy); without
        a plan, tasks that all carry gold actions (`extra["actions"]`) replay those; else None."""
        from mcp_rl.tasks.demonstrations import actions_plan

        plan = self.plan
        if plan is None and scenarios and all((getattr(s, "extra", None) or {}).get("actions") for s in scenarios):
            plan = actions_plan  # tasks that carry their gold actions demonstrate themselves, on any server
        if plan is None:
            return None
        from mcp_rl.policies.policy import DemonstrationPolicy

        return DemonstrationPolicy(scenarios, plan, tokenizer=tokenizer)

    def counterfactual(self):
        """Fresh counterfactual worlds for replaying a right answer's lookups, or None (not replayed)."""
        return self.worlds() if self.worlds is not None else None


def stdio_episodes(command: str | list[str], env: dict[str, str] | None = None, *, folder_var: str = "MCP_RL_ROLLOUT_DIR"):
    """An `episode` factory for a stdio server that keeps state on disk: each rollout starts its own
    process with `env` plus `folder_var` set to a private temp folder, removed after the rollout
    (the server should keep its state there, e.g. a copy of its database).

    >>> import asyncio
    >>> async def one():
    ...     async with stdio_episodes("python server.py", {"A": "1"})(None) as ep:
    ...         return ep.spec["env"]["A"], os.path.isdir(ep.spec["env"]["MCP_RL_ROLLOUT_DIR"])
    >>> asyncio.run(one())
    ('1', True)
    """
    @contextlib.asynccontextmanager
    async def episode(scenario):
        folder = tempfile.mkdtemp(prefix="mcp-rl-rollout-")
        try:
            spec = {"command": command, "env": {**(env or {}), folder_var: folder}}
            yield Episode(spec, state=Path(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return episode


def environment(spec: Any) -> Environment:
    """The Environment for a `--server` / `Config.server` value: an Environment as it is; one that an
    environment shipped under mcp_rl/environments/ recognises (by name or by its server's spec); else
    the spec wrapped as it is (a stdio command, a URL, a dict, a FastMCP object)."""
    if isinstance(spec, Environment):
        return spec
    from mcp_rl.environments import recognise

    found = recognise(spec)
    if found is not None:
        return found
    label = spec if isinstance(spec, str) else getattr(spec, "name", None) or type(spec).__name__
    return Environment(str(label)[:80] or "server", server=spec)


__all__ = ["Environment", "Episode", "environment", "stdio_episodes"]
