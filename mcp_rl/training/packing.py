"""The GRPO update's packed path: sequences laid end to end (no padding), log-probs only where trained.

    batches = token_batches(seqs, budget=16384)              # length-sorted, packed rows <= budget tokens
    new, old, mask = packed_logprobs(backbone, head, batch, device=..., autocast=...)   # each [B, K]

Why: the padded path (train.py `_logprobs`) runs every micro-batch at its longest sequence's length, so one
8078-token episode among 1-2k-token ones made 6865 padding tokens of activations (Gemma 3 270M, 70.2 GiB at
step 3 on an H100, issue [speed]); and it ran the LM head from the batch's first trained position on,
prompts, tool results and padding included (a 262k vocabulary for Gemma). Here the sequences of a micro-batch
go into rows as long as its longest sequence (first fit, longest first), each with its own `position_ids`
from 0, which transformers' masking reads as packed sequences (a block-diagonal causal mask, the sliding window
kept inside each sequence); the head runs only on the positions whose target is a trained token, through
Liger-Kernel's fused linear cross-entropy on CUDA (Triton: per-token log-probs without the logits tensor, its
gradient recomputed chunk by chunk) and loss.py's checkpointed chunks elsewhere.
The result has the padded path's layout ([B, K], zeros and mask 0 where untrained), so grpo_loss and
off_policy_stats are unchanged; tests/test_train.py checks the loss and gradients equal the padded path's.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from mcp_rl.training.loss import chunked_logprobs

log = logging.getLogger(__name__)


def token_batches(seqs: list[dict], budget: int) -> list[list[dict]]:
    """Consecutive runs of length-sorted `seqs` whose packed rows (`padded_size`: rows x the longest) hold at
    most `budget` tokens, padding tails included, so the budget bounds the activations; a longer one alone."""
    batches: list[list[dict]] = [[]]
    for s in seqs:
        if batches[-1] and padded_size(batches[-1] + [s]) > budget:
            batches.append([])
        batches[-1].append(s)
    return [b for b in batches if b]


def padded_size(batch: list[dict]) -> int:
    """Input positions the packed rows of `batch` take, padding tails included."""
    lengths = [len(s["ids"]) - 1 for s in batch]
    return len(rows_of(lengths, max(lengths))) * max(lengths)


def rows_of(lengths: list[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: indices of `lengths` per row of at most `row_len` tokens.

    >>> rows_of([3, 5, 2, 4], 6)
    [[1], [3, 2], [0]]
    """
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(row_len - lengths[i])
    return rows


def fused_available(device: torch.device) -> bool:
    """Liger-Kernel's Triton kernels need CUDA (and the optional `gpu` extra: pip install 'mcp-rl[gpu]')."""
    if device.type != "cuda":
        return False
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except Exception:  # noqa: BLE001  (not installed, or no Triton for this GPU: the chunked path is always right)
        return False
    return True


