"""Command line: `python -m mcp_rl COMMAND --help`.

    python -m mcp_rl tools --server "python mcp_server.py" [--json]   # each tool's side-effect class
    python -m mcp_rl scenarios --server mcp_server.py --generator grounded --n 500 --out data/scenarios.jsonl
    python -m mcp_rl rollout --server mcp_server.py --model smollm2 --task "How many employees are there?"
    python -m mcp_rl eval --server company --scenarios data/scenarios.jsonl [--model smollm2] [--adapter RUN|DIR]
    python -m mcp_rl eval --run runs/demo        # with the run's own config.json and newest checkpoint
    python -m mcp_rl audit-reward --split test [--no-evidence]   # can a policy that looks nothing up earn reward?
    python -m mcp_rl train --preset cpu|t4 [--config FILE] [--out DIR] [--resume] [--steps 5] [--set train.steps=5]
    python -m mcp_rl serve --model smollm2 --adapter runs/demo --port 8000
    python -m mcp_rl demo          # the whole pipeline on the embedded CPU model, no key, no download
    python -m mcp_rl export --run runs/demo --merged DIR [--gguf FILE --quant q8_0] [--ollama DIR] [--model BASE] [--dtype auto]

Settings come from the Config dataclasses (mcp_rl/runs/config.py): each field is a flag with its own help
and default (mcp_rl/runs/flags.py), over a base: a preset and --config file (train), the run's config.json
(eval --run), or the defaults. Rollouts offer the agent only read-only tools unless told otherwise:
--tools a,b (only these, whatever their class), --deny-tools c, --read-only-tools d (unannotated, but only
reads), --allow-side-effects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from pathlib import Path

from mcp_rl.runs import flags
from mcp_rl.runs.config import PRESETS, Config
from mcp_rl.environment import environment
from mcp_rl.environments import DEFAULT, names

ROLLOUT = flags.flags_of("rollout")  # every RolloutConfig field a flag can set
EVAL_ROLLOUT = tuple(p for p in ROLLOUT if p != "rollout.temperature") + ("train.eval_temperature",)


def _policy(cfg: Config, a: argparse.Namespace):
    """An OpenAI-compatible endpoint policy when --base-url is given, else a local one (flags.local_policy)."""
    if a.base_url:
        from mcp_rl.policies.policy import OpenAIPolicy

        return OpenAIPolicy(cfg.model, base_url=a.base_url, timeout=a.timeout,
                            api_key=os.environ.get(a.api_key_env or "OPENAI_API_KEY", "none"))
    adapter = a.adapter or getattr(a, "run", None)
    return flags.local_policy(cfg, adapter, base_from_adapter="model" not in flags.given(a) and not getattr(a, "run", None))


def _with_server(cfg: Config, fn):
    """`fn(spec)` (a coroutine function) run with the server of the environment cfg.server names."""
    with environment(cfg.server).serve(cfg.server_token) as spec:
        return asyncio.run(fn(spec))


def _scenarios(cfg: Config, split: str, n: int | None) -> list:
    """The split's checkable tasks: a verified answer, or any where the environment scores its own."""
    from mcp_rl.tasks.scenarios import load_scenarios

    scored = environment(cfg.server).score is not None
    return [s for s in load_scenarios(cfg.scenarios, split=split) if scored or s.answer is not None][:n]


def cmd_tools(a) -> int:
    from mcp_rl.mcp.listing import tools_json, tools_table

    cfg = flags.config(a, Config(), trains=False)

    async def go(server):
        print(await (tools_json if a.json else tools_table)(server, cfg.tool_policy()))

    _with_server(cfg, go)
    return 0


def cmd_scenarios(a) -> int:
    from mcp_rl.tasks.generate import generate_to_file

    cfg = flags.config(a, Config(), trains=False)
    kw = {}
    if a.generator == "llm":
        from mcp_rl.tasks.generate import resolve_generator

        kw = {"generator_model": a.model, "base_url": a.base_url, "api_key": os.environ.get(a.api_key_env)}
        resolve_generator(a.base_url, kw["api_key"])  # no key: said before a server is started
    if a.templates and a.templates not in names():
        print(f"error: --templates names a shipped environment ({', '.join(names())}), got {a.templates[:40]!r}",
              file=sys.stderr)
        return 2
    templates = environment(a.templates or cfg.server).templates
    n = _with_server(cfg, lambda s: generate_to_file(s, a.generator, a.n, a.out, a.seed, policy=cfg.tool_policy(),
                                                     max_answer_share=a.max_answer_share, templates=templates, **kw))
    print(f"wrote {n if isinstance(n, int) else len(n)} scenarios to {a.out}")
    return 0


