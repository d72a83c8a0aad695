"""Tests for mcp_rl/ship/gguf_export.py: a GGUF written here, loaded back by transformers, predicts
what the merged model predicts.

    .venv/bin/python -m pytest tests/test_gguf_export.py -q
Tiny random Llama and Qwen2 models (SmolLM2's tokenizer) for the layout; the real SmolLM2 with a
LoRA whose B is non-zero, merged, for the agreement targets (f16 >= 99%, q8_0 >= 95% of positions).
"""

import copy

import pytest
import torch

from mcp_rl.ship.gguf_export import gguf_summary, write_gguf
from mcp_rl.policies.local_policy import load_local_tokenizer
from mcp_rl.policies.models import dtype_kwarg

PROMPTS = ["How many employees work in the Sales department?",
           "<|im_start|>user\nList the tables.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n",
           "SELECT name, salary FROM employees WHERE department_id = 3 ORDER BY salary DESC LIMIT 5;",
           "The project with the largest budget is led by"]


def agreement(a, b, tok) -> float:
    """Share of positions where both models' greedy next token is the same."""
    same = total = 0
    for text in PROMPTS:
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            x, y = a(ids).logits.argmax(-1), b(ids).logits.argmax(-1)
        same, total = same + int((x == y).sum()), total + x.numel()
    return same / total


def load_gguf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **dtype_kwarg(torch.float32)).eval()


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("quant, least", [("f16", 0.99), ("q8_0", 0.85)])
def test_tiny_models_round_trip(arch, quant, least, tok, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(arch, vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    path = write_gguf(tmp_path / "hf", tmp_path / f"m-{quant}.gguf", quant=quant)
    info = gguf_summary(path)
    assert info["architecture"] == arch and info["chat_template"]
    # said outright (found by review): Ollama's engine adds a BOS when the key is missing, llama.cpp does not
    import gguf

    field = gguf.GGUFReader(path).fields["tokenizer.ggml.add_bos_token"]
    assert bool(field.parts[field.data[0]][0]) is False
    assert info["types"] == (["F16", "F32"] if quant == "f16" else ["F32", "Q8_0"])
    assert agreement(model, load_gguf(path), tok) >= least  # random weights: near-tied logits are common
    assert not list(tmp_path.glob("*.tmp-*"))


def test_unsupported_architectures_and_quants_are_refused(tok, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok))).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no GGUF writer for model_type 'gpt2'"):
        write_gguf(tmp_path, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="quant must be one of"):
        write_gguf(tmp_path, tmp_path / "x.gguf", quant="q4_k")


@pytest.fixture(scope="module")
def merged_smollm2(tmp_path_factory):
    """SmolLM2 with a LoRA whose B is non-zero (so the merge changes the model), merged and saved."""
    import peft

    from mcp_rl.policies.local_policy import load_local_model
    from mcp_rl.training.portable import PortableTrainer

    model, tok = load_local_model("smollm2")
    policy = type("P", (), {"model": model, "tokenizer": tok, "step": 0})()
    trainer = PortableTrainer(policy, lora_r=8)
    torch.manual_seed(1)
    for name, p in trainer.model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(0, 0.02)
    out = tmp_path_factory.mktemp("merged")
    trainer.merge_and_save(out)
    merged = copy.deepcopy(trainer.model).merge_and_unload().eval()
    assert isinstance(trainer.model, peft.PeftModel)
    return out, merged, tok


@pytest.mark.slow
@pytest.mark.parametrize("quant, least", [("f16", 0.99), ("q8_0", 0.95)])
def test_smollm2_with_a_merged_lora_round_trips(quant, least, merged_smollm2, tmp_path):
    folder, merged, tok = merged_smollm2
    path = write_gguf(folder, tmp_path / f"agent-{quant}.gguf", quant=quant)
    back = load_gguf(path)
    score = agreement(merged, back, tok)
    print(f"{quant}: {gguf_summary(path)['bytes'] / 2**20:.0f} MiB, greedy agreement {score:.1%}")
    assert score >= least
