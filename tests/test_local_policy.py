"""Tests for mcp_rl/policies/local_policy.py: chat template, batching, logprobs, ART tokenization.

    .venv/bin/python -m pytest tests/test_local_policy.py -q            # all (slow ones load SmolLM2)
    .venv/bin/python -m pytest tests/test_local_policy.py -q -m "not slow"

Uses the real SmolLM2 tokenizer throughout; batching logic runs on a tiny random
Llama built from a config (fast), the end-to-end checks on the embedded SmolLM2.
"""

import asyncio
import json
import math

import art
import pytest
import torch
from art.preprocessing.tokenize import tokenize_trajectory_groups

from mcp_rl.policies.local_policy import (
    HERMES_TEMPLATE, LocalPolicy, art_tokenizer, install_tool_template, load_local_model, load_local_tokenizer,
    stop_string_end,
)
from mcp_rl.policies.policy import ContextOverflow, ScriptedPolicy

TOOLS = [{"type": "function", "function": {"name": "run_query", "description": "Run one SQL query",
                                           "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "list_tables", "description": "List the tables",
                                           "parameters": {"type": "object", "properties": {}}}}]
RAW_CALL = '<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 1"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tok():
    return load_local_tokenizer()


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kw)


# ---------------------------------------------------------------- chat template


def test_smollm2_gets_the_tool_template(tok):
    assert tok.chat_template == HERMES_TEMPLATE and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    text = render(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
                  add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools")
    assert json.dumps(TOOLS[0], sort_keys=True) in text and "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_install_leaves_a_fitting_template_alone(tok):
    assert install_tool_template(tok) is False


def test_transformers_4_is_refused_in_one_line(tok, monkeypatch):
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.53.2")  # the ART + vLLM Colab install's
    with pytest.raises(RuntimeError, match=r"needs transformers 5, this machine has 4\.53\.2"):
        LocalPolicy(object(), tok)


def test_art_tokenizer_returns_ids(tok):
    ids = art_tokenizer(tok).apply_chat_template([{"role": "user", "content": "hi"}])
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    view = art_tokenizer(tok)  # passes the rest through, but narrows vocab_size to our marker (chat_templates.py)
    assert view.eos_token_id == tok.eos_token_id and view.vocab_size - 1 in tok.added_tokens_decoder


def check_art_tokenization(tok, trajectories, choice_lists, last_prompts=None):
    """ART's tokenizer puts each trajectory's choices, ids and logprobs, exactly where the mask is 1,
    and what precedes the last choice is the prompt the policy rendered for it."""
    group = art.TrajectoryGroup(trajectories)
    results = list(tokenize_trajectory_groups(art_tokenizer(tok), [group], False, False, False))
    assert len(results) == len(trajectories)
    for k, (result, choices) in enumerate(zip(results, choice_lists)):
        want_ids = [int(t.token.split(":")[1]) for c in choices for t in c.logprobs.content]
        want_lps = [t.logprob for c in choices for t in c.logprobs.content]
        masked = [i for i, m in enumerate(result.assistant_mask) if m]
        assert [result.token_ids[i] for i in masked] == want_ids
        assert [result.logprobs[i] for i in masked] == pytest.approx(want_lps)
        # Each choice is followed by the end-of-turn token the template adds.
        for i in masked:
            if i + 1 not in masked:
                assert tok.decode([result.token_ids[i + 1]]) == "<|im_end|>"
        if last_prompts:
            assert result.token_ids[:masked[-len(choices[-1].logprobs.content)]] == last_prompts[k]
    return results


def prompt_ids(tok, messages, tools):
    return tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, return_dict=False)


async def test_scripted_choices_pass_art_tokenization(tok):
    policy = ScriptedPolicy(lambda m: {"tool": "list_tables"} if len(m) == 2 else "There are 3 tables.", tokenizer=tok)
    base = [{"role": "system", "content": "You answer questions."}, {"role": "user", "content": "How many tables?"}]
    trajectories, choice_lists, prompts = [], [], []
    for reward in (1.0, 0.0):
        first = await policy.complete(base, TOOLS, max_tokens=32, temperature=0)
        tool_msg = {"role": "tool", "tool_call_id": "call_0", "content": "a, b, c"}
        so_far = base + [{"role": "assistant", "content": first.message.content}, tool_msg]
        second = await policy.complete(so_far, TOOLS, max_tokens=32, temperature=0)
        trajectories.append(art.Trajectory(messages_and_choices=[*base, first, tool_msg, second], tools=TOOLS, reward=reward))
        choice_lists.append([first, second])
        prompts.append(prompt_ids(tok, so_far, TOOLS))
    check_art_tokenization(tok, trajectories, choice_lists, prompts)


