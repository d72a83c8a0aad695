"""What a run is built from: the MCP server it talks to, the trainer (model, policy, optimizer) and
the rollout settings, checked against the server's tools and the installed stack before a model loads.

    trainer = build_trainer(cfg)              # the one builder: a `Trainer` of either backend
    trainer = build_trainer(cfg, model=(m, tok))   # the same, over weights already loaded (tests, rehearsals)

mcp_rl/runs/pipeline.py's phases use these; mcp_rl/runs/run.py opens them once per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mcp_rl.scale import distributed
from mcp_rl.runs.config import Config
from mcp_rl.mcp.connect import ToolSession
from mcp_rl.environment import environment
from mcp_rl.rollout import RolloutConfig


@contextlib.asynccontextmanager
async def open_server(cfg: Config):
    """Yield the ServerSpec of the environment cfg.server names (started for the block when it must be)."""
    with environment(cfg.server).serve(cfg.server_token) as spec:
        yield spec


def rollout_config(cfg: Config, **changes) -> RolloutConfig:
    """`cfg.rollout` with the tool policy of cfg's fields now (a Config changed in place included)."""
    return dataclasses.replace(cfg.rollout, tool_policy=cfg.tool_policy(), **changes)


async def check_tools(server, cfg: Config) -> None:
    """Raise SideEffectsRefused (or ToolPolicyError) now if the server's tools do not fit cfg's
    tool policy: one session, before a model is loaded or a rollout runs."""
    async with ToolSession(server, policy=cfg.tool_policy(), call_timeout=cfg.rollout.call_timeout):
        pass


def install_marker() -> Path:
    """Where the notebooks' install cell (notebooks/install_cell.py `marker`) records this machine's stack."""
    return Path(tempfile.gettempdir()) / "mcp-rl-installed"


def check_install(cfg: Config, stamp: Path | None = None) -> None:
    """On a machine the notebooks' install cell set up, refuse a config the installed stack cannot train."""
    stamp = stamp or install_marker()
    stack = stamp.read_text().split()[0] if stamp.is_file() and stamp.read_text().strip() else None
    if stack == "unsloth" and cfg.train.backend == "art":
        raise ValueError("this config trains through ART + vLLM, but the light install is here (PRESET = 't4-unsloth'): "
                         "set PRESET = 't4-unsloth', or PRESET = 't4' after Runtime > Disconnect and delete runtime")
    if stack == "art" and cfg.train.loader == "unsloth":
        raise ValueError("this config (train.loader = 'unsloth') needs the light install, but the ART install is here "
                         "(its older Unsloth): set PRESET = 't4', or PRESET = 't4-unsloth' after Runtime > Disconnect "
                         "and delete runtime")


@runtime_checkable
class Trainer(Protocol):
    """What a run needs of a trainer; `PortableTrainer` (mcp_rl/training/portable.py) and `ARTTrainer`
    (mcp_rl/training/art_backend.py) both are one. `step` counts GRPO updates (a step whose groups all tied makes
    none), `sft_steps` warm-start updates; `policy` samples the current weights."""

    step: int
    sft_steps: int
    policy: Any

    async def start(self) -> None:
        """Ready to sample and train (ART: starts vLLM and Unsloth on the GPU); a second call does nothing."""

    async def train(self, groups: list) -> dict:
        """One GRPO update on scored trajectory groups; returns its metrics."""

    def warm_start(self, demonstrations: list, epochs: int = 1, *, learning_rate: float, batch_size: int,
                   seed: int = 0) -> dict:
        """Supervised passes over demonstrations (ValueError where the backend has none)."""

    def save(self, directory: str | os.PathLike) -> Path:
        """The checkpoint, written atomically, with its sha256 manifest (mcp_rl.training.manifest)."""

    def load(self, directory: str | os.PathLike) -> dict:
        """Restore a `save`d checkpoint; returns its record (with the "step" it holds)."""


def _policy_kwargs(cfg: Config) -> dict:
    return dict(name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix, max_batch=cfg.policy_batch,
                batch_wait_s=cfg.policy_batch_wait_s, batch_gap_s=cfg.policy_batch_gap_s)


def build_trainer(cfg: Config, *, model: tuple[Any, Any] | None = None) -> Trainer:
    """The trainer `cfg` describes, every setting from it. `model`: (model, tokenizer) already loaded
    (random weights for a rehearsal, a test's tiny model), used instead of loading `cfg.model`."""
    check_install(cfg)
    t = cfg.train
    if t.backend == "art":
        from mcp_rl.training.art_backend import ARTTrainer

        if distributed.world() > 1:
            raise ValueError("the ART backend trains in one process (its own vLLM + Unsloth); under torchrun "
                             "use train.backend=portable")

        if t.warm_start_scenarios:
            raise ValueError("the ART backend has no warm start: set train.warm_start_scenarios=0 "
                             "(warm-start with the portable backend, then train with ART from its adapter)")
        return ARTTrainer(base_model=cfg.model, project=Path(cfg.out).name, learning_rate=t.learning_rate,
                          loss=t.loss, max_seq_length=t.max_seq_len, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                          logprob_chunk_size=t.logprob_chunk_size,
                          art_path=str(Path(cfg.out) / ".art"))
    from mcp_rl.policies.local_policy import LocalPolicy, load_local_model
    from mcp_rl.training.portable import PortableTrainer

    # float16 weights where training runs in float16 (a T4, or precision forced to fp16 on another GPU)
    dtype = "float16" if t.precision == "fp16" else None
    if t.loader == "unsloth" and model is None:  # Unsloth's 4-bit model, LoRA and sampler; the same trainer and loss
        from mcp_rl.policies.unsloth_loader import UnslothPolicy, load_unsloth_model

        model, tokenizer = load_unsloth_model(cfg.model, load_in_4bit=cfg.load_in_4bit, dtype=dtype,
                                              max_seq_len=t.max_seq_len, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                                              seed=t.seed)
        policy = UnslothPolicy(model, tokenizer, join=cfg.policy_join, **_policy_kwargs(cfg))  # join: refused there
        return PortableTrainer(policy, learning_rate=t.learning_rate, loss=t.loss, micro_batch_size=t.micro_batch_size,
                               max_seq_len=t.max_seq_len, precision=t.precision)
    model, tokenizer = model or load_local_model(cfg.model, quantize_4bit=cfg.load_in_4bit, dtype=dtype)
    policy = LocalPolicy(model, tokenizer, reuse_prefix=cfg.policy_reuse_prefix,
                         prefix_cache_gib=cfg.policy_prefix_cache_gib, compile_decode=cfg.policy_compile_decode,
                         join=cfg.policy_join, **_policy_kwargs(cfg))
    return PortableTrainer(policy, learning_rate=t.learning_rate, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                           loss=t.loss, micro_batch_size=t.micro_batch_size, max_seq_len=t.max_seq_len, precision=t.precision,
                           gradient_checkpointing=t.gradient_checkpointing, micro_batch_tokens=t.micro_batch_tokens,
                           packed=t.packed, lora_no_upcast=t.lora_no_upcast, lora_fused_add=t.lora_fused_add,
                           liger_kernels=t.liger_kernels)


__all__ = ["Trainer", "open_server", "rollout_config", "check_tools", "check_install", "build_trainer"]
