"""Command-line flags generated from the Config dataclasses, as TRL's HfArgumentParser does: a field's
flag, type and help text come from the field, so each default is written once, in mcp_rl/runs/config.py
(and the RolloutConfig / RewardConfig / TrainConfig sections it holds).

    p = argparse.ArgumentParser()
    add_flags(p, "server", SERVER)                # Config fields as flags, in an argument group
    a = p.parse_args(["--server", "company", "--temperature", "0.5"])
    cfg = config(a, base=Config())                # the flags typed, over a base (preset, file, a run's config)

A field's flag is its name with dashes (`rollout.max_turns` -> `--max-turns`, `load_in_4bit` ->
`--load-in-4bit`; a section field whose name is taken gets its section's: `--train-x`), except where NAMES keeps an older name (`--tools`, `--workers`, `--rollout-timeout`)
or adds one (`--token`, `--max-batch`); a command may name a field its own way (`eval --temperature`
sets train.eval_temperature, the greedy default of evaluation). Types follow the annotation: numbers
and text as typed, `A,B,...` for a list of names, `--x` / `--no-x` for a switch. Fields no flag can
say (reward.custom, reward.judge_params, rollout.tool_policy) are left to `--set` or a config file.

A flag's default is argparse.SUPPRESS, so the namespace holds only what was typed and every field
not typed keeps the base's value; `--help` shows the dataclass default. The two tokens are the
exception: their flags default to the environment (MCP_RL_TOKEN, MCP_RL_WORKER_TOKEN), as before.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from typing import Any

from mcp_rl.runs.config import Config, TrainConfig, with_fields
from mcp_rl.quote import quoted
from mcp_rl.rewards.score import RewardConfig
from mcp_rl.rollout import RolloutConfig

__all__ = ["add_flags", "add_config_flags", "add_model_flags", "config", "given", "flags_of", "local_policy",
           "SERVER", "MODEL", "WORKERS", "NAMES", "ENV"]

_DEST = "cfg:"  # a generated flag's dest: "cfg:rollout.temperature" (never clashes with a command's own flags)
SECTIONS = {"": Config, "rollout": RolloutConfig, "reward": RewardConfig, "train": TrainConfig}
NAMES = {"server_tools": ("--tools",), "rollout_workers": ("--workers",), "rollout.timeout": ("--rollout-timeout",),
         "server_token": ("--server-token", "--token"), "policy_batch": ("--policy-batch", "--max-batch")}
ENV = {"server_token": "MCP_RL_TOKEN", "worker_token": "MCP_RL_WORKER_TOKEN"}

# The shared sections: every command that talks to a server, loads a model or sends work to workers.
SERVER = ("server", "server_token", "server_tools", "deny_tools", "allow_side_effects", "read_only_tools")
MODEL = ("model", "load_in_4bit", "tool_prefix", "policy_batch", "policy_reuse_prefix", "policy_prefix_cache_gib",
         "policy_compile_decode", "policy_join")
WORKERS = ("rollout_workers", "worker_token", "policy_port")


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _kind(hint: Any) -> Any:
    """The flag type of an annotation (bool, int, float, str, list of names), None when a flag cannot say it."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return _kind(rest[0]) if len(rest) == 1 else None
    if typing.get_origin(hint) is list and typing.get_args(hint) == (str,):
        return list
    return hint if hint in (bool, int, float, str) else None


def _field(path: str) -> tuple[dataclasses.Field, Any]:
    section, _, name = path.rpartition(".")
    cls = SECTIONS[section]
    return next(f for f in dataclasses.fields(cls) if f.name == name), typing.get_type_hints(cls)[name]


def flags_of(section: str = "") -> tuple[str, ...]:
    """Paths of the fields of Config ("") or one of its sections that a flag can set, in field order."""
    prefix = f"{section}." if section else ""
    return tuple(prefix + f.name for f in dataclasses.fields(SECTIONS[section])
                 if f.name not in SECTIONS and _kind(typing.get_type_hints(SECTIONS[section])[f.name]) is not None)


