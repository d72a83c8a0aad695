"""Our model loading and LoRA merge on the ART + vLLM Colab stack's transformers (4.53.2), not only on ours (5.x).

The Colab 'art' install pins transformers 4.53.2 (openpipe-art[backend] 0.4.11, for vLLM 0.9.2), which
names the dtype argument `torch_dtype`; CI's venv has transformers 5. `make install` puts that stack's
transformers, tokenizers, huggingface_hub, peft and accelerate (tests/art_stack.txt: the versions of the
t4 lock; test_packaging checks they agree) into .venv/art-stack, and in a subprocess that imports them
first, this test merges a LoRA with `mcp_rl.ship.export.merge_adapter`, checks the merged logits, and
writes it as GGUF (notebook 01's export cell). No network.
Run: make install, then pytest tests/test_art_stack.py
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "art_stack.txt"
ART_STACK = dict(line.split()[0].split("==") for line in PINS.read_text().splitlines() if line and line[0] != "#")

SCRIPT = textwrap.dedent("""
    import sys, torch, transformers, peft
    assert transformers.__version__ == sys.argv[2], transformers.__version__
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from mcp_rl.ship.export import merge_adapter
    from mcp_rl.ship.gguf_export import gguf_summary, write_gguf

    root = sys.argv[1]
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *"abcdefghijklmnopqrstuvwxyz"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    base.save_pretrained(f"{root}/base")
    tokenizer.save_pretrained(f"{root}/base")
    lora = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    lora.save_pretrained(f"{root}/adapter")
    ids = torch.tensor([tokenizer("hello world")["input_ids"]])
    with torch.no_grad():
        want = lora(input_ids=ids).logits
    out = merge_adapter(f"{root}/adapter", f"{root}/merged", base_model=f"{root}/base", dtype="float32", device="cpu")
    merged = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        got = merged(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-4, float((got - want).abs().max())
    summary = gguf_summary(write_gguf(out, f"{root}/agent.gguf", quant="q8_0"))  # the notebook's next step
    assert summary["architecture"] == "llama" and summary["chat_template"], summary
    print("merged on transformers", transformers.__version__, "peft", peft.__version__)
""")


@pytest.fixture(scope="module")
def art_stack() -> Path:
    """The folder `make install` filled from tests/art_stack.txt, beside this venv's packages."""
    target = Path(sys.prefix) / "art-stack"
    found = dict(p.name.removesuffix(".dist-info").lower().split("-", 1) for p in target.glob("*.dist-info"))
    want = {name.replace("-", "_"): version for name, version in ART_STACK.items()}
    assert found == want, (f"{target} holds {found}, not {want}: run `make install` (it installs tests/art_stack.txt "
                           "there when that file changes)")
    return target


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_merge_adapter_runs_on_the_art_stacks_transformers(art_stack, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(art_stack), str(ROOT)]),
           "MCP_RL_CACHE": str(tmp_path / "cache")}  # a cache another transformers version wrote may not load
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), ART_STACK["transformers"]],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"merged on transformers {ART_STACK['transformers']} peft {ART_STACK['peft']}" in proc.stdout
