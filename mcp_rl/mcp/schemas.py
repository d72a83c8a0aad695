"""MCP tool → OpenAI function schema: what a model is shown of a server's tools.

    from mcp_rl.mcp.schemas import mcp_tool_to_openai, normalize_schema
    mcp_tool_to_openai({"name": "add", "inputSchema": {...}})
    # {"type": "function", "function": {"name": "add", "description": ..., "parameters": {...}}}

MCP input schemas are full JSON Schema (`$ref`/`$defs`, Optional as anyOf-with-null, titles
on every node); OpenAI-style function calling and small models want a plain object schema.
Pure functions, no I/O; `mcp_rl.mcp.connect` re-exports both public names.
Tests: `.venv/bin/python -m pytest tests/test_schemas.py -q`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["mcp_tool_to_openai", "normalize_schema", "field_of", "hide_bound"]


def field_of(obj: Any, *names: str) -> Any:
    """The first of `names` that `obj` (dict, pydantic model or dataclass) has. Models are asked
    only for declared fields, so the SDK's deprecated camelCase aliases never warn."""
    fields = getattr(type(obj), "model_fields", None)
    for name in names:
        if isinstance(obj, dict):
            if obj.get(name) is not None:
                return obj[name]
        elif fields is not None and name in fields or fields is None and hasattr(obj, name):
            return getattr(obj, name)
    return None


_EMPTY_PARAMS = {"type": "object", "properties": {}}
# Keys whose value is one schema, a list of schemas, or a name → schema map.
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties")
# Bookkeeping that costs a small model context and means nothing to it (titles repeat the name).
_DROP = ("$schema", "$id", "$defs", "definitions", "title", "$comment", "examples")
_MAX_DEPTH = 24


