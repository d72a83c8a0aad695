"""Earlier turns' KV cache, kept between an episode's turns so a rollout's next prompt prefills only what is new.

Internal to local_policy.py (`LocalPolicy(..., reuse_prefix=True)`). Each row a batch decodes leaves an entry:
its prompt ids plus the sampled ids that went through the model, with their keys and values (one row of the
batch's StaticCache, cut out). The episode's next prompt starts with exactly those ids (token-in: earlier turns
are rendered as the ids sampled, chat_templates.prompt_ids), so it reuses them and prefills only the tool
result and the template's turn markers. A match is the longest common prefix with any entry, so a new
episode's system prompt and tool list come from an earlier episode's entry too. Keys and values of a token
depend only on the ids up to it and their positions (left padding moves columns, not positions), so reuse is
exact up to float rounding: reused keys were computed by decode steps, re-prefilled ones by one prefill.

Entries are stale once the weights change: the cache empties when the policy's `step` or any parameter's
in-place version counter moves (what an optimizer step or a checkpoint load does; AdamW(fused=True) does not
bump them: call `LocalPolicy.clear_prefix_cache()` after such an update). Bounded in bytes, least recently
used first out; an entry is replaced by the one that extends it (the episode's next turn).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Entry:
    ids: Any  # 1-D CPU LongTensor: the prompt and the sampled ids whose keys and values are held
    key: tuple = field(repr=False)  # the same ids, as the entries' dict key
    kv: list = field(repr=False)  # per layer (keys, values), each [kv_heads, len(ids), head_dim] on the model's device
    nbytes: int = 0


@dataclass
class Plan:
    """How one batch prefills: the query window (the last `window` prompt columns) and, per reusing row,
    (row, first column, keys and values, how many columns to copy) for what lies left of the window."""
    window: int
    copies: list
    matched: list  # per row: the entry it matched in full (its episode's previous turn), else None
    reused: int = 0  # prompt tokens copied instead of prefilled


def common_prefix(a: Any, b: Any) -> int:
    """How many leading ids two 1-D tensors share.

    >>> import torch
    >>> t = torch.tensor
    >>> common_prefix(t([1, 2, 3]), t([1, 2, 4, 5])), common_prefix(t([7]), t([7, 8])), common_prefix(t([7]), t([8]))
    (2, 1, 0)
    """
    n = min(len(a), len(b))
    differ = (a[:n] != b[:n]).nonzero()
    return int(differ[0, 0]) if len(differ) else n


class PrefixCache:
    """Entries of (ids, keys and values), least recently used first, at most `max_bytes` in all.

    >>> import torch
    >>> cache = PrefixCache(max_bytes=2 * 3 * 4 * 2)   # two entries of 3 tokens: [1 head, 3, 1 dim] fp32, k and v
    >>> kv = lambda n: [(torch.zeros(1, n, 1), torch.zeros(1, n, 1))]
    >>> for ids in ([1, 2, 3], [4, 5, 6], [1, 2, 7]): cache.add(ids, kv(3))
    >>> [e.ids.tolist() for e in cache.entries.values()], cache.stats["evicted"]
    ([[4, 5, 6], [1, 2, 7]], 1)
    >>> entry, n = cache.match([1, 2, 3, 9]); entry.ids.tolist(), n
    ([1, 2, 7], 2)
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()
        self.nbytes = 0
        self.version: Any = None
        self.stats = dict.fromkeys(("stored", "evicted", "cleared", "hits"), 0)
        self._lock = threading.RLock()  # the decode thread uses it; clear() may come from the event loop's

    def __len__(self) -> int:
        return len(self.entries)

    def check(self, version: Any) -> None:
        """Empty the cache if the weights' `version` differs from the one its entries were computed with."""
        with self._lock:
            if version != self.version:
                self.stats["cleared"] += bool(self.entries)
                self.clear()
                self.version = version

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self.nbytes = 0

    def match(self, ids: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `ids`, and that length (marked recently used)."""
        import torch

        query, best, best_n = torch.tensor(ids, dtype=torch.long), None, 0
        with self._lock:
            entries = list(self.entries.values())
        for entry in entries:
            if len(query) and len(entry.ids) and int(entry.ids[0]) == ids[0]:
                n = common_prefix(query, entry.ids)
                if n > best_n:
                    best, best_n = entry, n
        with self._lock:
            if best is not None and best.key in self.entries:
                self.entries.move_to_end(best.key)
        return best, best_n

    def add(self, ids: list[int], kv: list) -> None:
        import torch

        key, nbytes = tuple(ids), sum(t.numel() * t.element_size() for pair in kv for t in pair)
        with self._lock:
            if key in self.entries:  # the same ids again (a greedy GRPO group): keep one copy
                self.entries.move_to_end(key)
                return
            if nbytes > self.max_bytes:
                return
            while self.entries and self.nbytes + nbytes > self.max_bytes:
                self.nbytes -= self.entries.popitem(last=False)[1].nbytes
                self.stats["evicted"] += 1
            self.entries[key] = Entry(torch.tensor(ids, dtype=torch.long), key, kv, nbytes)
            self.nbytes += nbytes
            self.stats["stored"] += 1

    def drop(self, entry: Entry | None) -> None:
        with self._lock:
            if entry is not None and self.entries.pop(entry.key, None) is not None:
                self.nbytes -= entry.nbytes

    def keep(self, plan: Plan, rows: list, kv_of: Any) -> None:
        """After a decode: each row's new entry replaces the one it extended (its episode's previous turn).
        `rows[i]` is (ids, first column) or None where the caller gave up (then neither stays);
        `kv_of(i, start, end)` cuts row i's keys and values out of the batch's cache."""
        with self._lock:
            for i, row in enumerate(rows):
                self.drop(plan.matched[i])
                if row is not None:
                    ids, start = row
                    self.add(ids, kv_of(i, start, start + len(ids)))

    def plan(self, prompts: list[list[int]], n_forced: int) -> Plan:
        """Which columns of a batch of left-padded `prompts` (all ending in the same column) to copy and which
        to prefill. Rows share one prefill forward, so its window is the longest part any row must compute;
        a row whose new part is shorter recomputes some of its cached ids (the same values, up to rounding).
        At least the forced prefix and one more token are always computed: the first logits come from them."""
        width = max(len(p) for p in prompts)
        hits = []
        for p in prompts:
            entry, n = self.match(p)
            hits.append((entry, n))
        window = max(len(p) - max(0, min(n, len(p) - n_forced - 1)) for p, (_, n) in zip(prompts, hits))
        copies, matched, reused = [], [], 0
        for row, (p, (entry, n)) in enumerate(zip(prompts, hits)):
            matched.append(entry if entry is not None and n == len(entry.ids) else None)
            count = len(p) - window  # this row's columns left of the window, all of them cached
            if count > 0:
                copies.append((row, width - len(p), entry.kv, count))
                reused += count
        if reused:
            self.stats["hits"] += len(copies)
        return Plan(window, copies, matched, reused)
