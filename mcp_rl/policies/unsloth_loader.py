"""Unsloth as the portable trainer's model loader and sampler (a CUDA GPU, e.g. a Colab T4).

    model, tokenizer = load_unsloth_model("Qwen/Qwen2.5-3B-Instruct", lora_r=16, max_seq_len=4096)
    policy = UnslothPolicy(model, tokenizer)          # same interface as LocalPolicy
    trainer = PortableTrainer(policy, precision="auto")  # sees a PeftModel: trains Unsloth's LoRA as it is

Or in a config: `train.loader=unsloth` (and `load_in_4bit=true`). What Unsloth brings: its
4-bit loading, its fused LoRA / RMSNorm / RoPE kernels in the forward and backward pass, and its
offloaded gradient checkpointing (`use_gradient_checkpointing="unsloth"`), on the torch the
machine already has (no vLLM, no torch reinstall). What stays ours: the Dr. GRPO loss, ART's
tokenization, the update loop and fp16 loss scaling (`PortableTrainer`), and the policy
interface (batched `complete`, per-token logprobs at temperature 1, the newest LoRA weights on
every call, since sampling reads the trained model in place).

Sampling goes through Unsloth's own `generate` (its fast decode path with a dynamic cache),
not LocalPolicy's CUDA-graph loop: Unsloth replaces the attention forward with one that keeps
a tuple KV cache, which the StaticCache loop cannot drive. Unsloth's generate switches the
model to inference (`FastLanguageModel.for_inference`: gradient checkpointing off, use_cache on);
each batch switches it back (`for_training` with the checkpointing mode it had, then `eval()`),
so the next update trains with Unsloth's checkpointing again.

`import unsloth` is deferred to the first load and needs CUDA; where it is missing or cannot
run, `UnslothUnavailable` says so in one line. CPU machines and CI keep `load_local_model`.
"""

from __future__ import annotations

from typing import Any

from mcp_rl.policies.local_policy import STOP_STRING, LocalPolicy
from mcp_rl.policies.models import EMBEDDED, SMOLLM2, build_cache, cache_dir, load_local_tokenizer

__all__ = ["UnslothUnavailable", "import_unsloth", "import_unsloth_if_used", "load_unsloth_model", "UnslothPolicy", "LORA_TARGETS"]

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_INSTALL = "pip install 'mcp-rl[unsloth]' on a CUDA GPU (Colab: the tutorial's install cell with INSTALL = 'unsloth')"


class UnslothUnavailable(RuntimeError):
    """Unsloth is not installed or cannot run here; the message is one line saying what to do."""


def import_unsloth() -> Any:
    """`unsloth` imported, or UnslothUnavailable with one line (no CUDA, not installed, broken)."""
    import torch

    if not torch.cuda.is_available():
        raise UnslothUnavailable("Unsloth needs a CUDA GPU and this machine has none: use train.loader=transformers "
                                 "(the default) here, or run on a GPU")
    try:
        import unsloth  # noqa: F401 - patches transformers/peft on import
    except Exception as e:  # ImportError, or Unsloth's own checks (NotImplementedError, RuntimeError...)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        what = "is not installed" if isinstance(e, ImportError) and getattr(e, "name", None) == "unsloth" else \
            "cannot be imported"
        raise UnslothUnavailable(f"Unsloth {what} ({type(e).__name__}: {first}): {_INSTALL}, "
                                 "or use train.loader=transformers") from None
    return unsloth


def import_unsloth_if_used(cfg: Any) -> None:
    """Import Unsloth now when `cfg` (a Config) trains with it (`train.loader='unsloth'`), else nothing.

    Unsloth patches transformers and peft when imported, so a run with its loader calls this before
    ART or the trainer import transformers: the CLI's `train`, notebook 01, bench/experiments/learning_proof.py."""
    if cfg.train.loader == "unsloth":
        import_unsloth()


def _source(name_or_path: str) -> str:
    if name_or_path not in EMBEDDED:
        return name_or_path
    cache = cache_dir(name_or_path)  # an embedded GGUF as a safetensors folder, which Unsloth can load
    if not (cache / "model.safetensors").exists():
        build_cache(name_or_path, cache)
    return str(cache)


