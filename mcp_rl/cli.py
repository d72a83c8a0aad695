"""Command line: `python -m mcp_rl COMMAND --help`.

    python -m mcp_rl tools --server "python mcp_server.py" [--json]   # each tool's side-effect class
    python -m mcp_rl scenarios --server mcp_server.py --generator grounded --n 500 --out data/scenarios.jsonl
    python -m mcp_rl rollout --server mcp_server.py --model smollm2 --task "How many employees are there?"
    python -m mcp_rl eval --server company --scenarios data/scenarios.jsonl [--model smollm2] [--adapter RUN|DIR]
    python -m mcp_rl audit-reward --split test [--no-evidence]   # can a policy that looks nothing up earn reward?
    python -m mcp_rl train --preset cpu|t4 [--config FILE] [--out DIR] [--resume] [--set train.steps=5]
    python -m mcp_rl serve --model smollm2 --adapter runs/demo --port 8000
    python -m mcp_rl demo          # the whole pipeline on the embedded CPU model, no key, no download
    python -m mcp_rl export --run runs/demo --merged DIR [--gguf FILE --quant q8_0] [--ollama DIR] [--model BASE] [--dtype auto]

Rollouts (rollout, eval, train, demo) offer the agent only read-only tools unless told otherwise:
--tools a,b (only these, whatever their class), --deny-tools c, --allow-side-effects.
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


def _policy(model: str | None, *, base_url: str | None, api_key_env: str | None, adapter: str | None,
            tool_prefix: bool, timeout: float = 60.0):
    """An OpenAI-compatible endpoint policy when --base-url is given, else a local transformers one.

    --adapter takes a run, checkpoint, ART checkpoint or adapter folder; without --model its base
    is the one the adapter records (else the embedded smollm2)."""
    if base_url:
        from .policy import OpenAIPolicy

        return OpenAIPolicy(model or "smollm2", base_url=base_url, timeout=timeout,
                            api_key=os.environ.get(api_key_env or "OPENAI_API_KEY", "none"))
    from .export import load_with_adapter, recorded_base_model
    from .local_policy import SMOLLM2, LocalPolicy, load_local_model

    model = model or (recorded_base_model(adapter) if adapter else None) or SMOLLM2
    m, tok = load_local_model(model)
    if adapter:
        m = load_with_adapter(m, adapter)
    return LocalPolicy(m, tok, name=Path(adapter).name if adapter else model, tool_prefix=tool_prefix)


async def _with_server(spec: str, token: str | None, fn):
    from .parts import COMPANY
    from .launch import company_server_command, serve_http

    if spec == COMPANY:
        async with serve_http(company_server_command(), token=token) as url:
            return await fn({"url": url, **({"token": token} if token else {})})
    return await fn({"url": spec, "token": token} if token and spec.startswith("http") else spec)


def _tool_policy(a):
    from .guard import ToolPolicy

    return ToolPolicy(allow=a.tools, deny=a.deny_tools or (), allow_side_effects=a.allow_side_effects)


async def _check_tools(server, tool_policy) -> None:
    """Refuse (SideEffectsRefused) before a model is loaded, not after."""
    from .connect import ToolSession

    async with ToolSession(server, policy=tool_policy):
        pass


def cmd_tools(a) -> int:
    from .connect import tools_json, tools_table

    async def go(server):
        print(await (tools_json if a.json else tools_table)(server, _tool_policy(a)))

    asyncio.run(_with_server(a.server, a.token, go))
    return 0


def cmd_scenarios(a) -> int:
    from .scenarios import generate_to_file

    kw = {}
    if a.generator == "llm":
        kw = {"generator_model": a.model, "base_url": a.base_url, "api_key": os.environ.get(a.api_key_env)}
    n = asyncio.run(_with_server(a.server, a.token, lambda s: generate_to_file(
        s, a.generator, a.n, a.out, a.seed, policy=_tool_policy(a), max_answer_share=a.max_answer_share, **kw)))
    print(f"wrote {n if isinstance(n, int) else len(n)} scenarios to {a.out}")
    return 0


def cmd_rollout(a) -> int:
    from .rollout import RolloutConfig, rollout, transcript
    from .scenarios import Scenario

    cfg = RolloutConfig(max_turns=a.max_turns, max_tokens=a.max_tokens, temperature=a.temperature,
                        timeout=a.rollout_timeout,
                        tool_policy=_tool_policy(a))

    async def go(server):
        await _check_tools(server, cfg.tool_policy)
        policy = _policy(a.model, base_url=a.base_url, api_key_env=a.api_key_env, adapter=a.adapter,
                         tool_prefix=a.tool_prefix, timeout=a.timeout)
        return await rollout(policy, server, Scenario(id="cli", task=a.task), cfg)

    traj = asyncio.run(_with_server(a.server, a.token, go))
    print(transcript(traj))
    return 1 if traj.metrics.get("fatal") else 0


def cmd_eval(a) -> int:
    from .audit import TOOL_CALLS, log_tool_calls
    from .evaluate import evaluate, save_eval, write_report
    from .rollout import RolloutConfig
    from .scenarios import load_scenarios

    scenarios = [s for s in load_scenarios(a.scenarios, split=a.split) if s.answer is not None][: a.n]
    cfg = RolloutConfig(max_turns=a.max_turns, max_tokens=a.max_tokens, temperature=a.temperature,
                        timeout=a.rollout_timeout,
                        tool_policy=_tool_policy(a))
    label = a.label or ("adapter" if a.adapter else "base")

    async def go(server):
        await _check_tools(server, cfg.tool_policy)
        policy = _policy(a.model, base_url=a.base_url, api_key_env=a.api_key_env, adapter=a.adapter,
                         tool_prefix=a.tool_prefix, timeout=a.timeout)
        # With --out, every tool call is logged beside the eval rows (and counted in report.md).
        with log_tool_calls(Path(a.out) / TOOL_CALLS, phase=f"eval {label}") if a.out else contextlib.nullcontext():
            return await evaluate(policy, server, scenarios, label=label, rollout_cfg=cfg, k=a.k)

    result, _ = asyncio.run(_with_server(a.server, a.token, go))
    print(result.line() + (f" | pass@{result.k} {result.pass_at_k:.1%}" if result.pass_at_k is not None else ""))
    if a.out:
        save_eval(Path(a.out), result)
        print(f"report: {write_report(a.out, [result], [])}")
    return 0


def cmd_audit_reward(a) -> int:
    """Cheating policies through the real loop and reward: exit 1 when one earns more than --max-success."""
    from .policy import DemonstrationPolicy
    from .reward_audit import audit_reward
    from .rewards import RewardConfig
    from .rollout import RolloutConfig
    from .scenarios import load_scenarios

    scenarios = [s for s in load_scenarios(a.scenarios, split=a.split) if s.answer is not None][: a.n]
    if not scenarios:
        print(f"error: {a.scenarios} has no verified scenarios in split {a.split!r}", file=sys.stderr)
        return 2
    reward = RewardConfig(require_evidence=not a.no_evidence, audit_max_success=a.max_success)
    cfg = RolloutConfig(max_turns=a.max_turns, tool_policy=_tool_policy(a))
    # Demonstrations need each scenario's reference query (the company server's tool names).
    demos = DemonstrationPolicy(scenarios) if all(s.reference for s in scenarios) and not a.no_demonstrations else None

    async def go(server):
        await _check_tools(server, cfg.tool_policy)
        return await audit_reward(server, scenarios, reward, cfg, demonstrations=demos)

    report = asyncio.run(_with_server(a.server, a.token, go))
    print(f"reward audit: {len(scenarios)} scenarios of {a.scenarios} ({a.split}), "
          f"evidence rule {'off' if a.no_evidence else 'on'}\n\n{report.table()}")
    return 1 if report.failed() else 0


def _with_tool_flags(cfg, a):
    """--tools / --deny-tools / --allow-side-effects over the config's own settings."""
    changes = {k: v for k, v in (("server_tools", a.tools), ("deny_tools", a.deny_tools)) if v is not None}
    if a.allow_side_effects:
        changes["allow_side_effects"] = True
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _with_worker_flags(cfg, a):
    """--workers / --worker-token / --policy-port over the config's own settings."""
    changes = {k: v for k, v in (("rollout_workers", a.workers), ("worker_token", a.worker_token),
                                 ("policy_port", a.policy_port)) if v is not None}
    return dataclasses.replace(cfg, **changes) if changes else cfg