def _cap(text: str, limit: int) -> str:
    text = " ".join(text.split()) if len(text) > limit else text
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _resolve(ref: str, root: dict) -> Any:
    """The target of a local JSON pointer ref ("#/$defs/Name"), or None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in filter(None, ref[1:].split("/")):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, dict) else None


def _is_null(s: Any) -> bool:
    return isinstance(s, dict) and (s.get("type") == "null" or s.get("const", 0) is None) and len(s) <= 2


def _norm(schema: Any, root: dict, seen: tuple, depth: int, cap: int) -> dict:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    if "$ref" in schema:
        ref = schema["$ref"]
        target = _resolve(ref, root) if isinstance(ref, str) else None
        name = str(ref).rsplit("/", 1)[-1]
        if target is None or ref in seen:
            # An unresolvable or recursive ref: the model still learns it is an object by name.
            why = "recursive" if target is not None else "unresolved"
            return {"type": "object", "description": f"({why} {name})"}
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return _norm(merged, root, seen + (ref,), depth + 1, cap)
    out: dict = {}
    for key, value in schema.items():
        if key in _DROP:
            continue
        if key in _MAP:
            if isinstance(value, dict):
                out[key] = {str(n): _norm(s, root, seen, depth + 1, cap) for n, s in value.items()}
        elif key in _ONE:
            if isinstance(value, bool) and key == "additionalProperties":
                out[key] = value
            elif isinstance(value, dict):
                out[key] = _norm(value, root, seen, depth + 1, cap)
            elif key == "items" and isinstance(value, list):  # draft-4 tuple form
                out[key] = _norm(value[0] if value else {}, root, seen, depth + 1, cap)
        elif key in _MANY:
            if isinstance(value, list):
                out[key] = [_norm(s, root, seen, depth + 1, cap) for s in value]
        elif key == "description":
            out[key] = _cap(str(value), cap)
        elif key == "required":
            if isinstance(value, list):
                out[key] = [r for r in value if isinstance(r, str)]
        else:
            out[key] = value
    return _simplify(out)


def _simplify(s: dict) -> dict:
    # Optional[X] arrives as anyOf [X, null]; a type list says the same in fewer tokens.
    alts = s.get("anyOf")
    if isinstance(alts, list) and len(alts) == 2 and any(map(_is_null, alts)):
        other = next(a for a in alts if not _is_null(a))
        if isinstance(other.get("type"), str):
            s = {**other, **{k: v for k, v in s.items() if k != "anyOf"}}
            s["type"] = [other["type"], "null"]
    if isinstance(s.get("allOf"), list) and len(s["allOf"]) == 1:
        s = {**s.pop("allOf")[0], **s}
    if "enum" in s and "type" not in s and isinstance(s["enum"], list) and s["enum"]:
        kinds = {type(v) for v in s["enum"]}
        names = {str: "string", bool: "boolean", int: "integer", float: "number"}
        if len(kinds) == 1 and kinds <= names.keys():
            s["type"] = names[kinds.pop()]
    is_object = s.get("type") == "object" or "properties" in s
    if "additionalProperties" in s and not is_object:
        del s["additionalProperties"]  # meaningless (and rejected by some APIs) off objects
    if "required" in s:
        props = s.get("properties")
        s["required"] = [r for r in s["required"] if not isinstance(props, dict) or r in props]
        if not s["required"]:
            del s["required"]
    if s.get("type") == "array" and "items" not in s:
        s["items"] = {}  # OpenAI rejects an array schema without items
    return s


def normalize_schema(schema: Any, *, max_description_chars: int = 1024) -> dict:
    """An MCP inputSchema as OpenAI function `parameters`: always an object schema, `$ref`s
    inlined (cycles cut), Optional collapsed to a type list, bookkeeping keys dropped."""
    if not isinstance(schema, dict) or not schema:
        return dict(_EMPTY_PARAMS, properties={})
    out = _norm(schema, schema, (), 0, max_description_chars)
    if out.get("type") != "object":
        # MCP requires object arguments; a server that says otherwise still gets called with one.
        out = {k: v for k, v in out.items() if k not in ("type", "items", "enum", "anyOf", "oneOf")}
        out["type"] = "object"
    out.setdefault("properties", {})
    if not isinstance(out["properties"], dict):
        out["properties"] = {}
    return out


def mcp_tool_to_openai(tool: Any, *, max_description_chars: int = 1024) -> dict:
    """An MCP Tool (object or dict) as an OpenAI function tool schema
    {"type": "function", "function": {"name", "description", "parameters"}}.
    Annotations fold into the description (read-only / destructive), which a model can use."""
    name = field_of(tool, "name")
    if not name:
        raise ValueError(f"MCP tool without a name: {tool!r:.200}")
    desc = str(field_of(tool, "description") or field_of(tool, "title") or "").strip()
    notes = field_of(tool, "annotations")
    if notes is not None:
        if field_of(notes, "read_only_hint", "readOnlyHint") is True:
            desc += " (read-only)"
        elif field_of(notes, "destructive_hint", "destructiveHint") is True:
            desc += " (destructive: changes data)"
    schema = field_of(tool, "input_schema", "inputSchema")
    return {"type": "function", "function": {
        "name": str(name),
        "description": _cap(desc.strip(), max_description_chars),
        "parameters": normalize_schema(schema, max_description_chars=max_description_chars),
    }}


def hide_bound(schema: dict, bound: dict) -> dict:
    """An OpenAI tool schema without the arguments an episode binds (they are set for every call).

    >>> s = {"type": "function", "function": {"name": "t", "parameters": {"type": "object",
    ...      "properties": {"q": {}, "state_key": {}}, "required": ["q", "state_key"]}}}
    >>> hide_bound(s, {"state_key": "r1"})["function"]["parameters"]
    {'type': 'object', 'properties': {'q': {}}, 'required': ['q']}
    """
    params = schema.get("function", {}).get("parameters") or {}
    if not bound or not set(bound) & set(params.get("properties") or {}):
        return schema
    params = {**params, "properties": {k: v for k, v in params["properties"].items() if k not in bound}}
    if "required" in params:
        params["required"] = [r for r in params["required"] if r not in bound]
    return {**schema, "function": {**schema["function"], "parameters": params}}
