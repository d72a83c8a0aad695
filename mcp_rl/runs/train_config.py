"""The trainer's and training loop's settings (`Config.train`), and the check that an episode fits them.

    TrainConfig(steps=20, learning_rate=1e-4, packed=True)   # checked on creation: a ValueError says how to fix it
    check_episode_fits(RolloutConfig(max_turns=8), TrainConfig(max_seq_len=4096))

`mcp_rl.runs.config` holds the whole run's Config, its presets and files; this is its `train` section.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp_rl.fields import described as _f
from mcp_rl.rollout import RolloutConfig
from mcp_rl.runs.config_types import check_own_types
from mcp_rl.training.art_backend import check_art_settings

__all__ = ["PROMPT_TOKENS", "TrainConfig", "check_episode_fits"]

# Tokens an episode needs before the agent's first turn: the system prompt, the tool schemas the
# chat template renders (a few hundred for mcp_server.py's four tools), the task, template overhead.
PROMPT_TOKENS = 1024


@dataclass
class TrainConfig:
    backend: str = _f("portable", "'portable' (transformers+peft, CPU or GPU) or 'art' (ART LocalBackend + vLLM, Colab)")
    loader: str = _f("transformers", "portable backend: 'transformers' (transformers + peft [+ bitsandbytes], CPU or GPU) "
                     "or 'unsloth' (Unsloth's 4-bit loading, kernels and sampler; CUDA, `pip install 'mcp-rl[unsloth]'`)")
    steps: int = _f(3, "GRPO steps")
    groups_per_step: int = _f(4, "scenarios per step")
    group_size: int = _f(4, "rollouts per scenario (more when rewards show no variance)")
    learning_rate: float = _f(5e-5, "LoRA learning rate")
    loss: str = _f("dr_grpo", "'dr_grpo' (no std scaling, constant normaliser) or 'grpo'")
    lora_r: int = _f(8, "LoRA rank")
    lora_alpha: int = _f(16, "LoRA alpha")
    micro_batch_size: int = _f(4, "sequences per forward/backward pass")
    micro_batch_tokens: int = _f(0, "portable trainer: fill each forward/backward pass with length-sorted sequences "
                                 "up to this many padded tokens instead of micro_batch_size sequences (0 = off; "
                                 "on a large GPU e.g. 65536: fewer, fuller passes, the same update)")
    packed: bool = _f(False, "portable trainer: pack each micro-batch's sequences end to end (no padding; "
                           "micro_batch_tokens bounds a pass) and run the LM head only on trained tokens, with "
                           "Liger's fused head on CUDA (the `gpu` extra): the same loss, less memory (mcp_rl/training/packing.py)")
    lora_no_upcast: bool = _f(True, "portable trainer with the transformers loader, under bf16/fp16 autocast (else "
                              "inert; ART and Unsloth bring their own kernels): the update gives LoRA layers their input "
                              "as it is, not peft's float32 copy that autocast casts straight back (two activation "
                              "copies per LoRA layer and pass, two more in backward); the same loss and gradients bit "
                              "for bit, LoRA weights stay float32; 1.20x the 3B-shape update (mcp_rl/training/kernels.py)")
    lora_fused_add: bool = _f(True, "portable trainer with the transformers loader, under bf16/fp16 autocast (else "
                              "inert): the update adds each LoRA layer's scaled product to its base output inside one "
                              "addmm (no separate multiply and add over the output); the loss moves within bf16 "
                              "rounding; 1.26x the 3B-shape update (mcp_rl/training/kernels.py)")
    liger_kernels: bool = _f(False, "portable trainer, CUDA only: Liger-Kernel's RMSNorm, SwiGLU/GeGLU and RoPE Triton "
                             "kernels patched into the model, as TRL's use_liger_kernel (the `gpu` extra); asked for "
                             "on a CPU or for a model type Liger lacks, the trainer refuses to start")
    max_seq_len: int = _f(4096, "longest tokenized trajectory trained on; longer ones are skipped (portable) "
                          "or cut (ART); also ART's context length in vLLM")
    logprob_chunk_size: int = _f(1024, "ART backend: tokens per chunk of its log-prob computation (ART's default "
                                 "1024; 8 on a T4 to save memory); must divide max_seq_len")
    warm_start_scenarios: int = _f(0, "training scenarios turned into demonstrations for a supervised warm start (0 = none)")
    warm_start_epochs: int = _f(1, "passes over the demonstrations")
    warm_start_lr: float = _f(2e-4, "warm-start learning rate")
    warm_start_batch_size: int = _f(4, "demonstrations per warm-start update")
    warm_start_gate_scenarios: int = _f(0, "quality gate: training scenarios (after the demonstrations' ones) the "
                                        "warm-start policy plays before RL; 0 = no gate")
    warm_start_max_tool_errors: float = _f(1.0, "quality gate: most failing tool calls per gate episode it accepts")
    warm_start_min_completed: float = _f(0.9, "quality gate: least share of gate episodes that end in complete_task")
    warm_start_max_extra_epochs: int = _f(2, "quality gate: most extra warm-start epochs it adds while not met")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass (long sequences, big models)")
    precision: str = _f("auto", "training precision: 'auto' (bf16 on GPUs with it, fp16 + loss scaling on those "
                                 "without, e.g. a T4; fp32 on a CPU), 'bf16' (also on CPU: ~2x faster there), "
                                 "'fp16' (autocast with dynamic loss scaling, float16 weights), 'fp32'")
    eval_every: int = _f(0, "evaluate on the validation split every N steps (0 = only before and after)")
    eval_every_split: str = _f("val", "split evaluated every eval_every steps: 'val', or 'test' for a curve of "
                               "held-out success (reported only, never used to pick a step)")
    eval_every_scenarios: int = _f(0, "scenarios in each periodic evaluation: the first N of that split (0 = all "
                                   "of it, at most eval_scenarios)")
    eval_scenarios: int = _f(32, "held-out (test split) scenarios evaluated before and after training")
    eval_warm_start: bool = _f(True, "also evaluate the warm-start-only policy (RL vs supervised on the same scenarios)")
    eval_temperature: float = _f(0.0, "sampling temperature for evaluation (0 = greedy)")
    eval_k: int = _f(1, "rollouts per held-out scenario in each evaluation: k > 1 reports pass@k and τ²-bench's "
                     "pass^k (all k succeed), sampled at eval_temperature > 0")
    seed: int = _f(0, "seed for scenario order and sampling")
    deadline_s: float = _f(0.0, "wall-clock seconds this process may take (counted from when mcp_rl.runs.callbacks was "
                           "imported: model load included); GRPO steps stop while one more step, its held-out "
                           "evaluation and the final evaluation still fit (0 = no deadline; mcp_rl.runs.callbacks.Deadline)")
    train_budget_s: float = _f(0.0, "cap on the seconds of all GRPO steps (rollouts + updates) over the whole run, "
                               "resumed calls included; steps stop before one would pass it (0 = no cap)")
    pause_at_deadline: bool = _f(False, "when train.deadline_s stops the steps, leave the run before its final "
                                 "evaluation, to be resumed by a later call (one process only, not under torchrun)")

    def __post_init__(self) -> None:
        check_own_types(self, "train.")
        if self.backend not in ("portable", "art"):
            raise ValueError(f"train.backend must be 'portable' or 'art', got {self.backend!r}")
        if self.loader not in ("transformers", "unsloth"):
            raise ValueError(f"train.loader must be 'transformers' or 'unsloth', got {self.loader!r}")
        if self.loader == "unsloth" and self.backend != "portable":
            raise ValueError("train.loader='unsloth' is the portable backend's loader (ART brings its own Unsloth): "
                             "set train.backend=portable or train.loader=transformers")
        if self.loss not in ("dr_grpo", "grpo"):
            raise ValueError(f"train.loss must be 'dr_grpo' or 'grpo', got {self.loss!r}")
        if self.group_size < 2:
            raise ValueError(f"train.group_size must be >= 2: GRPO compares rollouts of one scenario (got {self.group_size})")
        if self.eval_k < 1 or (self.eval_k > 1 and self.eval_temperature <= 0):
            raise ValueError(f"train.eval_k must be >= 1, and k > 1 needs train.eval_temperature > 0 (k greedy rollouts "
                             f"are one rollout k times), got eval_k={self.eval_k}, eval_temperature={self.eval_temperature}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"train.micro_batch_tokens must be >= 0 (0 = off), got {self.micro_batch_tokens}")
        # Liger is asked for (off by default); the LoRA levers are on by default and inert where they cannot act.
        if self.liger_kernels and (self.backend, self.loader) != ("portable", "transformers"):
            raise ValueError("train.liger_kernels is a switch of the portable trainer with the transformers loader "
                             "(ART and Unsloth bring their own kernels): set train.liger_kernels=false, or "
                             "train.backend=portable and train.loader=transformers")
        for name in ("steps", "groups_per_step", "micro_batch_size", "max_seq_len", "lora_r"):
            if getattr(self, name) < (0 if name == "steps" else 1):
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"train.precision must be 'auto', 'bf16', 'fp16' or 'fp32', got {self.precision!r}")
        if not 0 < self.learning_rate < float("inf"):
            raise ValueError(f"train.learning_rate must be a finite number > 0, got {self.learning_rate}")
        if self.eval_every_split not in ("val", "test"):
            raise ValueError(f"train.eval_every_split must be 'val' or 'test', got {self.eval_every_split!r}")
        if self.eval_every < 0 or self.eval_every_scenarios < 0:
            raise ValueError("train.eval_every and train.eval_every_scenarios must be >= 0 (0: off / all)")
        if self.warm_start_gate_scenarios < 0 or self.warm_start_max_extra_epochs < 0:
            raise ValueError("train.warm_start_gate_scenarios and train.warm_start_max_extra_epochs must be >= 0 "
                             f"(got {self.warm_start_gate_scenarios}, {self.warm_start_max_extra_epochs})")
        if self.warm_start_gate_scenarios and not self.warm_start_scenarios:
            raise ValueError("train.warm_start_gate_scenarios checks a warm start: set train.warm_start_scenarios "
                             "too, or the gate to 0")
        if not 0.0 <= self.warm_start_min_completed <= 1.0:
            raise ValueError(f"train.warm_start_min_completed is a share of episodes in [0, 1], got "
                             f"{self.warm_start_min_completed}")
        if self.warm_start_max_tool_errors < 0:
            raise ValueError(f"train.warm_start_max_tool_errors is a count per episode (>= 0), got "
                             f"{self.warm_start_max_tool_errors}")
        if self.backend == "art":
            check_art_settings(self.max_seq_len, self.logprob_chunk_size, self.lora_r, prefix="train.")


def check_episode_fits(rollout: RolloutConfig, train: TrainConfig) -> None:
    """Raise ValueError when an episode's prompt and assistant turns alone can exceed max_seq_len.

    Such an episode cannot be trained on whole: the portable trainer skips it, ART cuts its end
    (where the answer and so the reward are), vLLM refuses it as a context overflow. An error,
    not a warning: the lost episodes are always the long ones, so training would lean towards
    short episodes without a sign in the metrics, and the fix is one setting. Tool results (up to
    rollout.max_result_chars each) come on top, so this is a floor, not a guarantee.

    >>> check_episode_fits(RolloutConfig(max_turns=4, max_tokens=384), TrainConfig(max_seq_len=8192))
    """
    need = PROMPT_TOKENS + rollout.max_turns * rollout.max_tokens
    if need > train.max_seq_len:
        raise ValueError(
            f"rollout.max_turns x rollout.max_tokens ({rollout.max_turns} x {rollout.max_tokens}) plus "
            f"~{PROMPT_TOKENS} prompt tokens is {need}, over train.max_seq_len {train.max_seq_len}: long episodes "
            "would be skipped or cut before their answer; lower rollout.max_turns or rollout.max_tokens, "
            f"or raise train.max_seq_len to at least {need}")
