"""Which server tools an agent may be offered: side-effect classes, name filters, the guard.

    policy = ToolPolicy()                                   # the default: read-only tools only
    policy = ToolPolicy(allow=["list_tables", "run_query"]) # these tools, whatever their class
    policy = ToolPolicy(deny=["drop_table"], allow_side_effects=True)
    policy = ToolPolicy(read_only=["get_order"])            # unannotated, but declared read-only
    async with ToolSession(spec, policy=policy) as s:       # raises SideEffectsRefused at open
        tools = await s.openai_tools()                      # filtered tools only

A tool is read-only when the server annotates it `readOnlyHint: true` and not
`destructiveHint: true`; anything else (no annotations included) has side effects, as the MCP
spec says clients must assume of unannotated tools. Rollouts refuse a session that would offer
the agent a tool with side effects unless the tools are named in an allowlist or side effects
are allowed explicitly: an RL run calls tools thousands of times with a model's arguments.
Servers that annotate nothing can have their read-only tools declared (`read_only`): those pass the
guard as if annotated (a tool the server annotates destructive cannot be declared).
The refusal suggests an allowlist, leaving out tools whose names say they control or watch the
environment (`control_tool`: reset_state, get_call_log...), which a model must never be offered.
`filter_tools` applies a policy's name filters alone (for scenario generators that list tools).
Show each tool's class: `python -m mcp_rl tools --server SPEC`.

The check is not only at open: a server may change its tools mid-session and say so
(`notifications/tools/list_changed`); the session then re-lists them before its next call and
checks them again, and a failed re-check refuses that call and every later one (`ToolsChanged`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from mcp_rl.quote import SHORT_CHARS, short  # noqa: F401 - used here; also re-exported (runs.py imports it from guard)
from mcp_rl.mcp.schemas import field_of

__all__ = ["ToolPolicy", "ToolPolicyError", "SideEffectsRefused", "ToolsChanged", "READ_ONLY", "SIDE_EFFECTS", "classify_tool", "tool_hints",
           "tool_name", "filter_tools", "control_tool", "CONTROL_WORDS", "short"]

READ_ONLY = "read-only"
SIDE_EFFECTS = "side effects"
HINTS = (("readOnlyHint", "read_only_hint"), ("destructiveHint", "destructive_hint"),
         ("idempotentHint", "idempotent_hint"), ("openWorldHint", "open_world_hint"))


class ToolPolicyError(ValueError):
    """A server's tools do not fit a ToolPolicy: a configuration error, raised (not turned into
    failed rollouts) so that a run stops once, with one message, before the agent sees a tool."""


class SideEffectsRefused(ToolPolicyError):
    """A rollout would have offered the agent tools with side effects; the message names them
    and the two ways on (an allowlist, or allowing side effects)."""

    def __init__(self, message: str, tools: list[str]):
        super().__init__(message)
        self.tools = tools


class ToolsChanged(ToolPolicyError):
    """A server changed its tools during a session (`notifications/tools/list_changed`) and the guard's
    re-check refused the new list: a tool re-registered with side effects is never called. Raised by
    `ToolSession.call` (the one thing a call raises), so a run stops as it would had the server
    listed those tools at open; `cause` is the check's own error."""

    def __init__(self, message: str, cause: ToolPolicyError):
        super().__init__(message)
        self.cause = cause


def tool_name(tool: Any) -> str:
    """The name of an MCP Tool (object or dict) or an OpenAI function schema."""
    return field_of(tool, "name") or field_of(field_of(tool, "function") or {}, "name") or ""


def tool_hints(tool: Any) -> dict[str, bool]:
    """The MCP behaviour hints a server set on `tool`, by their MCP names (unset ones left out).

    >>> tool_hints({"name": "q", "annotations": {"readOnlyHint": True}})
    {'readOnlyHint': True}
    """
    ann = field_of(tool, "annotations")
    if ann is None:
        return {}
    out = {}
    for camel, snake in HINTS:
        value = field_of(ann, snake, camel) if not isinstance(ann, dict) else ann.get(camel, ann.get(snake))
        if value is not None:
            out[camel] = bool(value)
    return out