def fused_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype | None,
                   rows_per_chunk: int = 1024) -> torch.Tensor:
    """log p(target) for [N, H] hidden states through Liger's fused linear cross-entropy (reduction="none").

    Liger sizes its chunks as N / ceil(vocab / (chunk_mem_const * hidden)) rows: with the default
    constant a 262k vocabulary and 640 hidden units give 16-row chunks, each reading the whole head
    again; `chunk_mem_const` is set so a chunk holds about `rows_per_chunk` rows (a [rows, vocab] buffer)."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    weight, bias = head.weight, head.bias
    if dtype is not None:  # the autocast dtype: the same bf16/fp16 head the padded path runs under autocast
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    n, width = hidden.shape
    chunks = max(1, math.ceil(n / rows_per_chunk))
    const = max(1, weight.shape[0] // (width * chunks))
    loss = liger_fused_linear_cross_entropy(hidden.contiguous(), weight, targets, bias=bias, reduction="none",
                                            chunk_mem_const=const)
    return -loss.float()


def packed_inputs(batch: list[dict], pad: int) -> tuple[torch.Tensor, ...]:
    """(input ids [R, L], position ids [R, L], the flat packed index of each trained input position, its
    target token, its flat index in the [B, K] layout, K) for one micro-batch; row R's tail after its last sequence is
    one more block of padding (its own positions from 0: no real token attends to it, and it attends only
    to itself, so no attention row is empty)."""
    inputs = [s["ids"][:-1] for s in batch]  # position j predicts token j + 1
    lengths = [len(x) for x in inputs]
    row_len, width = max(lengths), max(lengths)
    rows = rows_of(lengths, row_len)
    ids = torch.full((len(rows), row_len), pad, dtype=torch.long)
    pos = torch.zeros((len(rows), row_len), dtype=torch.long)
    src, tgt, dst = [], [], []
    for r, members in enumerate(rows):
        offset = 0
        for i in members:
            n = lengths[i]
            ids[r, offset:offset + n] = torch.tensor(inputs[i])
            pos[r, offset:offset + n] = torch.arange(n)
            trained = [j for j in range(n) if batch[i]["mask"][j + 1]]
            src += [r * row_len + offset + j for j in trained]
            tgt += [batch[i]["ids"][j + 1] for j in trained]
            dst += [i * width + j for j in trained]
            offset += n
        pos[r, offset:] = torch.arange(row_len - offset)
    as_long = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return ids, pos, as_long(src), as_long(tgt), as_long(dst), width


def packed_logprobs(backbone: Any, head: Any, batch: list[dict], *, device: torch.device, autocast: Any,
                    dtype: torch.dtype | None, pad: int, fused: bool) -> tuple[torch.Tensor, ...]:
    """(new_logprobs, old_logprobs, mask), each [B, K]: column j is the sequence's token j + 1."""
    ids, pos, src, targets, dst, width = packed_inputs(batch, pad)
    with autocast():
        hidden = backbone(input_ids=ids.to(device), position_ids=pos.to(device), use_cache=False).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, src.to(device))
    targets = targets.to(device)
    if not len(targets):
        lp = hidden.sum(-1) * 0.0  # keeps the graph: a micro-batch without trained tokens backpropagates zeros
    elif fused:
        lp = fused_logprobs(head, hidden, targets, dtype)
    else:
        lp = chunked_logprobs(head, hidden[None], targets[None], autocast)[0]
    b = len(batch)
    flat = torch.zeros(b * width, device=device, dtype=lp.dtype).index_copy(0, dst.to(device), lp)
    old = torch.full((b, width), float("nan"))
    mask = torch.zeros(b, width)
    for i, s in enumerate(batch):
        n = len(s["ids"]) - 1
        old[i, :n] = torch.tensor(s["old"][1:], dtype=torch.float)
        mask[i, :n] = torch.tensor(s["mask"][1:], dtype=torch.float)
    return flat.view(b, width), old.to(device), mask.to(device)


def packing_works(backbone: Any) -> bool:
    """Whether this backbone and attention implementation read packed `position_ids` as separate sequences:
    two short sequences packed in one row must give each one's hidden states alone. transformers does it for
    sdpa and eager through its masks (and flash-attention through cu_seqlens); a kernel that ignored it
    would let the second sequence attend to the first, so the trainer keeps the padded path then."""
    param = next(backbone.parameters())
    a, b = torch.arange(3, 9, device=param.device), torch.arange(11, 16, device=param.device)
    training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            pos = torch.cat([torch.arange(len(a)), torch.arange(len(b))]).to(param.device)
            packed = backbone(input_ids=torch.cat([a, b])[None], position_ids=pos[None],
                              use_cache=False).last_hidden_state[0].float()
            alone = torch.cat([backbone(input_ids=x[None], use_cache=False).last_hidden_state[0]
                               for x in (a, b)]).float()
    except Exception as e:  # noqa: BLE001
        log.warning("packed sequences cannot run here (%s): the update keeps padded micro-batches", e)
        return False
    finally:
        backbone.train(training)
    # Per position, the relative distance of the two hidden states: a leak across sequences moves them
    # wholesale (0.94 on a CPU, 1.41 on an H100 for the Qwen2.5-3B shape), while an attention kernel that
    # differs between a masked and an unmasked call leaves bf16 noise (0.020 over that shape's 36 layers on
    # an H100, where an elementwise 1% test refused packing: bench/checks/probe_split.py).
    ok = bool((((packed - alone).norm(dim=-1) / alone.norm(dim=-1).clamp(min=1e-6)).max() < 0.1).item())
    if not ok:
        log.warning("this attention implementation ignores packed position_ids: the update keeps padded micro-batches")
    return ok


def padding_of(batch: list[dict]) -> int:
    """Padding tokens of a packed micro-batch: the tails of its rows."""
    return padded_size(batch) - sum(len(s["ids"]) - 1 for s in batch)
