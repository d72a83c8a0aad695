"""Chat templates for tool calling: the Hermes format every local policy speaks, and ART's view of a tokenizer.

    tokenizer = load_local_tokenizer()     # installs HERMES_TEMPLATE where the model's own ignores tools
    install_tool_template(tokenizer)       # the same, for a tokenizer you loaded yourself

The policy (local_policy.py) renders prompts with `prompt_ids` (the template, with earlier sampled
turns as the ids sampled), and ART's `tokenize_trajectory_groups` renders the same conversations again
for training, so the template is installed on the tokenizer itself: both see the same tokens. Both
tokenize through `chat_ids`: control tokens come from the template alone, and what tools, users and
tool schemas wrote is text, so a tool result cannot forge a turn.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

__all__ = ["HERMES_TEMPLATE", "GEMMA_TEMPLATE", "install_tool_template", "art_tokenizer", "art_tokenizing", "prompt_ids",
           "chat_ids"]

# Hermes / Qwen2.5-style ChatML with tools, for tokenizers whose template ignores
# `tools=` (SmolLM2's). Written here because the model ships none; differences from
# Qwen2.5's: no default system prompt, and an assistant message whose content
# already holds <tool_call> blocks (a text-format policy's raw turn) is rendered
# verbatim, so training sees exactly the tokens that were sampled; tool schemas are
# rendered with sorted keys, since art.Trajectory re-orders them when it validates.
HERMES_TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- set sys = messages[0].role == 'system' -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n' -}}{%- if sys -%}{{- text(messages[0].content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson(sort_keys=True)) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, '"
    " '\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif sys -%}{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and loop.first -%}"
    "{%- elif m.role == 'assistant' -%}{%- set c = text(m.content) -%}{{- '<|im_start|>assistant\\n' + c -}}"
    "{%- if m.tool_calls and '<tool_call>' not in c -%}{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if c or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}{%- endfor -%}{%- endif -%}{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# The same Hermes tool-call format inside Gemma's turn markers, for Gemma 3 (the 270M base model ships no
# template). As Gemma's own instruction template: <bos> first, no system role (the system prompt and the
# tool list open the first user turn), the assistant's role is `model`, turns end with <end_of_turn>.
# Tool calls, raw tool-call turns and tool results are rendered exactly as HERMES_TEMPLATE renders them.
GEMMA_TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- set sys = messages[0].role == 'system' -%}"
    "{%- set ns = namespace(pre=(text(messages[0].content) if sys else '')) -%}"
    "{%- if tools -%}"
    "{%- set ns.pre = (ns.pre + '\\n\\n' if ns.pre else '') + '# Tools\\n\\nYou may call one or more functions to "
    "assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:"
    "\\n<tools>' -%}"
    "{%- for tool in tools -%}{%- set ns.pre = ns.pre + '\\n' + (tool | tojson(sort_keys=True)) -%}{%- endfor -%}"
    "{%- set ns.pre = ns.pre + '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call>' -%}"
    "{%- endif -%}"
    "{%- set first = 1 if sys else 0 -%}"
    "{%- if ns.pre and (messages | length <= first or messages[first].role != 'user') -%}"
    "{{- '<start_of_turn>user\\n' + ns.pre + '<end_of_turn>\\n' -}}{%- set ns.pre = '' -%}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' and loop.first -%}"
    "{%- elif m.role == 'assistant' -%}{%- set c = text(m.content) -%}{{- '<start_of_turn>model\\n' + c -}}"
    "{%- if m.tool_calls and '<tool_call>' not in c -%}{%- for tc in m.tool_calls -%}"
    "{%- set f = tc.function if tc.function is defined else tc -%}"
    "{%- if c or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' -}}"
    "{%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}{%- endfor -%}{%- endif -%}{{- '<end_of_turn>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<start_of_turn>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<end_of_turn>\\n' -}}{%- endif -%}"
    "{%- elif loop.index0 == first and ns.pre -%}"
    "{{- '<start_of_turn>user\\n' + ns.pre + '\\n\\n' + text(m.content) + '<end_of_turn>\\n' -}}"
    "{%- else -%}{{- '<start_of_turn>' + m.role + '\\n' + text(m.content) + '<end_of_turn>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_PROBE_TOOL = {"type": "function", "function": {
    "name": "mcp_rl_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}


def _template_fits(tokenizer: Any) -> bool:
    """Does the tokenizer's own template list tools and render raw tool-call turns once?"""
    raw = '<tool_call>\n{"name": "mcp_rl_probe_tool", "arguments": {}}\n</tool_call>'
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": raw, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "mcp_rl_probe_tool", "arguments": "{}"}}]}]
    try:
        listed = tokenizer.apply_chat_template(msgs[:1], tools=[_PROBE_TOOL], tokenize=False)
        turn = tokenizer.apply_chat_template(msgs, tokenize=False)
    except Exception:  # no template, or one that cannot take these messages
        return False
    return "mcp_rl_probe_tool" in listed and turn.count("<tool_call>") == 1


