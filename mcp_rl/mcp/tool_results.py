"""Tool results in a model's terms: the text it reads, what kind of failure it was, and what a tool takes.

    text = result_to_text(result, max_chars=4000)   # text blocks, structured content, placeholders
    ToolResult(text, is_error=True, kind="bad_arguments")
    signature(tool)                                 # 'describe_table takes: table_name (string, required).'

`ToolSession.call` (connect.py) returns a ToolResult for everything, failures included: the text
is what the agent sees, so it says what went wrong and what to send instead.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from mcp_rl.mcp.schemas import field_of

__all__ = ["ToolResult", "result_to_text", "truncate", "signature"]

# Servers phrase argument-validation failures differently; these cover pydantic (FastMCP, the
# official SDK's MCPServer), JSON-schema validators and common hand-written checks.
BAD_ARGS = re.compile(
    r"validation error|invalid (?:arguments|params|input)|input validation|field required|"
    r"missing required|unexpected keyword|required (?:property|argument)|is a required", re.I)
UNKNOWN_TOOL = re.compile(r"unknown tool|tool .*not found|no such tool", re.I)


@dataclass(frozen=True)
class ToolResult:
    """What the model sees after a tool call. `kind` is None on success, else one of
    "tool_error", "unknown_tool", "bad_arguments", "timeout", "server_dead"."""

    text: str
    is_error: bool = False
    kind: str | None = None


def nbytes(b64: str | None) -> int:
    if not b64:
        return 0
    try:
        return len(base64.b64decode(b64, validate=False))
    except (ValueError, TypeError):
        return len(b64) * 3 // 4


def _block_text(block: Any) -> str:
    kind = field_of(block, "type")
    if kind == "text":
        return field_of(block, "text") or ""
    mime = field_of(block, "mime_type", "mimeType")
    if kind in ("image", "audio"):
        return f"[{mime or kind}, {nbytes(field_of(block, 'data'))} bytes]"
    if kind == "resource":
        res = field_of(block, "resource")
        if field_of(res, "text") is not None:
            return field_of(res, "text")
        mime = field_of(res, "mime_type", "mimeType") or "binary"
        return f"[resource {field_of(res, 'uri')}, {mime}, {nbytes(field_of(res, 'blob'))} bytes]"
    if kind == "resource_link":
        return f"[resource link {field_of(block, 'name') or ''} {field_of(block, 'uri')}]".replace("  ", " ")
    return f"[{kind or type(block).__name__} content]"


def truncate(text: str, max_chars: int | None) -> str:
    """`text` cut to `max_chars`, with a marker saying how much was cut."""
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[truncated {len(text) - max_chars} chars]"


def result_to_text(result: Any, max_chars: int | None = 4000) -> str:
    """The text a model sees for an MCP tool result (a fastmcp or mcp CallToolResult, or a dict):
    text blocks joined by newlines, structured content as compact JSON when no block has text,
    other blocks as short placeholders; over `max_chars` it is cut and says so."""
    blocks = field_of(result, "content") or []
    parts = [_block_text(b) for b in blocks]
    has_text = any(field_of(b, "type") == "text" and field_of(b, "text") for b in blocks)
    structured = field_of(result, "structured_content", "structuredContent")
    if not has_text and structured is not None:
        parts.insert(0, json.dumps(structured, separators=(",", ":"), ensure_ascii=False, default=str))
    text = "\n".join(p for p in parts if p) or "(empty result)"
    return truncate(text, max_chars)


_PYDANTIC_LINK = re.compile(r"\n[ \t]*For further information visit https://errors\.pydantic\.dev\S*")


def signature(tool: Any) -> str:
    """What `tool` takes, in one line, from its input schema.

    >>> from types import SimpleNamespace as T
    >>> signature(T(name="describe_table", input_schema={"properties": {"table_name": {"type": "string"}},
    ...                                                  "required": ["table_name"]}))
    'describe_table takes: table_name (string, required).'
    >>> signature(T(name="list_tables", input_schema={"properties": {}}))
    'list_tables takes no arguments: send {}.'
    """
    schema = field_of(tool, "input_schema", "inputSchema") or {}
    props, required = schema.get("properties") or {}, set(schema.get("required") or [])
    if not props:
        return f"{tool.name} takes no arguments: send {{}}."
    parts = [f"{k} ({v.get('type', 'any') if isinstance(v, dict) else 'any'}{', required' * (k in required)})"
             for k, v in props.items()]
    return f"{tool.name} takes: {', '.join(parts)}."


def explained(result: ToolResult, tool: Any) -> ToolResult:
    """A bad-arguments result without pydantic's documentation links, ending with what the tool takes."""
    if result.kind != "bad_arguments":
        return result
    return ToolResult(f"{_PYDANTIC_LINK.sub('', result.text)}\n{signature(tool)}", True, "bad_arguments")
