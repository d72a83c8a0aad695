"""Policies: what turns a conversation into the next assistant turn.

A policy is anything with `name`, `step` and `async complete(messages, tools, *,
max_tokens, temperature) -> Choice` (docs/DESIGN.md, "Choices"). This module has
the interface, `OpenAIPolicy` for any OpenAI-compatible endpoint (ART's
vLLM server, OpenRouter, OpenAI, Ollama, LM Studio) and two deterministic
policies: `ScriptedPolicy` (tests) and `DemonstrationPolicy` (verified
demonstrations for a supervised warm start).

    policy = OpenAIPolicy("gpt-4o-mini")               # OPENAI_API_KEY from env
    choice = await policy.complete(messages, tools, max_tokens=256, temperature=0.7)

The transformers policy lives in `local_policy.py`, the Hermes tool-call text format
(`find_tool_calls`, `choice_from_text`) in `hermes.py`.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import openai

from mcp_rl.tasks.demonstrations import format_answer, sql_plan, tables_in_sql  # noqa: F401 - public here too
from openai.types.chat.chat_completion import Choice

# The text format is hermes.py's; re-exported here, where it lived first.
from mcp_rl.policies.hermes import choice_from_text, find_tool_calls, tool_call_text

__all__ = [
    "Policy", "PolicyError", "ContextOverflow", "OpenAIPolicy", "ScriptedPolicy", "play",
    "DemonstrationPolicy", "choice_from_text", "find_tool_calls", "format_answer",
]


class PolicyError(RuntimeError):
    """The policy cannot produce a turn (endpoint down after retries, model crashed)."""


class ContextOverflow(PolicyError):
    """The conversation no longer fits the model's context window."""


@runtime_checkable
class Policy(Protocol):
    name: str
    step: int

    async def complete(
        self, messages: list[dict], tools: list[dict], *, max_tokens: int, temperature: float
    ) -> Choice: ...


# ---------------------------------------------------------------- OpenAI-compatible endpoints

_CONTEXT_MARKERS = ("context length", "maximum context", "context_length", "too many tokens", "prompt is too long")


def _is_context_error(e: openai.APIStatusError) -> bool:
    text = (str(e) + " " + json.dumps(getattr(e, "body", None) or {}, default=str)).lower()
    return e.status_code in (400, 413) and any(m in text for m in _CONTEXT_MARKERS)


def _mentions_logprobs(e: openai.APIStatusError) -> bool:
    return e.status_code in (400, 422) and "logprob" in str(e).lower()


class OpenAIPolicy:
    """A policy served by any OpenAI-compatible `/chat/completions` endpoint.

    Asks for token logprobs (`logprobs=True`) so ART can train on the choices;
    a server that rejects them is asked once more without, and remembered.
    Connection errors, timeouts, 429 and 5xx are retried with exponential
    backoff; after `retries` attempts a `PolicyError` is raised. A 400 about the
    context length raises `ContextOverflow`.
    """

    def __init__(
        self, model: str | Callable[[], str], *, base_url: str | None = None, api_key: str | None = None,
        timeout: float = 60, retries: int = 3, extra_body: dict | None = None, name: str | None = None,
        logprobs: bool = True, client: openai.AsyncOpenAI | None = None, backoff_s: float = 0.5,
    ):
        # `model` may be a callable so ART models are asked for their newest name on every call.
        self._model = model
        self._client = client or openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or ("not-needed" if base_url else None),
            timeout=timeout, max_retries=0,  # we retry ourselves, with our own error mapping
        )
        self.retries, self.extra_body, self.logprobs, self.backoff_s = retries, extra_body, logprobs, backoff_s
        self._name = name
        self._art_model: Any = None
        self._art_step = 0

    @classmethod
    def from_art(cls, model: Any, **kwargs: Any) -> "OpenAIPolicy":
        """Sample from an `art.Model` / registered `art.TrainableModel` (ART 0.4.11).

        The inference name is asked for on every call so the newest step is used.
        """
        policy = cls(model.get_inference_name, client=model.openai_client(), **kwargs)
        policy._art_model = model
        return policy

    @property
    def model_name(self) -> str:
        return self._model() if callable(self._model) else self._model

    @property
    def name(self) -> str:
        return self._name or self.model_name

    @property
    def step(self) -> int:
        """The `N` of a served `name@N`; else the ART backend's step seen on the last call, or set
        by the trainer after its last update (whichever came later)."""
        _, at, tail = self.model_name.rpartition("@")
        return int(tail) if at and tail.isdigit() else self._art_step

    @step.setter
    def step(self, value: int) -> None:
        # A trainer that has just updated the served LoRA knows the new step before any call
        # asks ART for it (ARTTrainer sets this), so the next rollouts are labelled right.
        self._art_step = int(value)

    async def _refresh_step(self) -> None:
        get_step = getattr(self._art_model, "get_step", None)
        if get_step is not None and getattr(self._art_model, "trainable", False):
            try:
                self._art_step = int(await get_step())
            except Exception:  # the step is metadata; sampling must not fail over it
                pass

    async def complete(
        self, messages: list[dict], tools: list[dict], *, max_tokens: int, temperature: float
    ) -> Choice:
        await self._refresh_step()
        body: dict[str, Any] = dict(
            model=self.model_name, messages=messages, max_tokens=max_tokens, temperature=temperature,
        )
        if tools:
            body["tools"] = tools
        if self.extra_body:
            body["extra_body"] = self.extra_body
        last: Exception | None = None
        attempt = 0
        while attempt < max(1, self.retries):
            try:
                if self.logprobs:
                    body["logprobs"] = True
                else:
                    body.pop("logprobs", None)
                response = await self._client.chat.completions.create(**body)
                if not response.choices:
                    raise PolicyError(f"{self.name}: the endpoint returned no choices")
                return response.choices[0]
            except openai.APIStatusError as e:
                if _is_context_error(e):
                    raise ContextOverflow(f"{self.name}: the conversation exceeds the model's context: {e}") from e
                if self.logprobs and _mentions_logprobs(e):
                    self.logprobs = False  # this server has no logprobs; ask without from now on
                    continue
                if e.status_code != 429 and e.status_code < 500:
                    raise PolicyError(f"{self.name}: the endpoint refused the request ({e.status_code}): {e}") from e
                last = e
            except (openai.APIConnectionError, openai.APITimeoutError) as e:
                last = e
            attempt += 1
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise PolicyError(
            f"{self.name}: no answer after {self.retries} attempts ({type(last).__name__}: {last}); "
            "is the endpoint up and the base_url right?"
        ) from last