def classify_tool(tool: Any) -> str:
    """READ_ONLY when annotated `readOnlyHint` and not `destructiveHint`, else SIDE_EFFECTS.

    >>> classify_tool({"name": "q", "annotations": {"readOnlyHint": True}})
    'read-only'
    >>> classify_tool({"name": "rm"}), classify_tool({"name": "rm", "annotations": {"readOnlyHint": True, "destructiveHint": True}})
    ('side effects', 'side effects')
    """
    hints = tool_hints(tool)
    return READ_ONLY if hints.get("readOnlyHint") and not hints.get("destructiveHint") else SIDE_EFFECTS


# Words that, as a whole word of a tool's name, mark a tool that drives or watches the environment
# rather than doing the task: τ²-style servers ship reset_state and get_call_log beside their task
# tools, unannotated. Whole words only: "catalog" or "login" hold no "log" word.
CONTROL_WORDS = frozenset({"reset", "restore", "seed", "setup", "teardown", "state", "snapshot",
                           "log", "logs", "debug", "admin"})


def control_tool(name: str) -> bool:
    """Whether a tool's name looks like environment control or instrumentation: a leading underscore,
    or a CONTROL_WORDS word among its snake_case, kebab-case or camelCase words. Such tools are never
    suggested in an allowlist (a heuristic: it only shapes a message, it offers and hides nothing).

    >>> [control_tool(n) for n in ("reset_state", "state_reset", "get_call_log", "resetDb", "_debug_dump")]
    [True, True, True, True, True]
    >>> [control_tool(n) for n in ("get_order_details", "search_catalog", "login_user", "exchange_items")]
    [False, False, False, False]
    """
    words = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", name)
    return name.startswith("_") or any(w.lower() in CONTROL_WORDS for w in words)


def _names(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):  # "a,b,c" from a command line or a YAML scalar
        value = [v for v in value.split(",")]
    names = tuple(str(v).strip() for v in value)
    if any(not n for n in names):
        raise ValueError(f"{what} must be tool names such as ['list_tables', 'run_query'], got {short(value)}")
    return names