def add_flags(parser: argparse.ArgumentParser, title: str, paths: tuple[str, ...] | list[str], *,
              names: dict[str, tuple[str, ...]] | None = None, required: tuple[str, ...] = (),
              aliases: bool = True, shown: dict[str, Any] | None = None) -> Any:
    """An argument group `title` with one flag per Config field in `paths` ("model", "rollout.max_turns").

    names: this command's own flag names for some fields; required: fields that must be given;
    aliases=False leaves out NAMES' extra names (rollout-worker's `--token` is its own);
    shown: defaults the help shows instead of the dataclass's (a command whose base differs)."""
    group = parser.add_argument_group(title)
    for path in paths:
        f, hint = _field(path)
        kind = _kind(hint)
        flags = (names or {}).get(path) or NAMES.get(path, ())[: None if aliases else 1] or \
            ("--" + path.rpartition(".")[2].replace("_", "-"),)
        if flags[0] in parser._option_string_actions and "." in path:  # a name two sections share: --train-x
            flags = ("--" + path.replace(".", "-").replace("_", "-"),)
        default = (shown or {}).get(path, f.default_factory() if f.default_factory is not dataclasses.MISSING
                                    else f.default)
        kw: dict[str, Any] = {"dest": _DEST + path, "required": path in required,
                              "default": os.environ.get(ENV.get(path, ""), argparse.SUPPRESS) or argparse.SUPPRESS,
                              "help": f"{f.metadata.get('help', '')} (default: {quoted(default)})".replace("%", "%%")}
        if kind is bool:
            group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif kind is list:
            group.add_argument(*flags, type=_names, metavar="A,B,...", **kw)
        else:
            group.add_argument(*flags, type=kind, metavar=flags[0].lstrip("-").replace("-", "_").upper(), **kw)
    return group


def given(a: argparse.Namespace) -> dict[str, Any]:
    """The Config fields the command line set: {"rollout.temperature": 0.5, ...}."""
    return {k[len(_DEST):]: v for k, v in vars(a).items() if k.startswith(_DEST)}


def config(a: argparse.Namespace, base: Config, *, trains: bool = True) -> Config:
    """`base` with the fields the command line set. trains=False (rollout, eval, audit-reward: they
    never train) leaves out the check that an episode fits train.max_seq_len, a training concern."""
    return with_fields(base, given(a), train_checks=trains)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Every Config field a flag can set, one group per section (the commands that train)."""
    shared = SERVER + MODEL + WORKERS
    for title, paths in (("server", SERVER), ("model", MODEL), ("rollout workers", WORKERS),
                         ("run", tuple(p for p in flags_of() if p not in shared)),
                         ("rollout", flags_of("rollout")), ("reward", flags_of("reward")), ("train", flags_of("train"))):
        add_flags(parser, title, paths)


def add_model_flags(parser: argparse.ArgumentParser, *, endpoint: bool) -> Any:
    """The model section (rollout, eval, serve): the MODEL fields and --adapter; with endpoint=True
    also --base-url (an OpenAI-compatible endpoint instead of a local model) and its key and timeout."""
    group = add_flags(parser, "model", MODEL)
    group.add_argument("--adapter", help="LoRA for a local model: a run folder (newest checkpoint), a checkpoint, "
                       "ART's checkpoint folder or a peft adapter folder; without --model, its recorded base model")
    if endpoint:
        group.add_argument("--base-url", help="OpenAI-compatible endpoint (vLLM, Ollama, OpenRouter...): --model "
                           "names the endpoint's model")
        group.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the endpoint key")
        group.add_argument("--timeout", type=float, default=60.0,
                           help="seconds per --base-url request (raise it for a local model served on a CPU)")
    return group


def local_policy(cfg: Config, adapter: str | None = None, *, base_from_adapter: bool = False, name: str | None = None):
    """The LocalPolicy the model section describes: cfg.model (or, with base_from_adapter, the base the
    adapter records), the adapter's LoRA, and cfg's policy settings (batching, prefix reuse, 4-bit)."""
    from mcp_rl.policies.local_policy import load_policy

    return load_policy(None if adapter and base_from_adapter else cfg.model, adapter, name=name,
                       quantize_4bit=cfg.load_in_4bit, tool_prefix=cfg.tool_prefix, max_batch=cfg.policy_batch,
                       reuse_prefix=cfg.policy_reuse_prefix, prefix_cache_gib=cfg.policy_prefix_cache_gib,
                       compile_decode=cfg.policy_compile_decode, join=cfg.policy_join)
