"""Continuous batching for LocalPolicy (`join=True`): a request joins the running decode in a finished row's slot.

Without it a batch decodes until its last row ends while requests that arrive meanwhile (rollouts back from a
tool call, the late part of a wave) wait for the next batch, and every batch pays its own prefill and its own
128-odd decode steps. Here a decode keeps slots over one KV cache (twice as many as the requests that start it,
plus 8, within `max_batch`); at each host sync (every 8 steps)
finished rows are answered and waiting requests take the free slots (once more wait than the decode has rows,
none joins any more: the rows finish and a wider batch takes them all): their prompts are prefilled together as a
batch of their own (decoder.Decoder) and their keys and values copied into the slot's cache columns ending at
the column the whole batch last wrote, so every row keeps writing the same column each step (what the CUDA
graph's fixed shapes need; the graph's buffers stay where they are). A row's positions are its own, counted from
its prompt's first token, as in a left-padded batch.

By hand because transformers' continuous batching (`generate_batch`, paged attention; 5.24) gives the log-probs
of the temperature-scaled distribution it samples from (`return_logprobs`: model_runner._sample), not the
temperature-1 log-probs our trainer compares with (DESIGN.md), has no stop string (`</tool_call>`) or forced
prefix, and runs its own cache and graphs instead of our decode step (fused LoRA sampling, the packed GQA).
Exactness: a joined row's tokens are those of decoding it alone up to float rounding (tests/test_joining.py).
Not combined with `reuse_prefix` (a kept prefix is written from a batch's first column; refused in LocalPolicy).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mcp_rl.policies.batch_decode import resolve, sample
from mcp_rl.policies.decoder import Decoder

ROOM = 2  # x max_tokens: empty columns left of the first prompts, so a later, longer prompt (a next turn) fits
STEPS = 4  # x max_tokens: the decode steps one joining decode may run; then the next batch starts afresh
SYNC = 8  # steps between host syncs: where rows finish and join
SPARE = 8  # rows: a decode has room for twice the requests that start it, plus SPARE (within max_batch)


class Inbox:
    """Requests that arrive while a decode runs (filled by the event loop, taken by the decode thread)."""

    def __init__(self):
        self._items: list = []
        self._lock = threading.Lock()

    def put(self, request: Any) -> None:
        with self._lock:
            self._items.append(request)

    def take(self, fits: Any, limit: int) -> list:
        """Up to `limit` requests for which `fits(request)`, oldest first; the others stay."""
        with self._lock:
            taken = [r for r in self._items if fits(r)][:limit]
            self._items = [r for r in self._items if all(r is not t for t in taken)]
        return taken

    def count(self, fits: Any) -> int:
        """How many waiting requests `fits`."""
        with self._lock:
            return sum(1 for r in self._items if fits(r))

    def drain(self) -> list:
        with self._lock:
            items, self._items = self._items, []
        return items


class SlotDecoder(Decoder):
    """A Decoder of `rows` slots that start empty; `admit` puts prefilled requests into free slots."""

    def __init__(self, model: Any, rows: int, length: int, *, cuda_graph: bool, compiled: bool = False):
        import torch

        device = model.device
        super().__init__(model, torch.zeros((rows, 1), dtype=torch.long, device=device),
                         torch.zeros((rows, 1), dtype=torch.bool, device=device), length, cuda_graph=False,
                         compiled=compiled)
        self.graph_wanted = cuda_graph
        self.step_ids = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.step_pos = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.started = False

    def admit(self, slots: list[int], prompts: list[list[int]], n_forced: int, last: int) -> tuple[Any, Any]:
        """Prefill `prompts` into `slots`, each prompt ending at cache column `last` (the one the batch wrote
        last); the logits of each one's first new token, and the forced prefix's logprobs (or None)."""
        import torch

        device, width = self.ids.device, max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
        keep = torch.zeros((len(prompts), width), dtype=torch.bool, device=device)
        for j, p in enumerate(prompts):
            ids[j, width - len(p):] = torch.tensor(p, device=device)
            keep[j, width - len(p):] = True
        part = Decoder(self.model, ids, keep, width, cuda_graph=False)
        logits, forced = part.prefill(n_forced)
        if not self.started:  # the cache's tensors, and the column its next write goes to
            for layer, src in zip(self.cache.layers, part.cache.layers):
                rows = self.ids.shape[0]
                layer.lazy_initialization(src.keys.new_zeros((rows, *src.keys.shape[1:2], 0, src.keys.shape[-1])),
                                          src.values.new_zeros((rows, *src.values.shape[1:2], 0, src.values.shape[-1])))
                layer.cumulative_length.fill_(last + 1)
            self.started = True
        for j, (slot, p) in enumerate(zip(slots, prompts)):
            first = last + 1 - len(p)
            for layer, src in zip(self.cache.layers, part.cache.layers):
                layer.keys[slot, :, first:last + 1] = src.keys[j, :, width - len(p):]
                layer.values[slot, :, first:last + 1] = src.values[j, :, width - len(p):]
            self.mask[slot] = self.neg
            self.mask[slot, 0, 0, first:last + 1] = 0.0
            if self.smask is not None:  # the next query (column last + 1) sees keys k with last + 1 - k < window
                self.smask[slot] = self.neg
                self.smask[slot, 0, 0, max(first, last + 2 - self.window):last + 1] = 0.0
            self.step_pos[slot, 0] = len(p) - 1  # the step adds one: the first new token's position is len(p)
        if self.graph_wanted and self.graph is None:
            self.graph_wanted = False  # captured once, on the first admitted rows (a failure decodes eagerly)
            self._capture()
        return logits, forced


def decode(policy: Any, first: list, inbox: Inbox, taken: list) -> None:
    """Decode `first` and whatever joins from `inbox` until no row is left (or the step budget is spent);
    answers each request when its row ends. `taken` receives every request taken from the inbox (the
    caller fails those still unanswered if this raises)."""
    import torch

    from mcp_rl.training.kernels import lora_sampling

    if policy.prefix_cache is not None:
        raise ValueError("join and reuse_prefix cannot be combined yet: turn one off (policy_join / policy_reuse_prefix)")
    first = [r for r in first if not r.future.done()]
    if not first:
        return
    model, stats, loop = policy.model, policy.decode_stats, policy._loop
    device, pad = model.device, policy.stop_ids[0]
    temperature, n_forced, most = first[0].temperature, first[0].n_forced, max(r.max_new for r in first)
    # Rows cost every step whether filled or not (SmolLM2 on an H100: 12-16 ms a step at 192 rows against ~10 for
    # the batches they replaced, bench/HISTORY.md section 28): room for twice the requests that start it, plus SPARE.
    rows, budget = max(len(first), min(policy.max_batch, 2 * len(first) + SPARE)), STEPS * most + SYNC
    rows_before = stats["rows"]
    top = max(len(r.prompt_ids) for r in first) + ROOM * most - 1  # the first prompts' last column
    slots: list = [None] * rows
    draining = False  # no more joins: the rows finish, and the next batch starts with every request waiting
    begin, forced = [0] * rows, [[] for _ in range(rows)]
    start = time.monotonic()
    prefill_s = 0.0
    policy.generate_calls += 1  # now: rows are answered (and their callers go on) while it decodes

    def fits(r: Any, last: int, t: int) -> bool:  # same sampling, its prompt left of `last`, its tokens in budget
        return ((r.temperature, r.n_forced) == (temperature, n_forced) and len(r.prompt_ids) <= last + 1
                and t + r.max_new + SYNC <= budget and not r.future.done())

    with torch.inference_mode(), lora_sampling(model, on=policy.fused_lora):
        dec = SlotDecoder(model, rows, top + 1 + budget, cuda_graph=policy.cuda_graph and device.type == "cuda",
                          compiled=policy.compile_decode)
        tokens = torch.full((rows, budget + 1), pad, dtype=torch.long, device=device)
        lps = torch.zeros((rows, budget + 1), dtype=torch.float32, device=device)
        done = torch.ones(rows, dtype=torch.bool, device=device)
        limits = torch.zeros(rows, dtype=torch.long, device=device)
        stops = torch.tensor(policy.stop_ids, device=device)

        def admit(reqs: list, last: int, t: int, logits: Any) -> Any:
            nonlocal prefill_s
            began = time.monotonic()
            free = [i for i, s in enumerate(slots) if s is None][: len(reqs)]
            new, new_forced = dec.admit(free, [r.prompt_ids for r in reqs], n_forced, last)
            logits = new.new_zeros((rows, new.shape[-1])) if logits is None else logits.clone()
            logits[free] = new
            tokens[free], lps[free] = pad, 0.0  # the slot's previous request's tokens are answered and gone
            for j, (i, r) in enumerate(zip(free, reqs)):
                slots[i], begin[i] = r, t
                forced[i] = new_forced[j].tolist() if new_forced is not None else []
                limits[i] = t + r.max_new
            done[free] = False
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            prefill_s += time.monotonic() - began
            stats["rows"] += len(reqs)
            stats["prompt_tokens"] += sum(len(r.prompt_ids) for r in reqs)
            stats["padded_prompt_tokens"] += len(reqs) * max(len(r.prompt_ids) for r in reqs)
            stats["prefill_tokens"] += len(reqs) * max(len(r.prompt_ids) for r in reqs)
            stats["queue_wait_s"] += sum(began - r.queued for r in reqs)
            stats["joined"] += len(reqs) if t else 0
            policy.last_batch_size = int(stats["rows"] - rows_before)  # rows this decode took, so far
            return logits

        def answer(index: list[int], t: int) -> None:
            for i, toks, lp in zip(index, tokens[index, : t + 1].tolist(), lps[index, : t + 1].tolist()):
                r, slots[i] = slots[i], None
                if not r.future.cancelled():
                    choice = policy._choice(r, toks[begin[i]:], lp[begin[i]:], forced[i])
                    loop.call_soon_threadsafe(resolve, r.future, choice)

        logits = admit(first, top, 0, None)
        last, checked, t = top, 0, 0
        while True:
            tok = sample(logits, temperature, t, tokens, lps, done, stops, pad)
            joiners: list = []
            if (t + 1) % SYNC == 0 or t == budget:  # host syncs every SYNC steps, not every step
                checked = policy._stop_at_string(tokens, done, checked, t + 1)
                gone = [i for i, r in enumerate(slots) if r is not None and r.future.cancelled()]
                if gone:
                    done[gone] = True
                done |= limits <= t + 1  # a row past its own max_tokens is finished too
                answer([i for i in (done & torch.tensor([s is not None for s in slots], device=device)).nonzero()[:, 0]
                        .tolist()], t)
                if t == budget:
                    break
                free = 0 if draining else sum(s is None for s in slots)
                joiners = inbox.take(lambda r: fits(r, last + 1, t + 1), free) if free else []
                taken.extend(joiners)  # before anything can raise: the caller fails them then, none is lost
                # More requests wait than this decode has rows, and a wider one could take them all at once (a step
                # of 10 rows costs about what one of 64 does): stop joining, so the next batch starts sooner.
                draining = draining or (rows < policy.max_batch
                                        and inbox.count(lambda r: fits(r, last + 1, t + 1)) >= rows)
                if not joiners and all(s is None for s in slots):
                    break
            logits = dec.step(tok, last + 1)
            last, t = last + 1, t + 1
            if joiners:
                logits = admit(joiners, last, t, logits)
        answer([i for i, s in enumerate(slots) if s is not None], t)  # none by construction; never left hanging
    decoded = time.monotonic()
    stats["decode_steps"] += t + 1
    stats["prefill_s"] += prefill_s
    stats["decode_s"] += decoded - start - prefill_s
    policy.decode_spans.append((start, decoded))