def _train_config(a):
    from .config import apply_overrides, load_config

    cfg = load_config(a.config, base=a.preset)
    overrides = list(a.set or [])
    if getattr(a, "allow_gameable_reward", False):
        overrides.append("reward.audit_max_success=1.0")
    if a.out:
        overrides.append(f"out={a.out}")
    return _with_worker_flags(_with_tool_flags(apply_overrides(cfg, overrides), a), a)


def cmd_train(a) -> int:
    cfg = _train_config(a)
    if cfg.train.loader == "unsloth":  # before ART imports transformers: Unsloth patches it on import
        from .unsloth_loader import import_unsloth

        import_unsloth()
    from .runs import run

    asyncio.run(run(cfg, resume=a.resume))
    return 0


def cmd_demo(a) -> int:
    from .config import apply_overrides, preset
    from .runs import run

    out = a.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()
    cfg = _with_worker_flags(_with_tool_flags(apply_overrides(preset("cpu", server="company"),
                                                              [f"out={out}", *(a.set or [])]), a), a)
    res = asyncio.run(run(cfg, resume=a.resume))
    from .demo import summary  # what the run checked, and what a CPU run cannot show

    print("\n" + summary(res, cfg, (time.monotonic() - t0) / 60, out))
    return 0


def cmd_export(a) -> int:
    import tempfile

    from .export import find_adapter, merge_adapter, recorded_base_model

    if not (a.merged or a.gguf or a.ollama or a.push_to_hub):
        raise ValueError("nothing to write: pass --merged DIR, --gguf FILE, --ollama DIR and/or --push-to-hub REPO")
    source = a.run or a.adapter
    adapter = find_adapter(source)
    base = a.model or recorded_base_model(source) or "not recorded"
    print(f"LoRA adapter: {adapter} | base model: {base} | merging ({a.dtype})...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        merged = merge_adapter(source, a.merged or Path(tmp) / "merged", base_model=a.model, dtype=a.dtype)
        print(f"merged model: {merged}" + ("" if a.merged else " (temporary)"))
        gguf = Path(a.gguf) if a.gguf else (Path(a.ollama) / "agent.gguf" if a.ollama else None)
        if gguf is not None:
            from .gguf_export import gguf_summary, write_gguf

            start = time.monotonic()
            info = gguf_summary(write_gguf(merged, gguf, quant=a.quant))
            print(f"GGUF: {gguf} | {info['architecture']} {a.quant} | {info['bytes'] / 2**20:.0f} MiB | "
                  f"{time.monotonic() - start:.0f} s")
        if a.ollama:
            from .ollama import write_modelfile

            modelfile = write_modelfile(a.ollama, gguf, name=a.name)
            print(f"Ollama Modelfile: {modelfile}\n  ollama create {a.name} -f {modelfile}\n  ollama run {a.name}")
        if a.push_to_hub:
            from huggingface_hub import HfApi

            from .keys import get_secret

            hub = HfApi(token=get_secret("HF_TOKEN"))
            hub.create_repo(a.push_to_hub, private=True, exist_ok=True)
            hub.upload_folder(folder_path=str(merged), repo_id=a.push_to_hub)
            print(f"pushed {merged} to https://huggingface.co/{a.push_to_hub} (private)")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .config import PRESETS

    p = argparse.ArgumentParser(prog="python -m mcp_rl", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def server_args(sp, default=None):
        sp.add_argument("--server", required=default is None, default=default,
                        help="'company' (mcp_server.py over HTTP), a .py file, a shell command, or an http(s) URL")
        sp.add_argument("--token", default=os.environ.get("MCP_RL_TOKEN"), help="bearer token for an HTTP server")

    def tool_args(sp):
        names = lambda text: [n.strip() for n in text.split(",") if n.strip()]  # noqa: E731
        sp.add_argument("--tools", type=names, metavar="A,B,...",
                        help="offer the agent only these server tools (whatever their class)")
        sp.add_argument("--deny-tools", type=names, metavar="A,B,...", help="never offer these server tools")
        sp.add_argument("--allow-side-effects", action="store_true",
                        help="offer tools not annotated read-only (or annotated destructive); refused otherwise")

    def model_args(sp):
        sp.add_argument("--model", help="'smollm2' (default), a Hugging Face id/dir, or an endpoint model with --base-url; "
                        "with --adapter, default: the adapter's base model")
        sp.add_argument("--base-url", help="OpenAI-compatible endpoint (vLLM, Ollama, OpenRouter...)")
        sp.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the endpoint key")
        sp.add_argument("--adapter", help="LoRA for a local model: a run folder (newest checkpoint), a checkpoint, "
                        "ART's checkpoint folder or a peft adapter folder")
        sp.add_argument("--tool-prefix", action="store_true", help="force the <tool_call> envelope (tiny models)")
        sp.add_argument("--max-turns", type=int, default=8)
        sp.add_argument("--max-tokens", type=int, default=256, help="new tokens per assistant turn")
        sp.add_argument("--timeout", type=float, default=60.0,
                        help="seconds per --base-url request (raise it for a local model served on a CPU)")
        sp.add_argument("--rollout-timeout", type=float, default=600.0,
                        help="wall-clock seconds per rollout (raise it for a local model on a busy CPU)")
        sp.add_argument("--temperature", type=float, default=0.0)

    sp = sub.add_parser("tools", help="a server's tools: side-effect class, MCP annotations, whether rollouts offer them")
    server_args(sp)
    tool_args(sp)
    sp.add_argument("--json", action="store_true", help="print the offered tools as OpenAI tool schemas (JSON) instead")
    sp.set_defaults(fn=cmd_tools)

    sp = sub.add_parser("scenarios", help="generate scenarios (grounded SQL templates or an LLM)")
    server_args(sp)
    tool_args(sp)  # the generators see only what rollouts will offer
    sp.add_argument("--generator", choices=["grounded", "llm"], default="grounded")
    sp.add_argument("--n", type=int, default=300)
    sp.add_argument("--out", required=True)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--max-answer-share", type=float, default=0.02,
                    help="most of a split's verified tasks one constant answer may pass (at least one task "
                         "per value); scenarios over it are dropped (mcp_rl/balance.py)")
    sp.add_argument("--model", default="openai/gpt-4.1-mini", help="generator model (llm)")
    sp.add_argument("--base-url", default="https://openrouter.ai/api/v1", help="generator endpoint (llm)")
    sp.add_argument("--api-key-env", default="OPENROUTER_API_KEY")
    sp.set_defaults(fn=cmd_scenarios)

    sp = sub.add_parser("rollout", help="run one task and print the transcript")
    server_args(sp)
    model_args(sp)
    tool_args(sp)
    sp.add_argument("--task", required=True)
    sp.set_defaults(fn=cmd_rollout)

    sp = sub.add_parser("eval", help="verified success on held-out scenarios")
    server_args(sp, default="company")
    model_args(sp)
    tool_args(sp)
    sp.add_argument("--scenarios", default="data/scenarios.jsonl")
    sp.add_argument("--split", default="test")
    sp.add_argument("--n", type=int, default=None, help="first N scenarios of the split")
    sp.add_argument("--k", type=int, default=1, help="rollouts per scenario (pass@k)")
    sp.add_argument("--label")
    sp.add_argument("--out", help="folder for eval rows, report and tool-call log")
    sp.set_defaults(fn=cmd_eval)

    sp = sub.add_parser("audit-reward", help="play cheating policies through the real loop and reward: does any earn credit?")
    server_args(sp, default="company")
    tool_args(sp)
    sp.add_argument("--scenarios", default="data/scenarios.jsonl")
    sp.add_argument("--split", default="test")
    sp.add_argument("--n", type=int, default=None, help="first N scenarios of the split (default: all)")
    sp.add_argument("--max-success", type=float, default=0.02, help="a cheat succeeding on more than this share fails")
    sp.add_argument("--max-turns", type=int, default=8)
    sp.add_argument("--no-evidence", action="store_true", help="pay correct answers without evidence (to compare)")
    sp.add_argument("--no-demonstrations", action="store_true", help="no demonstration row (a server without SQL tools)")
    sp.set_defaults(fn=cmd_audit_reward)

    for name, fn in (("train", cmd_train), ("demo", cmd_demo)):
        sp = sub.add_parser(name, help="train with a preset" if name == "train" else "the whole CPU pipeline, no key, no download")
        if name == "train":
            sp.add_argument("--preset", default="cpu", choices=list(PRESETS))
            sp.add_argument("--config", help="YAML/TOML/JSON file over the preset")
        sp.add_argument("--out")
        sp.add_argument("--resume", action="store_true", help="continue the run in --out from its last complete step")
        sp.add_argument("--set", action="append", metavar="FIELD=VALUE", help="override a config field, e.g. train.steps=5")
        sp.add_argument("--allow-gameable-reward", action="store_true",
                        help="train even when the reward audit finds a cheat that earns credit (reward.audit_max_success=1)")
        tool_args(sp)
        sp.add_argument("--workers", type=lambda t: [u.strip() for u in t.split(",") if u.strip()], metavar="URL,...",
                        help="rollout workers (python -m mcp_rl rollout-worker) for the training steps' rollouts")
        sp.add_argument("--worker-token", default=os.environ.get("MCP_RL_WORKER_TOKEN"),
                        help="bearer token the workers require (env MCP_RL_WORKER_TOKEN)")
        sp.add_argument("--policy-port", type=int, help="127.0.0.1 port serving the policy to the workers (0: free)")
        sp.set_defaults(fn=fn)

    sp = sub.add_parser("export", help="merge a run's LoRA into its base model (portable or ART run)",
                        description="Merge a LoRA into its base model and save it with its tokenizer, for vLLM, "
                        "transformers or a llama.cpp conversion. The LoRA itself needs no export: each portable "
                        "checkpoint's adapter/ folder, and ART's checkpoint folder, already is a peft adapter.")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a run folder (CLI or notebook, either backend): its newest checkpoint")
    src.add_argument("--adapter", help="the input LoRA: a checkpoint folder, ART's checkpoint folder "
                     "(<art_path>/<project>/models/<name>/checkpoints/NNNN) or a peft adapter folder")
    sp.add_argument("--model", help="base model (default: the one the adapter records; 'smollm2': the embedded one); "
                    "give the 16-bit base, never a 4-bit one")
    sp.add_argument("--merged", help="output folder (written atomically) for the merged model + tokenizer")
    sp.add_argument("--gguf", help="output GGUF file (llama.cpp, Ollama, LM Studio), written with the gguf package")
    sp.add_argument("--quant", choices=["f16", "q8_0"], default="q8_0", help="GGUF weights (default q8_0)")
    sp.add_argument("--ollama", help="output folder for an Ollama Modelfile (+ the GGUF, DIR/agent.gguf without --gguf)")
    sp.add_argument("--name", default="mcp-rl-agent", help="the Ollama model name in the printed commands")
    sp.add_argument("--push-to-hub", metavar="REPO", help="upload the merged model to a private Hub repository (HF_TOKEN)")
    sp.add_argument("--dtype", choices=["auto", "float16", "bfloat16", "float32"], default="auto",
                    help="weights of the merged model (auto: bf16 on a bf16 GPU, fp16 on other GPUs, fp32 without CUDA)")
    sp.set_defaults(fn=cmd_export)

    from .serve import add_serve_parser

    add_serve_parser(sub)  # `serve`: the trained agent as an OpenAI-compatible endpoint
    from .workers import add_worker_parser

    add_worker_parser(sub)  # `rollout-worker`: rollouts next to an MCP server, for train --workers
    a = p.parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, FileNotFoundError, RuntimeError) as e:  # bad input, missing server or extra
        if os.environ.get("MCP_RL_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
