"""The GRPO update's speed levers (mcp_rl/training/kernels.py): the same update with each on, where it can run on a
CPU; a clear refusal where it cannot; their config switches."""

import copy
import sys
import types

import art
import pytest
import torch

from mcp_rl.runs.config import TrainConfig
from mcp_rl.training import kernels
from mcp_rl.training.portable import PortableTrainer
from test_train import BAD, GOOD, lora_weights, trajectory


@pytest.fixture(scope="module")
def tiny():
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama

    tok = load_local_tokenizer()
    return tiny_llama(tok, max_position_embeddings=512), tok


def groups_of(model, tok):
    return [art.TrajectoryGroup([trajectory(model, tok, GOOD, 1.0), trajectory(model, tok, BAD, 0.0)]),
            art.TrajectoryGroup([trajectory(model, tok, "No.", 0.0), trajectory(model, tok, GOOD + " " + BAD, 1.0)])]


def casts_in(fn) -> int:
    """Real dtype copies (aten::_to_copy) that `fn` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.name == "aten::_to_copy" for e in prof.events())


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
@pytest.mark.parametrize("packed", [False, True])
def test_lora_inputs_left_in_the_autocast_dtype_give_the_same_step_bit_for_bit(tiny, precision, dtype, packed):
    """A whole train_step with bf16 (or fp16 with its loss scaler, a T4's path) weights and autocast: the same loss,
    gradient norm and LoRA weights with the lever as without, with fewer dtype copies; the weights stay float32."""
    model, tok = tiny
    groups = groups_of(model, tok)
    out = []
    for lever in (False, True):
        torch.manual_seed(1)
        trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model).to(dtype), tokenizer=tok, step=0),
                                  learning_rate=1e-2, precision=precision, max_seq_len=512, packed=packed,
                                  micro_batch_tokens=10**6 if packed else 0, lora_no_upcast=lever)
        assert all(p.dtype == torch.float32 for p in trainer.params)
        box, before = {}, lora_weights(trainer.model)
        casts = casts_in(lambda: box.update(trainer.train_step(groups)))
        out.append((box, lora_weights(trainer.model), casts))
        assert any(not torch.equal(before[n], p) for n, p in out[-1][1].items())  # the step moved the weights
    (m0, w0, c0), (m1, w1, c1) = out
    assert m0["updated"] == m1["updated"] == 1 and m0["skipped_steps"] == m1["skipped_steps"] == 0
    assert m1["loss"] == m0["loss"] and m1["grad_norm"] == m0["grad_norm"]
    assert w0.keys() == w1.keys() and all(torch.equal(w1[n], w0[n]) for n in w0)
    # 2 layers x 7 LoRA layers each skip peft's float32 copy and autocast's copy back; in backward both copies'
    # gradients too, but for the first layer's q/k/v, whose input (the frozen embeddings, normed) needs none
    assert c0 - c1 >= 2 * 14 + 2 * 11, (c0, c1)


def scaled_and_added(fn) -> tuple[int, int]:
    """(multiplies of a [B, T, N] activation by a scalar, forward adds of two [B, T, N] activations) `fn` runs:
    LoRA's `* scaling` (forward and backward) and its `result + ...` (forward) among them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    ops = [(e.name, e.input_shapes[:2], "evaluate_function" in getattr(e.cpu_parent, "name", ""))
           for e in prof.events() if e.name in ("aten::mul", "aten::add")]
    muls = sum(n == "aten::mul" and len(s[0]) == 3 and s[1] == [] for n, s, _ in ops)
    adds = sum(n == "aten::add" and len(s[0]) == 3 and s[0] == s[1] and not backward for n, s, backward in ops)
    return muls, adds


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_lora_scaled_add_inside_its_product_gives_the_same_step_within_rounding(tiny, precision, dtype):
    """LoRA's `result + lora_B(lora_A(x)) * scaling` as one addmm: the loss, gradient norm and LoRA weights of a
    packed step within half-precision rounding of peft's, without the multiply and add; peft's forward back after."""
    from peft.tuners.lora.layer import Linear

    model, tok = tiny
    groups = groups_of(model, tok)
    out = []
    for lever in (False, True):
        torch.manual_seed(1)
        trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model).to(dtype), tokenizer=tok, step=0),
                                  learning_rate=1e-2, precision=precision, max_seq_len=512, packed=True,
                                  micro_batch_tokens=10**6, lora_fused_add=lever)
        layers = [m for m in trainer.model.modules() if isinstance(m, Linear)]
        assert len(layers) == 14 and all(kernels.fusable(m) for m in layers)
        box = {}
        n = scaled_and_added(lambda: box.update(trainer.train_step(groups)))
        assert all("forward" not in vars(m) for m in layers)  # the instance forward is gone after the update
        out.append((box, lora_weights(trainer.model), n))
    (m0, w0, n0), (m1, w1, n1) = out
    assert m1["updated"] == 1 and m1["skipped_steps"] == 0
    assert m1["loss"] == pytest.approx(m0["loss"], rel=2e-2, abs=1e-4) and m1["loss"] != 0
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=5e-2)
    for k in w0:  # one step of lr 1e-2 from the same start: the moves agree to rounding
        torch.testing.assert_close(w1[k], w0[k], rtol=0, atol=2e-3)
    # 14 LoRA layers: a scalar multiply in forward and one in backward, an add in forward, each gone
    assert n1[0] <= n0[0] - 2 * 14 and n1[1] <= n0[1] - 14, (n0, n1)


