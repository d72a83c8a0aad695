"""Portable GRPO / Dr. GRPO LoRA trainer and supervised warm start (CPU or any CUDA GPU, no vLLM).

    trainer = PortableTrainer(policy, learning_rate=5e-5)   # wraps policy.model with LoRA in place
    trainer.warm_start(demonstrations, epochs=2)            # optional SFT on verified demonstrations
    metrics = await trainer.train(groups)                    # one optimizer step per batch of groups
    trainer.save("runs/demo/checkpoints/0003")               # atomic: adapter + optimizer + step

This file is the GRPO update; the warm start is in sft.py, checkpoints in checkpoint.py (both
mixed into PortableTrainer), the loss in loss.py.
What is written by hand here, and why: the update loop, and the GRPO loss it calls (loss.py). TRL's
GRPOTrainer owns its own generation loop (prompt -> completions), so it cannot
take our multi-turn MCP trajectories with tool messages in between; ART 0.4.11's
loss lives inside its Unsloth/TRL trainer service and needs a CUDA GPU + vLLM.
What is reused: ART's `tokenize_trajectory_groups` / `tokenize_trajectory` (so both
backends train on the same tokens, masks, old logprobs and advantages), peft for
LoRA, torch for AdamW, autocast, dynamic loss scaling (GradScaler) and gradient clipping.

Precision: "auto" is bf16 autocast on GPUs that have it, float16 autocast with dynamic
loss scaling on those that do not (a T4), fp32 on a CPU. LoRA weights stay float32 (peft's
default), so the scaler can unscale their gradients; a step whose gradients overflow is
skipped by the scaler and counted in `skipped_steps`. So is a bf16 or fp32 step whose gradient
norm is not finite: applying it would turn the LoRA weights into NaN and every later sample with
them (seen with Gemma 3 270M in bf16 on the H200, bench/RESULTS.md section 12).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import threading
import time
from typing import Any

import art
import torch
from art.preprocessing.tokenize import tokenize_trajectory_groups

from mcp_rl.scale import distributed
from mcp_rl.policies.chat_templates import art_tokenizer, art_tokenizing
from mcp_rl.training.checkpoint import Checkpoints
from mcp_rl.training import kernels, packing
from mcp_rl.training.loss import LOSSES, backbone_and_head, chunked_logprobs, grpo_loss, off_policy_stats
from mcp_rl.training.sft import WarmStart

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' -> 'bf16' on a CUDA GPU with bfloat16, 'fp16' on one without (a T4), 'fp32' on a CPU."""
    if precision != "auto":
        return precision
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"


