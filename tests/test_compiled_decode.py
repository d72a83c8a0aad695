"""The one-token decode step through torch.compile (decoder.Decoder(compiled=True), LocalPolicy(compile_decode=True)):
the same greedy tokens as the uncompiled step, a second batch shape without a third compile, and a step that cannot
be compiled decodes uncompiled with a warning."""

import asyncio
import logging

import pytest
import torch

from mcp_rl.policies import decoder
from mcp_rl.policies.local_policy import LocalPolicy
from test_local_policy import CONVERSATIONS, ids_of
from test_lora_sampling import lora_model, tok  # noqa: F401  (the fixture)


def spy(monkeypatch) -> list:
    """Records, per decode step, whether it ran compiled."""
    seen, one = [], decoder.Decoder._one

    def recording(self):
        out = one(self)
        seen.append(self.compiled)
        return out

    monkeypatch.setattr(decoder.Decoder, "_one", recording)
    return seen


async def turns(policy, conversations):
    return await asyncio.gather(*[policy.complete(m, [], max_tokens=8, temperature=0) for m in conversations])


@pytest.mark.timeout(600)
async def test_a_compiled_decode_samples_what_the_uncompiled_one_does(tok, monkeypatch):  # noqa: F811
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    monkeypatch.setattr(decoder, "_COMPILED", None)
    model = lora_model(tok)
    seen = spy(monkeypatch)
    batches = (CONVERSATIONS[:2], CONVERSATIONS)  # rows and cache length both change: recompiled with both symbolic
    out = {}
    for compiled in (False, True):
        policy = LocalPolicy(model, tok, compile_decode=compiled)
        out[compiled] = [await turns(policy, b) for b in batches]
    assert seen and all(seen[len(seen) // 2:]) and not any(seen[: len(seen) // 2])
    for plain_batch, compiled_batch in zip(out[False], out[True]):
        for plain, compiled in zip(plain_batch, compiled_batch):
            assert ids_of(compiled) == ids_of(plain)
            assert [t.logprob for t in compiled.logprobs.content] == pytest.approx(
                [t.logprob for t in plain.logprobs.content], abs=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # compiled for real: one graph per shape
    policy = LocalPolicy(model, tok, compile_decode=True)
    await turns(policy, CONVERSATIONS[1:])  # a third shape: the symbolic graph serves it
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    await turns(policy, CONVERSATIONS[:1])  # one row: dynamo specialises a size of 1, one more graph
    await turns(policy, CONVERSATIONS[2:])  # another single row: that graph again
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3


async def test_a_step_that_fails_to_compile_decodes_uncompiled_with_a_warning(tok, monkeypatch, caplog):  # noqa: F811
    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler " + "x" * 500)

    calls = []
    monkeypatch.setattr(decoder, "_COMPILED", None)  # what the failure sets for the process is put back after
    monkeypatch.setattr(decoder, "_compiled_one_token", lambda: calls.append(1) or broken)
    seen = spy(monkeypatch)
    model = lora_model(tok)
    want = [await turns(LocalPolicy(model, tok), b) for b in (CONVERSATIONS, CONVERSATIONS[1:])]
    with caplog.at_level(logging.WARNING, logger="mcp_rl.policies.decoder"):
        policy = LocalPolicy(model, tok, compile_decode=True)
        got = [await turns(policy, b) for b in (CONVERSATIONS, CONVERSATIONS[1:])]
    assert [[ids_of(c) for c in b] for b in got] == [[ids_of(c) for c in b] for b in want]
    assert seen and not any(seen) and calls == [1]  # tried once in the process, not once a batch
    warnings = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(warnings) == 1 and "decoding uncompiled" in warnings[0] and "no C compiler" in warnings[0]
    assert "policy_compile_decode=false" in warnings[0] and len(warnings[0]) < 360
