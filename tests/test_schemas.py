"""Tests for mcp_rl/mcp/schemas.py: MCP tool → OpenAI function schema, table-driven.

Run: .venv/bin/python -m pytest tests/test_schemas.py -q
Tables use MCP tools as dicts; one test converts real Tool objects from an in-memory
FastMCP server, listed through `fastmcp.Client`.
"""

from __future__ import annotations

import pytest
from fastmcp import Client, FastMCP

from mcp_rl.mcp.schemas import mcp_tool_to_openai

EMPTY = {"type": "object", "properties": {}}
CASES = [
    ("missing schema", {}, EMPTY),
    ("empty schema", {"inputSchema": {}}, EMPTY),
    ("null schema", {"inputSchema": None}, EMPTY),
    ("no properties", {"inputSchema": {"type": "object"}}, EMPTY),
    ("non-object root coerced", {"inputSchema": {"type": "string"}}, EMPTY),
    ("nested object and enum",
     {"inputSchema": {"type": "object", "title": "Args", "properties": {
         "where": {"type": "object", "title": "Where", "properties": {"kind": {"enum": ["a", "b"]}}}}}},
     {"type": "object", "properties": {
         "where": {"type": "object", "properties": {"kind": {"enum": ["a", "b"], "type": "string"}}}}}),
    ("array without items gets items",
     {"inputSchema": {"properties": {"ids": {"type": "array"}}}},
     {"properties": {"ids": {"type": "array", "items": {}}}, "type": "object"}),
    ("$ref and $defs inlined",
     {"inputSchema": {"type": "object", "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                      "properties": {"p": {"$ref": "#/$defs/P", "description": "a point"}}}},
     {"type": "object", "properties": {
         "p": {"type": "object", "properties": {"x": {"type": "integer"}}, "description": "a point"}}}),
    ("cyclic $ref cut",
     {"inputSchema": {"type": "object", "properties": {"n": {"$ref": "#/$defs/Node"}},
                      "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}}},
     {"type": "object", "properties": {"n": {"type": "object", "properties": {
         "next": {"type": "object", "description": "(recursive Node)"}}}}}),
    ("dangling $ref",
     {"inputSchema": {"type": "object", "properties": {"q": {"$ref": "#/$defs/Missing"}}}},
     {"type": "object", "properties": {"q": {"type": "object", "description": "(unresolved Missing)"}}}),
    ("anyOf with null collapses",
     {"inputSchema": {"type": "object", "properties": {
         "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}}}},
     {"type": "object", "properties": {"zip": {"type": ["string", "null"], "default": None}}}),
    ("anyOf of two real types kept",
     {"inputSchema": {"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}},
     {"type": "object", "properties": {"v": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}),
    ("additionalProperties kept on objects only",
     {"inputSchema": {"type": "object", "additionalProperties": False, "properties": {
         "s": {"type": "string", "additionalProperties": False},
         "m": {"type": "object", "additionalProperties": {"type": "integer"}}}}},
     {"type": "object", "additionalProperties": False, "properties": {
         "s": {"type": "string"}, "m": {"type": "object", "additionalProperties": {"type": "integer"}}}}),
    ("invalid additionalProperties dropped",
     {"inputSchema": {"type": "object", "additionalProperties": "nope", "properties": {}}}, EMPTY),
    ("required filtered to known properties",
     {"inputSchema": {"type": "object", "properties": {"a": {}}, "required": ["a", "ghost", 3]}},
     {"type": "object", "properties": {"a": {}}, "required": ["a"]}),
    ("a property named title survives",
     {"inputSchema": {"type": "object", "properties": {"title": {"type": "string", "title": "Title"}}}},
     {"type": "object", "properties": {"title": {"type": "string"}}}),
]


@pytest.mark.parametrize("tool, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mcp_tool_to_openai_parameters(tool, expected):
    schema = mcp_tool_to_openai({"name": "t", **tool})
    assert schema["type"] == "function" and schema["function"]["name"] == "t"
    assert schema["function"]["parameters"] == expected


@pytest.mark.parametrize("tool, expected", [
    ({"description": "Lists rows."}, "Lists rows."),
    ({"description": None, "title": "Row lister"}, "Row lister"),
    ({"description": "Lists rows.", "annotations": {"readOnlyHint": True}}, "Lists rows. (read-only)"),
    ({"description": "Drops it.", "annotations": {"destructiveHint": True}}, "Drops it. (destructive: changes data)"),
    ({"description": "x" * 5000}, "x" * 1023 + "…"),
])
def test_mcp_tool_to_openai_description(tool, expected):
    assert mcp_tool_to_openai({"name": "t", **tool})["function"]["description"] == expected


def test_mcp_tool_to_openai_rejects_nameless_tool():
    with pytest.raises(ValueError, match="without a name"):
        mcp_tool_to_openai({"description": "x"})


async def test_real_fastmcp_tool_objects_convert():
    mcp = FastMCP("schemas")

    @mcp.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async with Client(mcp) as client:  # real pydantic Tool objects, in memory
        tools = {t["function"]["name"]: t["function"] for t in map(mcp_tool_to_openai, await client.list_tools())}
    assert tools["add"]["parameters"] == {"type": "object", "additionalProperties": False, "required": ["a", "b"],
                                          "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    assert tools["add"]["description"] == "Add two integers."