@contextlib.contextmanager
def gpu_peaks(device: torch.device):
    """Yields a dict that gets, on a CUDA device, the peak GPU memory (GiB) since the last update (this
    step's rollouts, evaluations, the warm start) and the update's own: which phase limits how many runs
    share a card (bench/RESULTS.md section 14). It resets the peak before and after the update, so the
    process-wide peak is the largest of these."""
    peaks: dict[str, float] = {}
    cuda = device.type == "cuda"
    if cuda:
        peaks["gpu_peak_gib_before_update"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield peaks
    finally:
        if cuda:
            peaks["gpu_peak_gib_update"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)


class PortableTrainer(WarmStart, Checkpoints):
    """LoRA GRPO trainer on `policy.model` (anything with `.model`, `.tokenizer`, `.step`).

    The model is wrapped with peft LoRA in place (`policy.model` becomes the PeftModel)
    so the policy always samples the newest weights; `policy.step` follows `self.step`.
    All sequences of one `train_step` make one optimizer step, in micro-batches. ART's
    per-trajectory `weight` (1/tokens) is not used: Dr. GRPO's point is no length normalisation.
    """

    def __init__(self, policy: Any, *, learning_rate: float = 5e-5, lora_r: int = 8, lora_alpha: int = 16,
                 lora_dropout: float = 0.0, target_modules: str | list[str] = "all-linear",
                 loss: str = "dr_grpo", micro_batch_size: int = 4, max_seq_len: int = 2048,
                 max_grad_norm: float = 1.0, precision: str = "auto", epsilon: float = 0.2,
                 weight_decay: float = 0.0, gradient_checkpointing: bool = False, micro_batch_tokens: int = 0,
                 packed: bool = False, lora_no_upcast: bool = False, lora_fused_add: bool = False,
                 liger_kernels: bool = False):
        import peft

        for attr in ("model", "tokenizer"):
            if getattr(policy, attr, None) is None:
                raise TypeError(f"PortableTrainer needs a policy with .{attr} (e.g. a LocalPolicy); "
                                f"got {type(policy).__name__} without it")
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if micro_batch_size < 1 or max_seq_len < 2 or not learning_rate > 0:
            raise ValueError("micro_batch_size >= 1, max_seq_len >= 2 and learning_rate > 0 are required")
        self.policy, self.loss, self.epsilon = policy, loss, epsilon
        self.learning_rate, self.micro_batch_size, self.max_seq_len = learning_rate, micro_batch_size, max_seq_len
        # > 0: micro-batches hold as many (length-sorted) sequences as fit this many padded tokens, so short
        # sequences go in fewer, fuller passes; the loss is a sum with a fixed normaliser, so the update is
        # the same either way (up to float rounding).
        self.micro_batch_tokens = max(0, int(micro_batch_tokens))
        self.max_grad_norm = max_grad_norm
        self.tokenizer = art_tokenizer(policy.tokenizer)
        model = policy.model
        if not isinstance(model, peft.PeftModel):
            model = peft.get_peft_model(model, peft.LoraConfig(
                r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                target_modules=target_modules, task_type="CAUSAL_LM"))
            policy.model = model
        # Sampling is the resting state: get_peft_model returns a model in train mode, and with gradient
        # checkpointing a train-mode forward drops the KV cache, which breaks the decode loop.
        model.eval()
        self.model = model
        if gradient_checkpointing:  # transformers 5.2x renamed it, and warns at the old name
            base = model.get_base_model()
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.device = next(model.parameters()).device
        self.precision = resolve_precision(precision, self.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.scaler = None
        if self.precision == "fp16":
            for p in self.params:  # the scaler cannot unscale float16 gradients: train float32 LoRA weights
                p.data = p.data.float()
            self.scaler = torch.amp.GradScaler(self.device.type)
        self.skipped_steps = 0
        self.optimizer = torch.optim.AdamW(self.params, lr=learning_rate, betas=(0.9, 0.99), weight_decay=weight_decay)
        self._sft_optimizer: torch.optim.Optimizer | None = None
        self.step = int(getattr(policy, "step", 0) or 0)
        self.sft_steps = 0
        self._lock = threading.Lock()  # one update at a time, also across `train` threads
        self._keep_logits = "logits_to_keep" in inspect.signature(model.get_base_model().forward).parameters
        # Speed levers (kernels.py): during the update LoRA inputs left in the autocast dtype, LoRA's scaled add
        # inside its product; Liger's kernels in the model (CUDA only: an error elsewhere; `liger` lists them).
        self.lora_no_upcast, self.lora_fused_add = bool(lora_no_upcast), bool(lora_fused_add)
        self.liger = kernels.apply_liger(model) if liger_kernels else []
        self._split = backbone_and_head(model.get_base_model())
        self.packed = packed

    @property
    def packed(self) -> bool:
        """Packed micro-batches (mcp_rl/training/packing.py): sequences end to end, `micro_batch_tokens` bounds the packed
        rows, the LM head only on trained positions (Liger's fused kernel on CUDA). Needs a model whose logits are
        its head's (`_split`) and an attention that reads packed position_ids; otherwise the padded path stays."""
        return self._packed

    @packed.setter
    def packed(self, on: bool) -> None:
        self._packed = bool(on) and self._split is not None and packing.packing_works(self._split[0])
        self._fused = self._packed and packing.fused_available(self.device)

    # ---- forward pass -------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def levers(self) -> contextlib.AbstractContextManager:
        """The update's forward/backward passes run inside this (kernels.update_levers: only under autocast)."""
        return kernels.update_levers(self.model, autocast=self.precision in ("bf16", "fp16"),
                                     no_upcast=self.lora_no_upcast, fused_add=self.lora_fused_add)

    def _backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def _logprobs(self, seqs: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of each sequence's tokens from the first trained one on.

        Returns (new_logprobs, old_logprobs, mask), each [B, K]; right padding."""
        if self.packed:
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)
            return packing.packed_logprobs(*self._split, seqs, device=self.device, autocast=self._autocast, dtype=dtype,
                                           pad=self.tokenizer.pad_token_id or 0, fused=self._fused)
        length = max(len(s["ids"]) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(seqs), length), pad, dtype=torch.long)
        mask = torch.zeros(len(seqs), length)
        old = torch.full((len(seqs), length), float("nan"))
        for i, s in enumerate(seqs):
            n = len(s["ids"])
            ids[i, :n] = torch.tensor(s["ids"])
            mask[i, :n], old[i, :n] = torch.tensor(s["mask"], dtype=torch.float), torch.tensor(s["old"])
        # Logits only from the first trained position on: prompts (tool schemas) are long.
        first = max(1, min(s["mask"].index(1) for s in seqs))
        keep = length - first
        ids = ids.to(self.device)
        targets = ids[:, first:]
        # No attention mask, on purpose: padding sits after every real token, so causal attention
        # already keeps it out of their logits (unchanged), and the loss masks its own positions. A
        # padding mask would leave a sliding-window layer's padding rows past the window (Gemma 3:
        # 512) with no key at all, and CUDA attention kernels can give such rows NaN gradients under a
        # finite loss: the likely cause (unconfirmed on a GPU) of Gemma 3 270M's NaN steps on the H200
        # (bench/RESULTS.md section 12).
        if self._split is not None:
            backbone, head = self._split
            with self._autocast():
                hidden = backbone(input_ids=ids[:, :-1],
                                  use_cache=False).last_hidden_state[:, -keep:]  # no KV cache to train
            new = chunked_logprobs(head, hidden, targets, self._autocast)
            return new, old[:, first:].to(self.device), mask[:, first:].to(self.device)
        kwargs = {"logits_to_keep": keep} if self._keep_logits else {}
        with self._autocast():
            logits = self.model(input_ids=ids[:, :-1], use_cache=False, **kwargs).logits
        logits = logits[:, -keep:].float()
        new = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        return new, old[:, first:].to(self.device), mask[:, first:].to(self.device)

    @staticmethod
    def _by_length(seqs: list[dict]) -> list[dict]:
        # ART shuffles each group with the unseeded `random`: ties broken by content, so every rank
        # sorts the same sequences into the same order before taking its share.
        return sorted(seqs, key=lambda s: (len(s["ids"]), s["ids"], s["mask"], s["adv"]))

    def _micro_batches(self, seqs: list[dict]) -> list[list[dict]]:
        seqs = self._by_length(seqs)  # similar lengths together: less padding
        if self.packed and self.micro_batch_tokens:
            return packing.token_batches(seqs, self.micro_batch_tokens)
        if not self.micro_batch_tokens:
            return [seqs[i:i + self.micro_batch_size] for i in range(0, len(seqs), self.micro_batch_size)]
        batches: list[list[dict]] = [[]]
        for s in seqs:  # sorted ascending: the newest sequence is its batch's longest
            if batches[-1] and (len(batches[-1]) + 1) * len(s["ids"]) > self.micro_batch_tokens:
                batches.append([])
            batches[-1].append(s)
        return batches

    def _sequence(self, result: Any) -> dict:
        return {"ids": list(result.token_ids), "mask": list(result.assistant_mask),
                "old": [float(x) for x in result.logprobs], "adv": float(result.advantage)}

    def _keep_fitting(self, seqs: list[dict]) -> tuple[list[dict], int]:
        # Truncating would cut assistant turns mid-way and break the masks: skip instead.
        kept = [s for s in seqs if len(s["ids"]) <= self.max_seq_len and 1 in s["mask"]]
        too_long = sum(len(s["ids"]) > self.max_seq_len for s in seqs)
        if too_long:
            log.warning("skipped %d of %d sequences longer than max_seq_len=%d", too_long, len(seqs), self.max_seq_len)
        return kept, too_long

    def _grads_finite(self) -> bool:
        grads = [p.grad for p in self.params if p.grad is not None]
        return not grads or bool(torch.stack([g.isfinite().all() for g in grads]).all())  # one host sync

    def _update(self, optimizer: torch.optim.Optimizer, where: str = "") -> float:
        if self.scaler is None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            if torch.isfinite(grad_norm):
                optimizer.step()
            else:  # weights and AdamW state stay as they were
                self.skipped_steps += 1
                log.warning("gradient norm is %s: update skipped, weights unchanged%s", float(grad_norm), where)
        else:  # unscale first so clipping sees true gradients; the scaler skips a step with inf/NaN
            self.scaler.scale(torch.zeros((), device=self.device))  # its lazy start: a rank without sequences
            self.scaler.unscale_(optimizer)                         # never scaled a loss (found by review)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            if self.scaler.get_scale() < scale:
                self.skipped_steps += 1
                log.warning("float16 gradients overflowed: step skipped, loss scale %.0f -> %.0f",
                            scale, self.scaler.get_scale())
        optimizer.zero_grad(set_to_none=True)
        return float(grad_norm)

    # ---- GRPO ---------------------------------------------------------------------
    def train_step(self, groups: list[art.TrajectoryGroup]) -> dict[str, float]:
        """One GRPO update on a batch of trajectory groups (each group: rollouts of one scenario)."""
        start = time.perf_counter()
        groups = list(groups)
        kept, zero_var = [], 0
        for i, group in enumerate(groups):
            if not isinstance(group, art.TrajectoryGroup):
                raise TypeError(f"train_step takes art.TrajectoryGroup objects; item {i} is {type(group).__name__}")
            rewards = [t.reward for t in group.trajectories]
            if not all(isinstance(r, (int, float)) and math.isfinite(r) for r in rewards):
                raise ValueError(f"group {i} has a non-finite or non-numeric reward {rewards}; score it first")
            if len(rewards) < 2 or max(rewards) == min(rewards):
                zero_var += 1
            else:
                kept.append(group)
        if zero_var:
            log.info("skipped %d of %d groups with zero reward variance (no advantage to learn from)",
                     zero_var, len(groups))
        with self._lock, gpu_peaks(self.device) as peaks:
            t_tok = time.perf_counter()
            with art_tokenizing():
                results = list(tokenize_trajectory_groups(self.tokenizer, kept, allow_training_without_logprobs=False,
                                                          scale_rewards=(self.loss == "grpo")))
            t_tok = time.perf_counter() - t_tok  # CPU time outside the GPU's forward/backward (issue [speed])
            seqs, too_long = self._keep_fitting([self._sequence(r) for r in results])
            metrics = {"loss": 0.0, "num_sequences": float(len(seqs)), "num_tokens": 0.0, "grad_norm": 0.0,
                       "skipped_groups": float(zero_var), "skipped_too_long": float(too_long), "updated": 0.0,
                       # the step's longest sequence and widest micro-batch (its longest minus its shortest):
                       # what sets the update's peak memory, and how far padding ran past a sequence's end
                       "max_seq_tokens": float(max((len(s["ids"]) for s in seqs), default=0)), "max_padding": 0.0,
                       "tokenize_seconds": t_tok}
            gap = [0.0, 0.0, 0.0]  # off_policy_stats summed over micro-batches (and ranks)
            if seqs:
                constant = self.max_seq_len * len(seqs) if self.loss == "dr_grpo" else len(seqs)
                was_training = self.model.training
                self.model.train()
                levers = contextlib.ExitStack()
                try:
                    levers.enter_context(self.levers())
                    # Under torch.distributed every rank holds the whole step (mcp_rl/scale/distributed.py):
                    # each backpropagates its share, normalised by the whole step's `constant`.
                    where = ""  # the first micro-batch whose gradient was not finite, for the warning
                    batches = self._micro_batches(distributed.shard(self._by_length(seqs)))
                    for k, batch in enumerate(batches):
                        new, old, mask = self._logprobs(batch)
                        adv = torch.tensor([s["adv"] for s in batch], device=self.device)
                        loss = grpo_loss(new, old, adv, mask, kind=self.loss, epsilon=self.epsilon, constant=constant)
                        self._backward(loss)
                        if self.scaler is None and not where and not self._grads_finite():
                            lengths, known = [len(s["ids"]) for s in batch], torch.isfinite(old) & (mask > 0)
                            far = float((new.detach() - old)[known].abs().max()) if bool(known.any()) else 0.0
                            where = (f" (first in micro-batch {k + 1} of {len(batches)}: {len(batch)} sequences of "
                                     f"{min(lengths)}-{max(lengths)} tokens, loss {float(loss.detach()):.4g}, "
                                     f"largest |trainer - sampler| logprob {far:.3g})")
                        metrics["loss"] += float(loss.detach())
                        metrics["num_tokens"] += sum(len(s["ids"]) for s in batch)
                        metrics["max_padding"] = max(metrics["max_padding"], float(
                            packing.padding_of(batch) if self.packed else
                            max(len(s["ids"]) for s in batch) - min(len(s["ids"]) for s in batch)))
                        gap = [a + b for a, b in zip(gap, off_policy_stats(new, old, mask, epsilon=self.epsilon))]
                    distributed.all_reduce_grads(self.params)
                    metrics["loss"], metrics["num_tokens"], *gap = distributed.total(
                        [metrics["loss"], metrics["num_tokens"], *gap])
                    if gap[2]:
                        metrics["logprob_gap"], metrics["clip_fraction"] = gap[0] / gap[2], gap[1] / gap[2]
                    metrics["grad_norm"] = self._update(self.optimizer, where)
                finally:
                    levers.close()
                    self.model.train(was_training)
                self.step += 1
                self.policy.step = self.step
                metrics["updated"] = 1.0
        seconds = time.perf_counter() - start
        metrics.update(peaks)
        if peaks and distributed.active():  # each GPU's own peak, rank by rank: what one GPU must hold
            metrics["gpu_peak_gib_by_rank"] = distributed.unshard([max(peaks.values())], "GPU memory peaks")
        metrics.update(step=float(self.step), skipped_steps=float(self.skipped_steps), seconds=seconds, tokens_per_s=metrics["num_tokens"] / max(seconds, 1e-9))
        return metrics

    async def start(self) -> None:
        """Nothing to start: the model is loaded and LoRA-wrapped in `__init__` (mcp_rl.runs.parts.Trainer)."""

    async def train(self, groups: list[art.TrajectoryGroup]) -> dict[str, float]:
        """`train_step` in a worker thread, so the event loop (MCP sessions, servers) keeps running."""
        return await asyncio.to_thread(self.train_step, groups)
