"""Speed levers of the GRPO update (issue [speed]): switches on the model the trainer builds, each off by default.

    with lora_input_casts(model, off=True):   # the update: LoRA layers take their input as autocast gives it
        ...forward / backward...
    applied = apply_liger(model)              # CUDA: Liger-Kernel's RMSNorm, SwiGLU/GeGLU and RoPE in place

Why (bench/HISTORY.md section 24; bench/speed/attribute_update.py traces it): half the GPU time of the packed
Qwen2.5-3B-shape update was elementwise kernels, a fifth of it dtype copies. peft keeps LoRA weights in float32
(needed for the fp16 loss scaler) and casts every LoRA layer's input to them (`_cast_input_dtype`); under autocast
the LoRA matmul then casts that float32 copy straight back to bf16/fp16. Both copies of a full activation, and
their two copies again in backward, change no value: bf16 -> float32 -> bf16 is exact. `lora_input_casts(off=True)`
skips them for the update only (sampling runs without autocast and needs them); the loss and gradients are the
same bit for bit (tests/test_update_levers.py). The weights stay float32, so the optimizer and the T4's fp16 loss
scaler see what they saw.

The rest of the elementwise work is the model's own: RMSNorm's float32 round trip, SwiGLU's silu and product,
RoPE's rotate-and-add. Liger-Kernel's Triton kernels fuse each (what TRL's `use_liger_kernel` applies); they need
CUDA, and asking for them elsewhere is an error rather than a silent no-op: the switch only buys speed, so a run
that asked for it and did not get it would time something else than it says.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

import torch


@contextlib.contextmanager
def lora_input_casts(model: Any, *, off: bool) -> Iterator[None]:
    """While active with `off`: peft's LoRA layers use their input in its own dtype (no copy to the adapter's
    float32). Only right under autocast, which casts the LoRA matmul's operands itself; `off=False` is a no-op."""
    if not off:
        yield
        return
    from peft.helpers import disable_input_dtype_casting

    with disable_input_dtype_casting(model):
        yield


# Where transformers looks the rotary function up at call time: Liger replaces it module-wide (not per model).
ROPE_MODULES = {"llama": "transformers.models.llama.modeling_llama",
                "qwen2": "transformers.models.qwen2.modeling_qwen2",
                "qwen3": "transformers.models.qwen3.modeling_qwen3",
                "mistral": "transformers.models.mistral.modeling_mistral",
                "gemma3_text": "transformers.models.gemma3.modeling_gemma3"}


def liger_ready(device: torch.device) -> str:
    """'' when Liger's kernels can run on `device`, else why not (one line, with what to do)."""
    if device.type != "cuda":
        return (f"Liger-Kernel's kernels are Triton kernels for CUDA GPUs; the model is on {device.type}: "
                "set train.liger_kernels=false here")
    try:
        import liger_kernel.transformers.monkey_patch  # noqa: F401
    except Exception as e:  # noqa: BLE001  (not installed, or its Triton does not load)
        return f"liger-kernel does not import ({type(e).__name__}: {str(e)[:80]}): pip install 'mcp-rl[gpu]'"
    return ""


def apply_liger(model: Any) -> list[str]:
    """Patch Liger-Kernel's RMSNorm, SwiGLU (GeGLU for Gemma) and RoPE into `model` (a PeftModel or a causal LM)
    in place, as TRL's `use_liger_kernel` does, but no loss kernel: our head is packing.py's. Returns what was
    applied; raises RuntimeError where it cannot run (`liger_ready`) or for a model type Liger does not know.

    Liger's apply functions also swap transformers' RMSNorm/MLP classes for models built later in the process:
    put back here, so only this model changes. RoPE is a module-level function that every model of the type
    calls: it stays Liger's for the whole process (what `rope_is_liger` reports)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    why = liger_ready(next(base.parameters()).device)
    if why:
        raise RuntimeError(why)
    import importlib

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    kind = getattr(base.config, "model_type", None)
    if kind not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise RuntimeError(f"liger-kernel has no kernels for model type {kind!r}: set train.liger_kernels=false")
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN[kind]
    wanted = {"rope": True, "rms_norm": True, "swiglu": True, "geglu": True,
              "cross_entropy": False, "fused_linear_cross_entropy": False}
    params = inspect.signature(apply).parameters
    kwargs = {k: v for k, v in wanted.items() if k in params}
    module = importlib.import_module(apply.__module__ if kind not in ROPE_MODULES else ROPE_MODULES[kind])
    classes = {k: v for k, v in vars(module).items() if isinstance(v, type)} if kind in ROPE_MODULES else {}
    apply(model=base, **kwargs)
    for name, cls in classes.items():  # later models of this type keep transformers' own norm and MLP
        setattr(module, name, cls)
    return [k for k in ("rms_norm", "swiglu", "geglu", "rope") if kwargs.get(k)]


def rope_is_liger(model: Any) -> bool | None:
    """Whether the rotary function `model`'s attention calls is Liger's (None: a model type not in ROPE_MODULES)."""
    import importlib

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    path = ROPE_MODULES.get(getattr(base.config, "model_type", None))
    if path is None:
        return None
    return "liger" in getattr(importlib.import_module(path).apply_rotary_pos_emb, "__module__", "")
