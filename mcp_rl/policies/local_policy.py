"""A transformers policy (CPU or CUDA) with batching and per-token logprobs.

    model, tokenizer = load_local_model()          # the embedded SmolLM2-135M
    policy = LocalPolicy(model, tokenizer)
    policy = load_policy("smollm2", adapter="runs/demo")   # base model + a run's LoRA, in one call
    choice = await policy.complete(messages, tools, max_tokens=128, temperature=0.8)

The policy samples from the model object in place, so a trainer that updates its
(LoRA) weights makes the next `complete` use them (DESIGN.md, "Choices").
Concurrent `complete` calls (a GRPO group, parallel rollouts) are batched into
one left-padded decode (batch_decode.py; the step is decoder.py's: a StaticCache, replayed as a CUDA
graph on a GPU; with `join=True` joining.py, where a request joins a decode already running), run in
a worker thread so the event loop keeps serving MCP calls; the prompt is tokenised in a thread too
(a megabyte prompt takes seconds). A request whose caller gives up (a cancelled `complete`: the
served endpoint's client disconnected or ran out of time) is dropped from its batch within 8
decode steps, and the decode stops once no row is left. With `reuse_prefix=True` a turn's keys
and values are kept (prefix_cache.py), so an episode's next turn prefills only its new tokens.
Loading lives in models.py, the tool-calling chat template in chat_templates.py; their names are
re-exported here.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any

from mcp_rl.policies.chat_templates import HERMES_TEMPLATE, art_tokenizer, install_tool_template, prompt_ids
from mcp_rl.policies.decoder import stop_string_end
from mcp_rl.policies.models import SMOLLM2, load_local_model, load_local_tokenizer
from mcp_rl.policies.policy import ContextOverflow, PolicyError, choice_from_text
from mcp_rl.policies.prefix_cache import PrefixCache

__all__ = ["SMOLLM2", "load_local_model", "load_local_tokenizer", "LocalPolicy", "load_policy", "art_tokenizer",
           "install_tool_template", "HERMES_TEMPLATE", "stop_string_end"]

_TOOL_PREFIX = '<tool_call>\n{"name": "'
STOP_STRING = "</tool_call>"


@dataclass
class _Request:
    prompt_ids: list[int]
    n_forced: int
    max_new: int
    temperature: float
    future: asyncio.Future = field(repr=False)
    queued: float = field(default_factory=time.monotonic, repr=False)


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

    `reuse_prefix=True` keeps each row's keys and values after its turn (prefix_cache.py), so an
    episode's next turn prefills only the tool result and the turn markers; at most
    `prefix_cache_gib` of them, emptied when the weights change (or by `clear_prefix_cache()`).

    `fused_lora` (on by default) samples through each LoRA layer as two products in the base weights'
    dtype with the scaled add fused (training/kernels.lora_sampling): a quarter fewer ops a decode step
    in SmolLM2's shape; in float32 (a CPU) the same log-probs to 1e-5, in bf16 the LoRA factors rounded
    as the update's autocast rounds them. `fused_lora=False` keeps peft's float32 adapter path.
    `compile_decode=True` runs the one-token forward through torch.compile (decoder.py; ~30 s of
    compiling for a small model on an H100, again for a new batch shape; bench/RESULTS.md).
    `join=True` (continuous batching, joining.py): a request that arrives while a batch decodes takes a
    finished row's place in it at the next host sync instead of waiting for the batch to end; each decode
    then has room for twice the rows that started it, plus 8 (within `max_batch`). Not with `reuse_prefix`.
    """

    token_in = True  # rollouts pass earlier turns as Choices: the next prompt holds their sampled ids

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "local", max_batch: int = 8,
                 batch_wait_s: float = 0.02, tool_prefix: bool = False, max_context: int | None = None,
                 cuda_graph: bool = True, batch_gap_s: float | None = None, hand_back: bool = True,
                 reuse_prefix: bool = False, prefix_cache_gib: float = 1.0, fused_lora: bool = True,
                 compile_decode: bool = False, join: bool = False):
        import transformers

        if int(transformers.__version__.split(".")[0]) < 5:  # StaticCache, attention interface: 5.x APIs
            raise RuntimeError(f"LocalPolicy's decode loop needs transformers 5, this machine has "
                               f"{transformers.__version__} (the ART + vLLM install pins 4.53.2): sample through "
                               "ART's vLLM there (train.backend=art), or use the light install (INSTALL = 'unsloth')")
        self.model, self.tokenizer, self.name = model, tokenizer, name
        # None: a batch waits `batch_wait_s` after its first request. A gap: it closes as soon as no new
        # request came for `batch_gap_s` (still at most `batch_wait_s`), so a wave of rollouts returning
        # from their tool calls over a second joins one decode instead of splitting at a fixed window.
        self.batch_gap_s = batch_gap_s
        # A request whose row finishes early is answered then, not when the batch's longest row ends.
        self.hand_back = hand_back
        self.cuda_graph = cuda_graph
        self.fused_lora, self.compile_decode = fused_lora, compile_decode
        self.max_batch, self.batch_wait_s, self.tool_prefix = max_batch, batch_wait_s, tool_prefix
        self.max_context = max_context or getattr(model.config, "max_position_embeddings", None) or 4096
        self.step = 0
        self.generate_calls = 0  # how many batched decodes served requests (tests, benchmarks)
        # Where sampling time goes, summed over every batched decode (pipeline.train_step logs each
        # step's share): the rows' real and left-padded prompt tokens, decode steps, the seconds in
        # prefill and in the decode loop, and the seconds requests waited to join a batch. With
        # reuse_prefix, the prompt columns prefilled fall below the padded ones by about those copied
        # from earlier turns (reused_tokens); keep_s is the copying out of this turn's rows. With join,
        # `joined` counts the rows that joined a running decode.
        self.decode_stats = dict.fromkeys(("rows", "prompt_tokens", "padded_prompt_tokens", "prefill_tokens",
                                           "reused_tokens", "decode_steps", "prefill_s", "decode_s", "keep_s",
                                           "queue_wait_s", "joined"), 0.0)
        if join and reuse_prefix:
            raise ValueError("join and reuse_prefix cannot be combined yet (a kept prefix is written from a batch's "
                             "first column): turn one off (policy_join / policy_reuse_prefix)")
        self.join = join
        self._carry: list[_Request] = []  # requests that waited through a joining decode without fitting it
        self.prefix_cache = PrefixCache(int(prefix_cache_gib * 2**30)) if reuse_prefix else None
        self.last_batch_size = 0
        self.decode_spans: collections.deque = collections.deque(maxlen=4096)  # (start, end) monotonic, each decode
        self._prefix_ids = tokenizer.encode(_TOOL_PREFIX, add_special_tokens=False)
        self.stop_ids = self._stop_ids()
        self._queue: asyncio.Queue | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task | None = None

    @property
    def served_name(self) -> str:
        return f"{self.name}@{self.step}"

    def clear_prefix_cache(self) -> None:
        """Drop the kept keys and values: before an update that needs their memory, or after one that
        changed the weights without `step` or the parameters' version counters moving (a fused optimizer)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _weights_version(self) -> tuple:
        # In-place writes (optimizer steps, load_state_dict) bump a tensor's version counter.
        return self.step, sum(p._version for p in self.model.parameters())

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

    async def complete(self, messages: list, tools: list[dict], *, max_tokens: int, temperature: float) -> Any:
        # Earlier sampled turns (Choices) as their ids; in a thread, so a huge prompt holds no other caller.
        prompt = await asyncio.to_thread(prompt_ids, self.tokenizer, messages, tools)
        forced = self._prefix_ids if self.tool_prefix else []
        room = self.max_context - len(prompt) - len(forced)
        if room <= 0:
            raise ContextOverflow(f"the prompt is {len(prompt)} tokens; {self.name} holds {self.max_context}: "
                                  "use fewer turns or shorter tool results (max_result_chars)")
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            # A new event loop (each asyncio.run, each test) gets its own queue and worker; the same loop's
            # worker, dead, is restarted on what was waiting.
            if self._loop is not loop:
                self._loop, self._queue, self._carry = loop, asyncio.Queue(), []
            self._worker = loop.create_task(self._serve())
        request = _Request(list(prompt) + forced, len(forced), max(1, min(max_tokens, room)),
                           float(temperature), loop.create_future())
        await self._queue.put(request)
        return await request.future

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch, self._carry = self._carry[: self.max_batch], self._carry[self.max_batch:]
            batch = batch or [await self._queue.get()]
            deadline = loop.time() + self.batch_wait_s
            while len(batch) < self.max_batch:
                wait = max(0.0, deadline - loop.time())
                if self.batch_gap_s is not None:
                    wait = min(wait, self.batch_gap_s)
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), wait))
                except asyncio.TimeoutError:
                    break
            groups: dict[tuple, list[_Request]] = {}  # one generate per sampling setting
            for r in batch:
                if not r.future.done():  # the caller may have given up (timeout, cancel)
                    groups.setdefault((r.temperature, r.n_forced), []).append(r)
            for group in groups.values():
                taken = list(group)
                try:
                    if self.join:  # answers its requests itself, as their rows end
                        await self._decode_joining(group, taken)
                        continue
                    choices = await asyncio.to_thread(self._generate, group)
                except Exception as e:  # a crash in generate fails these requests, not the worker
                    error = PolicyError(f"{self.name}: generation failed: {type(e).__name__}: {e}")
                    for r in taken:
                        if not r.future.done():
                            r.future.set_exception(error)
                    continue
                for r, choice in zip(group, choices):
                    if not r.future.done():
                        r.future.set_result(choice)

    async def _decode_joining(self, group: list[_Request], taken: list[_Request]) -> None:
        """`group`'s decode, which requests queued meanwhile join (joining.py); those that could not stay
        first in line for the next batch."""
        from mcp_rl.policies import joining

        inbox = joining.Inbox()
        for r in self._carry:  # those that waited through an earlier decode go first
            inbox.put(r)
        self._carry = []

        async def feed() -> None:
            while True:
                inbox.put(await self._queue.get())

        feeder = asyncio.get_running_loop().create_task(feed())
        try:
            await asyncio.to_thread(joining.decode, self, group, inbox, taken)
        finally:
            feeder.cancel()
            self._carry.extend(inbox.drain())

    def _generate(self, reqs: list[_Request]) -> list[Any]:
        from mcp_rl.policies import batch_decode

        return batch_decode.decode(self, reqs)

    def _end(self, tokens: list[int], max_new: int) -> int:
        """How many sampled tokens a row's Choice keeps: up to its end-of-turn, within its max_tokens."""
        stop = next((t for t, tok in enumerate(tokens) if tok in self.stop_ids), None)
        return min(stop if stop is not None else len(tokens), max_new)

    def _stop_at_string(self, tokens: Any, done: Any, checked: int, upto: int) -> int:
        """Finish the rows whose text gained `</tool_call>` since token `checked`; returns `upto`.

        Tokens sampled after the one that completes it become padding (end-of-turn).
        """
        rows = (~done).nonzero()[:, 0].tolist()
        if rows:
            start = max(0, checked - 16)  # overlap: the stop string may straddle the last check
            window = tokens[rows, start:upto].tolist()
            for row, toks in zip(rows, window):
                end = stop_string_end(self.tokenizer, toks, STOP_STRING)
                if end is not None:
                    tokens[row, start + end:] = self.stop_ids[0]
                    done[row] = True
        return upto

    def _choice(self, r: _Request, tokens: list[int], lps: list[float], forced_lp: list[float]) -> Any:
        stop = next((t for t, tok in enumerate(tokens) if tok in self.stop_ids), None)
        end = self._end(tokens, r.max_new)
        tokens, lps = r.prompt_ids[len(r.prompt_ids) - r.n_forced:] + tokens[:end], forced_lp + lps[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        finished = (stop is not None and stop < r.max_new) or text.rstrip().endswith(STOP_STRING)
        return choice_from_text(text, tokenizer=self.tokenizer, token_ids=tokens, logprobs=lps,
                                finish_reason="stop" if finished else "length")


def load_policy(model: str | None = None, adapter: str | None = None, *, name: str | None = None,
                quantize_4bit: bool = False, **policy_kw: Any) -> LocalPolicy:
    """A LocalPolicy of `model` with the LoRA of `adapter` (a run folder: its newest checkpoint; a
    checkpoint; ART's checkpoint folder; a peft adapter folder). Without `model`: the base the adapter
    records, else the embedded smollm2. `name` (what clients ask for): the adapter folder's, else the
    model's; `policy.base_model` says which base it loaded. `policy_kw` go to LocalPolicy (tool_prefix,
    max_batch, reuse_prefix, ...)."""
    from pathlib import Path

    from mcp_rl.ship.export import load_with_adapter, recorded_base_model

    model = model or (recorded_base_model(adapter) if adapter else None) or SMOLLM2
    weights, tokenizer = load_local_model(model, quantize_4bit=quantize_4bit)
    if adapter:
        weights = load_with_adapter(weights, adapter)
    policy = LocalPolicy(weights, tokenizer, name=name or (Path(adapter).resolve().name if adapter else model), **policy_kw)
    policy.base_model = model
    return policy
