"""Tests for mcp_rl/policies/prefix_cache.py through LocalPolicy(reuse_prefix=True): multi-turn rollouts keep their
earlier turns' keys and values and prefill only what is new, with the same tokens and logprobs as without.

    .venv/bin/python -m pytest tests/test_prefix_cache.py -q

Tiny random models (a Llama, a Gemma 3 with a 4-token sliding window) and the SmolLM2 tokenizer; rollouts
run the real loop against the company server in-process.
"""

import asyncio
import functools

import pytest
import torch

from mcp_rl.policies.chat_templates import prompt_ids
from mcp_rl.policies.local_policy import LocalPolicy, load_local_tokenizer
from mcp_rl.policies.models import tiny_llama
from mcp_rl.rollout import RolloutConfig, gather_rollouts
from mcp_rl.tasks.scenarios import Scenario

SCENARIOS = [Scenario(id="a", task="How many employees are there?", answer=150),
             Scenario(id="b", task="Which department has the highest total salary across all of its staff?",
                      answer="Sales")]
CALL = 'list_tables", "arguments": {}}\n</tool_call>'  # what follows the forced `<tool_call>\n{"name": "`


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


def tiny_gemma(tok):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=4096,
                              sliding_window=4,
                              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return Gemma3ForCausalLM(config).eval()