def cmd_rollout(a) -> int:
    from mcp_rl.runs.parts import check_tools
    from mcp_rl.rollout import rollout, transcript
    from mcp_rl.tasks.scenarios import Scenario

    cfg = flags.config(a, Config(), trains=False)

    async def go(server):
        await check_tools(server, cfg)  # refused before a model is loaded, not after
        return await rollout(_policy(cfg, a), server, Scenario(id="cli", task=a.task), cfg.rollout)

    traj = _with_server(cfg, go)
    print(transcript(traj))
    return 1 if traj.metrics.get("fatal") else 0


def cmd_eval(a) -> int:
    from mcp_rl.mcp.audit import TOOL_CALLS, log_tool_calls
    from mcp_rl.runs.config import run_config
    from mcp_rl.runs.evaluate import evaluate, save_eval, write_report
    from mcp_rl.runs.parts import check_tools

    cfg = flags.config(a, run_config(a.run) if a.run else Config(server=DEFAULT), trains=False)
    cfg = environment(cfg.server).configure(cfg)  # its tasks (where none are named), prompt, rewards
    # A run's own evaluation: the first train.eval_scenarios of the split (pipeline.load_splits).
    scenarios = _scenarios(cfg, a.split, a.n if a.n is not None or not a.run else cfg.train.eval_scenarios)
    rollout_cfg = dataclasses.replace(cfg.rollout, temperature=cfg.train.eval_temperature)
    label = a.label or ("adapter" if a.adapter or a.run else "base")

    async def go(server):
        await check_tools(server, cfg)
        policy = _policy(cfg, a)
        # With --out, every tool call is logged beside the eval rows (and counted in report.md).
        with log_tool_calls(Path(a.out) / TOOL_CALLS, phase=f"eval {label}") if a.out else contextlib.nullcontext():
            return await evaluate(policy, server, scenarios, label=label, rollout_cfg=rollout_cfg,
                                  reward_cfg=cfg.reward, k=a.k, counterfactual=environment(cfg.server).counterfactual())

    result, _ = _with_server(cfg, go)
    print(result.line())
    if a.out:
        save_eval(Path(a.out), result)
        print(f"report: {write_report(a.out, [result], [])}")
    return 0


def cmd_audit_reward(a) -> int:
    """Cheating policies through the real loop and reward: exit 1 when one earns more than --max-success."""
    from mcp_rl.runs.parts import check_tools
    from mcp_rl.rewards.reward_audit import audit_reward
    from mcp_rl.tasks.demonstrations import demonstrable

    cfg = flags.config(a, Config(server=DEFAULT), trains=False)
    cfg = environment(cfg.server).configure(cfg)
    scenarios = _scenarios(cfg, a.split, a.n)
    if not scenarios:
        print(f"error: {cfg.scenarios} has no verified scenarios in split {a.split!r}", file=sys.stderr)
        return 2
    env = environment(cfg.server)  # its demonstrations replay each scenario's reference
    demos = env.demonstrations(scenarios) if all(map(demonstrable, scenarios)) and not a.no_demonstrations else None

    async def go(server):
        await check_tools(server, cfg)
        return await audit_reward(server, scenarios, cfg.reward, cfg.rollout, demonstrations=demos,
                                  counterfactual=env.counterfactual())

    report = _with_server(cfg, go)
    print(f"reward audit: {len(scenarios)} scenarios of {cfg.scenarios} ({a.split}), "
          f"evidence rule {'on' if cfg.reward.require_evidence else 'off'}\n\n{report.table()}")
    return 1 if report.failed() else 0


def _train_config(a, base: Config) -> Config:
    """base (a preset + --config file), then --set, then the flags typed, then --allow-gameable-reward."""
    from mcp_rl.runs.config import apply_overrides, with_fields

    cfg = flags.config(a, apply_overrides(base, list(a.set or [])))
    return with_fields(cfg, {"reward.audit_max_success": 1.0}) if a.allow_gameable_reward else cfg


def cmd_train(a) -> int:
    from mcp_rl.runs.config import load_config
    from mcp_rl.policies.unsloth_loader import import_unsloth_if_used

    cfg = _train_config(a, load_config(a.config, base=a.preset))
    import_unsloth_if_used(cfg)  # before ART or the trainer import transformers
    from mcp_rl.runs.run import run

    asyncio.run(run(cfg, resume=a.resume))
    return 0


