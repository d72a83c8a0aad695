"""The supervised warm start of `PortableTrainer` (mixed into it; see train.py for the GRPO update).

    trainer.warm_start(demonstrations, epochs=2)   # SFT on verified demonstrations, before RL
    trainer.sft_nll(demonstrations)                # mean NLL per assistant token, no update

Demonstrations are ART trajectories whose assistant Choices carry `token_id:<id>` logprobs
(`DemonstrationPolicy` builds them); ART's `tokenize_trajectory` turns them into the same
tokens and assistant masks the GRPO update trains on. The loss is the mean negative
log-likelihood of the assistant tokens, with its own AdamW (SFT moments never reach RL steps).
"""

from __future__ import annotations

import random
import time
from typing import Iterable

import art
import torch
from art.preprocessing.tokenize import tokenize_trajectory
from art.trajectories import History
from tqdm.auto import tqdm

from mcp_rl.scale import distributed
from mcp_rl.policies.chat_templates import art_tokenizing


class WarmStart:
    """Supervised passes for `PortableTrainer` (uses its `_logprobs`, `_micro_batches`, `_update`)."""

    def _sft_sequences(self, trajectories: Iterable[art.Trajectory]) -> list[dict]:
        seqs = []
        for t in trajectories:
            for history in [History(messages_and_choices=t.messages_and_choices, tools=t.tools), *t.additional_histories]:
                with art_tokenizing():
                    result = tokenize_trajectory(self.tokenizer, history, 1.0, False)
                if result:
                    seqs.append(self._sequence(result))
        if not seqs:
            raise ValueError("no demonstration has an assistant Choice with token logprobs to imitate "
                             "(build them with DemonstrationPolicy, whose Choices carry token_id:<id> logprobs)")
        return self._keep_fitting(seqs)[0]

    def sft_nll(self, trajectories: Iterable[art.Trajectory]) -> float:
        """Mean negative log-likelihood per assistant token (no update)."""
        seqs, total, count = self._sft_sequences(trajectories), 0.0, 0.0
        with torch.no_grad():
            for batch in self._micro_batches(seqs):
                new, _, mask = self._logprobs(batch)
                total += float(-(new * mask).sum())
                count += float(mask.sum())
        return total / max(count, 1.0)

    def sft_step(self, trajectories: Iterable[art.Trajectory], *, learning_rate: float = 2e-4) -> dict[str, float]:
        """One supervised update: mean NLL over all assistant tokens of the demonstrations."""
        start = time.perf_counter()
        if self._sft_optimizer is None:  # its own optimizer: SFT moments should not leak into RL steps
            self._sft_optimizer = torch.optim.AdamW(self.params, lr=learning_rate, betas=(0.9, 0.99))
        for group in self._sft_optimizer.param_groups:
            group["lr"] = learning_rate
        with self._lock:
            seqs = self._sft_sequences(trajectories)
            n_tokens = sum(sum(s["mask"]) for s in seqs)
            was_training, nll = self.model.training, 0.0
            self.model.train()
            try:
                for batch in self._micro_batches(distributed.shard(self._by_length(seqs))):  # as in train_step
                    new, _, mask = self._logprobs(batch)
                    loss = -(new * mask).sum() / n_tokens
                    self._backward(loss)
                    nll += float(loss.detach())
                distributed.all_reduce_grads(self.params)
                nll = distributed.total(nll)
                grad_norm = self._update(self._sft_optimizer)
            finally:
                self.model.train(was_training)
            self.sft_steps += 1
        return {"nll": nll, "num_sequences": float(len(seqs)), "num_tokens": float(n_tokens),
                "grad_norm": grad_norm, "seconds": time.perf_counter() - start}

    def warm_start(self, trajectories: list[art.Trajectory], epochs: int = 1, *, learning_rate: float = 2e-4,
                   batch_size: int = 8, seed: int = 0) -> dict[str, float]:
        """Supervised passes over demonstrations before RL (teaches the tool-call format).

        Does not advance `step` (that counts RL updates); counted in `sft_steps`."""
        trajectories = list(trajectories)
        if not trajectories or epochs < 1 or batch_size < 1:
            raise ValueError("warm_start needs at least one demonstration, epochs >= 1 and batch_size >= 1")
        start, rng, history = time.perf_counter(), random.Random(seed), []
        for epoch in range(epochs):
            order = trajectories[:]
            rng.shuffle(order)
            nlls = []
            bar = tqdm(range(0, len(order), batch_size), desc=f"warm start {epoch + 1}/{epochs}", leave=True)
            for i in bar:
                nlls.append(self.sft_step(order[i:i + batch_size], learning_rate=learning_rate)["nll"])
                bar.set_postfix(nll=f"{nlls[-1]:.3f}")
            history.append(sum(nlls) / len(nlls))
            print(f"warm start epoch {epoch + 1}/{epochs} | nll {history[-1]:.3f}", flush=True)
        return {"epochs": float(epochs), "steps": float(self.sft_steps), "nll_first_epoch": history[0],
                "nll_last_epoch": history[-1], "num_trajectories": float(len(trajectories)),
                "seconds": time.perf_counter() - start}
