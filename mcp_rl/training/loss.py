"""The GRPO / Dr. GRPO loss and the log-probabilities it needs: pure torch, no model, no I/O.

    new = chunked_logprobs(lm_head, hidden, targets, autocast)    # [B, K], the LM head in chunks
    loss = grpo_loss(new, old, advantages, mask, kind="dr_grpo", constant=max_seq_len * B)
    gap, clipped, tokens = off_policy_stats(new, old, mask)          # how far the sampler was off-policy

Written by hand (mcp_rl/training/portable.py says why: TRL's and ART's losses live inside their trainers); the
trainer (`PortableTrainer`) batches sequences, calls these, and updates LoRA weights.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.checkpoint

LOSSES = ("dr_grpo", "grpo")


def grpo_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, kind: str = "dr_grpo", epsilon: float = 0.2,
              constant: float | None = None) -> torch.Tensor:
    """PPO-clipped GRPO loss over [B, T] token log-probabilities.

    `old_logprobs` are the sampler's (NaN/inf where unknown: treated as on-policy, ratio 1,
    as ART does); `advantages` is [B] or [B, T]; `mask` marks trained tokens.
    kind="dr_grpo": token losses summed and divided by `constant` (default B*T; the
    trainer passes max_seq_len * sequences-in-step), no length normalisation.
    kind="grpo": mean over each sequence's tokens, summed over sequences and divided
    by `constant` (default B). With one update per batch the ratio is 1 and the clip
    is inactive, so this is the plain policy gradient. A token whose log-ratio is past
    +-20 gets no gradient.
    """
    if kind not in LOSSES:
        raise ValueError(f"loss kind must be one of {LOSSES}, got {kind!r}")
    mask = mask.to(new_logprobs.dtype)
    old = torch.where(torch.isfinite(old_logprobs), old_logprobs, new_logprobs.detach())
    adv = advantages.to(new_logprobs.dtype)
    if adv.dim() == new_logprobs.dim() - 1:
        adv = adv.unsqueeze(-1)
    # The log-ratio clamped to +-20 before exp, as verl does: past about 88 nats exp overflows float32,
    # and the clipped branch's zero gradient times an infinite ratio is NaN in backward while the loss
    # stays finite. Gemma's NaN steps (bench/RESULTS.md section 12) more likely came from padding rows
    # left empty by its sliding window (train.py passes no attention mask since); this stays as a guard.
    ratio = torch.exp((new_logprobs - old).clamp(-20.0, 20.0))
    token_loss = -torch.min(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon) * adv) * mask
    if kind == "dr_grpo":
        return token_loss.sum() / (constant if constant is not None else new_logprobs.numel())
    per_seq = token_loss.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / (constant if constant is not None else new_logprobs.shape[0])


def off_policy_stats(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor, *,
                     epsilon: float = 0.2) -> tuple[float, float, float]:
    """(sum |new - old|, tokens with the ratio outside 1 +- epsilon, tokens) over masked tokens with known old.

    Before the update of a one-update-per-batch step the trainer's logprobs should equal the sampler's:
    a gap means the sampler is off-policy (a stale adapter, or kernels or precision that differ).
    The trainer logs the mean gap (`logprob_gap`) and the clipped share (`clip_fraction`).

    >>> off_policy_stats(torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.0, -2.5, float("nan")]]),
    ...                  torch.tensor([[1.0, 1.0, 1.0]]))
    (0.5, 1.0, 2.0)
    """
    known = torch.isfinite(old_logprobs) & (mask > 0)
    diff = (new_logprobs.detach().float() - torch.where(known, old_logprobs, 0.0).float())[known]
    clipped = (diff.exp() - 1).abs() > epsilon
    return float(diff.abs().sum()), float(clipped.sum()), float(known.sum())


def backbone_and_head(model: Any) -> tuple[Any, Any] | None:
    """(decoder, lm_head) of a causal LM whose logits are just lm_head(hidden), else None.

    Models that scale or soft-cap their logits keep the full forward. Each names it differently
    (Gemma 2's final_logit_softcapping, Cohere's logit_scale, Granite's logits_scaling, Falcon-H1's
    lm_head_multiplier, ...), so a four-token probe compares the two paths instead of a list of keys."""
    backbone, head = getattr(model, "model", None), model.get_output_embeddings()
    if backbone is None or not isinstance(head, torch.nn.Linear):
        return None
    ids = torch.arange(1, 5, device=head.weight.device)[None]
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits.float()
            split = head(backbone(input_ids=ids, use_cache=False).last_hidden_state).float()
    except Exception:  # noqa: BLE001  (a backbone that cannot run alone: the full forward is always right)
        return None
    finally:
        model.train(training)
    return (backbone, head) if torch.allclose(full, split, rtol=1e-3, atol=1e-3) else None


def chunked_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, autocast: Any,
                      chunk: int = 1024) -> torch.Tensor:
    """log p(target) from the hidden states, `chunk` positions at a time.

    The full [B, K, vocab] float32 logits (and their gradient) would dominate the step's memory
    for a 150k vocabulary (bench/RESULTS.md): each chunk's logits are recomputed in the backward
    pass instead of kept (activation checkpointing), as TRL's and Liger's fused heads do."""
    def piece(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        with autocast():
            logits = head(h).float()
        return torch.gather(logits, -1, t.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)

    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    parts = []
    for i in range(0, flat_t.shape[0], chunk):
        h, t = flat_h[i:i + chunk], flat_t[i:i + chunk]
        grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
        parts.append(torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False) if grad else piece(h, t))
    return torch.cat(parts).reshape(targets.shape)
