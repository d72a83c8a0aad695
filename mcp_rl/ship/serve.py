"""Serve a (trained) agent as an OpenAI-compatible endpoint on 127.0.0.1.

    python -m mcp_rl serve --model smollm2 --adapter runs/demo --port 8000
    python -m mcp_rl rollout --server company --base-url http://127.0.0.1:8000/v1 --model demo --task "..."

    with ServerThread(openai_app(policy)) as server:     # tests, notebooks: uvicorn in a thread
        openai.OpenAI(base_url=server.base_url, api_key="x").models.list()

`GET /v1/models` and `POST /v1/chat/completions` (Starlette + uvicorn) over any policy; a
`LocalPolicy` batches concurrent requests into one decode. Tools go in as OpenAI schemas; the
reply's Hermes `<tool_call>` blocks come out as `tool_calls`, parsed as in training
(`find_tool_calls`); a block that does not parse stays in `content` (as in vLLM's Hermes parser).
`logprobs: true` gives the sampled tokens as `token_id:N` (vLLM's `--return-tokens-as-token-ids`,
what ART trains on); `stream: true` sends the finished turn as one chunk; `tool_choice: "none"`
leaves the tools out and returns any call as text; `stop` is refused (the agent stops at end-of-turn
and after each tool call, as trained); other sampling options (top_p, seed...) are ignored. A bad
request gets a 4xx with an OpenAI-style error body.

Limits, so one client cannot hold the others (a batch decodes to its longest row):
- `max_tokens` (server side, `serve --max-tokens`, default 1024): a request asking for more is
  CLAMPED to it, not refused (agent frameworks send generous defaults); its reply then ends with
  `finish_reason: "length"` as at any other limit;
- `request_timeout` (`--request-timeout`, default 300 s): a generation past it is cancelled, 504;
- a client that disconnects cancels its generation (a LocalPolicy drops the row from its batch);
- the prompt is tokenised off the event loop, so a huge prompt does not stall other clients;
- http_checks: POSTs must be `Content-Type: application/json` and the Host a loopback name (a web
  page in the operator's browser can do neither), bodies are capped while read, and JSON nested
  deeper than http_checks.MAX_DEPTH is a 400.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import socket
import threading
import time
import uuid
from typing import Any, Literal

from jinja2 import TemplateError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from mcp_rl.quote import short  # a prefix of what a client sent, never all of it
from mcp_rl.ship.http_checks import BadRequest, LoopbackOnly, read_json
from mcp_rl.mcp.launch import free_port
from mcp_rl.policies.policy import ContextOverflow, find_tool_calls

__all__ = ["openai_app", "serve_policy", "ServerThread", "add_serve_parser", "HOST"]

HOST = "127.0.0.1"  # never 0.0.0.0: the endpoint has no auth; put a proxy in front to share it
log = logging.getLogger(__name__)
_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)  # as policy.find_tool_calls reads them


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # clients send fields we do not use (user, top_p...)


class _Named(_Open):  # a tool's or a tool call's "function"
    name: str = Field(min_length=1)


class _Tool(_Open):
    type: Literal["function"]
    function: _Named


class _Function(_Named):
    arguments: str | dict  # the chat template renders them: a missing one failed there as a 500


class _ToolCall(_Open):
    function: _Function


class _Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None
    tool_calls: list[_ToolCall] | None = None

    @model_validator(mode="after")
    def _text_only(self) -> "_Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        if isinstance(self.content, list) and not all(p.get("type") == "text" and isinstance(p.get("text"), str)
                                                      for p in self.content):
            raise ValueError('content parts must be {"type": "text", "text": "..."}; images and audio are not served')
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
    stream_options: dict | None = None
    logprobs: bool | None = False
    stop: str | list[str] | None = None



def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status_code=status)


def _explain(e: ValidationError) -> str:
    parts = [f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']} (got {short(err.get('input'))})"
             for err in e.errors()[:3]]
    return "invalid request: " + "; ".join(parts) + (f"; and {e.error_count() - 3} more" if e.error_count() > 3 else "")


def _prose(text: str) -> str | None:
    """The text around the tool-call blocks that parsed (unparseable ones stay, so the client sees them)."""
    return _BLOCK.sub(lambda m: "" if find_tool_calls(m.group(0))[0] else m.group(0), text).strip() or None


def _completion(choice: Any, served: str, logprobs: bool, usage: dict) -> dict:
    """A ChatCompletion body from the policy's Choice (whose content is the raw Hermes text)."""
    text = choice.message.content or ""
    calls = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",  # unique across a conversation
              "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in choice.message.tool_calls or []]
    message = {"role": "assistant", "content": _prose(text) if calls else text} | ({"tool_calls": calls} if calls else {})
    lps = choice.logprobs.model_dump(mode="json", exclude_none=True) if logprobs and choice.logprobs else None
    finish = "tool_calls" if calls else (choice.finish_reason or "stop")
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": served, "choices": [{"index": 0, "message": message, "logprobs": lps, "finish_reason": finish}],
            "usage": usage}


