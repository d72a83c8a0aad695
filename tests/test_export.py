"""Tests for mcp_rl/ship/export.py (and `python -m mcp_rl export`): finding a run's LoRA in every layout
and merging it, on a tiny random Llama saved to tmp_path (CPU, seconds; the embedded model's tokenizer).

    .venv/bin/python -m pytest tests/test_export.py -q
"""

import json
import shutil
import types
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.utils.quantization_config import QuantizationMethod

from mcp_rl import cli
from mcp_rl.ship.export import _unquantized, find_adapter, load_with_adapter, merge_adapter, recorded_base_model
from mcp_rl.policies.local_policy import load_local_tokenizer, load_policy
from mcp_rl.policies.models import dtype_kwarg, tiny_llama

IDS = torch.tensor([[1, 17, 230, 4051, 99, 12, 7, 2048]])


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer (and tool chat template), saved like a Hub model."""
    tok = load_local_tokenizer()
    d = tmp_path_factory.mktemp("base")
    tiny_llama(tok, max_position_embeddings=128).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


@pytest.fixture(scope="module")
def lora(base_dir, tmp_path_factory):
    """A saved LoRA with random (non-zero) B weights, and the logits with and without it."""
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    base_logits = logits(base)
    torch.manual_seed(1)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                 init_lora_weights=False, task_type="CAUSAL_LM")).eval()
    d = tmp_path_factory.mktemp("lora") / "adapter"
    peft_model.save_pretrained(d)
    assert json.loads((d / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base_dir)
    return types.SimpleNamespace(dir=d, base=base_logits, peft=logits(peft_model))


def copy_adapter(lora, dest: Path, **config) -> Path:
    shutil.copytree(lora.dir, dest)
    if config:
        path = dest / "adapter_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dest


def portable_run(lora, run: Path) -> Path:
    """RUN/checkpoints/step-NNNN/{adapter/, trainer_state.json}, plus an older step and a crashed save."""
    for step in ("step-0001", "step-0002"):
        copy_adapter(lora, run / "checkpoints" / step / "adapter")
        (run / "checkpoints" / step / "trainer_state.json").write_text(json.dumps({"step": int(step[-1])}))
    (run / "checkpoints" / "step-0001" / "adapter" / "adapter_model.safetensors").unlink()  # not the newest
    (run / "checkpoints" / "step-0003.tmp-x1y2").mkdir()  # atomic_dir's leftover after a crash: not a checkpoint
    return run / "checkpoints" / "step-0002" / "adapter"


def art_run(lora, run: Path, base_dir: Path, recorded: str = ".art/proj/models/name/checkpoints/0003") -> Path:
    """RUN/checkpoints/step-0003/art_trainer.json -> ART's own LoRA folder under RUN/.art (as the notebooks set)."""
    # Unsloth records its 4-bit copy as the adapter's base; the ART record names the real base.
    lora_dir = copy_adapter(lora, run / ".art/proj/models/name/checkpoints/0003",
                            base_model_name_or_path="unsloth/tiny-unsloth-bnb-4bit")
    (run / "checkpoints" / "step-0003").mkdir(parents=True)
    (run / "checkpoints" / "step-0003" / "art_trainer.json").write_text(json.dumps({
        "backend": "art", "name": "name", "project": "proj", "base_model": str(base_dir), "step": 3,
        "art_path": ".art", "art_checkpoint": recorded}))
    return lora_dir