@pytest.mark.parametrize("precision, off", [("fp32", False), ("bf16", True)])
def test_the_lever_turns_peft_casting_off_only_under_autocast_and_only_during_the_update(tiny, precision, off):
    """Without autocast a bf16 input must meet float32 LoRA weights through peft's cast, and sampling (no
    autocast) needs it always: the lever is off in fp32 and outside `levers()`."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    model, tok = tiny
    trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                              precision=precision, lora_no_upcast=True)
    layers = [m for m in trainer.model.modules() if isinstance(m, BaseTunerLayer)]
    assert len(layers) == 14 and all(m.cast_input_dtype_enabled for m in layers)
    with trainer.levers():
        assert all(m.cast_input_dtype_enabled is not off for m in layers)
    assert all(m.cast_input_dtype_enabled for m in layers)


def test_liger_kernels_on_a_cpu_refuse_to_start_saying_why(tiny):
    model, tok = tiny
    with pytest.raises(RuntimeError, match=r"CUDA GPUs; the model is on cpu: set train.liger_kernels=false"):
        PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0), liger_kernels=True)
    assert PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0)).liger == []


def test_liger_patches_this_model_only_and_says_what(tiny, monkeypatch):
    """Where liger-kernel is installed (the `gpu` extra): its norm and MLP forwards in this model (LoRA layers kept),
    transformers' classes put back for models built later, RoPE module-wide. Only the patching: the kernels run on
    CUDA, so readiness is faked here."""
    pytest.importorskip("liger_kernel.transformers.monkey_patch")
    from transformers.models.llama import modeling_llama as ml

    rope, norm, mlp = ml.apply_rotary_pos_emb, ml.LlamaRMSNorm, ml.LlamaMLP
    monkeypatch.setattr(kernels, "liger_ready", lambda device: "")
    monkeypatch.setattr(ml, "apply_rotary_pos_emb", rope)  # put back after the test
    model = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(tiny[0]), tokenizer=tiny[1], step=0)).model
    assert kernels.apply_liger(model) == ["rms_norm", "swiglu", "rope"]
    layer = model.get_base_model().model.layers[0]
    assert "Liger" in layer.input_layernorm.forward.__qualname__ and "Liger" in layer.mlp.forward.__qualname__
    assert type(layer.mlp.gate_proj).__module__.startswith("peft")
    assert ml.LlamaRMSNorm is norm and ml.LlamaMLP is mlp and kernels.rope_is_liger(model)


def test_liger_missing_on_a_gpu_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", None)  # import fails
    assert "pip install 'mcp-rl[gpu]'" in kernels.liger_ready(torch.device("cuda"))
    assert "set train.liger_kernels=false" in kernels.liger_ready(torch.device("cpu"))


@pytest.mark.parametrize("values, error", [
    ({"lora_no_upcast": True}, None),
    ({"liger_kernels": True}, None),
    ({"lora_fused_add": True}, None),
    ({"lora_fused_add": True, "loader": "unsloth"}, None),  # inert there (Unsloth's own LoRA kernels)
    ({"lora_no_upcast": True, "backend": "art", "max_seq_len": 8192, "logprob_chunk_size": 1024}, None),
    ({"liger_kernels": "yes"}, "train.liger_kernels must be true or false"),
    ({"lora_no_upcast": "yes"}, "train.lora_no_upcast must be true or false"),
    ({"liger_kernels": True, "loader": "unsloth"}, "train.liger_kernels is a switch of the portable trainer"),
    ({"liger_kernels": True, "backend": "art", "max_seq_len": 8192, "logprob_chunk_size": 1024},
     "train.liger_kernels is a switch of the portable trainer"),
])
def test_the_switches_are_checked_like_every_field(values, error):
    if error is None:
        cfg = TrainConfig(**values)
        assert all(getattr(cfg, k) is v for k, v in values.items())
        default = TrainConfig()  # the LoRA levers on since measured on an H100 (1.20x, 1.26x); Liger asked for
        assert default.lora_no_upcast and default.lora_fused_add and not default.liger_kernels
    else:
        with pytest.raises(ValueError, match=error):
            TrainConfig(**values)


def test_build_trainer_passes_the_switches_on(tiny, monkeypatch):
    from mcp_rl.runs import parts
    from mcp_rl.runs.config import preset

    cfg = preset("cpu")
    cfg.train.lora_no_upcast = cfg.train.lora_fused_add = True
    monkeypatch.setattr(parts, "check_install", lambda cfg: None)
    trainer = parts.build_trainer(cfg, model=(copy.deepcopy(tiny[0]), tiny[1]))
    assert trainer.lora_no_upcast is True and trainer.lora_fused_add is True
    cfg.train.liger_kernels = True
    with pytest.raises(RuntimeError, match="liger"):
        parts.build_trainer(cfg, model=(copy.deepcopy(tiny[0]), tiny[1]))


def test_the_lever_bench_runs_each_lever_beside_new_and_records_what_ran(tmp_path, capsys):
    """bench/speed/bench_update.py --levers on a CPU (bf16 autocast): new, new + each lever, new + all, one row each
    per repetition, the same loss, and what ran in every row; Liger asked for on a CPU stops it before timing."""
    import json
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "speed"))
    import bench_update

    out = tmp_path / "rows.jsonl"
    assert bench_update.main(["--shape", "tiny", "--seqs", "6", "--mean-len", "50", "--longest", "90", "--reps", "1",
                              "--precision", "bf16", "--levers", "lora-casts", "fused-add", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({r["mode"] for r in rows}) == ["new", "new+all", "new+fused-add", "new+lora-casts"]
    ran = {r["mode"]: r["levers_ran"] for r in rows}
    assert ran["new"]["packed"] and not ran["new"]["lora_no_upcast"] and not ran["new"]["lora_fused_layers"]
    assert ran["new+lora-casts"]["lora_no_upcast"] and ran["new+fused-add"]["lora_fused_layers"] == 14
    assert ran["new+all"]["lora_no_upcast"] and ran["new+all"]["lora_fused_layers"] == 14
    assert max(r["loss"] for r in rows) == pytest.approx(min(r["loss"] for r in rows), rel=1e-2)
    assert "within bf16 rounding" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_update.main(["--shape", "tiny", "--levers", "liger"])
    assert "need a CUDA GPU" in capsys.readouterr().err