# ---------------------------------------------------------------- deterministic policies


class ScriptedPolicy:
    """A policy whose turns come from `script(messages)` (verifiers' MockClient).

    The script returns Hermes text (tool-call blocks allowed) or a convenience
    dict `{"tool": name, "arguments": {...}}`. With a tokenizer the choices
    carry token ids (logprob 0.0), so they can be tokenized for training.
    """

    name = "scripted"

    def __init__(self, script: Callable[[list[dict]], str | dict], tokenizer: Any = None, *, name: str | None = None):
        self.script, self.tokenizer, self.step = script, tokenizer, 0
        if name:
            self.name = name

    async def complete(self, messages: list[dict], tools: list[dict], *, max_tokens: int = 0, temperature: float = 0.0) -> Choice:
        reply = self.script(messages)
        if isinstance(reply, dict):
            if "tool" not in reply:
                raise ValueError(f"a scripted dict reply needs a 'tool' key, got {sorted(reply)}")
            reply = tool_call_text(reply["tool"], reply.get("arguments") or {})
        if not isinstance(reply, str):
            raise TypeError(f"a script must return str or dict, got {type(reply).__name__}")
        return choice_from_text(reply, tokenizer=self.tokenizer)


def play(*turns: str | dict) -> Callable[[list[dict]], str | dict]:
    """A script for `ScriptedPolicy` that plays `turns` in order, one per assistant turn so far;
    the last one repeats.

    >>> script = play("a", {"tool": "t"})
    >>> script([]), script([{"role": "assistant"}] * 3)
    ('a', {'tool': 't'})
    """
    if not turns:
        raise ValueError("play() needs at least one turn")

    def script(messages: list[dict]) -> str | dict:
        done = sum(m.get("role") == "assistant" for m in messages)
        return turns[min(done, len(turns) - 1)]
    return script


class DemonstrationPolicy(ScriptedPolicy):
    """Emits verified demonstrations for known scenarios, one tool call per turn: `plan(scenario)`
    (an environment's, e.g. `sql_plan`) for the scenario whose `.task` is the first user message. The
    next step is chosen from the assistant turns so far, so tool errors (even a failing query) do not
    derail it.
    """

    name = "demonstration"

    def __init__(self, scenarios: Sequence[Any], plan: Callable[[Any], list[dict]], tokenizer: Any = None):
        if not callable(plan):
            raise ValueError("DemonstrationPolicy needs a plan: fn(scenario) -> tool-call steps (e.g. policy.sql_plan)")
        self.by_task: dict[str, Any] = {}
        self.ambiguous: set[str] = set()  # texts shared by tasks with different plans (τ² tickets repeat)
        for s in scenarios:
            text = s.task.strip()
            if text in self.by_task and plan(self.by_task[text]) != plan(s):
                self.ambiguous.add(text)
            self.by_task.setdefault(text, s)
        self.plan, self.scenario = plan, None
        super().__init__(self._next, tokenizer)

    def for_scenario(self, scenario: Any) -> "DemonstrationPolicy":
        """This policy bound to one task (rollout() asks for it): the task's own plan, whatever its text."""
        bound = copy.copy(self)  # a subclass (a test's failing endpoint) stays itself
        bound.scenario, bound.script = scenario, bound._next
        return bound

    def _next(self, messages: list[dict]) -> dict:
        task = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        scenario = self.scenario or self.by_task.get(task.strip())
        if scenario is None:
            raise PolicyError(f"no demonstration for task {task[:80]!r}: pass its Scenario to DemonstrationPolicy")
        if self.scenario is None and task.strip() in self.ambiguous:
            raise PolicyError(f"tasks with the text {task[:80]!r} have different demonstrations: roll out through "
                              "rollout(), which binds each episode to its scenario (for_scenario)")
        done = sum(1 for m in messages if m.get("role") == "assistant")
        steps = self.plan(scenario)
        return steps[min(done, len(steps) - 1)]