# ---------------------------------------------------------------- batching on a tiny random Llama


@pytest.fixture(scope="module")
def tiny(tok):
    from mcp_rl.policies.models import tiny_llama

    return tiny_llama(tok, max_position_embeddings=256)


def ids_of(choice):
    return [int(t.token.split(":")[1]) for t in choice.logprobs.content]


def forward_logprobs(model, tok, messages, tools, ids):
    prompt = prompt_ids(tok, messages, tools)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].float().log_softmax(-1)
    return [logits[len(prompt) - 1 + k, t].item() for k, t in enumerate(ids)]


CONVERSATIONS = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "tell me " * 12}],
                 [{"role": "system", "content": "s"}, {"role": "user", "content": "a much longer question " * 6}]]


@pytest.mark.parametrize("tool_prefix", [False, True])
async def test_batched_generation_matches_one_at_a_time(tok, tiny, tool_prefix):
    policy = LocalPolicy(tiny, tok, tool_prefix=tool_prefix)
    batched = await asyncio.gather(*[policy.complete(m, [], max_tokens=8, temperature=0) for m in CONVERSATIONS])
    assert (policy.generate_calls, policy.last_batch_size) == (1, 3)
    stats = policy.decode_stats  # the sampling profile pipeline.train_step logs per step
    lengths = [len(policy.tokenizer.apply_chat_template(m, add_generation_prompt=True, return_dict=False)) +
               len(policy._prefix_ids) * tool_prefix for m in CONVERSATIONS]
    assert (stats["rows"], stats["prompt_tokens"], stats["padded_prompt_tokens"]) == (3, sum(lengths), 3 * max(lengths))
    assert 1 <= stats["decode_steps"] <= 8 and stats["prefill_s"] > 0 and stats["decode_s"] > 0
    alone = [await policy.complete(m, [], max_tokens=8, temperature=0) for m in CONVERSATIONS]
    for b, a, messages in zip(batched, alone, CONVERSATIONS):
        assert ids_of(b) == ids_of(a) and b.message.content == a.message.content
        assert [t.logprob for t in b.logprobs.content] == pytest.approx(
            forward_logprobs(tiny, tok, messages, [], ids_of(b)), abs=1e-4)
        assert b.message.content.startswith('<tool_call>\n{"name": "') == tool_prefix


@pytest.mark.parametrize("wait, gap, calls", [
    (0.15, None, 2),   # a fixed window from the first request splits requests 0.1 s apart over 0.3 s
    (2.0, 0.3, 1),     # a gap wait keeps collecting while they keep coming: one decode
])
async def test_a_gap_wait_joins_a_spread_wave_into_one_decode(tok, tiny, wait, gap, calls):
    policy = LocalPolicy(tiny, tok, batch_wait_s=wait, batch_gap_s=gap)

    async def late(k):
        await asyncio.sleep(0.1 * k)
        return await policy.complete(CONVERSATIONS[k % 3], [], max_tokens=2, temperature=0)

    await asyncio.gather(*[late(k) for k in range(4)])
    assert policy.generate_calls == calls


async def test_each_request_keeps_its_own_max_tokens(tok, tiny):
    policy = LocalPolicy(tiny, tok)
    short, long = await asyncio.gather(policy.complete(CONVERSATIONS[0], [], max_tokens=3, temperature=0),
                                       policy.complete(CONVERSATIONS[1], [], max_tokens=9, temperature=0))
    assert policy.generate_calls == 1 and (len(ids_of(short)), len(ids_of(long))) == (3, 9)
    assert short.finish_reason == long.finish_reason == "length"


