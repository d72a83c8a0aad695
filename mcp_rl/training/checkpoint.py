"""Checkpoints of `PortableTrainer` (mixed into it): atomic save, load, and a merged export.

    trainer.save("runs/x/checkpoints/step-0003")    # adapter/ + optimizer.pt + trainer_state.json
    trainer.load("runs/x/checkpoints/step-0003")    # LoRA weights, optimizer, step, loss scale
                                                    # (after its manifest's sha256 check, mcp_rl.training.manifest)
    trainer.merge_and_save("runs/x/merged")         # a plain Hugging Face model + tokenizer

Every folder is written beside its target and renamed into place (`atomic_dir`), so a crash
mid-write leaves the previous checkpoint as it was; its files reach the disk (fsync) before the rename,
and `manifest.json` records their sizes and sha256, checked by `load` and by export/serve.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

from mcp_rl.training.manifest import MANIFEST, CheckpointCorrupt, check_safetensors, verify_manifest, write_manifest

STATE_FILE = "trainer_state.json"
_FORMAT = 2  # 2: every save writes manifest.json, so a format-2 checkpoint without one is damaged


@contextlib.contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder; on success it replaces `target` by rename.

    A crash leaves `target` as it was (plus a `<name>.tmp-XXXX` folder that no loader reads)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        for f in tmp.rglob("*"):  # on disk before the rename: a crash must not leave zeroed files in place
            if f.is_file():
                with open(f, "rb") as handle:
                    os.fsync(handle.fileno())
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


# What a merged export writes (save_pretrained + the tokenizer): a folder holding only these may be
# replaced by a new export; anything else in it is the user's, and an export refuses to delete it.
_EXPORT_FILES = ("config.json", "generation_config.json", "chat_template.jinja", "special_tokens_map.json",
                 "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                 "added_tokens.json", "model.safetensors.index.json")


def check_export_target(target: Path) -> None:
    """Refuse to replace a folder that holds anything a merged export would not have written."""
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"{target} is a file; merged models go into a folder")
    other = [p.name for p in target.iterdir() if p.name not in _EXPORT_FILES and p.suffix != ".safetensors"]
    if other:
        raise ValueError(f"{target} holds files a merged export did not write ({', '.join(sorted(other)[:3])}"
                         f"{' ...' if len(other) > 3 else ''}): replacing the folder would delete them; "
                         "choose an empty or new folder")


def dequantized_copy(model: Any) -> Any:
    """A plain model of `model`'s config holding its weights, for a GGUF-loaded model: those refuse
    save_pretrained, but their weights are plain dequantized tensors. The copy's config drops the
    GGUF `quantization_config`, which would make transformers reload the export as a GGUF model."""
    from transformers import AutoModelForCausalLM

    from mcp_rl.policies.models import dtype_kwarg

    config = copy.deepcopy(model.config)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, **dtype_kwarg(model.dtype))
    clean.load_state_dict(model.state_dict())
    clean.generation_config = model.generation_config
    return clean


class Checkpoints:
    """save / load / merge_and_save for `PortableTrainer`."""

    def save(self, directory: str | os.PathLike) -> Path:
        """Write adapter/ (peft), optimizer.pt and trainer_state.json atomically to `directory`."""
        target = Path(directory)
        with self._lock, atomic_dir(target) as tmp:
            self.model.save_pretrained(tmp / "adapter")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            (tmp / STATE_FILE).write_text(json.dumps({
                "format": _FORMAT, "step": self.step, "sft_steps": self.sft_steps, "loss": self.loss,
                "precision": self.precision, "skipped_steps": self.skipped_steps,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "learning_rate": self.learning_rate, "max_seq_len": self.max_seq_len}, indent=2))
            write_manifest(tmp)
        return target

    def load(self, directory: str | os.PathLike) -> dict:
        """Restore LoRA weights, optimizer state and step from a `save`d folder."""
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        path = Path(directory)
        if not (path / STATE_FILE).is_file() or not (path / "adapter").is_dir():
            raise FileNotFoundError(f"{path} is not a PortableTrainer checkpoint (no {STATE_FILE} or adapter/); "
                                    "pass a folder written by trainer.save()")
        state = json.loads((path / STATE_FILE).read_text())
        if not verify_manifest(path):  # a checkpoint saved before manifests: the check needing no record
            if state.get("format", 1) >= 2:
                raise CheckpointCorrupt(f"{path} has no {MANIFEST}, which every checkpoint of this version writes "
                                        "(a partial copy?): copy it again from where it was written, or use an "
                                        "earlier checkpoint")
            for f in (path / "adapter").glob("*.safetensors"):
                check_safetensors(f)
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
        check_export_target(Path(directory))
        with self._lock:
            merged = copy.deepcopy(self.model).merge_and_unload()
        if getattr(merged, "hf_quantizer", None) is not None:
            merged = dequantized_copy(merged)
        with atomic_dir(Path(directory)) as tmp:
            merged.save_pretrained(tmp)
            self.tokenizer.tokenizer.save_pretrained(tmp)
        return Path(directory)
