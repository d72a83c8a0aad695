"""Checkpoints of `PortableTrainer` (mixed into it): atomic save, load, and a merged export.

    trainer.save("runs/x/checkpoints/step-0003")    # adapter/ + optimizer.pt + trainer_state.json
    trainer.load("runs/x/checkpoints/step-0003")    # LoRA weights, optimizer, step, loss scale
    trainer.merge_and_save("runs/x/merged")         # a plain Hugging Face model + tokenizer

Every folder is written beside its target and renamed into place (`_atomic_dir`), so a crash
mid-write leaves the previous checkpoint as it was.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch

STATE_FILE = "trainer_state.json"
_FORMAT = 1


@contextlib.contextmanager
def _atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `target` by rename.

    A crash leaves `target` as it was (plus a `<name>.tmp-XXXX` folder that no loader reads)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        old = None
        if target.exists():  # a directory cannot be renamed onto a non-empty one: move it aside first
            old = Path(tempfile.mkdtemp(prefix=f"{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class Checkpoints:
    """save / load / merge_and_save for `PortableTrainer`."""

    def save(self, directory: str | os.PathLike) -> Path:
        """Write adapter/ (peft), optimizer.pt and trainer_state.json atomically to `directory`."""
        target = Path(directory)
        with self._lock, _atomic_dir(target) as tmp:
            self.model.save_pretrained(tmp / "adapter")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / STATE_FILE).write_text(json.dumps({
                "format": _FORMAT, "step": self.step, "sft_steps": self.sft_steps, "loss": self.loss,
                "precision": self.precision, "skipped_steps": self.skipped_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "learning_rate": self.learning_rate, "max_seq_len": self.max_seq_len}, indent=2))
        return target

    def load(self, directory: str | os.PathLike) -> dict:
        """Restore LoRA weights, optimizer state and step from a `save`d folder."""
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        path = Path(directory)
        if not (path / STATE_FILE).is_file() or not (path / "adapter").is_dir():
            raise FileNotFoundError(f"{path} is not a PortableTrainer checkpoint (no {STATE_FILE} or adapter/); "
                                    "pass a folder written by trainer.save()")
        state = json.loads((path / STATE_FILE).read_text())
        weights = load_peft_weights(str(path / "adapter"), device=str(self.device))
        try:
            result = set_peft_model_state_dict(self.model, weights)
        except RuntimeError as e:  # shape mismatch: another rank or model
            raise ValueError(f"checkpoint {path} does not fit this model's LoRA (different rank/model?): {e}") from e
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"checkpoint {path} has weights this model lacks: {result.unexpected_keys[:3]}...")
        if (path / "optimizer.pt").is_file():
            self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=self.device))
            for group in self.optimizer.param_groups:  # the saved groups carry the old lr: this trainer's counts
                group["lr"] = self.learning_rate
        self.step, self.sft_steps = int(state["step"]), int(state.get("sft_steps", 0))
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])  # resume with the loss scale the run had reached
        self.policy.step = self.step
        return state

    def merge_and_save(self, directory: str | os.PathLike) -> Path:
        """Export a merged Hugging Face model (+ tokenizer) for serving (vLLM, llama.cpp convert...).

        Merges a copy (the live model keeps its adapter), so it needs the model's memory twice."""
        from transformers import AutoModelForCausalLM

        with self._lock:
            merged = copy.deepcopy(self.model).merge_and_unload()
        if getattr(merged, "hf_quantizer", None) is not None:
            # A GGUF-loaded model refuses save_pretrained; its weights are plain dequantized tensors.
            clean = AutoModelForCausalLM.from_config(merged.config)
            clean.load_state_dict(merged.state_dict())
            merged = clean
        with _atomic_dir(Path(directory)) as tmp:
            merged.save_pretrained(tmp)
            self.tokenizer.tokenizer.save_pretrained(tmp)
        return Path(directory)