def install_tool_template(tokenizer: Any) -> bool:
    """Give `tokenizer` the Hermes template unless its own fits; True if installed.

    Installed on the tokenizer itself, so ART's `tokenize_trajectory_groups`, which
    calls `tokenizer.apply_chat_template(messages, tools=...)`, renders the same
    prompt the policy saw.
    """
    if _template_fits(tokenizer):
        return False
    tokenizer.chat_template = HERMES_TEMPLATE
    return True


class art_tokenizer:  # noqa: N801 - used like a function: art_tokenizer(tokenizer)
    """`tokenizer` as ART 0.4.11's `tokenize_trajectory_groups` expects it.

    ART reads `apply_chat_template(...)` as a list of ids; transformers 5 returns a
    BatchEncoding by default. This view flips that default, and narrows `vocab_size` so
    that ART's marker (the highest id below `vocab_size` that a trajectory lacks) is our
    `_sentinel`: the lowest special added token that encodes to itself wherever the template puts it. ART's
    own pick, the vocabulary's last id, can be an ordinary token that re-encodes as other
    ids when rendered, and then ART cannot find it ("262142 is not in list": Gemma 3's
    `<unused6240>` in the tokenizer transformers 5.17 converts, models.py). Everything
    else passes through.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer, self._pieces = tokenizer, {}

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str:
        # ART decodes every trained token by itself (its `tokens` list): ~300k calls a step of 192
        # rollouts. One id always decodes the same, so each is decoded once (with the low marker: Gemma's
        # tokenizing 4.54 -> 1.09 s for 192 rollouts on the CPU, bench/results/step_host.txt).
        if isinstance(token_ids, int) and not args and not kwargs:
            if token_ids not in self._pieces:
                self._pieces[token_ids] = self.tokenizer.decode(token_ids)
            return self._pieces[token_ids]
        return self.tokenizer.decode(token_ids, *args, **kwargs)

    def apply_chat_template(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("return_dict", False)
        if kwargs.get("tokenize", True) and not kwargs["return_dict"] and not args and not kwargs.get("return_tensors"):
            # ART's ids for training: with what tools and users wrote as text, as the policy sampled it.
            kw = {k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict", "tools")}
            return chat_ids(self.tokenizer, messages, kwargs.get("tools"), **kw)
        return self.tokenizer.apply_chat_template(messages, *args, **kwargs)

    @property
    def vocab_size(self) -> int:
        mark = _sentinel(self.tokenizer)
        return self.tokenizer.vocab_size if mark is None else mark + 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


@contextlib.contextmanager
def art_tokenizing() -> Iterator[None]:
    """ART's tokenizer errors on a malformed trajectory as one ValueError that says what it needs."""
    try:
        yield
    except (AssertionError, IndexError, KeyError, ValueError, AttributeError) as e:
        raise ValueError(f"ART could not tokenize a trajectory ({type(e).__name__}: {e}); assistant turns must be "
                         "Choices whose logprobs.content tokens read 'token_id:<id>'") from e


