"""An Ollama Modelfile for an exported GGUF: the chat format the agent was trained on.

    write_modelfile("runs/x/ollama", "runs/x/agent.gguf", name="sql-agent")
    # then:  ollama create sql-agent -f runs/x/ollama/Modelfile  &&  ollama run sql-agent

TEMPLATE is written here in Ollama's Go template language, because Ollama does not read the
Jinja chat template inside the GGUF. It renders what `local_policy.HERMES_TEMPLATE` renders (the
embedded model's training template; Qwen2.5's own, which its runs train with, renders the same
turns when a system prompt is given): ChatML turns, the tool listing in the system turn,
assistant tool calls as `<tool_call>` blocks, tool results as `<tool_response>` blocks in a user
turn. Known differences, all from Ollama writing JSON with Go's encoder: each tool's schema is
compact (`{"a":1}`, training wrote `{"a": 1}`), in the key order of Ollama's own structs; a past tool call's
arguments come out in sorted key order (training kept the order the model wrote); and <, >, &
inside JSON strings become \\u003c, \\u003e, \\u0026.
tests/test_ollama.py renders both with Go's own text/template and compares.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# "</tool_call>" too: training cut each turn there (local_policy), so the model never learned to end
# its turn after a call and runs on; Ollama's parser needs no closing tag, and the template writes it back.
STOPS = ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "</tool_call>")

# Go text/template; `json` is Ollama's template function. Ollama finds a model's tool-call tag as the
# first text inside `{{ if .ToolCalls }}` (tools/template.go parseTag); without that block it falls
# back to "{" and returns a reply that starts with `<tool_call>` as plain text, no tool_calls.
# Map ranges visit keys sorted, so
# tool-call arguments come out as Python's json.dumps(sort_keys=True) writes them. Go templates
# have no arithmetic, so "was the previous message a tool result" is kept in $prev.
TEMPLATE = """\
{{- if .Tools }}<|im_start|>system
{{ if .System }}{{ .System }}

{{ end }}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{{- range .Tools }}
{{ json . }}
{{- end }}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{{ else if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- $prev := "" }}
{{- range $i, $m := .Messages }}
{{- if and (eq $prev "tool") (ne .Role "tool") }}<|im_end|>
{{ end }}
{{- if eq .Role "assistant" }}<|im_start|>assistant
{{ .Content }}{{ if and $m.Content $m.ToolCalls }}
{{ end }}
{{- if .ToolCalls }}{{ range $j, $c := .ToolCalls }}<tool_call>
{"name": "{{ .Function.Name }}", "arguments": {
{{- $first := true }}{{ range $k, $v := .Function.Arguments }}{{ if not $first }}, {{ end }}{{ $first = false }}{{ json $k }}: {{ json $v }}{{ end -}}
}}
</tool_call>{{ if lt $j (len (slice $m.ToolCalls 1)) }}
{{ end }}{{ end }}{{ end }}<|im_end|>
{{ else if eq .Role "tool" }}
{{- if ne $prev "tool" }}<|im_start|>user{{ end }}
<tool_response>
{{ .Content }}
</tool_response>
{{- else if ne .Role "system" }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}
{{- $prev = .Role }}
{{- end }}
{{- if eq $prev "tool" }}<|im_end|>
{{ end }}
{{- if ne $prev "assistant" }}<|im_start|>assistant
{{ end }}"""


def modelfile(gguf_name: str, *, temperature: float = 0.0, num_ctx: int = 8192) -> str:
    """The Modelfile text: FROM the GGUF beside it, TEMPLATE, stops and sampling PARAMETERs."""
    lines = [f"FROM ./{gguf_name}", f'TEMPLATE """{TEMPLATE}"""']
    lines += [f'PARAMETER stop "{s}"' for s in STOPS]
    # Greedy by default: held-out success was measured greedily; num_ctx fits the training length.
    lines += [f"PARAMETER temperature {temperature}", f"PARAMETER num_ctx {num_ctx}"]
    return "\n".join(lines) + "\n"


def write_modelfile(directory: str | os.PathLike, gguf: str | os.PathLike, *, name: str = "mcp-rl-agent",
                    temperature: float = 0.0, num_ctx: int = 8192) -> Path:
    """DIR/Modelfile next to the GGUF (a link, or a copy where links fail), plus DIR/README.txt
    with the two commands that create and run the model in Ollama."""
    import shutil

    directory, gguf = Path(directory), Path(gguf)
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf} is not a file: write the GGUF first (export --gguf FILE)")
    directory.mkdir(parents=True, exist_ok=True)
    local = directory / gguf.name
    if local.resolve() != gguf.resolve():
        local.unlink(missing_ok=True)
        try:
            os.link(gguf, local)
        except OSError:  # another file system: a copy under a temporary name, then renamed into place
            part = local.with_name(local.name + ".part")
            shutil.copy2(gguf, part)
            os.replace(part, local)
    target = directory / "Modelfile"
    fd, tmp = tempfile.mkstemp(prefix="Modelfile.tmp-", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(modelfile(gguf.name, temperature=temperature, num_ctx=num_ctx))
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    (directory / "README.txt").write_text(
        f"ollama create {name} -f {target}\nollama run {name}\n")
    return target
