"""A server's tools for a person: `python -m mcp_rl tools --server SPEC [--json]`.

    print(await tools_table("python mcp_server.py"))   # each tool's class, MCP hints, whether rollouts offer it
    print(await tools_json("python mcp_server.py"))    # the OpenAI tool schemas rollouts would show the model
"""

from __future__ import annotations

import json
from typing import Any

from mcp_rl.mcp.connect import ToolSession
from mcp_rl.mcp.guard import READ_ONLY, ToolPolicy, tool_hints
from mcp_rl.mcp.specs import ServerSpec, describe_spec

__all__ = ["tools_json", "tools_table"]


async def tools_json(spec: ServerSpec, policy: ToolPolicy | None = None, **session_kw: Any) -> str:
    """The server's tools as a JSON list of OpenAI tool schemas (`mcp_rl tools --json`): those
    `policy`'s filters admit, all without one (no side-effect check: nothing is called)."""
    async with ToolSession(spec, **session_kw) as session:
        if policy is not None:
            session.policy = policy
        return json.dumps(await session.openai_tools(), indent=2, ensure_ascii=False)


async def tools_table(spec: ServerSpec, policy: ToolPolicy | None = None, **session_kw: Any) -> str:
    """Each tool's side-effect class, MCP hints and whether rollouts under `policy` (default:
    `ToolPolicy()`) offer it, then what rollouts would do: `python -m mcp_rl tools`."""
    policy = policy or ToolPolicy()
    async with ToolSession(spec, **session_kw) as session:
        tools = await session.all_tools()
    rows = [("tool", "class", "hints (MCP annotations)", "offered")]
    for t in tools:
        hints = ", ".join(k.removesuffix("Hint") + ("" if v else "=false") for k, v in tool_hints(t).items())
        cls = policy.classify(t) + (" (declared)" if t.name in policy.read_only else "")
        rows.append((t.name, cls, hints or "(none)", "yes" if policy.admits(t.name) else "no (filtered)"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{describe_spec(spec)}: {len(tools)} tool{'s' * (len(tools) != 1)}"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3] for r in rows]
    try:
        policy.check(tools, server=describe_spec(spec))
        offered = policy.filter(tools)
        risky = [t.name for t in offered if policy.classify(t) != READ_ONLY]
        lines.append(f"rollouts: offer {len(offered)} tool{'s' * (len(offered) != 1)}" +
                     (f", with side effects allowed for {', '.join(risky)}" if risky else ", all read-only"))
    except ValueError as e:
        lines.append(f"rollouts: refused: {e}")
    return "\n".join(lines)