# ---- find_adapter: every layout ------------------------------------------------------
LAYOUTS = {
    "portable run": lambda lora, tmp, base: (tmp / "run", portable_run(lora, tmp / "run")),
    "portable checkpoint": lambda lora, tmp, base: (tmp / "run/checkpoints/step-0002", portable_run(lora, tmp / "run")),
    "adapter folder": lambda lora, tmp, base: (tmp / "a", copy_adapter(lora, tmp / "a")),
    "notebook final only": lambda lora, tmp, base: (tmp / "nb", copy_adapter(lora, tmp / "nb/final/adapter")),
    "art run": lambda lora, tmp, base: (tmp / "run", art_run(lora, tmp / "run", base)),
    "art checkpoint record": lambda lora, tmp, base: (tmp / "run/checkpoints/step-0003", art_run(lora, tmp / "run", base)),
    "art record from Colab": lambda lora, tmp, base: (tmp / "run", art_run(
        lora, tmp / "run", base, "/content/runs/sql-agent/.art/proj/models/name/checkpoints/0003")),
    "art record from the repo root": lambda lora, tmp, base: (tmp / "run", art_run(
        lora, tmp / "run", base, "runs/sql-agent/.art/proj/models/name/checkpoints/0003")),
    "art checkpoint folder": lambda lora, tmp, base: (tmp / "run/.art/proj/models/name/checkpoints/0003",
                                                      art_run(lora, tmp / "run", base)),
    "art model folder": lambda lora, tmp, base: (tmp / "run/.art/proj/models/name", art_run(lora, tmp / "run", base)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_find_adapter_finds_the_newest_lora(layout, lora, base_dir, tmp_path):
    given, expected = LAYOUTS[layout](lora, tmp_path, base_dir)
    assert find_adapter(given) == expected


@pytest.mark.parametrize("layout, base", [("portable run", "base"), ("art run", "base"), ("art checkpoint folder", None),
                                          ("adapter folder", "base")])
def test_recorded_base_prefers_the_art_record(layout, base, lora, base_dir, tmp_path):
    given, _ = LAYOUTS[layout](lora, tmp_path, base_dir)
    # Without the record, an ART folder's adapter_config names Unsloth's 4-bit copy: its 16-bit sibling is used.
    assert recorded_base_model(given) == (str(base_dir) if base else "unsloth/tiny")


@pytest.mark.parametrize("recorded, expected", [
    ("/root/.cache/mcp-rl/smollm2", "smollm2"),  # the embedded model's cache, here or on another machine
    ("smollm2", "smollm2"),
    ("unsloth/Qwen2.5-3B-Instruct-unsloth-bnb-4bit", "unsloth/Qwen2.5-3B-Instruct"),
    ("unsloth/qwen2.5-3b-instruct-bnb-4bit", "unsloth/qwen2.5-3b-instruct"),
    ("Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-3B-Instruct"),
    (None, None),
])
def test_recorded_base_model_names(recorded, expected, lora, tmp_path):
    assert recorded_base_model(copy_adapter(lora, tmp_path / "a", base_model_name_or_path=recorded)) == expected


def _empty_run(tmp):
    (tmp / "run" / "checkpoints").mkdir(parents=True)
    return tmp / "run"


def _no_adapter(tmp):
    (tmp / "run/checkpoints/step-0001").mkdir(parents=True)
    (tmp / "run/checkpoints/step-0001/trainer_state.json").write_text("{}")
    return tmp / "run"


def _art_elsewhere(tmp):
    (tmp / "ck").mkdir()
    (tmp / "ck/art_trainer.json").write_text(json.dumps({"art_checkpoint": "/gone/p/models/n/checkpoints/0001"}))
    return tmp / "ck"


def _no_weights(tmp):
    (tmp / "a").mkdir()
    (tmp / "a/adapter_config.json").write_text("{}")
    return tmp / "a"


@pytest.mark.parametrize("make, error, message", [
    (lambda tmp: tmp / "missing", FileNotFoundError, "is not a folder; expected a run folder"),
    (_empty_run, FileNotFoundError, "holds no LoRA adapter: expected a run folder"),
    (lambda tmp: tmp, FileNotFoundError, "holds no LoRA adapter"),
    (_no_adapter, FileNotFoundError, "newest checkpoint .*step-0001 holds no adapter/"),
    (_art_elsewhere, FileNotFoundError, "points at ART's LoRA folder /gone.*pass --adapter"),
    (_no_weights, FileNotFoundError, "no adapter_model.safetensors"),
])
def test_find_adapter_says_what_it_expected(make, error, message, tmp_path):
    with pytest.raises(error, match=message):
        find_adapter(make(tmp_path))


# ---- merge_adapter ---------------------------------------------------------------------
def check_merged(out: Path, lora, base_dir: Path) -> None:
    merged = AutoModelForCausalLM.from_pretrained(out, **dtype_kwarg(torch.float32)).eval()
    got = logits(merged)
    assert (got - lora.peft).abs().max() < 1e-4 < 1e-2 < (got - lora.base).abs().max()  # merged, not the base
    assert not any("lora" in k for k in merged.state_dict())
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(base_dir).chat_template


@pytest.mark.parametrize("layout", ["portable run", "art run"])
def test_merge_gives_the_peft_models_logits(layout, lora, base_dir, tmp_path):
    given, _ = LAYOUTS[layout](lora, tmp_path, base_dir)
    out = merge_adapter(given, tmp_path / "merged")
    check_merged(out, lora, base_dir)
    assert not list(tmp_path.glob("merged.tmp-*"))  # atomic: the temporary sibling was renamed


def test_model_overrides_a_missing_recorded_base(lora, base_dir, tmp_path):
    adapter = copy_adapter(lora, tmp_path / "a", base_model_name_or_path=str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="cannot load base model .*gone.*--model"):
        merge_adapter(adapter, tmp_path / "merged")
    check_merged(merge_adapter(adapter, tmp_path / "merged", base_model=str(base_dir)), lora, base_dir)


@pytest.mark.parametrize("dtype, expected", [("auto", torch.float32), ("bfloat16", torch.bfloat16)])
def test_merge_dtype(dtype, expected, lora, base_dir, tmp_path):
    out = merge_adapter(copy_adapter(lora, tmp_path / "a"), tmp_path / "m", dtype=dtype)
    assert AutoModelForCausalLM.from_pretrained(out, **dtype_kwarg("auto")).dtype == expected


@pytest.mark.parametrize("out, base, message", [
    ("a", None, "would replace the adapter"),
    ("m", None, "records no base model; pass base_model="),
])
def test_merge_refuses(out, base, message, lora, tmp_path):
    adapter = copy_adapter(lora, tmp_path / "a", base_model_name_or_path=base)
    with pytest.raises(ValueError, match=message):
        merge_adapter(adapter, tmp_path / out)
    assert (adapter / "adapter_model.safetensors").is_file()


def test_merge_onto_another_base_says_so(lora, base_dir, tmp_path):
    config = LlamaConfig.from_pretrained(base_dir)
    config.hidden_size, config.intermediate_size = 48, 96
    LlamaForCausalLM(config).save_pretrained(tmp_path / "other")
    shutil.copy(base_dir / "tokenizer.json", tmp_path / "other")
    shutil.copy(base_dir / "tokenizer_config.json", tmp_path / "other")
    with pytest.raises(ValueError, match="does not fit base model .*other.*--model"):
        merge_adapter(copy_adapter(lora, tmp_path / "a"), tmp_path / "m", base_model=str(tmp_path / "other"))


def quantizer(method):
    return types.SimpleNamespace(quantization_config=types.SimpleNamespace(quant_method=method))


def test_never_merges_onto_quantized_weights_but_takes_dequantized_gguf(base_dir):
    """Stand-ins for transformers' hf_quantizer: bitsandbytes needs CUDA, a GGUF-loaded model a .gguf file."""
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    model.hf_quantizer = quantizer(QuantizationMethod.BITS_AND_BYTES)
    with pytest.raises(ValueError, match="bitsandbytes quantized weights; merge onto the 16-bit base"):
        _unquantized(model, "x")
    model.hf_quantizer = quantizer(QuantizationMethod.GGUF)
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": "x.gguf", "dequantize": False}
    clean = _unquantized(model, "x")
    assert getattr(clean, "hf_quantizer", None) is None and torch.equal(logits(clean.eval()), logits(model.eval()))
    # the export's config.json must not say GGUF: transformers would reload it as GGUF-quantized (found by review)
    assert getattr(clean.config, "quantization_config", None) is None


def test_merge_never_deletes_files_it_did_not_write(lora, tmp_path):
    """`--merged DIR` replaced DIR whole: a folder holding notes.txt and ollama/ lost both (found by review)."""
    adapter = copy_adapter(lora, tmp_path / "a")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="notes.txt.*choose an empty or new folder"):
        merge_adapter(adapter, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    out = merge_adapter(adapter, tmp_path / "m")
    assert merge_adapter(adapter, out) == out  # a previous export is replaced


# ---- loading for eval, and the CLI -----------------------------------------------------------
def test_load_with_adapter_takes_an_art_run(lora, base_dir, tmp_path):
    given, _ = LAYOUTS["art run"](lora, tmp_path, base_dir)
    model = load_with_adapter(AutoModelForCausalLM.from_pretrained(base_dir).eval(), given)
    assert (logits(model) - lora.peft).abs().max() < 1e-5


def test_eval_policy_takes_a_run_folder_and_its_recorded_base(lora, base_dir, tmp_path):
    given, _ = LAYOUTS["portable run"](lora, tmp_path, base_dir)
    policy = load_policy(adapter=str(given))  # what eval/rollout/serve --adapter build (cli._policy, cmd_serve)
    assert isinstance(policy.model, PeftModel) and (logits(policy.model) - lora.peft).abs().max() < 1e-5


def test_cli_export_end_to_end(lora, base_dir, tmp_path, capsys):
    run = tmp_path / "run"
    art_run(lora, run, base_dir)
    assert cli.main(["export", "--run", str(run), "--merged", str(tmp_path / "merged"), "--dtype", "float32"]) == 0
    assert "merged model:" in capsys.readouterr().out
    check_merged(tmp_path / "merged", lora, base_dir)
    adapter = copy_adapter(lora, tmp_path / "a", base_model_name_or_path=None)
    assert cli.main(["export", "--adapter", str(adapter), "--model", str(base_dir), "--merged", str(tmp_path / "m2")]) == 0
    check_merged(tmp_path / "m2", lora, base_dir)


@pytest.mark.parametrize("args, message", [
    (["--run", "{tmp}/nothing"], "error: {tmp}/nothing is not a folder"),
    (["--adapter", "{tmp}"], "error: {tmp} holds no LoRA adapter"),
])
def test_cli_export_errors_are_one_line(args, message, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MCP_RL_DEBUG", raising=False)
    fill = [a.format(tmp=tmp_path) for a in args]
    assert cli.main(["export", *fill, "--merged", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message.format(tmp=tmp_path)) and err.count("\n") == 1


def test_cli_export_needs_exactly_one_input(tmp_path):
    with pytest.raises(SystemExit) as e:  # the old `--run R --adapter OUT` (write the adapter) is gone
        cli.main(["export", "--run", str(tmp_path), "--adapter", str(tmp_path / "out"), "--merged", str(tmp_path / "m")])
    assert e.value.code == 2


def test_cli_export_writes_gguf_and_an_ollama_modelfile(lora, base_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    portable_run(lora, run)
    assert cli.main(["export", "--run", str(run), "--ollama", str(tmp_path / "ollama"), "--quant", "f16",
                     "--dtype", "float32", "--name", "sql-agent"]) == 0
    out = capsys.readouterr().out
    assert "(temporary)" in out and "ollama create sql-agent -f" in out and "llama f16" in out
    assert (tmp_path / "ollama" / "Modelfile").read_text().startswith("FROM ./agent.gguf\n")
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "ollama", gguf_file="agent.gguf", **dtype_kwarg(torch.float32))
    assert torch.allclose(logits(back), lora.peft, atol=5e-3)  # the GGUF is the merged model


def test_cli_export_needs_something_to_write(lora, tmp_path, capsys):
    run = tmp_path / "run"
    portable_run(lora, run)
    assert cli.main(["export", "--run", str(run)]) == 2
    assert "nothing to write" in capsys.readouterr().err


# ---- an adapter is used only as it was saved (mcp_rl/training/manifest.py) -------------------------
def zero_tail(path: Path, n: int = 256) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-n] + b"\0" * n)


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1000])


