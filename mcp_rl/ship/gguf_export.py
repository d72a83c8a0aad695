"""Write a merged Hugging Face model folder as a GGUF file (llama.cpp, Ollama, LM Studio).

    write_gguf("runs/x/merged", "runs/x/agent.gguf", quant="q8_0")   # or "f16"
    python -m mcp_rl export --run runs/x --gguf runs/x/agent.gguf [--quant f16|q8_0]

Written with the `gguf` package (the llama.cpp project's own Python package): no llama.cpp build,
no network. That package has the writer, the tensor-name map and the quantizers but not
llama.cpp's `convert_hf_to_gguf.py`; what this module does by hand is that converter's part for
the architectures named in ARCHS (Llama: SmolLM2; Qwen2: Qwen2.5): hyperparameters, the BPE
vocabulary, and the Q/K row permutation llama.cpp's Llama kernels expect (Qwen2 has none).
The tokenizer's merges, special tokens and chat template go in through `gguf.SpecialVocab`.
1-D tensors (norms, biases) stay float32, as the converter keeps them.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

# HF `model_type` -> (GGUF architecture, tokenizer pre-tokenizer name, Q/K permuted?)
ARCHS = {"llama": ("LLAMA", "smollm", True), "qwen2": ("QWEN2", "qwen2", False)}
QUANTS = ("f16", "q8_0")


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's Llama row order for q_proj/k_proj (convert_hf_to_gguf.py `LlamaModel.permute`)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _vocab(tokenizer, n_vocab: int):
    """Tokens and their types in id order, as the converter's `get_vocab_base` builds them."""
    import gguf

    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.get_added_vocab()
    special = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        token = reverse[i]
        tokens.append(token)
        if token in added:
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    return tokens, types


def _plan(model_dir: Path, cfg, names, quant: str) -> list[tuple]:
    """(file, hf name, gguf name, shape, numpy dtype, bytes, ggml type) for each tensor, from headers only."""
    import gguf
    from safetensors import safe_open

    plan = []
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            for name in f.keys():
                if name.endswith("rotary_emb.inv_freq") or (
                        name == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False)):
                    continue  # llama.cpp reuses token_embd when output is absent
                new = names.get_name(name, try_suffixes=(".weight", ".bias"))
                if new is None:
                    raise ValueError(f"no GGUF name for tensor {name!r} of a {cfg.model_type} model")
                shape = list(f.get_slice(name).get_shape())
                numel = int(np.prod(shape))
                if len(shape) == 1:
                    plan.append((file, name, new, shape, np.float32, numel * 4, None))
                elif quant == "f16":
                    plan.append((file, name, new, shape, np.float16, numel * 2, None))
                else:
                    q8 = gguf.GGMLQuantizationType.Q8_0
                    byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, q8)
                    plan.append((file, name, new, byte_shape, np.uint8, int(np.prod(byte_shape)), q8))
    return plan


def _tensor(file: Path, name: str, new: str, quant: str, n_head: int, n_kv: int, permute: bool) -> np.ndarray:
    import gguf
    import torch
    from safetensors import safe_open

    with safe_open(file, "pt") as f:
        data = f.get_tensor(name).to(torch.float32).numpy()
    if permute and name.endswith("q_proj.weight"):
        data = _permute(data, n_head)
    elif permute and name.endswith("k_proj.weight"):
        data = _permute(data, n_kv)
    if data.ndim == 1:
        return data.astype(np.float32)
    if quant == "f16":
        return data.astype(np.float16)
    return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)


def write_gguf(model_dir: str | os.PathLike, out: str | os.PathLike, *, quant: str = "f16") -> Path:
    """`model_dir` (a merged HF model + tokenizer) -> one GGUF file, written atomically."""
    import gguf
    from transformers import AutoConfig, AutoTokenizer

    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {quant!r}")
    model_dir, out = Path(model_dir), Path(out)
    cfg = AutoConfig.from_pretrained(model_dir)
    if cfg.model_type not in ARCHS:
        raise ValueError(f"no GGUF writer for model_type {cfg.model_type!r}; supported: {sorted(ARCHS)} "
                         "(for others use llama.cpp's convert_hf_to_gguf.py on the merged folder)")
    arch_name, pre, permute = ARCHS[cfg.model_type]
    arch = getattr(gguf.MODEL_ARCH, arch_name)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    n_head, n_kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, gguf.MODEL_ARCH_NAMES[arch])
        w.add_name(model_dir.name)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_kv)
        w.add_rope_dimension_count(head_dim)
        rope = getattr(cfg, "rope_parameters", None) or {}
        w.add_rope_freq_base(float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))))
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_vocab_size(cfg.vocab_size)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if quant == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0)

        tokens, types = _vocab(tokenizer, cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens))
        if tokenizer.chat_template and not special.chat_template:  # e.g. the embedded model's Hermes template
            special.chat_template = tokenizer.chat_template
        # Said outright: llama.cpp adds no BOS when the key is missing, Ollama's own engine adds one.
        special.add_special_token.setdefault("bos", bool(getattr(tokenizer, "add_bos_token", False)))
        special.add_to_gguf(w)

        names = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
        plan = _plan(model_dir, cfg, names, quant)
        # Two passes, one tensor in memory at a time (a 3B model would not fit twice in a Colab's
        # RAM): tensor infos first, then each tensor converted and written in the same order.
        for _, _, new, data_shape, dtype, nbytes, raw in plan:
            w.add_tensor_info(new, data_shape, dtype, nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for file, name, new, *_ in plan:
            w.write_tensor_data(_tensor(file, name, new, quant, n_head, n_kv, permute))
        w.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private; Ollama's server may run as another user
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def gguf_summary(path: str | os.PathLike) -> dict:
    """Architecture, tensor count, quantisation types and size of a GGUF file (read back with `gguf`)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    kinds = sorted({t.tensor_type.name for t in r.tensors})
    return {"architecture": arch, "tensors": len(r.tensors), "types": kinds,
            "bytes": Path(path).stat().st_size,
            "chat_template": "tokenizer.chat_template" in r.fields}


if __name__ == "__main__":  # python -m mcp_rl.ship.gguf_export MERGED_DIR OUT.gguf [f16|q8_0]
    import sys

    print(json.dumps(gguf_summary(write_gguf(sys.argv[1], sys.argv[2], quant=(sys.argv[3:] or ["f16"])[0])), indent=2))
