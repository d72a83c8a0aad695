"""Tests for mcp_rl/training/loss.py: the GRPO loss by hand-computed values, and the chunked log-probabilities.

    .venv/bin/python -m pytest tests/test_loss.py -q
"""

import contextlib
import math

import pytest
import torch

from mcp_rl.training.loss import backbone_and_head, chunked_logprobs, grpo_loss

# ---- grpo_loss: hand-computed values ------------------------------------------------
ON_POLICY = dict(new=torch.zeros(2, 3), old=torch.zeros(2, 3), adv=torch.tensor([1.0, -1.0]),
                 mask=torch.tensor([[1.0, 1, 1], [1, 0, 0]]))


@pytest.mark.parametrize("kind, constant, expected", [
    # token losses: row 0 = -1,-1,-1 ; row 1 = +1 (one token)
    ("dr_grpo", None, (-3 + 1) / 6),    # summed, divided by B*T
    ("dr_grpo", 100.0, (-3 + 1) / 100),  # the trainer's max_seq_len * sequences
    ("grpo", None, (-1 + 1) / 2),       # per-sequence means (-1, +1), averaged
    ("grpo", 4.0, (-1 + 1) / 4),
])
def test_grpo_loss_on_policy_values(kind, constant, expected):
    loss = grpo_loss(ON_POLICY["new"], ON_POLICY["old"], ON_POLICY["adv"], ON_POLICY["mask"], kind=kind, constant=constant)
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("ratio, adv, token_loss", [
    (1.5, 1.0, -1.2),   # gain is clipped at 1 + eps
    (1.5, -1.0, 1.5),   # pessimistic side: not clipped
    (0.5, 1.0, -0.5),
    (0.5, -1.0, 0.8),   # clipped at 1 - eps
    (1.1, 1.0, -1.1),   # inside the trust region
])
def test_grpo_loss_clips_the_ratio(ratio, adv, token_loss):
    new, old = torch.tensor([[math.log(ratio)]]), torch.zeros(1, 1)
    loss = grpo_loss(new, old, torch.tensor([adv]), torch.ones(1, 1), kind="dr_grpo", epsilon=0.2)
    assert loss.item() == pytest.approx(token_loss, rel=1e-5)


def test_grpo_loss_gradient_is_the_policy_gradient_on_policy():
    new = torch.zeros(2, 3, requires_grad=True)
    grpo_loss(new, torch.zeros(2, 3), ON_POLICY["adv"], ON_POLICY["mask"], kind="dr_grpo", constant=10.0).backward()
    expected = -ON_POLICY["adv"].unsqueeze(-1) * ON_POLICY["mask"] / 10.0
    assert torch.allclose(new.grad, expected)


def test_grpo_loss_treats_unknown_old_logprobs_as_on_policy():
    new = torch.tensor([[-0.7, -2.0]])
    loss = grpo_loss(new, torch.tensor([[float("nan"), float("-inf")]]), torch.tensor([2.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-2.0 * 2 / 2)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_a_log_ratio_past_exps_range_gives_finite_gradients(adv):
    """A token 199 nats more likely to the trainer than to the sampler: exp overflows float32, and without
    the clamp the clipped branch's zero gradient times an infinite ratio is NaN, though the loss is finite."""
    new = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss = grpo_loss(new, torch.tensor([[-200.0, -1.0]]), torch.tensor([adv]), torch.ones(1, 2), constant=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    assert new.grad[0, 0] == 0 and new.grad[0, 1] == -adv  # the far token is left alone, the other trained


def test_grpo_loss_rejects_unknown_kind():
    with pytest.raises(ValueError, match="dr_grpo"):
        grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1), kind="ppo")


def test_chunked_logprobs_match_the_full_logits_and_their_gradient():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    ids = torch.randint(0, 300, (3, 20))
    backbone, head = backbone_and_head(model)
    hidden = backbone(input_ids=ids[:, :-1]).last_hidden_state[:, -12:]
    chunked = chunked_logprobs(head, hidden, ids[:, -12:], contextlib.nullcontext, chunk=7)  # chunks cross rows
    (grad_chunked,) = torch.autograd.grad(chunked.sum(), head.weight)
    full = model(input_ids=ids[:, :-1]).logits[:, -12:].log_softmax(-1).gather(-1, ids[:, -12:, None]).squeeze(-1)
    (grad_full,) = torch.autograd.grad(full.sum(), head.weight)
    assert torch.allclose(chunked, full, atol=1e-5) and torch.allclose(grad_chunked, grad_full, atol=1e-5)


def test_a_model_that_scales_its_logits_keeps_the_full_forward():
    """Granite divides its logits by `logits_scaling`, a key the old list did not name: the split path
    gave trainer logprobs up to 13.5 nats off the sampler's (found by review). The probe catches it."""
    from transformers import GraniteConfig, GraniteForCausalLM, LlamaConfig, LlamaForCausalLM

    shape = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2)
    torch.manual_seed(0)
    assert backbone_and_head(GraniteForCausalLM(GraniteConfig(logits_scaling=8.0, **shape))) is None
    assert backbone_and_head(LlamaForCausalLM(LlamaConfig(**shape))) is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger's Triton kernels need CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_liger_fused_logprobs_match_the_chunked_head_and_its_gradient(dtype):
    """The packed update's fused head (mcp_rl/training/packing.py) gives loss.py's chunked log-probs and hidden-state
    gradients, a 262k vocabulary like Gemma 3's, in the autocast dtypes the trainer runs (fp16: a T4)."""
    pytest.importorskip("liger_kernel")
    from mcp_rl.training.packing import fused_available, fused_logprobs

    assert fused_available(torch.device("cuda"))
    torch.manual_seed(0)
    head = torch.nn.Linear(640, 262144, bias=False, device="cuda")
    head.weight.data.mul_(0.5)
    hidden = torch.randn(3000, 640, device="cuda", requires_grad=True)
    targets = torch.randint(0, 262144, (3000,), device="cuda")
    cast = (lambda: torch.autocast("cuda", dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext
    weights = torch.randn(3000, device="cuda")
    with cast():
        fused = fused_logprobs(head, hidden, targets, None if dtype == torch.float32 else dtype, rows_per_chunk=512)
    (g_fused,) = torch.autograd.grad((fused * weights).sum(), hidden)
    chunked = chunked_logprobs(head, hidden[None], targets[None], cast)[0]
    (g_chunked,) = torch.autograd.grad((chunked * weights).sum(), hidden)
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}[dtype]
    torch.testing.assert_close(fused, chunked, rtol=tol, atol=tol)
    torch.testing.assert_close(g_fused.float(), g_chunked.float(), rtol=tol, atol=tol * float(g_chunked.abs().max()))