def load_unsloth_model(name_or_path: str = SMOLLM2, *, load_in_4bit: bool = True, dtype: Any = None,
                       max_seq_len: int = 4096, lora_r: int = 8, lora_alpha: int = 16, lora_dropout: float = 0.0,
                       target_modules: list[str] | None = None, gradient_checkpointing: str | bool = "unsloth",
                       seed: int = 0) -> tuple[Any, Any]:
    """`(peft model, tokenizer)` through `FastLanguageModel`: 4-bit base, LoRA on all 7 projections.

    dtype defaults to bf16 where the GPU has it and float16 elsewhere (a T4). The tokenizer is the
    one `load_local_model` returns (left padding, a tool-call chat template), so prompts, ART's
    tokenization and the policy agree with the transformers path.
    """
    import torch

    import_unsloth()
    from unsloth import FastLanguageModel

    if dtype is None:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model, _ = FastLanguageModel.from_pretrained(
        model_name=_source(name_or_path), max_seq_length=max_seq_len, dtype=dtype, load_in_4bit=load_in_4bit,
        local_files_only=name_or_path == SMOLLM2)
    model = FastLanguageModel.get_peft_model(
        model, r=lora_r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, target_modules=target_modules or LORA_TARGETS,
        bias="none", use_gradient_checkpointing=gradient_checkpointing, random_state=seed, max_seq_length=max_seq_len)
    model._mcp_rl_checkpointing = gradient_checkpointing  # what `UnslothPolicy` restores after sampling
    model.config.use_cache = False
    model.eval()
    return model, load_local_tokenizer(name_or_path)


class _Logprobs:
    """A logits processor that records log p(sampled token) at temperature 1.

    transformers runs user processors before the temperature / top-k warpers, so `scores` here
    are the raw logits; the token a step samples is read from `input_ids` at the next call (and
    the last one from the returned sequences), so only one [batch, vocab] row set is kept.
    """

    def __init__(self) -> None:
        self.prev, self.picked = None, []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.prev is not None:
            self.picked.append(self.prev.gather(-1, input_ids[:, -1:])[:, 0])
        self.prev = torch.log_softmax(scores.float(), -1)
        return scores

    def finish(self, last_tokens: Any) -> Any:
        import torch

        if self.prev is not None:
            self.picked.append(self.prev.gather(-1, last_tokens[:, None])[:, 0])
        return torch.stack(self.picked, 1) if self.picked else last_tokens.new_zeros((last_tokens.shape[0], 0)).float()


class UnslothPolicy(LocalPolicy):
    """`LocalPolicy` whose batched decode is Unsloth's `generate` (see the module docstring).

    Same Choices: raw text, parsed tool calls, one logprob per generated token (temperature 1),
    stop at end-of-turn or after `</tool_call>`, the forced tool-call prefix with its logprobs.
    """

    def __init__(self, model: Any, tokenizer: Any, **kwargs: Any):
        if kwargs.get("join"):
            raise ValueError("join (continuous batching) needs LocalPolicy's own decode step; Unsloth decodes through "
                             "its generate: leave policy_join off with train.loader = 'unsloth'")
        kwargs["cuda_graph"] = False  # Unsloth's decode has its own cache; no graph capture
        super().__init__(model, tokenizer, **kwargs)

    def _generate(self, reqs: list) -> list[Any]:
        import torch
        from unsloth import FastLanguageModel

        model, device = self.model, self.model.device
        n, width = len(reqs), max(len(r.prompt_ids) for r in reqs)
        max_new, pad = max(r.max_new for r in reqs), self.stop_ids[0]
        n_forced, temperature = reqs[0].n_forced, reqs[0].temperature
        ids = torch.full((n, width), pad, dtype=torch.long)
        attn = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            attn[i, width - len(r.prompt_ids):] = 1
        ids, attn = ids.to(device), attn.to(device)
        checkpointing = getattr(model, "_mcp_rl_checkpointing", "unsloth")
        recorder = _Logprobs()
        try:
            FastLanguageModel.for_inference(model)
            with torch.inference_mode():
                forced = self._forced_logprobs(ids, attn, n_forced) if n_forced else None
                sample = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
                    dict(do_sample=False)
                out = model.generate(
                    input_ids=ids, attention_mask=attn, max_new_tokens=max_new, eos_token_id=self.stop_ids,
                    pad_token_id=pad, use_cache=True, logits_processor=[recorder], repetition_penalty=1.0,
                    stop_strings=[STOP_STRING], tokenizer=self.tokenizer, return_dict_in_generate=True, **sample)
                new = out.sequences[:, width:]
                lps = recorder.finish(new[:, -1])
        finally:  # back to training: the next update needs Unsloth's checkpointing and use_cache off
            FastLanguageModel.for_training(model, use_gradient_checkpointing=checkpointing)
            model.config.use_cache = False  # Unsloth checkpoints layers only when no cache is built
            model.eval()
        new_ids, new_lp = new.tolist(), lps.tolist()
        forced_lp = forced.tolist() if forced is not None else [[] for _ in reqs]
        self.generate_calls += 1
        self.last_batch_size = n
        return [self._choice(r, new_ids[i], new_lp[i], forced_lp[i]) for i, r in enumerate(reqs)]

    def _forced_logprobs(self, ids: Any, attn: Any, n_forced: int) -> Any:
        import torch

        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False,
                            logits_to_keep=n_forced + 1).logits
        return torch.log_softmax(logits[:, -n_forced - 1:-1].float(), -1).gather(
            -1, ids[:, -n_forced:, None]).squeeze(-1)
