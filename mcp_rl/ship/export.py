"""Export: find a run's LoRA adapter (portable or ART, CLI or notebook run) and merge it into its base model.

    adapter = find_adapter("runs/demo")                  # the newest checkpoint's peft adapter folder
    merge_adapter("runs/demo", "out/merged")             # base from the adapter's record; fp32/bf16/fp16
    model = load_with_adapter(model, "runs/demo")        # a loaded base model + the run's LoRA, for eval
    python -m mcp_rl export --run runs/demo --merged out/merged [--model BASE] [--dtype auto]

No run config.json is needed, so notebook runs export too. Portable checkpoints are
`RUN/checkpoints/step-NNNN/adapter/` (peft) + trainer_state.json; ART ones are `art_trainer.json`,
a record of where ART keeps the LoRA (`<art_path>/<project>/models/<name>/checkpoints/NNNN`, a
peft folder); notebooks also write `RUN/final/`. The adapter needs no export: it already is one.
Whatever finds an adapter here (export, `serve --adapter`, `eval --adapter`) first checks its files
against the checkpoint's manifest (sizes and sha256, `mcp_rl.training.manifest`); one saved without a manifest
gets the check that needs none (each safetensors file as long as its header says).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from mcp_rl.training.art_backend import STATE_FILE as ART_STATE
from mcp_rl.policies.local_policy import SMOLLM2
from mcp_rl.training.manifest import ART_PREFIX, MANIFEST, CheckpointCorrupt, check_safetensors, verify_manifest

log = logging.getLogger(__name__)

__all__ = ["find_adapter", "merge_adapter", "load_with_adapter", "recorded_base_model", "DTYPES"]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
DTYPES = ("auto", "float16", "bfloat16", "float32")
EXPECTED = ("expected a run folder (checkpoints/step-N/ inside), a checkpoint folder (adapter/ or art_trainer.json "
            "inside), ART's checkpoint folder or a peft adapter folder (adapter_config.json inside)")
_STEP = re.compile(r"(?:step-)?(\d+)")  # ours (step-0003) and ART's own (0003); not step-0003.tmp-xyz


def _format(state: Path) -> int:
    try:
        return int(json.loads(state.read_text()).get("format", 1))
    except (ValueError, TypeError, AttributeError):
        return 1  # an unreadable record: the safetensors check below still runs


def _checked(adapter: Path, art_record: Path | None = None) -> Path:
    """`adapter`, once its files match the manifest saved with them (CheckpointCorrupt otherwise)."""
    if not any((adapter / w).is_file() for w in ADAPTER_WEIGHTS):
        raise FileNotFoundError(f"{adapter} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS[0]}: use another checkpoint")
    if art_record is not None:  # ART's LoRA folder, listed in our step folder's manifest
        verified = verify_manifest(art_record, only=ART_PREFIX, art_checkpoint=adapter)
    elif (adapter.parent / MANIFEST).is_file() and adapter.name == "adapter":  # a portable checkpoint's adapter/
        verified = verify_manifest(adapter.parent, only="adapter/")
    else:
        verified = verify_manifest(adapter)
        state = adapter.parent / "trainer_state.json"
        if not verified and adapter.name == "adapter" and state.is_file() and _format(state) >= 2:
            raise CheckpointCorrupt(f"{adapter.parent} has no {MANIFEST}, which every checkpoint of this version "
                                    "writes (a partial copy?): copy it again, or use an earlier checkpoint")
    if not verified:
        for f in adapter.glob("*.safetensors"):
            check_safetensors(f)
    return adapter


def _from_art_record(ckpt: Path) -> tuple[Path, str | None]:
    """The LoRA folder an ART record points at, and the base model it names."""
    record = ckpt / ART_STATE
    try:
        state = json.loads(record.read_text())
    except ValueError as e:
        raise ValueError(f"{record} is not valid JSON ({e}); pass --adapter <ART's checkpoint folder>") from e
    if not state.get("art_checkpoint"):
        raise ValueError(f"{record} records no art_checkpoint; pass --adapter "
                         "<art_path>/<project>/models/<name>/checkpoints/<step>")
    where = Path(state["art_checkpoint"])
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    # The record holds the path as training saw it: relative to that process's working directory
    # (runs/x/.art/...), or absolute on another machine (/content/...). Also try each tail of it
    # under the run folder, down to <project>/models/<name>/checkpoints/<step>.
    tails = [run / Path(*where.parts[i:]) for i in range(1 if where.is_absolute() else 0, len(where.parts) - 4)]
    for candidate in [where, *tails]:
        if (candidate / ADAPTER_CONFIG).is_file():
            return _checked(candidate, art_record=ckpt), state.get("base_model")
    raise FileNotFoundError(f"{record} points at ART's LoRA folder {where}, which is not there (nor under {run}); "
                            "copy that folder next to the run or pass --adapter <that folder>")


def _from_checkpoint(ckpt: Path) -> tuple[Path, str | None] | None:
    if (ckpt / ADAPTER_CONFIG).is_file():
        return _checked(ckpt), None
    if (ckpt / "adapter" / ADAPTER_CONFIG).is_file():
        return _checked(ckpt / "adapter"), None
    if (ckpt / ART_STATE).is_file():
        return _from_art_record(ckpt)
    return None


def _locate(path: str | os.PathLike) -> tuple[Path, str | None]:
    """(adapter folder, base model named by an ART record or None) for any accepted layout."""
    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"{p} is not a folder; {EXPECTED}")
    found = _from_checkpoint(p)
    if found:
        return found
    steps = sorted((int(m.group(1)), c) for c in (p / "checkpoints").glob("*")
                   if c.is_dir() and (m := _STEP.fullmatch(c.name)))
    newest = steps[-1][1] if steps else p / "final"  # a notebook run that checkpointed no RL step
    if not newest.is_dir():
        raise FileNotFoundError(f"{p} holds no LoRA adapter: {EXPECTED}")
    found = _from_checkpoint(newest)
    if not found:
        raise FileNotFoundError(f"the newest checkpoint {newest} holds no adapter/ (portable trainer), "
                                f"{ART_STATE} (ART) or {ADAPTER_CONFIG}")
    return found


def find_adapter(path: str | os.PathLike) -> Path:
    """The peft adapter folder for a run, checkpoint, ART checkpoint or adapter folder (newest step)."""
    return _locate(path)[0]


def recorded_base_model(path: str | os.PathLike) -> str | None:
    """The base model an adapter was trained on, as export loads it (None if nothing records it).

    An ART record's `base_model` comes first: Unsloth may record its 4-bit copy in adapter_config.json
    (unsloth/X-unsloth-bnb-4bit), whose 16-bit weights Unsloth publishes as unsloth/X. A folder
    named `smollm2` is the embedded model's safetensors cache (local_policy), maybe from another machine."""
    adapter, base = _locate(path)
    if not base:
        try:
            base = json.loads((adapter / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
        except ValueError as e:
            raise ValueError(f"{adapter / ADAPTER_CONFIG} is not valid JSON ({e})") from e
    if not base:
        return None
    if Path(base).name == SMOLLM2:
        return SMOLLM2
    stripped = re.sub(r"(-unsloth)?-bnb-4bit$", "", base)
    if stripped != base:
        log.info("adapter records Unsloth's 4-bit %s; merging onto its 16-bit weights %s", base, stripped)
    return stripped


def _dtype(dtype: str) -> Any:
    """The torch dtype; "auto" follows the machine, not the merge device: Colab merges on the CPU
    (vLLM holds the T4) a model it will serve in float16 on the GPU, at half fp32's memory."""
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype != "auto":
        return getattr(torch, dtype)
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    return torch.float32


def _unquantized(model: Any, name: str) -> Any:
    """`model` as plain tensors; refuses real quantized weights (a LoRA merged into 4-bit is lost precision)."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    method = getattr(quantizer.quantization_config, "quant_method", "unknown")
    method = str(getattr(method, "value", method))  # transformers' QuantizationMethod is a str Enum
    if method != "gguf":
        raise ValueError(f"base model {name!r} loads with {method} quantized weights; merge onto the 16-bit base "
                         "instead (e.g. --model Qwen/Qwen2.5-3B-Instruct for a 4-bit ART/Unsloth run)")
    from mcp_rl.training.checkpoint import dequantized_copy

    return dequantized_copy(model)


def merge_adapter(adapter: str | os.PathLike, out_dir: str | os.PathLike, *, base_model: str | None = None,
                  dtype: str = "auto", device: str | None = None) -> Path:
    """Merge the LoRA at `adapter` (any layout `find_adapter` takes) into its base; save model + tokenizer.

    The base is `base_model`, else the one the adapter records ("smollm2": the embedded model), loaded
    unquantized on `device` (default: CUDA if present): dtype "auto" is bf16 where the GPU has it, else
    fp16 on a CUDA machine, fp32 without CUDA. `out_dir` is written atomically (a temporary sibling
    renamed into place) and loads with transformers / vLLM."""
    import torch
    from peft import PeftModel

    from mcp_rl.policies.local_policy import load_local_model
    from mcp_rl.training.checkpoint import atomic_dir, check_export_target

    folder, out = find_adapter(adapter), Path(out_dir)
    if folder.resolve().is_relative_to(out.resolve()):
        raise ValueError(f"--merged {out} would replace the adapter {folder}; choose another folder")
    check_export_target(out)
    base = base_model or recorded_base_model(adapter)
    if not base:
        raise ValueError(f"{folder / ADAPTER_CONFIG} records no base model; pass base_model= (--model)")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    from huggingface_hub.errors import HFValidationError  # hub < 1.0 (ART's stack): a missing folder read as a repo id

    try:
        model, tokenizer = load_local_model(base, dtype=_dtype(dtype), device=device)
    except (OSError, HFValidationError) as e:
        raise FileNotFoundError(f"cannot load base model {base!r} ({str(e).splitlines()[0]}); pass the model the "
                                "adapter was trained on with base_model= (--model)") from e
    model = _unquantized(model, base)
    try:
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except (RuntimeError, KeyError) as e:  # shape mismatch: another base model than the LoRA's
        raise ValueError(f"the LoRA in {folder} does not fit base model {base!r} ({str(e).splitlines()[0][:200]}); "
                         "pass the base it was trained on with --model") from e
    with atomic_dir(out) as tmp:
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)  # with the chat template the policy used (tool format included)
    return out


def load_with_adapter(model: Any, path: str | os.PathLike) -> Any:
    """`model` wrapped (for inference) with the LoRA of a run, checkpoint, ART checkpoint or adapter folder."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(find_adapter(path)))