def damaged_run(lora, tmp, base, layout, damage, manifest=True):
    from mcp_rl.training.manifest import write_manifest

    given, adapter = LAYOUTS[layout](lora, tmp, base)
    if manifest and layout.startswith("art"):
        write_manifest(tmp / "run/checkpoints/step-0003", art_checkpoint=adapter)
    elif manifest:
        write_manifest(adapter.parent)
    damage(adapter / "adapter_model.safetensors")
    return given


@pytest.mark.parametrize("layout", ["portable run", "art run", "portable checkpoint"])
@pytest.mark.parametrize("damage, manifest, says", [
    (zero_tail, True, "is not the file saved"), (cut, True, "bytes, not the"), (cut, False, "header says"),
])
def test_find_adapter_refuses_an_adapter_that_is_not_as_saved(layout, damage, manifest, says, lora, base_dir, tmp_path):
    from mcp_rl.training.manifest import CheckpointCorrupt

    given = damaged_run(lora, tmp_path, base_dir, layout, damage, manifest)
    with pytest.raises(CheckpointCorrupt, match=f"adapter_model.safetensors .*{says}"):
        find_adapter(given)


def test_an_intact_adapter_with_its_manifest_is_found(lora, base_dir, tmp_path):
    assert find_adapter(damaged_run(lora, tmp_path, base_dir, "art run", lambda p: None)).name == "0003"


@pytest.mark.parametrize("command", [
    ["export", "--run", "{run}", "--merged", "{tmp}/m"],
    ["serve", "--adapter", "{run}"],  # the base the adapter records, then the adapter
    ["serve", "--adapter", "{run}", "--model", "{base}"],  # the base given: the adapter is checked as it loads
    ["eval", "--adapter", "{run}", "--server", "company"],
])
def test_cli_commands_print_a_damaged_adapter_as_one_line(command, lora, base_dir, tmp_path, capsys, monkeypatch):
    from mcp_rl.ship import serve

    monkeypatch.delenv("MCP_RL_DEBUG", raising=False)
    monkeypatch.setattr(serve, "serve_policy", lambda *a, **k: pytest.fail("served a damaged adapter"))
    run = damaged_run(lora, tmp_path, base_dir, "portable run", zero_tail)
    args = [c.format(run=run, tmp=tmp_path, base=base_dir) for c in command]
    assert cli.main(args) == 2
    err = capsys.readouterr().err  # (a loading bar may come first, from loading the --model base)
    last = err.splitlines()[-1]
    assert last.startswith("error: ") and "adapter_model.safetensors is not the file saved" in last
    assert "Traceback" not in err and err.count("error:") == 1
