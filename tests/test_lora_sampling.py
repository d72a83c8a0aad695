"""Sampling through LoRA layers as two products with the scaled add fused (training/kernels.lora_sampling,
LocalPolicy(fused_lora=True)): the same logits as peft's path, fewer ops a decode step, nothing left patched."""

import asyncio
import sys
import threading
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from mcp_rl.policies.local_policy import LocalPolicy
from mcp_rl.policies.models import load_local_tokenizer, tiny_llama
from mcp_rl.training import kernels
from test_local_policy import CONVERSATIONS, ids_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "speed"))
from profile_decode import Ops  # noqa: E402  (the op count the bench prints)


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


def lora_model(tok, dtype=torch.float32):
    """The tiny Llama with LoRA on every linear layer and lora_B moved off zero, so the adapter changes the logits."""
    model = get_peft_model(tiny_llama(tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")).to(dtype)
    torch.manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model.eval()


def test_fused_sampling_gives_peft_logits_with_fewer_ops_and_restores_the_layers(tok):
    model = lora_model(tok)
    ids = torch.tensor([tok.encode("a question about the company", add_special_tokens=False)])
    with torch.inference_mode():
        base = model.get_base_model()
        with model.disable_adapter():
            plain = base(ids).logits
        with Ops() as peft_ops:
            want = model(ids).logits
        with kernels.lora_sampling(model, on=True) as layers, Ops() as fused_ops:
            got = model(ids).logits
        again = model(ids).logits
    assert layers == 2 * 7  # every projection of both layers
    assert not torch.allclose(want, plain, atol=1e-3)  # the adapter matters here
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # peft: two products, the scale and the add a layer; fused: the two products (the scale and add in the second)
    assert sum(peft_ops.count.values()) - sum(fused_ops.count.values()) == 2 * layers
    assert torch.equal(again, want) and not any("forward" in vars(m) for m in model.modules())


def test_a_lever_acts_only_in_the_thread_that_entered_it(tok):
    """A rollout thread decoding through fused layers while the main thread trains the same model (the tutorial's CI
    run did): the training forward takes peft's path and every LoRA weight gets its gradient; and the update's fused
    add, entered by the trainer, leaves a sampling thread on peft's path."""
    model = lora_model(tok)
    ids = torch.tensor([tok.encode("which department has the most employees", add_special_tokens=False)])
    with Ops() as alone:
        model(ids)
    entered, leave, seen = threading.Event(), threading.Event(), {}

    def sampler():
        with torch.inference_mode(), kernels.lora_sampling(model, on=True) as layers:
            seen["layers"] = layers
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=sampler)
    thread.start()
    try:
        assert entered.wait(30) and seen["layers"] == 14
        with Ops() as ops:
            logits = model(ids).logits
        logits.float().pow(2).mean().backward()
        assert ops.count == alone.count  # peft's own ops, not the sampler's
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_" in n)
    finally:
        leave.set()
        thread.join()
    assert not any("forward" in vars(m) for m in model.modules())

    box = {}
    with kernels.lora_fused_add(model, on=True) as fused:  # the trainer's lever; a sampler thread meanwhile
        thread = threading.Thread(target=lambda: box.update(logits=model(ids).logits.detach()))
        thread.start()
        thread.join()
    assert fused == 14 and torch.equal(box["logits"], model(ids).logits.detach())
    assert not any("forward" in vars(m) for m in model.modules())


def test_off_or_training_dropout_leaves_peft_path(tok):
    model = lora_model(tok)
    with kernels.lora_sampling(model, on=False) as layers:
        assert layers == 0
    drop = get_peft_model(tiny_llama(tok), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules="all-linear"))
    drop.train()  # a dropout that acts is peft's to apply
    with torch.no_grad(), kernels.lora_sampling(drop, on=True) as layers:
        assert layers == 0
    drop.eval()
    with torch.no_grad(), kernels.lora_sampling(drop, on=True) as layers:
        assert layers == 14
    with pytest.raises(RuntimeError, match="lora_sampling is for sampling"):  # with gradients it would train nothing
        with kernels.lora_sampling(drop, on=True):
            pass
    assert not any("forward" in vars(m) for m in drop.modules())


def test_nested_levers_in_one_thread_give_each_other_back(tok):
    """The sampling lever entered inside the fused add (one thread): inside, sampling's forward; after, the fused
    add's again, with fewer ops than peft's; after both, peft's own layers."""
    model = lora_model(tok)
    ids = torch.tensor([tok.encode("list the tables", add_special_tokens=False)])
    layer = next(m for m in model.modules() if kernels.fusable(m))
    running = lambda: kernels._ACTIVE.layers[id(layer)][0]  # noqa: E731  (this thread's forward for the layer)
    with Ops() as peft:
        model(ids)
    with torch.no_grad(), kernels.lora_fused_add(model, on=True):
        with kernels.lora_sampling(model, on=True):
            assert running() is kernels._sampling_forward
        assert running() is kernels._fused_forward
        with Ops() as after:
            model(ids)
    assert sum(after.count.values()) < sum(peft.count.values())
    assert id(layer) not in kernels._ACTIVE.layers and not any("forward" in vars(m) for m in model.modules())


def test_bf16_factors_round_as_the_update_autocast_does(tok):
    """In bf16 the factors are bf16 copies (as the update's autocast casts them): logits within bf16 rounding of
    peft's float32 adapter path, and the LoRA weights themselves untouched float32."""
    model = lora_model(tok).to(torch.bfloat16)
    plain = model.get_base_model()  # for the adapter's own size below
    for name, p in model.named_parameters():  # bf16 base weights, float32 LoRA: what the trainer builds on a GPU
        if "lora_" in name:
            p.data = p.data.float()
    ids = torch.tensor([tok.encode("how many employees", add_special_tokens=False)])
    with torch.inference_mode():
        want = model(ids).logits.float()
        with kernels.lora_sampling(model, on=True):
            got = model(ids).logits.float()
        with model.disable_adapter():
            bare = plain(ids).logits.float()
    assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)
    assert (got - want).abs().max() <= 0.05 * (want - bare).abs().max()  # rounding, far below the adapter's effect


async def test_a_fused_policy_samples_what_the_plain_one_does(tok):
    """Greedy batched turns: the same tokens, log-probs equal to float32 rounding."""
    model = lora_model(tok)
    out = []
    for fused in (False, True):
        policy = LocalPolicy(model, tok, fused_lora=fused)
        out.append(await asyncio.gather(*[policy.complete(m, [], max_tokens=8, temperature=0) for m in CONVERSATIONS]))
    for plain, fused in zip(*out):
        assert ids_of(fused) == ids_of(plain)
        assert [t.logprob for t in fused.logprobs.content] == pytest.approx(
            [t.logprob for t in plain.logprobs.content], abs=1e-4)


def test_the_decode_profile_counts_fewer_ops_with_fused_layers(tmp_path):
    """bench/speed/profile_decode.py on a CPU: a row per mode, the fused mode's step has fewer ops than LoRA's."""
    import profile_decode

    out = tmp_path / "decode.txt"
    assert profile_decode.main(["--shape", "tiny", "--rows", "3", "--width", "24", "--new", "6",
                                "--modes", "base", "lora", "lora+fused", "--out", str(out)]) == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in out.read_text().splitlines()
            if line.startswith("| ") and "mode" not in line}
    assert list(rows) == ["base", "lora", "lora+fused"]
    ops = {mode: int(cells[3]) for mode, cells in rows.items()}
    assert ops["base"] < ops["lora+fused"] < ops["lora"]
