"""mcp-rl: teach a small open LLM, by reinforcement learning, to use an MCP server well.

Pipeline (one module per stage): connect → scenarios → rollout → rewards →
train → evaluate → export; `runs` strings the stages into a resumable run. `guard` decides which
server tools an agent is offered, `audit` logs every tool call a run makes, `reward_audit` checks
that cheating policies earn nothing under a run's reward before it trains. Names that need torch
(LocalPolicy, PortableTrainer, ...) are imported on first use, so `import mcp_rl` stays light for
the server-only paths.
"""

import os
from importlib import import_module

# litellm fetches its price list at import time unless told otherwise; offline machines
# (CI, the GPU box) would wait on it. The bundled copy is enough for judge calls.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

_NAMES = {
    "connect": ["ServerSpec", "ToolSession", "ToolResult", "ServerUnavailable", "make_client", "mcp_tool_to_openai", "tools_json",
                "tools_table"],
    "guard": ["ToolPolicy", "ToolPolicyError", "SideEffectsRefused", "ToolsChanged", "classify_tool", "filter_tools"],
    "audit": ["log_tool_calls", "read_tool_calls"],
    "scenarios": ["Scenario", "load_scenarios", "save_scenarios", "split_scenarios", "collect_context",
                  "grounded_scenarios", "llm_scenarios", "enrich_tools"],
    "policy": ["Policy", "PolicyError", "ContextOverflow", "OpenAIPolicy", "ScriptedPolicy", "DemonstrationPolicy"],
    "local_policy": ["LocalPolicy", "load_local_model"],
    "rollout": ["RolloutConfig", "rollout", "gather_rollouts", "transcript"],
    "rewards": ["RewardConfig", "verify_answer", "score_group", "score_trajectory"],
    "reward_audit": ["audit_reward", "AuditReport", "RewardGameable"],
    "evidence": ["supported"],
    "balance": ["answer_balance", "balance_report"],
    "train": ["PortableTrainer"],
    "unsloth_loader": ["UnslothPolicy", "UnslothUnavailable", "import_unsloth", "load_unsloth_model"],
    "art_backend": ["ARTTrainer"],
    "evaluate": ["EvalResult", "evaluate", "write_report", "compare_transcripts"],
    "config": ["Config", "TrainConfig", "PRESETS", "preset", "load_config", "apply_overrides"],
    "launch": ["HttpServer", "serve_http", "company_server_command"],
    "parts": ["Trainer", "build_trainer", "open_server"],
    "pipeline": ["load_splits", "audit_before_training", "evaluate_policy", "warm_start", "train_step"],
    "callbacks": ["TrainerCallback", "HeldOutCurve", "Deadline"],
    "runs": ["Run", "RunState", "open_run", "run"],
    "export": ["find_adapter", "merge_adapter", "load_with_adapter", "recorded_base_model"],
    "gguf_export": ["write_gguf", "gguf_summary"],
    "ollama": ["write_modelfile"],
    "serve": ["openai_app", "serve_policy", "ServerThread"],
    "keys": ["get_secret"],
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE)
__version__ = "0.1.0"


# `rollout` and `evaluate` are both a function and the module that defines it: importing the
# module would set the package attribute to the module, so bind the functions up front.
from .evaluate import evaluate  # noqa: E402
from .rollout import rollout  # noqa: E402


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'mcp_rl' has no attribute {name!r}")
    value = getattr(import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
