"""ART LocalBackend trainer (vLLM + Unsloth on one CUDA GPU, e.g. a free Colab T4), same interface as PortableTrainer.

    trainer = ARTTrainer("agent-001", "mcp-rl")     # builds the art.TrainableModel; no GPU touched yet
    await trainer.start()                             # starts vLLM + Unsloth (needs openpipe-art[backend])
    groups = ...                                      # rollouts sampled from trainer.policy
    metrics = await trainer.train(groups)             # one ART GRPO step

Pinned to ART 0.4.11 (the release OpenPipe's T4 notebooks install): `await model.register(backend)`,
`await model.train(groups, config=art.TrainConfig(...))`. ART 0.5.x trains with
`backend.train(model, groups, ...)`; that difference is kept in `art_train` alone.
`art.local` is imported lazily: core ART (CI, CPU) has no backend extra.

T4 memory: ART computes log-probs `logprob_chunk_size` tokens at a time (ART's default 1024; its
T4 notebooks use 8 for 8192-token sequences) and asserts that the packed sequence length is a
multiple of it; vLLM 0.9.2 accepts only LoRA ranks in `VLLM_LORA_RANKS`. `check_art_settings`
checks both on the CPU, before vLLM starts (`ARTTrainer` and `mcp_rl.runs.config` call it).

Checkpoints: ART writes the LoRA of every step to `<art_path>/<project>/models/<name>/checkpoints/<step>`
and, on `register`, resumes from the newest one by itself. So `save(dir)` only records which ART
model and step a run reached (`art_trainer.json`, written atomically, and a manifest with the sha256 of
it and of ART's LoRA files) and `load(dir)` checks it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import art

from mcp_rl.training.manifest import write_manifest

log = logging.getLogger(__name__)

QWEN_3B = "Qwen/Qwen2.5-3B-Instruct"
STATE_FILE = "art_trainer.json"
# vLLM 0.9.2 `LoRAConfig.__post_init__`: max_lora_rank must be one of these (ART passes the LoRA r).
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# ART 0.4.11 `LocalBackend._get_packed_tensors` pads sequences to a multiple of this, capped at max_seq_length.
ART_PACK_MULTIPLE = 2048
INSTALL_HINT = ("ART's LocalBackend needs the backend extra and a CUDA GPU: "
                "pip install 'openpipe-art[backend]==0.4.11' vllm==0.9.2, then triton==3.2.0 "
                "(see the notebooks' install cell), or use the portable trainer (train.backend='portable')")


def check_art_settings(max_seq_len: int, logprob_chunk_size: int, lora_r: int, *, prefix: str = "",
                       seq_name: str = "max_seq_len") -> None:
    """Raise ValueError for settings ART 0.4.11 / vLLM 0.9.2 would reject only after vLLM has started.

    ART packs trajectories into sequences of `min(ceil(longest / 2048) * 2048, max_seq_len)` tokens
    and asserts `seq_len % logprob_calculation_chunk_size == 0`, so the chunk must divide
    `max_seq_len` and, when sequences may be shorter than it, 2048 too.

    >>> check_art_settings(8192, 8, 8)          # ART's T4 notebooks: fine
    >>> check_art_settings(8192, 8, 12)         # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ValueError: lora_r 12 is not a rank vLLM 0.9.2 serves ...
    """
    seq, chunk, rank = f"{prefix}{seq_name}", f"{prefix}logprob_chunk_size", f"{prefix}lora_r"
    if logprob_chunk_size < 1:
        raise ValueError(f"{chunk} must be positive, got {logprob_chunk_size} (ART's default is 1024, 8 on a T4)")
    if max_seq_len % logprob_chunk_size:
        up = -(-max_seq_len // logprob_chunk_size) * logprob_chunk_size
        raise ValueError(f"{seq} {max_seq_len} is not a multiple of {chunk} {logprob_chunk_size}: ART asserts "
                         f"seq_len % chunk == 0 in training; use a {seq_name} that is a multiple of "
                         f"{logprob_chunk_size} (e.g. {up}) or a smaller chunk that divides it (ART's T4 "
                         f"notebooks use 8 with 8192)")
    if max_seq_len > ART_PACK_MULTIPLE and ART_PACK_MULTIPLE % logprob_chunk_size:
        raise ValueError(f"{chunk} {logprob_chunk_size} must divide {ART_PACK_MULTIPLE}: ART pads shorter batches to a "
                         f"multiple of {ART_PACK_MULTIPLE} tokens and asserts seq_len % chunk == 0; use a power of "
                         f"two such as 1024 (ART's default) or 8 (ART's T4 notebooks)")
    if lora_r not in VLLM_LORA_RANKS:
        raise ValueError(f"{rank} {lora_r} is not a rank vLLM 0.9.2 serves (it becomes vLLM's max_lora_rank); "
                         f"use one of {', '.join(map(str, VLLM_LORA_RANKS))}")


def t4_internal_config(*, max_seq_length: int = 8192, gpu_memory_utilization: float = 0.8,
                       dtype: str | None = "float16", lora_r: int = 8, lora_alpha: int = 16) -> art.dev.InternalModelConfig:
    """The overrides ART's own T4 notebooks use, plus the T4's float16 (it has no bfloat16).

    4-bit Unsloth weights with vLLM sharing the GPU (`fast_inference`); eager vLLM (CUDA graphs
    need memory a T4 lacks); one scheduler step (multi-step needs compute capability >= 8).
    Pass `dtype=None` on a bf16 GPU to let Unsloth and vLLM choose."""
    engine = art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=gpu_memory_utilization,
                                num_scheduler_steps=1)
    if dtype:
        engine["dtype"] = dtype
    return art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=max_seq_length, load_in_4bit=True, fast_inference=True,
                                   max_lora_rank=lora_r),
        engine_args=engine,
        peft_args=art.dev.PeftArgs(r=lora_r, lora_alpha=lora_alpha),
    )


async def art_train(model: art.TrainableModel, backend: Any, groups: list[art.TrajectoryGroup], *,
                    learning_rate: float, beta: float = 0.0, scale_rewards: bool = False,
                    logprob_chunk_size: int | None = None) -> dict[str, float]:
    """One ART training step; the only code that knows which ART API is installed.

    0.4.x: `model.train(groups, config=TrainConfig(learning_rate, beta),
    _config={scale_rewards, logprob_calculation_chunk_size})`, metrics go to ART's history.jsonl /
    W&B and nothing is returned (None leaves the chunk to ART: 1024).
    0.5.x: `backend.train(model, groups, learning_rate=...)` returns a result with `.step` and `.metrics`."""
    if callable(getattr(backend, "train", None)):  # 0.5.x: the Backend trains
        result = await backend.train(model, groups, learning_rate=learning_rate)
        metrics = {f"art/{k}": float(v) for k, v in (getattr(result, "metrics", None) or {}).items()
                   if isinstance(v, (int, float))}
        return {**metrics, "step": float(result.step)}
    dev_config = art.dev.TrainConfig(scale_rewards=scale_rewards)
    if logprob_chunk_size is not None:
        dev_config["logprob_calculation_chunk_size"] = logprob_chunk_size
    await model.train(groups, config=art.TrainConfig(learning_rate=learning_rate, beta=beta), _config=dev_config)
    return {}


class ARTTrainer:
    """GRPO through ART's LocalBackend: vLLM serves `policy`, Unsloth trains a 4-bit LoRA.

    `loss="dr_grpo"` turns off ART's std scaling of advantages (`scale_rewards=False`); ART keeps
    its own per-token normalisation either way. The defaults are those of ART's T4 notebooks
    (8192-token sequences, log-probs in chunks of 8, float16); `check_art_settings` runs here too,
    so a trainer built without `mcp_rl.runs.config` fails on the CPU rather than inside vLLM."""

    def __init__(self, name: str = "mcp-rl-agent", project: str = "mcp-rl", *, base_model: str = QWEN_3B,
                 learning_rate: float = 1e-5, loss: str = "dr_grpo", beta: float = 0.0,
                 max_seq_length: int = 8192, gpu_memory_utilization: float = 0.8, dtype: str | None = "float16",
                 lora_r: int = 8, lora_alpha: int = 16, logprob_chunk_size: int = 8,
                 art_path: str | os.PathLike = ".art", in_process: bool = True,
                 internal_config: art.dev.InternalModelConfig | None = None):
        if loss not in ("dr_grpo", "grpo"):
            raise ValueError(f"loss must be 'dr_grpo' or 'grpo', got {loss!r}")
        if not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        internal_config = internal_config or t4_internal_config(
            max_seq_length=max_seq_length, gpu_memory_utilization=gpu_memory_utilization,
            dtype=dtype, lora_r=lora_r, lora_alpha=lora_alpha)
        # Check what ART will use: a given internal_config wins over the keyword arguments.
        init_args, peft_args = internal_config.get("init_args", {}), internal_config.get("peft_args", {})
        check_art_settings(int(init_args.get("max_seq_length", 32_768)), logprob_chunk_size,
                           int(init_args.get("max_lora_rank", peft_args.get("r", lora_r))), seq_name="max_seq_length")
        self.learning_rate, self.loss, self.beta = learning_rate, loss, beta
        self.logprob_chunk_size = logprob_chunk_size
        self.art_path, self.in_process = str(art_path), in_process  # in-process: Colab shows the logs
        self.model = art.TrainableModel(name=name, project=project, base_model=base_model,
                                        _internal_config=internal_config)
        self.backend: Any = None
        self.step = 0
        self.sft_steps = 0  # no warm start here: the Trainer protocol's count stays 0
        self._policy: Any = None

    async def start(self) -> None:
        """`register` once (mcp_rl.runs.parts.Trainer): a run calls this on every trainer it is given."""
        if self.backend is None:
            await self.register()

    def warm_start(self, demonstrations: list, epochs: int = 1, **kwargs: Any) -> dict:
        raise ValueError("the ART backend has no warm start: set train.warm_start_scenarios=0 (warm-start with the "
                         "portable backend, then train with ART from its adapter)")

    async def register(self, backend: Any = None) -> "ARTTrainer":
        """Start ART (vLLM server + trainer) for this model; resumes from ART's newest checkpoint."""
        if backend is None:
            try:
                from art.local import LocalBackend
            except ImportError as e:
                raise RuntimeError(f"{INSTALL_HINT} ({e})") from e
            backend = LocalBackend(in_process=self.in_process, path=self.art_path)
        await self.model.register(backend)
        self.backend, self._policy = backend, None
        self.step = int(await self.model.get_step())
        return self

    @property
    def policy(self) -> Any:
        """An OpenAIPolicy on ART's vLLM server; it asks the model for its newest name on every call.

        Its `step` is set from this trainer (on creation and after each update), so rollouts label
        their trajectories with the right step before the policy's first call learns it."""
        if self.backend is None:
            raise RuntimeError("the ART policy is served by vLLM: call `await trainer.register()` first")
        if self._policy is None:
            from mcp_rl.policies.policy import OpenAIPolicy

            self._policy = OpenAIPolicy.from_art(self.model)
            self._policy.step = self.step
        return self._policy

    async def train_step(self, groups: list[art.TrajectoryGroup]) -> dict[str, float]:
        """One ART step. Zero-variance groups are counted and not sent (ART would skip them anyway).

        Returns ART's `train/*` metrics as `art/*`, plus `loss` and `grad_norm` under the plain names
        PortableTrainer uses, so the pipeline's step line reads both trainers alike."""
        if self.backend is None:
            raise RuntimeError("call `await trainer.register()` before training")
        start, groups = time.perf_counter(), list(groups)
        for i, group in enumerate(groups):
            if not isinstance(group, art.TrajectoryGroup):
                raise TypeError(f"train_step takes art.TrajectoryGroup objects; item {i} is {type(group).__name__}")
        trainable = [g for g in groups if len({t.reward for t in g.trajectories}) > 1]
        skipped = len(groups) - len(trainable)
        if skipped:
            log.info("skipped %d of %d groups with zero reward variance", skipped, len(groups))
        metrics: dict[str, float] = {"skipped_groups": float(skipped), "num_groups": float(len(trainable)),
                                     "num_trajectories": float(sum(len(g.trajectories) for g in trainable)),
                                     "updated": 0.0}
        if trainable:
            metrics.update(await art_train(self.model, self.backend, trainable, learning_rate=self.learning_rate,
                                           beta=self.beta, scale_rewards=(self.loss == "grpo"),
                                           logprob_chunk_size=self.logprob_chunk_size))
            metrics.update(self._history_metrics())
            metrics.update({k: metrics[f"art/{k}"] for k in ("loss", "grad_norm") if f"art/{k}" in metrics})
            self.step = int(await self.model.get_step())
            if self._policy is not None:  # the next rollouts sample the new LoRA: label them so
                self._policy.step = self.step
            metrics["updated"] = 1.0
        metrics.update(step=float(self.step), seconds=time.perf_counter() - start)
        return metrics

    train = train_step  # already async: the same call as `await PortableTrainer.train(groups)`

    def _history_metrics(self) -> dict[str, float]:
        """ART 0.4.11 returns nothing from train; its last `train/*` row in history.jsonl has the loss."""
        path = Path(self.art_path) / self.model.project / "models" / self.model.name / "history.jsonl"
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return {}
        for row in reversed(rows):
            if any(k.startswith("train/") for k in row):
                return {f"art/{k[6:]}": float(v) for k, v in row.items()
                        if k.startswith("train/") and isinstance(v, (int, float))}
        return {}

    def checkpoint_dir(self) -> Path:
        """Where ART keeps the LoRA of the current step."""
        return Path(self.art_path) / self.model.project / "models" / self.model.name / "checkpoints" / f"{self.step:04d}"

    def save(self, directory: str | os.PathLike) -> Path:
        """Record the ART model and step (ART itself saved the LoRA); atomic via rename."""
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        state = {"backend": "art", "name": self.model.name, "project": self.model.project,
                 "base_model": self.model.base_model, "step": self.step, "art_path": self.art_path,
                 "art_checkpoint": str(self.checkpoint_dir())}
        fd, tmp = tempfile.mkstemp(prefix=f"{STATE_FILE}.tmp-", dir=target)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f, indent=2)
            os.replace(tmp, target / STATE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        write_manifest(target, art_checkpoint=self.checkpoint_dir())
        return target

    def load(self, directory: str | os.PathLike) -> dict:
        """Check a `save`d record belongs to this model; ART resumes from its own checkpoint on register."""
        path = Path(directory) / STATE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: pass a folder written by ARTTrainer.save()")
        state = json.loads(path.read_text())
        mine = {"name": self.model.name, "project": self.model.project, "base_model": self.model.base_model}
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(f"{path} is for ART model {theirs}, not {mine}; use the same name/project/base_model")
        if self.backend is not None and int(state["step"]) > self.step:
            raise ValueError(f"{path} records step {state['step']} but ART's checkpoints end at step {self.step} "
                             f"(is art_path {self.art_path!r} the one the run used?)")
        self.step = max(self.step, int(state["step"]))
        return state
