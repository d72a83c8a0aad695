"""mcp-rl: teach a small open LLM, by reinforcement learning, to use an MCP server well.

Pipeline (one module per stage): connect → scenarios → rollout → rewards →
train → evaluate → export; `runs` strings the stages into a resumable run, on an `Environment`
(a server, its tasks, their reward; the shipped ones are in mcp_rl/environments/). `guard` decides which
server tools an agent is offered, `audit` logs every tool call a run makes, `reward_audit` checks
that cheating policies earn nothing under a run's reward before it trains. Names that need torch
(LocalPolicy, PortableTrainer, ...) are imported on first use, so `import mcp_rl` stays light for
the server-only paths.
"""

import os
import sys
import types
from importlib import import_module

# litellm fetches its price list at import time unless told otherwise; offline machines
# (CI, the GPU box) would wait on it. The bundled copy is enough for judge calls.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_NAMES = {
    "mcp.connect": ["ServerSpec", "ToolSession", "ToolResult", "ServerUnavailable", "make_client", "mcp_tool_to_openai"],
    "mcp.listing": ["tools_json", "tools_table"],
    "mcp.guard": ["ToolPolicy", "ToolPolicyError", "SideEffectsRefused", "ToolsChanged", "classify_tool", "filter_tools"],
    "mcp.audit": ["log_tool_calls", "read_tool_calls"],
    "tasks.scenarios": ["Scenario", "load_scenarios", "save_scenarios", "split_scenarios"],
    "tasks.context": ["collect_context", "enrich_tools"],
    "tasks.grounded": ["grounded_scenarios"],
    "tasks.generate": ["llm_scenarios", "generate_to_file"],
    "environment": ["Environment", "Episode", "environment", "stdio_episodes"],
    "policies.policy": ["Policy", "PolicyError", "ContextOverflow", "OpenAIPolicy", "ScriptedPolicy", "DemonstrationPolicy", "sql_plan"],
    "policies.local_policy": ["LocalPolicy", "load_local_model"],
    "rollout": ["RolloutConfig", "rollout", "gather_rollouts", "transcript"],
    "rewards.score": ["RewardConfig", "verify_answer", "score_group", "score_trajectory"],
    "rewards.reward_audit": ["audit_reward", "AuditReport", "RewardGameable"],
    "rewards.evidence": ["supported"],
    "tasks.balance": ["answer_balance", "balance_report"],
    "training.portable": ["PortableTrainer"],
    "policies.unsloth_loader": ["UnslothPolicy", "UnslothUnavailable", "import_unsloth", "load_unsloth_model"],
    "training.art_backend": ["ARTTrainer"],
    "runs.evaluate": ["EvalResult", "evaluate", "write_report", "compare_transcripts"],
    "runs.config": ["Config", "TrainConfig", "PRESETS", "preset", "load_config", "apply_overrides"],
    "mcp.launch": ["HttpServer", "serve_http"],
    "runs.parts": ["Trainer", "build_trainer", "open_server"],
    "runs.pipeline": ["load_splits", "audit_before_training", "evaluate_policy", "warm_start", "train_step"],
    "runs.callbacks": ["TrainerCallback", "HeldOutCurve", "Deadline"],
    "runs.run": ["Run", "RunState", "open_run", "run"],
    "ship.export": ["find_adapter", "merge_adapter", "load_with_adapter", "recorded_base_model"],
    "ship.gguf_export": ["write_gguf", "gguf_summary"],
    "ship.ollama": ["write_modelfile"],
    "ship.serve": ["openai_app", "serve_policy", "ServerThread"],
    "keys": ["get_secret"],
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"



class _Package(types.ModuleType):
    """`rollout`, `evaluate` and `environment` are each a function and the module that defines it: the import system
    sets a loaded submodule as its package's attribute, which would hide the function. Binding the
    functions at import time would import torch-free but heavy modules (MCP, litellm: seconds) into
    every process that imports any part of mcp_rl, the company server's included; so the package
    keeps the function whenever the import system hands it the module."""

    def __setattr__(self, name: str, value) -> None:
        if name in ("rollout", "evaluate", "environment") and isinstance(value, types.ModuleType) and hasattr(value, name):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'mcp_rl' has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