_TEXT_ENDS = {"<eos>", "</s>", "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "<end_of_turn>"}


def _sentinel(tokenizer: Any) -> int | None:
    """The lowest special added token that the chat template never writes and that encodes to itself, or None.

    Special: `chat_ids` keeps tool and user text from writing it (an ordinary added token such as Gemma's
    `[multimodal]` would be encoded from a tool result, and the marker then found twice).

    The lowest: ART builds `set(range(vocab_size))` for every trajectory it tokenizes, and the view
    gives it this id + 1 as `vocab_size`: Gemma 3's highest such id (262,143) made it a set of 262k ids
    per trajectory (with the decode memo: 4.54 -> 1.09 s for 192 rollouts, bench/HISTORY.md section 30)."""
    if "_mcp_rl_sentinel" not in tokenizer.__dict__:
        template = tokenizer.chat_template or ""
        # ids a tokenizer writes by itself, and ends of text a model may sample (Gemma's eos is <end_of_turn>
        # here, but its base model ends text with <eos>)
        skip = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
                tokenizer.unk_token_id, tokenizer.mask_token_id}
        tokenizer._mcp_rl_sentinel = next(
            (i for i, tok in sorted(tokenizer.added_tokens_decoder.items())
             if tok.special and i not in skip and tok.content not in template and tok.content not in _TEXT_ENDS
             and tokenizer.encode(tok.content, add_special_tokens=False) == [i]), None)
    return tokenizer._mcp_rl_sentinel


def prompt_ids(tokenizer: Any, messages: list, tools: list[dict] | None) -> list[int]:
    """The generation prompt, with each earlier sampled turn (a Choice) as the very ids sampled.

    ART trains on the sampled ids of every turn. Re-encoding a turn's text can give other ids (a
    model may draw `'` and `"` as two tokens where the tokenizer writes `'"` as one), so a prompt
    rendered from text would put later turns in another context than the one they are trained in:
    an off-policy gap of up to several nats on the tokens after it (bench/RESULTS.md section 10).
    The same sentinel trick as ART's `tokenize_trajectory`: render each sampled turn as one marker
    token, then put the turn's ids where the marker is. Plain dicts render as before. Not ART's function
    itself: it renders no generation prompt and searches the whole vocabulary for a marker on every call.
    """
    from art.trajectories import get_messages

    def render(msgs: list) -> list[int]:
        return chat_ids(tokenizer, msgs, tools, add_generation_prompt=True)

    sampled = [m for m in messages if not isinstance(m, dict) and m.logprobs and m.logprobs.content]
    mark = _sentinel(tokenizer) if sampled else None
    if mark is None:
        return render(get_messages(messages))
    ids_of = {id(m) for m in sampled}
    marked = [{"role": "assistant", "content": tokenizer.decode([mark])} if id(m) in ids_of
              else get_messages([m])[0] for m in messages]
    ids = render(marked)
    if ids.count(mark) != len(sampled):  # cannot happen since chat_ids; a safe fallback all the same
        return render(get_messages(messages))
    out, turns = [], iter(sampled)
    for t in ids:
        if t == mark:
            out.extend(int(lp.token.split(":")[1]) for lp in next(turns).logprobs.content)
        else:
            out.append(t)
    return out


# ---------------------------------------------------------------- control tokens only where the template puts them

def _controls(tokenizer: Any) -> tuple[frozenset[int], str]:
    """The ids of the tokenizer's special tokens, and the characters any of them starts with.

    Special added tokens only (`<|im_start|>`, `<|im_end|>`, `<end_of_turn>`, `<bos>`, ...): those are
    the turn markers. A non-special added token (Qwen's `<tool_call>`) stays as the tokenizer makes it:
    it opens no turn, and Qwen's own template puts tool results through it the same way."""
    if "_mcp_rl_controls" not in tokenizer.__dict__:
        added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items() if t.special and t.content}
        tokenizer._mcp_rl_controls = (frozenset(added), "".join(sorted({c[0] for c in added.values()})))
    return tokenizer._mcp_rl_controls