@dataclass(frozen=True)
class ToolPolicy:
    """Which of a server's tools the agent is offered (and may call).

    `allow`: only these tools (None: all); `deny`: never these; `allow_side_effects`: offer tools
    with side effects even without an allowlist; `read_only`: tools the server leaves unannotated
    that count as read-only for the guard. An allowlist is itself a way on: the tools it names are
    offered whatever their class, because someone chose them by name.
    """

    allow: tuple[str, ...] | None = field(default=None, metadata={"help": "only these tools (None: all)"})
    deny: tuple[str, ...] = field(default=(), metadata={"help": "never these tools"})
    allow_side_effects: bool = field(default=False, metadata={
        "help": "offer tools not annotated read-only (or annotated destructive)"})
    read_only: tuple[str, ...] = field(default=(), metadata={"help": "tools to count as read-only though not annotated"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", _names(self.allow, "allow"))
        object.__setattr__(self, "deny", _names(self.deny, "deny") or ())
        object.__setattr__(self, "read_only", _names(self.read_only, "read_only") or ())
        if not isinstance(self.allow_side_effects, bool):
            raise ValueError(f"allow_side_effects must be true or false, got {self.allow_side_effects!r}")
        if self.allow is not None and not self.allow:
            raise ValueError("allow is empty: the agent would have no tools; name at least one, or pass None for all")

    def as_dict(self) -> dict:
        """Its fields as JSON values (what a trainer sends a rollout worker; `ToolPolicy(**d)` reads it back).

        >>> ToolPolicy(allow=["a"]).as_dict()
        {'allow': ['a'], 'deny': [], 'allow_side_effects': False, 'read_only': []}
        """
        return {"allow": None if self.allow is None else list(self.allow), "deny": list(self.deny),
                "allow_side_effects": self.allow_side_effects, "read_only": list(self.read_only)}

    def classify(self, tool: Any) -> str:
        """`classify_tool`, with the tools this policy declares read-only counted as READ_ONLY."""
        return READ_ONLY if tool_name(tool) in self.read_only else classify_tool(tool)

    def admits(self, name: str) -> bool:
        """Whether a tool called `name` passes the name filters."""
        return (self.allow is None or name in self.allow) and name not in self.deny

    def filter(self, tools: Iterable[Any]) -> list[Any]:
        """The tools (MCP Tools or OpenAI schemas) that pass the name filters, in order."""
        return [t for t in tools if self.admits(tool_name(t))]

    def check(self, tools: list[Any], server: str = "the MCP server") -> None:
        """Raise ToolPolicyError when a filter names a tool `server` lacks (a typo would offer a tool
        someone meant to hide, or hide one they meant to offer), SideEffectsRefused when the
        tools that pass would include one with side effects and nothing allows it."""
        have = [tool_name(t) for t in tools]
        for what, names in (("--tools / Config.server_tools / ToolPolicy.allow", self.allow or ()),
                            ("--deny-tools / Config.deny_tools / ToolPolicy.deny", self.deny),
                            ("--read-only-tools / Config.read_only_tools / ToolPolicy.read_only", self.read_only)):
            missing = [n for n in names if n not in have]
            if missing:
                raise ToolPolicyError(f"{what} names tools that {server} does not have: "
                                 f"{', '.join(short(n) for n in missing)}; its tools are: {', '.join(have) or '(none)'}")
        # The server's own word that a tool destroys outranks a declaration that it only reads.
        destructive = [tool_name(t) for t in tools
                       if tool_name(t) in self.read_only and tool_hints(t).get("destructiveHint")]
        if destructive:
            raise ToolPolicyError(f"--read-only-tools / Config.read_only_tools names {', '.join(destructive)}, which "
                                  f"{server} annotates destructiveHint: it cannot count as read-only; name it in "
                                  "--tools or allow side effects instead")
        if self.allow is not None or self.allow_side_effects:
            return
        offered = self.filter(tools)
        risky = [tool_name(t) for t in offered if self.classify(t) == SIDE_EFFECTS]
        if risky:
            raise SideEffectsRefused(self._refusal(offered, risky, server), risky)

    def _refusal(self, offered: list[Any], risky: list[str], server: str) -> str:
        """The refusal: what is refused, why side effects need per-rollout state, and the ways on, with an
        allowlist example that leaves out control tools (and says which)."""
        safe = [tool_name(t) for t in offered if self.classify(t) == READ_ONLY]
        candidates = safe or risky
        control = [n for n in (tool_name(t) for t in offered) if control_tool(n)]
        example = ",".join(n for n in candidates if not control_tool(n)) or "NAME,..."
        left_out = (f" (left out of that example: {', '.join(control)}, whose names look like environment control "
                    f"or instrumentation, which a model must never be offered: --deny-tools {','.join(control)})"
                    if control else "")
        return (f"refusing to offer the agent tools with side effects: {', '.join(risky)} (of {server}: not "
                f"annotated readOnlyHint, or annotated destructiveHint); rollouts would call them with a model's "
                f"arguments. Tools with side effects need per-rollout isolation: each rollout must get its own fresh "
                f"copy of the server's state, or parallel and successive rollouts see and break each other's changes. "
                f"Either name the tools the agent may use (--tools {example}; Config.server_tools=[...]; "
                f"ToolPolicy(allow=[...])){left_out}, declare the unannotated tools that only read "
                f"(--read-only-tools NAME,...; Config.read_only_tools=[...]; ToolPolicy(read_only=[...])), or allow "
                f"side effects (--allow-side-effects; Config.allow_side_effects=True; "
                f"ToolPolicy(allow_side_effects=True)). "
                f"`python -m mcp_rl tools --server SPEC` shows each tool's class.")


def filter_tools(tools: Iterable[Any], policy: ToolPolicy | None) -> list[Any]:
    """`tools` (MCP Tools or OpenAI schemas) that pass `policy`'s name filters; all of them for
    None. For code that lists tools itself (scenario generators): no side-effect check here."""
    return list(tools) if policy is None else policy.filter(tools)