def cmd_demo(a) -> int:
    from mcp_rl.runs.config import preset
    from mcp_rl.runs.demo import summary  # what the run checked, and what a CPU run cannot show
    from mcp_rl.runs.run import run

    if "out" not in flags.given(a):
        a = argparse.Namespace(**vars(a), **{"cfg:out": f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"})
    t0 = time.monotonic()
    cfg = _train_config(a, preset("cpu", server=DEFAULT))
    res = asyncio.run(run(cfg, resume=a.resume))
    print("\n" + summary(res, cfg, (time.monotonic() - t0) / 60, cfg.out))
    return 0


def parser() -> argparse.ArgumentParser:
    """Every command; their flags for Config fields come from mcp_rl/runs/flags.py."""
    from mcp_rl.ship.export_command import add_export_parser
    from mcp_rl.ship.serve import add_serve_parser
    from mcp_rl.scale.workers import add_worker_parser

    p = argparse.ArgumentParser(prog="python -m mcp_rl", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    on_default = {"server": DEFAULT}  # eval and audit-reward use the default environment unless told otherwise

    def command(name, fn, help, *, server=None, model=False, split=False):
        sp = sub.add_parser(name, help=help)
        sp.set_defaults(fn=fn)
        if server is not None:  # None: no server; {}: --server required; else the defaults shown
            flags.add_flags(sp, "server", flags.SERVER, required=() if server else ("server",), shown=server)
        if model:
            flags.add_model_flags(sp, endpoint=True)
        if split:
            group = flags.add_flags(sp, "scenarios", ("scenarios",))
            group.add_argument("--split", default="test", help="the scenarios' split (default: test)")
            group.add_argument("--n", type=int, default=None, help="first N scenarios of the split (default: all)")
        return sp

    sp = command("tools", cmd_tools, "a server's tools: side-effect class, MCP annotations, whether rollouts offer them",
                 server={})
    sp.add_argument("--json", action="store_true", help="print the offered tools as OpenAI tool schemas (JSON) instead")

    sp = command("scenarios", cmd_scenarios, "generate scenarios (grounded SQL templates or an LLM)", server={})
    sp.add_argument("--generator", choices=["grounded", "llm"], default="grounded")
    sp.add_argument("--n", type=int, default=300)
    sp.add_argument("--out", required=True)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max-answer-share", type=float, default=0.02,
                    help="most of a split's verified tasks one constant answer may pass (at least one task "
                         "per value); scenarios over it are dropped (mcp_rl/tasks/balance.py)")
    sp.add_argument("--templates", default=None, metavar="ENV",
                    help="grounded: the question templates of a shipped environment (e.g. company) for a server that "
                         "serves its database; default: those of the environment --server names, if any")
    sp.add_argument("--model", default="openai/gpt-4.1-mini", help="generator model (llm)")
    sp.add_argument("--base-url", default="https://openrouter.ai/api/v1", help="generator endpoint (llm): a URL, "
                    "or openrouter, openai, ollama (local, no key: http://localhost:11434/v1)")
    sp.add_argument("--api-key-env", default="OPENROUTER_API_KEY")

    sp = command("rollout", cmd_rollout, "run one task and print the transcript", server={}, model=True)
    flags.add_flags(sp, "rollout", ROLLOUT)
    sp.add_argument("--task", required=True)

    sp = command("eval", cmd_eval, "verified success on held-out scenarios", server=on_default, model=True, split=True)
    sp.add_argument("--run", help="a run folder: evaluate with its config.json (server, model, tools, rollout, "
                    "reward; --n default: its train.eval_scenarios) and newest checkpoint; flags override it")
    flags.add_flags(sp, "rollout", EVAL_ROLLOUT, names={"train.eval_temperature": ("--temperature",)})
    sp.add_argument("--k", type=int, default=1, help="rollouts per scenario (pass@k: any succeeds; pass^k: all do)")
    sp.add_argument("--label")
    sp.add_argument("--out", help="folder for eval rows, report and tool-call log")

    sp = command("audit-reward", cmd_audit_reward, "play cheating policies through the real loop and reward: does "
                 "any earn credit?", server=on_default, split=True)
    flags.add_flags(sp, "audit", ("rollout.max_turns", "reward.audit_max_success", "reward.require_evidence"),
                    names={"reward.audit_max_success": ("--max-success",), "reward.require_evidence": ("--evidence",)})
    sp.add_argument("--no-demonstrations", action="store_true", help="no demonstration row (a server without SQL tools)")

    for name, fn, help in (("train", cmd_train, "train with a preset"),
                           ("demo", cmd_demo, "the whole CPU pipeline, no key, no download")):
        sp = sub.add_parser(name, help=help, description="Every Config field is a flag (below, by section); "
                            "--set FIELD=VALUE reaches the rest.")
        sp.set_defaults(fn=fn)
        if name == "train":
            sp.add_argument("--preset", default="cpu", choices=list(PRESETS))
            sp.add_argument("--config", help="YAML/TOML/JSON file over the preset")
        sp.add_argument("--resume", action="store_true", help="continue the run in --out from its last complete step")
        sp.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field, e.g. train.steps=5")
        sp.add_argument("--allow-gameable-reward", action="store_true",
                        help="train even when the reward audit finds a cheat that earns credit (reward.audit_max_success=1)")
        flags.add_config_flags(sp)
    add_export_parser(sub)  # `export`: merge a LoRA, GGUF, Ollama, the Hub
    add_serve_parser(sub)  # `serve`: the trained agent as an OpenAI-compatible endpoint
    add_worker_parser(sub)  # `rollout-worker`: rollouts next to an MCP server, for train --workers
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # bad input, missing server or extra
        if os.environ.get("MCP_RL_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