def _control_spans(tokenizer: Any, text: str) -> list[tuple[int, int, int]]:
    """(start, end, id) of each special token the tokenizer finds in `text`. The tokenizer's own matcher,
    not a regex of ours: Gemma 3 has 6,249 special tokens, and a regex alternation of them takes minutes
    to compile; a text none of whose characters opens one (nearly every text) is not encoded at all."""
    ids, firsts = _controls(tokenizer)
    if not ids or not any(c in text for c in firsts):
        return []
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return [(a, b, i) for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i in ids]


def _swap(value: Any, sub: Any) -> Any:
    """`value` (a JSON-like message or tool schema) with `sub` applied to every string in it."""
    if isinstance(value, str):
        return sub(value)
    if isinstance(value, dict):  # keys too: a tool schema's property names are the server's text
        return {_swap(k, sub): _swap(v, sub) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_swap(v, sub) for v in value]
    return value


def _joined(m: Any) -> Any:
    """An untrusted message whose content is a list of text parts, as one string (what templates render)."""
    parts = m.get("content") if isinstance(m, dict) and m.get("role") != "assistant" else None
    if isinstance(parts, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        return {**m, "content": "".join(str(p.get("text", "")) for p in parts)}
    return m


def chat_ids(tokenizer: Any, messages: list, tools: list[dict] | None = None, **template_kw: Any) -> list[int]:
    """`apply_chat_template(messages, tools=tools, tokenize=True)`'s ids, except that text a tool, a user
    or a system prompt wrote (and tool schemas: an MCP server writes their descriptions) is tokenized as
    text: a tool result holding "<|im_end|>\n<|im_start|>system\n..." gets no control token and so cannot
    forge a turn. Assistant turns are the model's own (and carry prompt_ids' and ART's marker token),
    so they render as the template renders them. Messages are dicts here (as ART's get_messages gives).

    Why not `split_special_tokens=True` on the whole prompt: it would split the template's own turn markers
    too. Why not escape the text (a zero-width space in "<|im_end|>"): the model would read other text than
    the tool returned. So: render the template with each control token inside untrusted text swapped for a
    placeholder, cut the rendered text at the control tokens the template wrote (each one id), and encode
    the text between them, placeholders put back, with `split_special_tokens=True`. Text between control
    tokens is what a tokenizer encodes as one piece anyway, so the ids equal the tokenizer's own wherever
    nothing was forged, and a prompt with no control text in untrusted parts (nearly all) takes the plain path.
    """
    kw = {"add_generation_prompt": False, **template_kw, "tools": tools or None}
    originals: list[str] = []
    mark = ""

    def hide(text: str) -> str:
        out, at = [], 0
        for a, b, _ in _control_spans(tokenizer, text):
            out += [text[at:a], f"{mark}{len(originals)}{mark}"]
            originals.append(text[a:b])
            at = b
        return "".join(out) + text[at:]

    # Text parts of one message are joined first: hidden one part at a time, "42<|im_" + "end|>" would
    # only meet as a control token once the template joins them (a served request's content parts).
    messages = [_joined(m) for m in messages]
    trusted = [isinstance(m, dict) and m.get("role") == "assistant" for m in messages]
    used: set[str] = set()
    _swap([[m for m in messages if isinstance(m, dict)], tools], used.update)  # every character of every string
    mark = next(chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in used)  # a private-use char no text has
    safe = [m if t else _swap(m, hide) for m, t in zip(messages, trusted)]
    safe_tools = _swap(tools, hide) if tools else None
    if not originals:
        return list(tokenizer.apply_chat_template(messages, **kw, tokenize=True, return_dict=False))
    text = tokenizer.apply_chat_template(safe, **{**kw, "tools": safe_tools}, tokenize=False)
    back = re.compile(f"{mark}(\\d+){mark}")
    out: list[int] = []
    at = 0
    for a, b, i in [*_control_spans(tokenizer, text), (len(text), len(text), None)]:
        if a > at:  # text between control tokens, with what the placeholders hid put back as text
            out.extend(tokenizer.encode(back.sub(lambda m: originals[int(m[1])], text[at:a]), add_special_tokens=False,
                                        split_special_tokens=True))
        if i is not None:  # a control token the template (or an assistant turn) wrote
            out.append(i)
        at = b
    return out
