"""Serve a (trained) agent as an OpenAI-compatible endpoint on 127.0.0.1.

    python -m mcp_rl serve --model smollm2 --adapter runs/demo --port 8000
    python -m mcp_rl rollout --server company --base-url http://127.0.0.1:8000/v1 --model demo --task "..."

    with ServerThread(create_app(policy)) as server:     # tests, notebooks: uvicorn in a thread
        openai.OpenAI(base_url=server.base_url, api_key="x").models.list()

`GET /v1/models` and `POST /v1/chat/completions` (Starlette + uvicorn) over any policy;
a `LocalPolicy` batches concurrent requests into one decode. Tools go in as OpenAI tool
schemas and the reply's Hermes `<tool_call>` blocks come out as `tool_calls`, parsed
exactly as in training (`policy.find_tool_calls`); a block that does not parse stays in
`content`, as vLLM's Hermes parser leaves it. `logprobs: true` returns the sampled
tokens as `token_id:N` (vLLM's `--return-tokens-as-token-ids`), which ART trains on.
`stream: true` sends the finished turn as one chunk (no token-by-token streaming).
Sampling options other than temperature and max_tokens (top_p, stop, seed...) are ignored.
A bad request gets a 4xx with an OpenAI-style error body; nothing a client sends stops the server.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .launch import free_port
from .policy import ContextOverflow, find_tool_calls

__all__ = ["create_app", "serve", "ServerThread", "add_serve_parser", "HOST"]

HOST = "127.0.0.1"  # never 0.0.0.0: the endpoint has no auth; put a proxy in front to share it
log = logging.getLogger(__name__)
_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)  # as policy.find_tool_calls reads them


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (user, top_p...)


class _Function(_Open):
    name: str = Field(min_length=1)
    parameters: dict | None = None


class _Tool(_Open):
    type: Literal["function"]
    function: _Function


class _CallFunction(_Open):
    name: str = Field(min_length=1)
    arguments: str | dict


class _ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _CallFunction


class _TextPart(_Open):
    type: Literal["text"]
    text: str


class _Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None
    tool_calls: list[_ToolCall] | None = None

    @model_validator(mode="after")
    def _has_content(self) -> "_Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self


class _ChatRequest(_Open):
    model: str
    messages: list[_Message] = Field(min_length=1)
    tools: list[_Tool] | None = None
    tool_choice: Literal["auto", "none"] | None = None  # 'required' / a named function: not supported
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    n: Literal[1] = 1
    stream: bool = False
    logprobs: bool | None = False


def _short(value: Any, n: int = 40) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return repr(text[:n] + ("..." if len(text) > n else ""))


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _explain(e: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']} (got {_short(err.get('input'))})"
             for err in e.errors()[:3]]
    return "invalid request: " + "; ".join(parts) + (f"; and {e.error_count() - 3} more" if e.error_count() > 3 else "")


def _prose(text: str) -> str | None:
    """The text around the tool-call blocks that parsed (unparseable ones stay, so the client sees them)."""
    return _BLOCK.sub(lambda m: "" if find_tool_calls(m.group(0))[0] else m.group(0), text).strip() or None


def create_app(policy: Any, *, name: str | None = None, max_body_bytes: int = 4 << 20,
               default_max_tokens: int = 512) -> Starlette:
    """A Starlette app serving `policy` (anything with `async complete(...)`) under `name`."""
    served, started = name or policy.name, int(time.time())
    card = {"id": served, "object": "model", "created": started, "owned_by": "mcp-rl"}
    tokenizer = getattr(policy, "tokenizer", None)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [card]})

    async def model(request: Request) -> JSONResponse:
        if request.path_params["model"] != served:
            return _error(404, f"model {_short(request.path_params['model'])} is not served here; "
                          f"this server serves {served!r}", code="model_not_found")
        return JSONResponse(card)

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        too_big = f"the body is over {max_body_bytes} bytes; send a shorter conversation"
        if declared.isdigit() and int(declared) > max_body_bytes:
            raise HTTPException(413, too_big)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > max_body_bytes:
                raise HTTPException(413, too_big)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HTTPException(400, f"the body is not valid JSON ({e}): {_short(body.decode('utf-8', 'replace'))}")

    async def chat(request: Request) -> Any:
        data = await read_json(request)
        if not isinstance(data, dict):
            return _error(400, f"the body must be a JSON object (a chat completion request), got {_short(data)}")
        try:
            req = _ChatRequest.model_validate(data)
        except ValidationError as e:
            return _error(400, _explain(e))
        if req.model != served:
            return _error(404, f"model {_short(req.model)} is not served here; use {served!r} (GET /v1/models)",
                          code="model_not_found")
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in data["messages"]]
        tools = [] if req.tool_choice == "none" else (data.get("tools") or [])
        max_tokens = req.max_completion_tokens or req.max_tokens or default_max_tokens
        temperature = 1.0 if req.temperature is None else req.temperature
        try:
            choice = await policy.complete(messages, tools, max_tokens=max_tokens, temperature=temperature)
        except ContextOverflow as e:  # OpenAIPolicy reads "maximum context length" as ContextOverflow
            return _error(400, f"this conversation exceeds the model's maximum context length: {e}",
                          code="context_length_exceeded")
        except Exception as e:  # noqa: BLE001 - a template or generation failure fails this request only
            from jinja2 import TemplateError

            if isinstance(e, TemplateError):
                return _error(400, f"the chat template cannot render these messages: {e}")
            log.exception("generation failed")
            return _error(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")
        text = choice.message.content or ""
        calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in choice.message.tool_calls or []]
        message = {"role": "assistant", "content": _prose(text) if calls else text, **({"tool_calls": calls} if calls else {})}
        lps = choice.logprobs.model_dump(mode="json", exclude_none=True) if req.logprobs and choice.logprobs else None
        finish = "tool_calls" if calls else (choice.finish_reason or "stop")
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
               "model": served, "choices": [{"index": 0, "message": message, "logprobs": lps, "finish_reason": finish}],
               "usage": _usage(tokenizer, messages, tools, text, choice)}
        return _stream(out, data) if req.stream else JSONResponse(out)

    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, e.detail if e.status_code != 404 else
                      f"no route {request.url.path}; this server has GET /v1/models and POST /v1/chat/completions")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/models/{model:path}", model),
                             Route("/v1/chat/completions", chat, methods=["POST"])],
                     exception_handlers={HTTPException: http_error})


def _usage(tokenizer: Any, messages: list[dict], tools: list[dict], text: str, choice: Any) -> dict:
    prompt = completion = 0
    if tokenizer is not None:  # a policy without a tokenizer (scripted, remote) reports zeros
        try:
            prompt = len(tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))
        except Exception:  # noqa: BLE001 - usage is a report; never fail a finished turn over it
            prompt = 0
        completion = len(choice.logprobs.content) if choice.logprobs and choice.logprobs.content else \
            len(tokenizer.encode(text, add_special_tokens=False))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stream(out: dict, data: dict) -> StreamingResponse:
    """The finished completion as server-sent chat.completion.chunk events."""
    head = {k: out[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    (choice,) = out["choices"]
    delta = dict(choice["message"])
    if "tool_calls" in delta:  # chunks index their tool calls
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(delta["tool_calls"])]
    events = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}]}]
    if (data.get("stream_options") or {}).get("include_usage"):
        events.append({**head, "choices": [], "usage": out["usage"]})
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return StreamingResponse(iter([body]), media_type="text/event-stream")


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread: `.base_url` (…/v1), `.stop()`.

    The policy's batching worker lives on this thread's event loop: while it serves, do not
    call the same LocalPolicy from another event loop.
    """

    def __init__(self, app: Any, *, port: int | None = None, startup_timeout: float = 30.0):
        import uvicorn

        self.port, self.startup_timeout = port or free_port(), startup_timeout
        self.server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name=f"mcp-rl-serve-{self.port}", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {HOST}:{self.port}; is the port in use?")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(policy: Any, *, port: int = 8000, name: str | None = None) -> None:
    """Serve `policy` on 127.0.0.1:`port` until Ctrl-C (blocking)."""
    import uvicorn

    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    with socket.socket() as s:  # a clear message instead of uvicorn's exit on a taken port
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise RuntimeError(f"cannot listen on {HOST}:{port} ({e.strerror}); pass another --port") from e
    uvicorn.run(create_app(policy, name=name), host=HOST, port=port, log_level="info")


