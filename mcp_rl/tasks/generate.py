"""Scenario generation: tasks written from a server's tools, split and balanced, saved as JSONL.

    await generate_to_file("python mcp_server.py", "grounded", 300, "data/scenarios.jsonl", seed=0)
    await generate_to_file("uvx mcp-server-time", "llm", 40, "time.jsonl", seed=0,
                           generator_model="openai/gpt-4.1-mini")  # OpenRouter by default

Two generators. `grounded_scenarios` (mcp_rl/tasks/grounded.py) writes questions over a
SQL server's live schema and computes every answer through the server's own SQL
tool (`run_query` in the company server, `read_query` in mcp-server-sqlite, ...), so answers are
verified; an environment adds its own question templates (`Environment.templates`). `llm_scenarios`
works for any server: it asks a generator model (ART's `art.mcp.generate_scenarios`) for tasks, fed
with the real schema from `collect_context` (mcp_rl/tasks/context.py), and keeps only tasks that name no
invented table, column or tool; their `answer` is None (unverified).

Both are balanced (mcp_rl/tasks/balance.py): no constant answer passes more than `max_answer_share`
(2%) of a split's verified tasks. Regenerate the committed set with `python -m mcp_rl scenarios
--server mcp_server.py --generator grounded --n 500 --out data/scenarios.jsonl`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
from pathlib import Path
from typing import Any

from mcp_rl.tasks.balance import balance_splits
from mcp_rl.mcp.connect import ToolSession
from mcp_rl.tasks.context import collect_context, enrich_tools
from mcp_rl.environment import environment
from mcp_rl.tasks.grounded import grounded_scenarios
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.tasks.scenarios import (Scenario, append_scenarios, load_scenarios, normalize_task, save_scenarios, split_scenarios,
                        task_id)

log = logging.getLogger(__name__)


# Where a generator lives and which env var holds its key. `base_url` may be one
# of these names or any OpenAI-compatible URL (vLLM, LM Studio, a proxy).
PROVIDERS = {
    "openrouter": ("https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "ollama": ("http://localhost:11434/v1", None),
}

# ART's prompt asks for "a summary ... and a thorough analysis and report" in every
# task, which no verifier can check; these instructions override that requirement.
LLM_INSTRUCTIONS = """\
Override requirement 6: do NOT ask for summaries, reports or analyses. Each task must be one
concrete question with a single short, checkable answer (a number, a name, a date, or a list of
at most 5 items) that can be found with the tools. Do not name the tools in the task.
Use only the tables, columns, tools and values shown below; never invent names."""


class ScenarioGenerationError(RuntimeError):
    """Generation gave up; `.scenarios` holds what was accepted (and saved) before that."""

    def __init__(self, message: str, scenarios: list[Scenario]):
        super().__init__(message)
        self.scenarios = scenarios


def resolve_generator(base_url: str, api_key: str | None) -> tuple[str, str]:
    """(URL, key) for a provider name or URL; a clear error if a hosted provider has no key."""
    url, env = PROVIDERS.get(base_url, (base_url, None))
    if not re.match(r"https?://", url):
        raise ValueError(f"base_url must be one of {sorted(PROVIDERS)} or an http(s):// URL, got {base_url!r}")
    if env is None:
        env = next((e for u, e in PROVIDERS.values() if e and u.rstrip("/") == url.rstrip("/")), None)
    key = api_key or (os.environ.get(env) if env else None)
    if not key:
        if env:
            raise ValueError(f"no API key for {url}: set {env} (or pass api_key=), or use a local OpenAI-compatible "
                             "endpoint, which needs none: base_url='ollama' (the CLI: --base-url ollama --model "
                             "MODEL; that is http://localhost:11434/v1) or your server's http://HOST:PORT/v1 (vLLM, "
                             "LM Studio)")
        key = "EMPTY"  # local servers (Ollama, vLLM) ignore the key but the client needs one
    return url, key


def _flat_tools(tools: list[dict]) -> list[dict]:
    # ART reads tool["name"] / ["description"] / ["parameters"] at the top level;
    # OpenAI schemas nest them under "function", which would reach ART as empty names.
    return [t.get("function", t) for t in tools]


async def _art_batch(tools, resources, k, instructions, model, url, key, timeout) -> list[dict]:
    from art.mcp import generate_scenarios  # imported here: ART's import is slow

    def call() -> Any:
        # ART's generator is `async` but calls the synchronous OpenAI client inside,
        # so it gets its own event loop in a worker thread instead of blocking ours.
        return asyncio.run(generate_scenarios(
            tools=tools, resources=resources, num_scenarios=k, show_preview=False,
            custom_instructions=instructions, generator_model=model,
            generator_api_key=key, generator_base_url=url))

    # ART builds its client without a timeout; on expiry the worker thread is
    # abandoned and ends when its HTTP call does.
    collection = await asyncio.wait_for(asyncio.to_thread(call), timeout)
    return [{"task": s.task, "difficulty": s.difficulty} for s in collection.scenarios]


async def llm_scenarios(context, n: int, *, generator_model: str = "openai/gpt-4.1-mini",
                        base_url: str = "openrouter", api_key: str | None = None,
                        out_path: str | os.PathLike | None = None, batch_size: int = 10,
                        retries: int = 3, seed: int = 0, custom_instructions: str | None = None,
                        enrich: bool = True, timeout: float = 180.0) -> list[Scenario]:
    """Ask a generator model for `n` new tasks about the server described by `context`.

    `context` is a `ServerContext` (from `collect_context`). Tasks naming tables,
    columns or tools the server lacks are rejected (`context.validate_task`), and
    duplicates (normalized text) dropped. Each accepted batch is appended to
    `out_path` at once; tasks already there count towards `n` (so a rerun resumes)
    and are never repeated. A wrong count, a failed call or a batch with nothing
    new is retried, `retries` times in a row at most, then ScenarioGenerationError.
    """
    if n < 0 or batch_size < 1 or retries < 0:
        raise ValueError(f"need n >= 0, batch_size >= 1, retries >= 0; got {n}, {batch_size}, {retries}")
    url, key = resolve_generator(base_url, api_key)

    tools = _flat_tools(enrich_tools(context.tools, context) if enrich else context.tools)
    resources = [{"uri": r["uri"], "name": r.get("name", ""), "text": r.get("text", "")[:2000]}
                 for r in context.resources]
    previous = load_scenarios(out_path) if out_path and Path(out_path).exists() else []
    seen = {normalize_task(s.task) for s in previous}
    accepted: list[Scenario] = []
    rng = random.Random(seed)
    failures, batch = 0, 0
    while len(previous) + len(accepted) < n:
        k = min(batch_size, n - len(previous) - len(accepted))
        batch += 1
        # A different focus per batch (chosen by seed) keeps batches from repeating each other.
        focus = context.focus_hint(rng)
        instructions = "\n\n".join(x for x in (LLM_INSTRUCTIONS, focus, context.as_text(),
                                               custom_instructions) if x)
        try:
            raw = await _art_batch(tools, resources, k, instructions, generator_model, url, key, timeout)
            error = None
        except asyncio.TimeoutError:
            raw, error = [], f"no answer within {timeout:.0f}s"
        except Exception as e:  # noqa: BLE001 - wrong counts, HTTP and JSON errors all mean: try again
            raw, error = [], f"{type(e).__name__}: {e}"
        fresh: list[Scenario] = []
        for item in raw:
            task = " ".join(str(item["task"]).split())
            reason = context.validate_task(task)
            if reason or normalize_task(task) in seen:
                log.info("rejected generated task %r: %s", task[:80], reason or "duplicate")
                continue
            seen.add(normalize_task(task))
            fresh.append(Scenario(id=task_id("llm", task), task=task,
                                  difficulty=min(5, max(1, int(item["difficulty"]))), tags=["llm"]))
        if fresh:
            if out_path:
                append_scenarios(out_path, fresh)
            accepted += fresh
            failures = 0
        else:
            failures += 1
            log.warning("batch %d gave nothing new (%s); %d of %d retries used",
                        batch, error or "all tasks rejected", failures, retries)
            if failures > retries:
                where = f"; {len(accepted)} new scenarios are saved in {out_path}" if out_path else ""
                raise ScenarioGenerationError(
                    f"scenario generation stopped after {failures} failed batches in a row "
                    f"(last: {error or 'every task rejected or duplicate'}); got {len(previous) + len(accepted)} "
                    f"of {n}{where}. Check the model name, base_url and key, then rerun to resume.",
                    accepted)
    return accepted


async def generate_to_file(spec, generator: str, n: int, out: str | os.PathLike, seed: int = 0,
                           policy=None, max_answer_share: float = 0.02, templates=None, **llm_kwargs) -> list[Scenario]:
    """The CLI's `scenarios` command: generate, assign splits (seed 0 hashing), balance, save `out`.

    `generator` is "grounded" (SQL servers; verified answers) or "llm" (any server;
    `llm_kwargs` go to `llm_scenarios`). Returns everything now in `out`.
    `policy` (a `mcp_rl.mcp.guard.ToolPolicy`; None: `ToolPolicy()`) is the one rollouts use: the
    generators see only the tools the agent will be offered, and a server with side-effect tools
    is refused the same way, so no task is written for a tool training would never offer.
    `max_answer_share`: no constant answer may pass more than this share of a split's verified
    tasks (at least one task per value), nor a nearest training task's answer more than this share of
    a held-out split (`mcp_rl.tasks.balance`); the scenarios over it are dropped. `templates`: the grounded
    generator's own question templates (default: those of the environment `spec` names or serves).
    """

    if generator not in ("grounded", "llm"):
        raise ValueError(f"generator must be 'grounded' or 'llm', got {generator!r}")
    async with ToolSession(spec, policy=policy or ToolPolicy()) as session:
        if generator == "grounded":
            scenarios = await grounded_scenarios(session, n, seed=seed, max_answer_share=max_answer_share,
                                                 templates=templates or environment(spec).templates)
        else:
            context = await collect_context(session)
            await llm_scenarios(context, n, out_path=out, seed=seed, **llm_kwargs)
            scenarios = load_scenarios(out)
    # Split by seed 0 regardless of the generation seed: a scenario's split then depends
    # only on its id, the same in every file it appears in.
    split_scenarios(scenarios, seed=0)
    # Balanced on the final splits (generation balanced on their expected sizes); an answer an
    # LLM task has gained by verification counts the same as a grounded one, None never does.
    scenarios = balance_splits(scenarios, max_answer_share, seed=seed)
    save_scenarios(out, scenarios)
    return scenarios