def nudged(model, tok, text):
    """`model`, its next-token logits nudged (+8) toward spelling `text` after each prompt: greedy decoding
    then writes a valid tool call every turn (a random model never does), so the rollouts get real tool
    results, while every logprob still comes from the model's own attention over the cache."""
    script = torch.tensor(tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")])
    forward = model.forward

    @functools.wraps(forward)  # keeps the signature decoder.py reads the cache's keyword from
    def nudge(*args, position_ids=None, **kw):
        out = forward(*args, position_ids=position_ids, **kw)
        if position_ids.shape[1] > 1:  # a prefill: decoding starts after this position
            model._start = position_ids[:, -1:].clone()
        k = (position_ids[:, -1:] - model._start).clamp(max=len(script) - 1)
        out.logits[:, -1].scatter_add_(1, script[k], torch.full(k.shape, 8.0))
        return out

    model.forward, model._plain, model._script = nudge, forward, script
    return model


async def roll(policy, company_db, group_size=2, max_turns=4):
    from mcp_server import build_server

    groups = await gather_rollouts(policy, build_server(company_db), SCENARIOS,
                                   RolloutConfig(max_turns=max_turns, max_tokens=16, temperature=0.0),
                                   group_size=group_size)
    return [t for g in groups for t in g.trajectories]


def ids_of(choice):
    return [int(t.token.split(":")[1]) for t in choice.logprobs.content]


def forward_logprobs(model, prompt, ids, n_forced):
    """The logprobs of `ids` after `prompt` from one plain forward (with the nudge where `model` has one: from
    the last of the `n_forced` prefix tokens on, as the decode nudges the tokens it samples)."""
    positions = torch.arange(len(prompt) + len(ids))[None]
    with torch.no_grad():
        logits = getattr(model, "_plain", model.forward)(input_ids=torch.tensor([prompt + ids]),
                                                         position_ids=positions).logits[0].float()
    if hasattr(model, "_script"):  # the nudge, from the prompt's last position on
        rows = torch.arange(len(prompt) + n_forced - 1, len(prompt) + len(ids) - 1)
        logits[rows, model._script[(rows - rows[0]).clamp(max=len(model._script) - 1)]] += 8.0
    lp = logits.log_softmax(-1)
    return [lp[len(prompt) - 1 + k, t].item() for k, t in enumerate(ids)]


def choices(traj):
    return [c for c in traj.messages_and_choices if not isinstance(c, dict)]


def assert_same(off, on):
    """The same turns, the same sampled ids, logprobs within 1e-5 (fp32)."""
    for a, b in zip(off, on, strict=True):
        ca, cb = choices(a), choices(b)
        assert [c.message.content for c in ca] == [c.message.content for c in cb]
        for x, y in zip(ca, cb):
            assert [t.token for t in x.logprobs.content] == [t.token for t in y.logprobs.content]
            assert [t.logprob for t in x.logprobs.content] == pytest.approx([t.logprob for t in y.logprobs.content],
                                                                          abs=1e-5)


@pytest.mark.parametrize("build, calls", [
    (lambda tok: nudged(tiny_llama(tok), tok, CALL), True),         # valid calls: the server's results come back
    (lambda tok: nudged(tiny_gemma(tok), tok, CALL), True),         # sliding-window layers: the window's mask
    (lambda tok: tiny_llama(tok), False),                           # the model's own tokens: malformed-call replies
])
async def test_greedy_rollouts_are_the_same_with_reuse_on_and_off(tok, company_db, build, calls):
    model = build(tok)
    off, on = LocalPolicy(model, tok, tool_prefix=True), LocalPolicy(model, tok, tool_prefix=True, reuse_prefix=True)
    trajs_off, trajs_on = await roll(off, company_db), await roll(on, company_db)
    assert_same(trajs_off, trajs_on)
    assert all(t.metrics["turns"] == 4 for t in trajs_on)
    assert any(t.metrics["tool_calls"] for t in trajs_on) == calls and not any(t.metrics["fatal"] for t in trajs_on)
    s_off, s_on = off.decode_stats, on.decode_stats
    assert s_off["prefill_tokens"] == s_off["padded_prompt_tokens"] and s_on["prompt_tokens"] == s_off["prompt_tokens"]
    # (batches form by timing, so the two runs' padding may differ a little)
    assert s_on["reused_tokens"] > 0 and s_on["prefill_tokens"] < 0.6 * s_on["padded_prompt_tokens"]
    assert len(on.prefix_cache) <= len(trajs_on)  # each turn's entry replaced its previous turn's
    for traj in trajs_on:  # the last turn's logprobs are what one forward over the conversation gives (the trainer's)
        k = max(i for i, m in enumerate(traj.messages_and_choices) if not isinstance(m, dict))
        last, ids = traj.messages_and_choices[k], ids_of(traj.messages_and_choices[k])
        prompt = prompt_ids(tok, traj.messages_and_choices[:k], traj.tools)
        assert [t.logprob for t in last.logprobs.content] == pytest.approx(
            forward_logprobs(model, prompt, ids, len(on._prefix_ids)), abs=1e-4)


async def test_the_cache_stays_under_its_bound_and_evicts_the_least_recent(tok, company_db):
    model = nudged(tiny_llama(tok), tok, CALL)
    # A tiny Llama's keys and values: 2 layers x (k, v) x 2 heads x 16 dims x 4 bytes = 512 bytes a token,
    # so 400 kB holds some of the 4 episodes' ~300-token prefixes, never all of them.
    policy = LocalPolicy(model, tok, tool_prefix=True, reuse_prefix=True, prefix_cache_gib=400e3 / 2**30)
    cache, seen = policy.prefix_cache, []
    add = cache.add

    def watch(ids, kv):
        add(ids, kv)
        seen.append(cache.nbytes)

    cache.add = watch
    on = await roll(policy, company_db)
    assert cache.stats["evicted"] > 0 and max(seen) <= cache.max_bytes
    assert policy.decode_stats["reused_tokens"] > 0  # some episodes still found their prefix
    assert_same(await roll(LocalPolicy(model, tok, tool_prefix=True), company_db), on)


async def test_a_cancelled_request_leaves_no_entry(tok):
    """Its caller gave up: neither its turn nor the previous turn it extended stays in the cache."""
    policy = LocalPolicy(tiny_llama(tok), tok, reuse_prefix=True)
    first = [{"role": "user", "content": "hi"}]
    choice = await policy.complete(first, [], max_tokens=8, temperature=0)
    [previous] = policy.prefix_cache.entries.values()
    history = first + [choice, {"role": "user", "content": "go on"}]
    task = asyncio.create_task(policy.complete(history, [], max_tokens=200, temperature=0))
    bye = [{"role": "user", "content": "bye"}]
    other = await policy.complete(bye, [], max_tokens=24, temperature=0)  # answered while `task` decodes on
    assert not task.done() and policy.generate_calls == 1
    task.cancel()
    while policy.generate_calls < 2:  # the decode drops the cancelled row and ends
        await asyncio.sleep(0.01)
    kept = [e.ids.tolist() for e in policy.prefix_cache.entries.values()]
    assert kept == [prompt_ids(tok, bye, []) + [int(t.token.split(":")[1]) for t in other.logprobs.content]]


async def test_changed_weights_empty_the_cache(tok):
    """An in-place update (an optimizer step) or a new `step`: the next turn prefills everything again,
    with the new weights, as a policy without reuse does."""
    model = tiny_llama(tok)
    policy = LocalPolicy(model, tok, reuse_prefix=True)
    first = [{"role": "user", "content": "hi there"}]
    choice = await policy.complete(first, [], max_tokens=8, temperature=0)
    history = first + [choice, {"role": "user", "content": "go on"}]
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(3.0)  # changes every key the cache holds
    again = await policy.complete(history, [], max_tokens=8, temperature=0)
    fresh = await LocalPolicy(model, tok).complete(history, [], max_tokens=8, temperature=0)
    assert policy.decode_stats["reused_tokens"] == 0 and policy.prefix_cache.stats["cleared"] == 1
    assert [t.logprob for t in again.logprobs.content] == pytest.approx([t.logprob for t in fresh.logprobs.content],
                                                                        abs=1e-5)
    policy.step = 1
    await policy.complete(history + [again, {"role": "user", "content": "more"}], [], max_tokens=4, temperature=0)
    assert policy.decode_stats["reused_tokens"] == 0 and policy.prefix_cache.stats["cleared"] == 2


async def test_the_trainers_updates_empty_the_cache(tok, company_db, tiny_trainer):
    """The real trainer: an SFT warm start (its AdamW writes the LoRA weights in place, `step` stays 0)
    and a GRPO step (`step` moves) each leave the next turn nothing to reuse."""
    from mcp_rl.policies.prefix_cache import PrefixCache

    trainer = tiny_trainer()
    policy = trainer.policy
    policy.prefix_cache = PrefixCache(2**30)  # what LocalPolicy(..., reuse_prefix=True) makes
    policy.tool_prefix = True  # malformed calls: the episodes go on for their turns
    [first, second, *_] = await roll(policy, company_db, max_turns=2)
    assert policy.decode_stats["reused_tokens"] > 0 and len(policy.prefix_cache)
    trainer.warm_start([first], epochs=1, learning_rate=1e-2)
    assert trainer.step == 0
    reused = policy.decode_stats["reused_tokens"]
    await policy.complete(first.messages_and_choices, first.tools, max_tokens=4, temperature=0)
    assert policy.decode_stats["reused_tokens"] == reused and policy.prefix_cache.stats["cleared"] == 1
    first.reward, second.reward = 1.0, 0.0
    import art

    await trainer.train([art.TrajectoryGroup([first, second])])
    assert trainer.step == 1
    await policy.complete(first.messages_and_choices, first.tools, max_tokens=4, temperature=0)
    assert policy.decode_stats["reused_tokens"] == reused and policy.prefix_cache.stats["cleared"] == 2


@pytest.mark.slow
async def test_smollm2_greedy_rollouts_are_the_same_with_reuse_on_and_off(company_db):
    """The embedded SmolLM2-135M (fp32 on the CPU) through the real loop."""
    from mcp_rl.policies.local_policy import load_local_model

    model, tok = load_local_model()
    off, on = LocalPolicy(model, tok, tool_prefix=True), LocalPolicy(model, tok, tool_prefix=True, reuse_prefix=True)
    trajs_off, trajs_on = await roll(off, company_db, group_size=1, max_turns=3), await roll(on, company_db,
                                                                                             group_size=1, max_turns=3)
    assert_same(trajs_off, trajs_on)
    assert sum(t.metrics["turns"] for t in trajs_on) > len(trajs_on) and on.decode_stats["reused_tokens"] > 0


@pytest.mark.parametrize("prompts, n_forced, window, copied", [
    ([list(range(12)), [0, 1, 99, 98, 97]], 0, 3, [(0, 0, 9), (1, 7, 2)]),  # rows share the longest new part
    ([list(range(10))], 2, 3, [(0, 0, 7)]),         # all cached: the forced prefix and one more token still run
    ([list(range(12)), [5, 6, 7]], 0, 3, [(0, 0, 9)]),  # a row with nothing cached sets the window
])
def test_a_batch_prefills_the_longest_part_any_row_lacks(prompts, n_forced, window, copied):
    from mcp_rl.policies.prefix_cache import PrefixCache

    cache = PrefixCache(2**20)
    cache.add(list(range(10)), [(torch.zeros(1, 10, 1), torch.zeros(1, 10, 1))])
    plan = cache.plan(prompts, n_forced)
    assert plan.window == window and [(row, column, count) for row, column, _, count in plan.copies] == copied
    assert plan.reused == sum(c for *_, c in copied)
    assert [m is not None for m in plan.matched] == [len(p) >= 10 for p in prompts]  # extends the entry: replaces it