def _usage(tokenizer: Any, messages: list[dict], tools: list[dict], choice: Any) -> dict:
    prompt = completion = 0
    if tokenizer is not None:  # a policy without a tokenizer (scripted, remote) reports zeros
        try:
            prompt = len(tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))
        except Exception:  # noqa: BLE001 - usage is a report; never fail a finished turn over it
            pass
        lps = choice.logprobs.content if choice.logprobs else None
        completion = len(lps) if lps else len(tokenizer.encode(choice.message.content or "", add_special_tokens=False))
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stream(out: dict, include_usage: bool) -> StreamingResponse:
    """The finished completion as server-sent chat.completion.chunk events."""
    head = {"id": out["id"], "object": "chat.completion.chunk", "created": out["created"], "model": out["model"]}
    (choice,) = out["choices"]
    delta = dict(choice["message"])
    if "tool_calls" in delta:  # chunks index their tool calls
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(delta["tool_calls"])]
    events = [{**head, "choices": [{"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}]
    events += [{**head, "choices": [], "usage": out["usage"]}] if include_usage else []
    body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    return StreamingResponse(iter([body]), media_type="text/event-stream")


async def _until_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body has been read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0.05)


def openai_app(policy: Any, *, name: str | None = None, max_body_bytes: int = 4 << 20,
               default_max_tokens: int = 512, max_tokens: int = 2048, request_timeout: float = 300.0,
               hosts: tuple[str, ...] = ()) -> Starlette:
    """A Starlette app serving `policy` (anything with `async complete(...)`) as model `name`.

    `max_tokens` caps what a request may ask (more is clamped); `request_timeout` bounds a generation
    (504 after it); `hosts`: Host names accepted besides loopback ones (a proxy's)."""
    if max_tokens < 1 or request_timeout <= 0:
        raise ValueError(f"max_tokens must be >= 1 and request_timeout > 0, got {max_tokens}, {request_timeout}")
    served = name or policy.name
    card = {"id": served, "object": "model", "created": int(time.time()), "owned_by": "mcp-rl"}
    unknown = f"is not served here; use {served!r} (GET /v1/models)"

    async def models(request: Request) -> JSONResponse:
        asked = request.path_params.get("model")
        if asked is None or asked == served:
            return JSONResponse(card if asked else {"object": "list", "data": [card]})
        return _error(404, f"model {short(asked)} {unknown}", code="model_not_found")

    async def generate(request: Request, messages: list, tools: list, **kw: Any) -> Any:
        """policy.complete, cancelled when the client disconnects or the time budget runs out."""
        async def bounded() -> Any:
            async with asyncio.timeout(request_timeout):
                return await policy.complete(messages, tools, **kw)

        work, gone = asyncio.ensure_future(bounded()), asyncio.ensure_future(_until_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():  # the client left (or this handler was cancelled): stop generating
                work.cancel()
        if not work.done() or work.cancelled():
            raise asyncio.CancelledError("the client disconnected")
        return work.result()

    async def chat(request: Request) -> Any:
        try:
            data = await read_json(request, max_body_bytes, too_big="send a shorter conversation")
        except BadRequest as e:
            return _error(e.status, e.message)
        if not isinstance(data, dict):
            return _error(400, f"the body must be a JSON object (a chat completion request), got {short(data)}")
        try:
            req = _ChatRequest.model_validate(data)
        except ValidationError as e:
            return _error(400, _explain(e))
        if req.model != served:
            return _error(404, f"model {short(req.model)} {unknown}", code="model_not_found")
        if req.stop:  # the policy stops at end-of-turn and after a tool call, not at client strings
            return _error(400, "stop sequences are not supported: the agent stops at end-of-turn and after each "
                               "tool call; leave `stop` out")
        messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in data["messages"]]
        tools = [] if req.tool_choice == "none" else (data.get("tools") or [])
        asked = req.max_completion_tokens or req.max_tokens or default_max_tokens
        try:
            choice = await generate(request, messages, tools, max_tokens=min(asked, max_tokens),
                                    temperature=1.0 if req.temperature is None else req.temperature)
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # the server is shutting down: let it
                raise
            return _error(499, "the client closed the request", code="client_closed_request")
        except TimeoutError:
            return _error(504, f"the generation took over {request_timeout:.0f} s (the server's --request-timeout); "
                               "ask for fewer max_tokens", kind="server_error", code="timeout")
        except ContextOverflow as e:  # OpenAIPolicy reads "maximum context length" as ContextOverflow
            return _error(400, f"the conversation exceeds the model's maximum context length: {e}",
                          code="context_length_exceeded")
        except (TemplateError, TypeError, ValueError) as e:  # messages the template cannot take are the client's
            return _error(400, f"the chat template cannot render these messages: {short(str(e), 200)}")
        except Exception as e:  # noqa: BLE001 - a failed generation fails this request only
            log.exception("generation failed")
            return _error(500, f"generation failed: {type(e).__name__}: {e}", kind="server_error")
        # Off the event loop: counting a megabyte prompt's tokens takes seconds.
        usage = await asyncio.to_thread(_usage, getattr(policy, "tokenizer", None), messages, tools, choice)
        if req.tool_choice == "none" and choice.message.tool_calls:  # no calls were asked for: the text stays text
            choice = choice.model_copy(update={"message": choice.message.model_copy(update={"tool_calls": None})})
        out = _completion(choice, served, bool(req.logprobs), usage)
        return _stream(out, bool((req.stream_options or {}).get("include_usage"))) if req.stream else JSONResponse(out)

    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        return _error(e.status_code, e.detail if e.status_code != 404 else
                      f"no route {request.url.path}; this server has GET /v1/models and POST /v1/chat/completions")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/models/{model:path}", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])],
                     exception_handlers={HTTPException: http_error},
                     middleware=[Middleware(LoopbackOnly, refuse=_error, hosts=hosts)])


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread: `.base_url` (.../v1), `.stop()`. The policy's
    batching worker then lives on this thread's event loop: do not call it from another loop meanwhile."""

    def __init__(self, app: Any, *, port: int | None = None, startup_timeout: float = 30.0):
        import uvicorn

        self.port, self.startup_timeout = port or free_port(), startup_timeout
        self.server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name=f"mcp-rl-serve-{self.port}", daemon=True)
        self.base_url = f"http://{HOST}:{self.port}/v1"

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.server.started:
            self.stop()
            raise RuntimeError(f"the server did not start on {HOST}:{self.port}; is the port in use?")
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)

    __enter__ = start

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve_policy(policy: Any, *, port: int = 8000, name: str | None = None, max_tokens: int = 1024,
                 request_timeout: float = 300.0) -> None:
    """Serve `policy` on 127.0.0.1:`port` until Ctrl-C (blocking); see openai_app for the limits."""
    import uvicorn

    if not 0 < port < 65536:
        raise ValueError(f"port must be in 1..65535, got {port}")
    with socket.socket() as s:  # a clear message instead of uvicorn's exit on a taken port
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise RuntimeError(f"cannot listen on {HOST}:{port} ({e.strerror}); pass another --port") from e
    app = openai_app(policy, name=name, max_tokens=max_tokens, default_max_tokens=min(512, max_tokens),
                     request_timeout=request_timeout)
    uvicorn.run(app, host=HOST, port=port, log_level="info", timeout_graceful_shutdown=5)


