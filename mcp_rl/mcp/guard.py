"""Which server tools an agent may be offered: side-effect classes, name filters, the guard.

    policy = ToolPolicy()                                   # the default: read-only tools only
    policy = ToolPolicy(allow=["list_tables", "run_query"]) # these tools, whatever their class
    policy = ToolPolicy(deny=["drop_table"], allow_side_effects=True)
    async with ToolSession(spec, policy=policy) as s:       # raises SideEffectsRefused at open
        tools = await s.openai_tools()                      # filtered tools only

A tool is read-only when the server annotates it `readOnlyHint: true` and not
`destructiveHint: true`; anything else (no annotations included) has side effects, as the MCP
spec says clients must assume of unannotated tools. Rollouts refuse a session that would offer
the agent a tool with side effects unless the tools are named in an allowlist or side effects
are allowed explicitly: an RL run calls tools thousands of times with a model's arguments.
`filter_tools` applies a policy's name filters alone (for scenario generators that list tools).
Show each tool's class: `python -m mcp_rl tools --server SPEC`.

The check is not only at open: a server may change its tools mid-session and say so
(`notifications/tools/list_changed`); the session then re-lists them before its next call and
checks them again, and a failed re-check refuses that call and every later one (`ToolsChanged`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from mcp_rl.quote import SHORT_CHARS, short  # noqa: F401 - used here; also re-exported (runs.py imports it from guard)
from mcp_rl.mcp.schemas import field_of

__all__ = ["ToolPolicy", "ToolPolicyError", "SideEffectsRefused", "ToolsChanged", "READ_ONLY", "SIDE_EFFECTS", "classify_tool", "tool_hints",
           "tool_name", "filter_tools", "short"]

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
    with side effects even without an allowlist. An allowlist is itself a way on: the tools it
    names are offered whatever their class, because someone chose them by name.
    """

    allow: tuple[str, ...] | None = field(default=None, metadata={"help": "only these tools (None: all)"})
    deny: tuple[str, ...] = field(default=(), metadata={"help": "never these tools"})
    allow_side_effects: bool = field(default=False, metadata={
        "help": "offer tools not annotated read-only (or annotated destructive)"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "allow", _names(self.allow, "allow"))
        object.__setattr__(self, "deny", _names(self.deny, "deny") or ())
        if not isinstance(self.allow_side_effects, bool):
            raise ValueError(f"allow_side_effects must be true or false, got {self.allow_side_effects!r}")
        if self.allow is not None and not self.allow:
            raise ValueError("allow is empty: the agent would have no tools; name at least one, or pass None for all")

    def as_dict(self) -> dict:
        """Its fields as JSON values (what a trainer sends a rollout worker; `ToolPolicy(**d)` reads it back).

        >>> ToolPolicy(allow=["a"]).as_dict()
        {'allow': ['a'], 'deny': [], 'allow_side_effects': False}
        """
        return {"allow": None if self.allow is None else list(self.allow), "deny": list(self.deny),
                "allow_side_effects": self.allow_side_effects}

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
                            ("--deny-tools / Config.deny_tools / ToolPolicy.deny", self.deny)):
            missing = [n for n in names if n not in have]
            if missing:
                raise ToolPolicyError(f"{what} names tools that {server} does not have: "
                                 f"{', '.join(short(n) for n in missing)}; its tools are: {', '.join(have) or '(none)'}")
        if self.allow is not None or self.allow_side_effects:
            return
        offered = self.filter(tools)
        risky = [tool_name(t) for t in offered if classify_tool(t) == SIDE_EFFECTS]
        if risky:
            safe = [tool_name(t) for t in offered if classify_tool(t) == READ_ONLY]
            example = ",".join(safe or risky)
            raise SideEffectsRefused(
                f"refusing to offer the agent tools with side effects: {', '.join(risky)} (of {server}: not "
                f"annotated readOnlyHint, or annotated destructiveHint); rollouts would call them with a model's "
                f"arguments. Either name the tools the agent may use (--tools {example}; "
                f"Config.server_tools=[...]; ToolPolicy(allow=[...])) or allow side effects "
                f"(--allow-side-effects; Config.allow_side_effects=True; ToolPolicy(allow_side_effects=True)). "
                f"`python -m mcp_rl tools --server SPEC` shows each tool's class.", risky)


def filter_tools(tools: Iterable[Any], policy: ToolPolicy | None) -> list[Any]:
    """`tools` (MCP Tools or OpenAI schemas) that pass `policy`'s name filters; all of them for
    None. For code that lists tools itself (scenario generators): no side-effect check here."""
    return list(tools) if policy is None else policy.filter(tools)
