"""The Hermes tool-call text format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

What Qwen2.5 and the chat templates here render, and what every text policy (local models,
scripted ones, demonstrations) emits. `find_tool_calls(text)` parses the blocks (with an
explanatory error per block that does not parse, which the agent then reads as a tool message);
`choice_from_text` builds the OpenAI `Choice` a policy returns, with token ids and logprobs in
vLLM's `token_id:<id>` form for ART's tokenizer; `tool_call_text` writes one block.

    >>> calls, errors = find_tool_calls('<tool_call>{"name": "list_tables", "arguments": {}}</tool_call>')
    >>> calls, errors
    ([{'name': 'list_tables', 'arguments': {}}], [])
"""

from __future__ import annotations

import json
import re
from typing import Any, Sequence

from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_tool_call import (
    ChatCompletionMessageToolCall,
    Function,
)
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from mcp_rl.quote import SHORT_CHARS, short

__all__ = ["find_tool_calls", "choice_from_text", "tool_call_text"]


_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)


def _parse_block(body: str, k: int) -> tuple[dict | None, str | None]:
    body = body.strip()
    if fence := _FENCE.match(body):  # small models like to wrap the JSON in ```json fences
        body = fence.group(1).strip()
    if not body:
        return None, f"tool call {k} is empty: put {{\"name\": ..., \"arguments\": {{...}}}} inside <tool_call></tool_call>"
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call {k} is not valid JSON: {e.msg} at char {e.pos} in {short(body)}"
    if not isinstance(obj, dict):
        return None, f"tool call {k} must be a JSON object with \"name\" and \"arguments\", got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f"tool call {k} has no \"name\" (a string naming the tool to call)"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return None, f"tool call {k} ({name[:SHORT_CHARS]}): \"arguments\" is a string that is not valid JSON: {e.msg}"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"tool call {k} ({name[:SHORT_CHARS]}): \"arguments\" must be a JSON object, got {type(args).__name__}"
    return {"name": name.strip(), "arguments": args}, None


def find_tool_calls(text: str | None) -> tuple[list[dict], list[str]]:
    """Parse every `<tool_call>{json}</tool_call>` block in `text`.

    Returns `(calls, errors)`: calls are `{"name": str, "arguments": dict}` for the
    blocks that parsed, errors one explanatory string per block that did not.
    A block left open at the end of the text (generation stopped) still counts.

    >>> find_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>')
    ([{'name': 'f', 'arguments': {'x': 1}}], [])
    >>> find_tool_calls('<tool_call>{"name": "f",</tool_call>')[1][0][:34]
    'tool call 1 is not valid JSON: Exp'
    """
    calls, errors = [], []
    for k, m in enumerate(_BLOCK.finditer(text or ""), start=1):
        call, error = _parse_block(m.group(1), k)
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    return calls, errors


def choice_from_text(
    text: str,
    tokenizer: Any = None,
    token_ids: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
    finish_reason: str = "stop",
) -> Choice:
    """Build the OpenAI `Choice` a text-format policy returns (DESIGN.md "Choices").

    With `token_ids` (or a `tokenizer` to encode `text` with) the choice carries
    `logprobs.content` in vLLM's `token_id:<id>` form, which ART's tokenizer reads;
    without given `logprobs` every logprob is 0.0 (demonstrations).
    """
    calls, _ = find_tool_calls(text)
    tool_calls = [
        ChatCompletionMessageToolCall(
            id=f"call_{k}", type="function",
            function=Function(name=c["name"], arguments=json.dumps(c["arguments"], ensure_ascii=False)),
        )
        for k, c in enumerate(calls)
    ]
    message = ChatCompletionMessage(role="assistant", content=text, tool_calls=tool_calls or None)
    if token_ids is None and tokenizer is not None:
        token_ids = tokenizer.encode(text, add_special_tokens=False)
    choice_logprobs = None
    if token_ids is not None:
        token_ids = [int(t) for t in token_ids]
        if logprobs is None:
            logprobs = [0.0] * len(token_ids)
        if len(logprobs) != len(token_ids):
            raise ValueError(f"got {len(token_ids)} token ids but {len(logprobs)} logprobs; pass one logprob per token")
        content = []
        for tid, lp in zip(token_ids, logprobs):
            # Bytes of the decoded piece (a partial UTF-8 char decodes to U+FFFD,
            # which ART can still .decode("utf-8")).
            piece = tokenizer.decode([tid]) if tokenizer is not None else None
            content.append(ChatCompletionTokenLogprob(
                token=f"token_id:{tid}", logprob=float(lp),
                bytes=list(piece.encode("utf-8")) if piece is not None else None, top_logprobs=[],
            ))
        # An empty turn (end-of-turn sampled first) gets no logprobs: ART would read its first one.
        choice_logprobs = ChoiceLogprobs(content=content) if content else None
    return Choice(finish_reason=finish_reason, index=0, message=message, logprobs=choice_logprobs)


def tool_call_text(name: str, arguments: dict) -> str:
    """One Hermes tool-call block, formatted the way the chat templates render them."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"
