"""What a run is built from: the MCP server it talks to, the trainer (model, policy, optimizer) and
the rollout settings, checked against the server's tools and the installed stack before a model loads.

mcp_rl/pipeline.py's phases use these; mcp_rl/runs.py opens them once per run.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from . import distributed
from .config import Config
from .connect import ToolSession
from .launch import HttpServer, company_server_command
from .rollout import RolloutConfig

COMPANY = "company"  # Config.server value: our server, launched over HTTP on a local port


@contextlib.asynccontextmanager
async def open_server(cfg: Config):
    """Yield a ServerSpec for rollouts; 'company' starts mcp_server.py over HTTP."""
    if cfg.server == COMPANY:
        with HttpServer(company_server_command(), token=cfg.server_token) as server:
            yield server.spec
    else:
        yield cfg.server


def rollout_config(cfg: Config, **changes) -> RolloutConfig:
    """`cfg.rollout` with the tool policy of cfg's fields now (a Config changed in place included)."""
    return dataclasses.replace(cfg.rollout, tool_policy=cfg.tool_policy(), **changes)


async def check_tools(server, cfg: Config) -> None:
    """Raise SideEffectsRefused (or ToolPolicyError) now if the server's tools do not fit cfg's
    tool policy: one session, before a model is loaded or a rollout runs."""
    async with ToolSession(server, policy=cfg.tool_policy(), call_timeout=cfg.rollout.call_timeout):
        pass


STAMP = Path(__file__).resolve().parent.parent / ".colab-installed"  # the notebooks' install cell writes it


def check_install(cfg: Config, stamp: Path = STAMP) -> None:
    """On a machine the notebooks' install cell set up, refuse a config the installed stack cannot train."""
    stack = stamp.read_text().split()[0] if stamp.is_file() and stamp.read_text().strip() else None
    if stack == "unsloth" and cfg.train.backend == "art":
        raise ValueError("this config trains through ART + vLLM, but the light install is here (PRESET = 't4-unsloth'): "
                         "set PRESET = 't4-unsloth', or PRESET = 't4' after Runtime > Disconnect and delete runtime")
    if stack == "art" and cfg.train.loader == "unsloth":
        raise ValueError("this config (train.loader = 'unsloth') needs the light install, but the ART install is here "
                         "(its older Unsloth): set PRESET = 't4', or PRESET = 't4-unsloth' after Runtime > Disconnect "
                         "and delete runtime")


def build_trainer(cfg: Config):
    check_install(cfg)
    t = cfg.train
    if t.backend == "art":
        from .art_backend import ARTTrainer

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
    from .local_policy import LocalPolicy, load_local_model
    from .train import PortableTrainer

    # float16 weights where training runs in float16 (a T4, or precision forced to fp16 on another GPU)
    dtype = "float16" if t.precision == "fp16" else None
    if t.loader == "unsloth":  # Unsloth's 4-bit model, LoRA and sampler; the same trainer and loss
        from .unsloth_loader import UnslothPolicy, load_unsloth_model

        model, tokenizer = load_unsloth_model(cfg.model, load_in_4bit=cfg.load_in_4bit, dtype=dtype,
                                              max_seq_len=t.max_seq_len, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                                              seed=t.seed)
        policy = UnslothPolicy(model, tokenizer, name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix,
                               max_batch=cfg.policy_batch)
        return PortableTrainer(policy, learning_rate=t.learning_rate, loss=t.loss, micro_batch_size=t.micro_batch_size,
                               max_seq_len=t.max_seq_len, precision=t.precision)
    model, tokenizer = load_local_model(cfg.model, quantize_4bit=cfg.load_in_4bit, dtype=dtype)
    policy = LocalPolicy(model, tokenizer, name=Path(cfg.out).name, tool_prefix=cfg.tool_prefix,
                         max_batch=cfg.policy_batch, reuse_prefix=cfg.policy_reuse_prefix,
                         prefix_cache_gib=cfg.policy_prefix_cache_gib)
    return PortableTrainer(policy, learning_rate=t.learning_rate, lora_r=t.lora_r, lora_alpha=t.lora_alpha,
                           loss=t.loss, micro_batch_size=t.micro_batch_size, max_seq_len=t.max_seq_len, precision=t.precision,
                           gradient_checkpointing=t.gradient_checkpointing, micro_batch_tokens=t.micro_batch_tokens,
                           packed=t.packed)


__all__ = ["COMPANY", "open_server", "rollout_config", "check_tools", "check_install", "build_trainer"]
