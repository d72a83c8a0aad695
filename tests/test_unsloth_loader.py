"""Tests for mcp_rl/policies/unsloth_loader.py on a CPU (no Unsloth installed, no GPU).

    .venv/bin/python -m pytest tests/test_unsloth_loader.py -q

What a CPU can check: the one-line errors where Unsloth is missing or cannot run, the config
option, and UnslothPolicy's decode (transformers' generate with the logprob recorder) against
LocalPolicy's on a tiny random Llama. For the last, a stand-in `unsloth` module supplies
FastLanguageModel.for_inference / for_training (the only Unsloth calls the sampler makes): it
stands at the import boundary and says so. The real Unsloth path runs on the GPU machine
(bench/speed/bench_unsloth.py, bench/RESULTS.md).
"""

import math
import sys
import types

import pytest
import torch

from mcp_rl.runs.config import TrainConfig
from mcp_rl.policies.local_policy import LocalPolicy, load_local_tokenizer
from mcp_rl.policies.unsloth_loader import UnslothPolicy, UnslothUnavailable, import_unsloth, load_unsloth_model

MESSAGES = [{"role": "system", "content": "You answer with tools."}, {"role": "user", "content": "How many rows?"}]


def test_no_cuda_gives_one_clear_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UnslothUnavailable) as e:
        load_unsloth_model("smollm2")
    msg = str(e.value)
    assert "\n" not in msg and "CUDA GPU" in msg and "train.loader=transformers" in msg


def test_missing_unsloth_gives_one_clear_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "unsloth", None)  # what `import unsloth` sees where it is not installed
    with pytest.raises(UnslothUnavailable) as e:
        import_unsloth()
    msg = str(e.value)
    assert "\n" not in msg and "Unsloth is not installed" in msg and "mcp-rl[unsloth]" in msg


def test_unusable_unsloth_gives_one_clear_line(monkeypatch):
    class Broken(types.ModuleType):
        def __getattr__(self, name):
            raise AttributeError(name)

    def fail(*a, **k):
        raise NotImplementedError("Unsloth cannot find any torch accelerator?\nmore lines")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delitem(sys.modules, "unsloth", raising=False)
    real_import = __builtins__["__import__"] if isinstance(__builtins__, dict) else __builtins__.__import__
    monkeypatch.setattr("builtins.__import__", lambda name, *a, **k: fail() if name == "unsloth" else real_import(name, *a, **k))
    with pytest.raises(UnslothUnavailable) as e:
        import_unsloth()
    assert "\n" not in str(e.value) and "NotImplementedError: Unsloth cannot find any torch accelerator?" in str(e.value)


@pytest.mark.parametrize("kwargs, needle", [
    ({"loader": "vllm"}, "train.loader must be"),
    ({"loader": "unsloth", "backend": "art"}, "portable backend's loader"),
])
def test_config_checks_the_loader(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        TrainConfig(**kwargs)
    assert TrainConfig(loader="unsloth").loader == "unsloth" and TrainConfig().loader == "transformers"


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


@pytest.fixture()
def fake_unsloth(monkeypatch):
    """Stand-in for the `unsloth` package at the import boundary: records the mode switches."""
    calls = []
    fast = types.SimpleNamespace(for_inference=lambda m: calls.append("inference") or m,
                                 for_training=lambda m, use_gradient_checkpointing=True: calls.append(
                                     ("training", use_gradient_checkpointing)) or m)
    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=fast))
    return calls


def tiny(tok):
    from mcp_rl.policies.models import tiny_llama

    return tiny_llama(tok, max_position_embeddings=256)


def ids_of(choice):
    return [int(t.token.split(":")[1]) for t in choice.logprobs.content]


@pytest.mark.parametrize("tool_prefix", [False, True])
async def test_greedy_turns_match_the_local_policy(tok, fake_unsloth, tool_prefix):
    model = tiny(tok)
    model._mcp_rl_checkpointing = "unsloth"
    ours = UnslothPolicy(model, tok, tool_prefix=tool_prefix)
    ref = LocalPolicy(model, tok, tool_prefix=tool_prefix, cuda_graph=False)
    a = await ours.complete(MESSAGES, [], max_tokens=12, temperature=0.0)
    b = await ref.complete(MESSAGES, [], max_tokens=12, temperature=0.0)
    assert ids_of(a) == ids_of(b) and a.message.content == b.message.content
    for x, y in zip(a.logprobs.content, b.logprobs.content):
        assert math.isclose(x.logprob, y.logprob, abs_tol=1e-4)
    # each batch goes to inference mode and back to training with the checkpointing mode it had
    assert fake_unsloth == ["inference", ("training", "unsloth")] and model.training is False
    assert model.config.use_cache is False


async def test_concurrent_sampled_turns_are_batched_with_finite_logprobs(tok, fake_unsloth):
    import asyncio

    policy = UnslothPolicy(tiny(tok), tok, batch_wait_s=0.2)
    choices = await asyncio.gather(*(policy.complete(MESSAGES, [], max_tokens=8, temperature=1.0) for _ in range(3)))
    assert policy.generate_calls == 1 and policy.last_batch_size == 3
    for c in choices:
        assert 1 <= len(c.logprobs.content) <= 8
        assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in c.logprobs.content)


def test_t4_unsloth_preset_is_the_t4_preset_on_the_portable_trainer():
    from mcp_rl.runs.config import preset

    light, art = preset("t4-unsloth"), preset("t4")
    assert (light.train.backend, light.train.loader, light.load_in_4bit) == ("portable", "unsloth", True)
    assert light.model == art.model and light.rollout.max_turns == art.rollout.max_turns


def test_pipeline_without_cuda_stops_with_the_one_line(monkeypatch):
    from mcp_rl.runs.config import preset
    from mcp_rl.runs.parts import build_trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UnslothUnavailable, match="needs a CUDA GPU"):
        build_trainer(preset("t4-unsloth"))


def test_import_unsloth_if_used_imports_only_for_the_unsloth_loader(monkeypatch):
    """The step the CLI's train, notebook 01 and learning_proof.py each wrote out; one builder now."""
    from types import SimpleNamespace as NS

    from mcp_rl.policies import unsloth_loader

    calls = []
    monkeypatch.setattr(unsloth_loader, "import_unsloth", lambda: calls.append(1))
    unsloth_loader.import_unsloth_if_used(NS(train=NS(loader="transformers")))
    assert calls == []
    unsloth_loader.import_unsloth_if_used(NS(train=NS(loader="unsloth")))
    assert calls == [1]


def test_unsloth_policy_refuses_join():
    """Continuous batching needs LocalPolicy's own decode step; Unsloth decodes through its generate."""
    with pytest.raises(ValueError, match="leave policy_join off"):
        UnslothPolicy(None, None, join=True)
