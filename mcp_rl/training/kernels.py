"""Speed levers of the GRPO update and of sampling (issue [speed]): switches on the model the trainer builds.

    with update_levers(model, autocast=True, no_upcast=True, fused_add=True):   # around the update's passes
        ...forward / backward...
    applied = apply_liger(model)              # CUDA: Liger-Kernel's RMSNorm, SwiGLU/GeGLU and RoPE in place
    with lora_sampling(model, on=True):       # around a batched decode (LocalPolicy's fused_lora)
        ...

Why (bench/HISTORY.md section 24; bench/speed/attribute_update.py traces it): half the GPU time of the packed
Qwen2.5-3B-shape update was elementwise kernels, a fifth of it dtype copies. peft keeps LoRA weights in float32
(needed for the fp16 loss scaler) and casts every LoRA layer's input to them (`_cast_input_dtype`); under autocast
the LoRA matmul then casts that float32 copy straight back to bf16/fp16. Both copies of a full activation, and
their two copies again in backward, change no value: bf16 -> float32 -> bf16 is exact. `lora_input_casts(off=True)`
skips them for the update only (sampling runs without autocast and needs them); the loss and gradients are the
same bit for bit (tests/test_update_levers.py). The weights stay float32, so the optimizer and the T4's fp16 loss
scaler see what they saw.

peft then adds `lora_B(lora_A(x)) * scaling` to the base layer's output: a multiply and an add over the output
(for the MLP's gate and up projections, 5x the hidden size wide) in forward, the multiply again in backward.
`lora_fused_add` computes the same sum as one `result.addmm_(lora_A(x), lora_B.weight.T, alpha=scaling)`: the
scale and the add go into the matrix product's epilogue, the backward's scale onto the rank-r factors. It rounds once
instead of three times, so the loss moves within bf16 rounding, not bit for bit (tests/test_update_levers.py).

The rest of the elementwise work is the model's own: RMSNorm's float32 round trip, SwiGLU's silu and product,
RoPE's rotate-and-add. Liger-Kernel's Triton kernels fuse each (what TRL's `use_liger_kernel` applies); they need
CUDA, and asking for them elsewhere is an error rather than a silent no-op: the switch only buys speed, so a run
that asked for it and did not get it would time something else than it says.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
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


def _fused_forward(self, state: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """peft's vanilla LoRA Linear forward (one active adapter, not merged, no bias on lora_B) with the scaled add
    inside the product, in place on the base output: an out-of-place addmm would first copy it (cuBLAS and the
    CPU both do), and the base matmul keeps no output for its backward. On 2-D rows, so the in-place op is on
    no view (a view's would cost a gradient copy in backward, CopySlices). The input goes in as it comes (under
    autocast the LoRA matmul casts it); in-place ops get no autocast, so lora_B's weight is cast here, as
    autocast would."""
    rows = x.reshape(-1, x.shape[-1])
    result = self.base_layer(rows, *args, **kwargs)
    name = self.active_adapters[0]
    low = self.lora_A[name](self.lora_dropout[name](rows))
    result.addmm_(low.to(result.dtype), self.lora_B[name].weight.to(result.dtype).t(), alpha=self.scaling[name])
    return result.view(*x.shape[:-1], result.shape[-1])


# A lever's forward acts only in the thread that entered it: a rollout thread may decode while the main thread
# trains the same model (the tutorial's CI run did: a warm-start step went through the sampler's detached copies).
# Each thread keeps {id(layer): (forward, state)}; a layer's `_dispatch` runs its thread's entry, else peft's own.
_ACTIVE = threading.local()
_LOCK = threading.Lock()
_USERS: dict[int, int] = {}  # id(layer) -> contexts (all threads) that installed `_dispatch` on it


def _dispatch(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    entry = getattr(_ACTIVE, "layers", {}).get(id(self))
    if entry is None:
        return type(self).forward(self, x, *args, **kwargs)
    forward, state = entry
    return forward(self, state, x, *args, **kwargs)


@contextlib.contextmanager
def _installed(layers: list, forward: Any, states: list) -> Iterator[None]:
    """`forward(layer, state, x, ...)` as each layer's forward in this thread, for the context's duration."""
    if not hasattr(_ACTIVE, "layers"):
        _ACTIVE.layers = {}
    mine = _ACTIVE.layers
    before = {id(m): mine.get(id(m)) for m in layers}  # a context entered inside another gives it back on exit
    with _LOCK:
        for m, state in zip(layers, states):
            mine[id(m)] = (forward, state)
            _USERS[id(m)] = _USERS.get(id(m), 0) + 1
            m.forward = _dispatch.__get__(m)
    try:
        yield
    finally:
        with _LOCK:
            for m in layers:
                if before[id(m)] is None:
                    mine.pop(id(m), None)
                else:
                    mine[id(m)] = before[id(m)]
                _USERS[id(m)] -= 1
                if not _USERS[id(m)]:
                    del _USERS[id(m)]
                    m.__dict__.pop("forward", None)


def fusable(module: Any) -> bool:
    """A peft LoRA Linear that `_fused_forward` computes exactly as peft does (up to rounding)."""
    from peft.tuners.lora.layer import Linear

    if type(module) is not Linear or module.merged or module.disable_adapters or len(module.active_adapters) != 1:
        return False
    own = vars(module).get("forward")  # someone else's per-instance forward (a hook) is left alone
    if own is not None and getattr(own, "__func__", None) is not _dispatch:
        return False
    name = module.active_adapters[0]
    return (name in module.lora_A and name not in module.lora_variant and module.lora_B[name].bias is None
            and not getattr(module, "use_dora", {}).get(name, False))


@contextlib.contextmanager
def lora_fused_add(model: Any, *, on: bool) -> Iterator[int]:
    """While active with `on`, in this thread: every `fusable` LoRA layer runs `_fused_forward`. Yields how many
    layers it changed."""
    layers = [m for m in model.modules() if fusable(m)] if on else []
    with _installed(layers, _fused_forward, [None] * len(layers)):
        yield len(layers)


def _sampling_forward(self, state: tuple, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """`_fused_forward` for sampling (no grad, no autocast): the LoRA factors are copies in the base output's
    dtype (`lora_sampling`), so the adapter costs a decode step two products, not peft's six kernels (a float32
    copy of the input, two float32 products, the scale, the add, the cast back)."""
    rows = x.reshape(-1, x.shape[-1])
    result = self.base_layer(rows, *args, **kwargs)
    a, b, scale = state
    result.addmm_(rows.to(a.dtype) @ a.t(), b.t(), alpha=scale)
    return result.view(*x.shape[:-1], result.shape[-1])


@contextlib.contextmanager
def lora_sampling(model: Any, *, on: bool) -> Iterator[int]:
    """While active with `on`, in this thread (sampling only: no gradients flow): every `fusable` LoRA layer runs
    `_sampling_forward` with its LoRA factors copied, at entry, to its base layer's weight dtype. A small model's
    batched decode step is kernel launches, not arithmetic (bench/speed/profile_decode.py); LoRA on every linear
    layer is half of a SmolLM2 step's ops, and a fused layer needs half of peft's (2,580 -> 1,950 a step). On a
    GPU the factors are then bf16, as the update's autocast rounds them; on a CPU's float32 the same products as
    peft's. Yields how many layers it changed."""
    if on and torch.is_grad_enabled():  # the copies are detached: a forward with gradients would train nothing
        raise RuntimeError("lora_sampling is for sampling: enter it under torch.inference_mode() or torch.no_grad()")
    layers, states = [], []
    for m in (m for m in model.modules() if fusable(m)) if on else ():
        name = m.active_adapters[0]
        dtype = m.base_layer.weight.dtype
        if not dtype.is_floating_point or (m.training and not isinstance(m.lora_dropout[name], torch.nn.Identity)):
            continue  # a quantized base layer, or a dropout that would act: peft's own path
        layers.append(m)
        states.append((m.lora_A[name].weight.detach().to(dtype), m.lora_B[name].weight.detach().to(dtype),
                       m.scaling[name]))
    with _installed(layers, _sampling_forward, states):
        yield len(layers)


@contextlib.contextmanager
def update_levers(model: Any, *, autocast: bool, no_upcast: bool, fused_add: bool) -> Iterator[None]:
    """The LoRA levers around an update's forward and backward passes; both need autocast (which casts the
    LoRA product's operands to one dtype), so without it this is a no-op."""
    with lora_input_casts(model, off=autocast and no_upcast), lora_fused_add(model, on=autocast and fused_add):
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