async def test_sampling_gives_finite_logprobs_and_step_names(tok, tiny):
    policy = LocalPolicy(tiny, tok, name="tiny")
    choice = await policy.complete(CONVERSATIONS[0], [], max_tokens=6, temperature=1.0)
    assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in choice.logprobs.content)
    policy.step = 2
    assert policy.served_name == "tiny@2"


def test_rows_stop_after_the_token_that_closes_the_tool_call(tok, tiny):
    policy = LocalPolicy(tiny, tok)
    pad = policy.stop_ids[0]
    call = tok.encode(RAW_CALL + " and more text after it", add_special_tokens=False)
    other = tok.encode("no call here, just words and words", add_special_tokens=False)
    width = max(len(call), len(other))
    tokens = torch.tensor([call + [pad] * (width - len(call)), other + [pad] * (width - len(other))])
    done = torch.tensor([False, False])
    assert policy._stop_at_string(tokens, done, 0, width) == width
    end = stop_string_end(tok, call, "</tool_call>")
    assert tok.decode(call[:end]) == RAW_CALL and done.tolist() == [True, False]
    assert tokens[0, end:].eq(pad).all() and tokens[0, :end].tolist() == call[:end]
    assert tokens[1].tolist() == other + [pad] * (width - len(other))


@pytest.fixture(scope="module")
def tiny_gemma(tok):
    """A random Gemma 3 whose sliding window (4) is far shorter than every prompt here."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return Gemma3ForCausalLM(config).eval()


async def test_sliding_window_layers_decode_as_the_full_forward(tok, tiny_gemma):
    """Batched, left-padded decoding through the StaticCache gives each row the logprobs of the plain
    forward pass, whose sliding layers see only the last 4 positions: the window lives in the masks."""
    policy = LocalPolicy(tiny_gemma, tok)
    batched = await asyncio.gather(*[policy.complete(m, [], max_tokens=10, temperature=0) for m in CONVERSATIONS])
    assert (policy.generate_calls, policy.last_batch_size) == (1, 3)
    for b, messages in zip(batched, CONVERSATIONS):
        assert len(ids_of(b)) > policy_window(tiny_gemma)  # decoding crosses the window too
        assert [t.logprob for t in b.logprobs.content] == pytest.approx(
            forward_logprobs(tiny_gemma, tok, messages, [], ids_of(b)), abs=1e-4)


def policy_window(model):
    from mcp_rl.policies.decoder import sliding_window

    return sliding_window(model.config)


async def test_too_long_prompt_is_context_overflow(tok, tiny):
    with pytest.raises(ContextOverflow, match="holds 256"):
        await LocalPolicy(tiny, tok).complete([{"role": "user", "content": "word " * 300}], [], max_tokens=4, temperature=0)


# ---------------------------------------------------------------- the embedded SmolLM2


@pytest.fixture(scope="module")
def smollm2():
    return load_local_model()


TASKS = ["How many employees work in Sales?", "Which department has the highest total salary?"]


def conversation(task):
    return [{"role": "system", "content": "You answer questions about a company database with the tools."},
            {"role": "user", "content": task}]


@pytest.mark.slow
async def test_smollm2_batches_and_its_choices_train_with_art(smollm2):
    model, tok = smollm2
    torch.manual_seed(0)
    policy = LocalPolicy(model, tok, tool_prefix=True)
    firsts = await asyncio.gather(*[policy.complete(conversation(t), TOOLS, max_tokens=32, temperature=0.7)
                                    for t in TASKS for _ in range(2)])
    assert (policy.generate_calls, policy.last_batch_size) == (1, 4)
    for choice, task in zip(firsts, [t for t in TASKS for _ in range(2)]):
        lps = [t.logprob for t in choice.logprobs.content]
        assert all(math.isfinite(lp) for lp in lps)
        assert lps == pytest.approx(forward_logprobs(model, tok, conversation(task), TOOLS, ids_of(choice)), abs=1e-3)
        text = choice.message.content
        assert text.startswith("<tool_call>") and ("</tool_call>" not in text or text.rstrip().endswith("</tool_call>"))
    # A second turn for the first task's two samples, then one GRPO group through ART's tokenizer.
    tool_msg = {"role": "tool", "tool_call_id": "call_0", "content": "employees, departments"}
    so_far = [conversation(TASKS[0]) + [{"role": "assistant", "content": c.message.content}, tool_msg] for c in firsts[:2]]
    seconds = await asyncio.gather(*[policy.complete(m, TOOLS, max_tokens=16, temperature=0.7) for m in so_far])
    trajectories = [art.Trajectory(messages_and_choices=[*conversation(TASKS[0]), first, tool_msg, second],
                                   tools=TOOLS, reward=reward)
                    for first, second, reward in zip(firsts[:2], seconds, (1.0, 0.0))]
    check_art_tokenization(tok, trajectories, [[f, s] for f, s in zip(firsts[:2], seconds)],
                           [prompt_ids(tok, m, TOOLS) for m in so_far])


@pytest.mark.parametrize("model_name", ["tiny", "tiny_gemma"])
async def test_decoding_without_repeat_kv_gives_the_forward_pass_logprobs(tok, model_name, request, monkeypatch):
    """The packed GQA attention that decoder.py registers on transformers without it (5.17, the GPU
    machine's): decode steps take the packed path and still give each row the plain forward's logprobs."""
    from transformers import AttentionInterface

    from mcp_rl.policies.decoder import packed_gqa_sdpa

    model = request.getfixturevalue(model_name)
    original, packed_calls = AttentionInterface._global_mapping["sdpa"], []
    packed = packed_gqa_sdpa(original)

    def spy(module, query, key, value, mask, **kw):
        packed_calls.append(query.shape[2] == 1 and mask is not None and module.num_key_value_groups > 1)
        return packed(module, query, key, value, mask, **kw)

    spy._mcp_rl = True
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", spy)
    model.config._attn_implementation = "sdpa"
    policy = LocalPolicy(model, tok)
    batched = await asyncio.gather(*[policy.complete(m, [], max_tokens=6, temperature=0) for m in CONVERSATIONS])
    assert sum(packed_calls) >= 5 * model.config.num_hidden_layers  # decode steps went the packed way
    for b, messages in zip(batched, CONVERSATIONS):
        assert [t.logprob for t in b.logprobs.content] == pytest.approx(
            forward_logprobs(model, tok, messages, [], ids_of(b)), abs=1e-4)


async def test_a_finished_row_is_answered_while_the_batch_decodes_on(tok, tiny):
    """A request that ends early gets its Choice during the decode (its rollout can call its tool),
    the same Choice the batch's end would have given it."""
    policy = LocalPolicy(tiny, tok)
    answered_during = {}

    async def ask(k, max_tokens):
        choice = await policy.complete(CONVERSATIONS[k], [], max_tokens=max_tokens, temperature=0)
        answered_during[k] = policy.generate_calls == 0  # the batch's decode has not returned yet
        return choice

    short, long = await asyncio.gather(ask(0, 8), ask(1, 40))
    assert policy.generate_calls == 1 and answered_during == {0: True, 1: False}
    assert len(ids_of(short)) == 8 and len(ids_of(long)) == 40
    alone = await policy.complete(CONVERSATIONS[0], [], max_tokens=8, temperature=0)
    assert ids_of(alone) == ids_of(short) and [t.logprob for t in alone.logprobs.content] == pytest.approx(
        [t.logprob for t in short.logprobs.content], abs=1e-5)


def test_load_policy_puts_an_adapters_lora_on_its_recorded_base(tmp_path):
    """Base model + adapter -> LocalPolicy, which `rollout`/`eval` and `serve` each wrote out."""
    from peft import LoraConfig, PeftModel, get_peft_model

    from mcp_rl.policies.local_policy import load_policy

    model, _ = load_local_model()
    lora = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    lora.save_pretrained(tmp_path / "my-run")
    policy = load_policy(adapter=str(tmp_path / "my-run"), max_batch=3, tool_prefix=True)
    assert isinstance(policy.model, PeftModel) and policy.base_model == "smollm2"  # the base the adapter records
    assert (policy.name, policy.max_batch, policy.tool_prefix) == ("my-run", 3, True)
    plain = load_policy("smollm2", name="served")
    assert not isinstance(plain.model, PeftModel) and (plain.name, plain.base_model) == ("served", "smollm2")