def cmd_serve(a: argparse.Namespace) -> int:
    from mcp_rl.runs import flags
    from mcp_rl.runs.config import Config

    cfg = flags.config(a, Config(), trains=False)
    policy = flags.local_policy(cfg, a.adapter, base_from_adapter="model" not in flags.given(a), name=a.name)
    print(f"serving {policy.name!r} ({policy.base_model}{' + ' + a.adapter if a.adapter else ''}) at http://{HOST}:{a.port}/v1 "
          f"(clients ask for model {policy.name!r})", flush=True)
    serve_policy(policy, port=a.port, name=policy.name, max_tokens=a.max_tokens, request_timeout=a.request_timeout)
    return 0


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `serve` subcommand on cli.main's subparsers; sets `fn=cmd_serve`. The model section's flags
    are the Config fields' (mcp_rl/runs/flags.py); --max-batch is policy_batch's older name."""
    from mcp_rl.runs import flags

    sp = subparsers.add_parser("serve", help="serve a model (+ LoRA) as an OpenAI-compatible endpoint on 127.0.0.1",
                               description="OpenAI-compatible /v1/models and /v1/chat/completions (tools in, "
                               "tool_calls out) on 127.0.0.1, for any agent framework or MCP client.")
    flags.add_model_flags(sp, endpoint=False)
    sp.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000)")
    sp.add_argument("--name", help="model name clients ask for (default: the adapter folder's name, else --model)")
    sp.add_argument("--max-tokens", type=int, default=1024,
                    help="the most new tokens a request gets; asking more is clamped to this (default 1024)")
    sp.add_argument("--request-timeout", type=float, default=300.0,
                    help="seconds a generation may take before it is cancelled with a 504 (default 300)")
    sp.set_defaults(fn=cmd_serve)
    return sp