def cmd_serve(a: argparse.Namespace) -> int:
    from .export import load_with_adapter, recorded_base_model
    from .local_policy import SMOLLM2, LocalPolicy, load_local_model

    base = a.model or (recorded_base_model(a.adapter) if a.adapter else None) or SMOLLM2
    model, tokenizer = load_local_model(base)
    if a.adapter:
        model = load_with_adapter(model, a.adapter)
    name = a.name or (Path(a.adapter).resolve().name if a.adapter else base)
    policy = LocalPolicy(model, tokenizer, name=name, tool_prefix=a.tool_prefix, max_batch=a.max_batch)
    print(f"serving {name!r} ({base}{' + ' + a.adapter if a.adapter else ''}) at http://{HOST}:{a.port}/v1 "
          f"| try: python -m mcp_rl rollout --server company --base-url http://{HOST}:{a.port}/v1 "
          f"--model {name} --task \"How many employees are there?\"", flush=True)
    serve(policy, port=a.port, name=name)
    return 0


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `serve` subcommand, for cli.main's `add_subparsers()`; sets `fn=cmd_serve`."""
    sp = subparsers.add_parser("serve", help="serve a model (+ LoRA) as an OpenAI-compatible endpoint on 127.0.0.1",
                               description="OpenAI-compatible /v1/models and /v1/chat/completions (tools in, "
                               "tool_calls out) on 127.0.0.1, for any agent framework or MCP client.")
    sp.add_argument("--model", help="'smollm2' (default), a Hugging Face id or folder; with --adapter, "
                    "default: the adapter's base model")
    sp.add_argument("--adapter", help="LoRA: a run folder (newest checkpoint), a checkpoint, ART's checkpoint "
                    "folder or a peft adapter folder")
    sp.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)")
    sp.add_argument("--name", help="model name clients ask for (default: the adapter folder's name, else --model)")
    sp.add_argument("--tool-prefix", action="store_true", help="force the <tool_call> envelope (tiny models)")
    sp.add_argument("--max-batch", type=int, default=8, help="concurrent requests decoded as one batch")
    sp.set_defaults(fn=cmd_serve)
    return sp
