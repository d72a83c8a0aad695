"""What `python -m mcp_rl demo` (`make demo`) prints at its end: what the CPU run checked, and what it cannot show.

A 2-step CPU run of a 135M model on 12 held-out scenarios is a check that every stage runs, not a
learning result: a newcomer reading "base 0.0% -> trained 0.0%" must not conclude that nothing worked,
nor read "-> 8.3%" as learning. The measured learning runs (GPU, 128 held-out scenarios) are in the
README.
"""

from __future__ import annotations

from typing import Any


def _grounded(result: Any) -> float | None:
    """The evaluation's grounded success: right, and shown by the episode's tool results (what the reward pays)."""
    return getattr(result, "grounded_rate", None)


def summary(res: dict, cfg: Any, minutes: float, out: str) -> str:
    """The demo's closing lines, from `runs.run`'s result and the config it ran.

    >>> from types import SimpleNamespace as NS
    >>> r = lambda s, c, e: NS(n=12, success_rate=s, success_se=0.08, completed_rate=c, mean_tool_errors=e)
    >>> cfg = NS(train=NS(steps=2, groups_per_step=2, group_size=4, warm_start_scenarios=32))
    >>> print(summary({"base": r(0.0, 0.0, 0.0), "trained": r(0.0, 0.92, 1.2), "report": "x/report.md"}, cfg, 17.9, "x"))
    ... # doctest: +NORMALIZE_WHITESPACE
    demo done in 17.9 min | report x/report.md
    What this CPU run checked:
      - every stage ran end to end: the MCP server over HTTP, 12 held-out scenarios evaluated before and after, a warm start on 32 demonstrations, 2 GRPO steps of 2 x 4 rollouts, the report
      - the tool-call format (taught by the warm start): 92% of held-out episodes ended in a well-formed complete_task call (base model: 0%), 1.20 tool errors per episode
      - verified success on the 12 held-out scenarios: base 0.0% -> trained 0.0% (one scenario is 8.3 points)
    What it cannot show: whether RL improves the model. 2 steps on 12 scenarios are within noise of each other either way; learning needs a GPU run (README.md, "What a run shows": measured on 128 held-out scenarios).
    next: python -m mcp_rl serve --adapter x --port 8000         # the trained agent as an OpenAI endpoint
          python -m mcp_rl export --run x --merged x/merged --ollama x/ollama   # GGUF + Modelfile
    """
    base, trained, t = res["base"], res["trained"], cfg.train
    warm = f"a warm start on {t.warm_start_scenarios} demonstrations, " if t.warm_start_scenarios else ""
    grounded = _grounded(trained)
    taught = " (taught by the warm start)" if warm and trained.completed_rate > base.completed_rate else ""
    return "\n".join([
        f"demo done in {minutes:.1f} min | report {res['report']}",
        "What this CPU run checked:",
        f"  - every stage ran end to end: the MCP server over HTTP, {base.n} held-out scenarios evaluated before and "
        f"after, {warm}{t.steps} GRPO steps of {t.groups_per_step} x {t.group_size} rollouts, the report",
        f"  - the tool-call format{taught}: {trained.completed_rate:.0%} of held-out episodes ended in a well-formed "
        f"complete_task call (base model: {base.completed_rate:.0%}), {trained.mean_tool_errors:.2f} tool errors "
        "per episode",
        f"  - verified success on the {base.n} held-out scenarios: base {base.success_rate:.1%} -> trained "
        f"{trained.success_rate:.1%} (one scenario is {100 / max(base.n, 1):.1f} points)"
        + (f" | grounded success {_grounded(base) or 0:.1%} -> {grounded:.1%}" if grounded is not None else ""),
        f"What it cannot show: whether RL improves the model. {t.steps} steps on {base.n} scenarios are within noise "
        "of each other either way; learning needs a GPU run (README.md, \"What a run shows\": measured on 128 "
        "held-out scenarios).",
        f"next: python -m mcp_rl serve --adapter {out} --port 8000         # the trained agent as an OpenAI endpoint",
        f"      python -m mcp_rl export --run {out} --merged {out}/merged --ollama {out}/ollama   # GGUF + Modelfile",
    ])
