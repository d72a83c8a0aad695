"""Tests for mcp_rl/training/art_backend.py, on CPU up to the GPU boundary.

The pinned ART's signatures that ARTTrainer calls are checked here, so an ART bump that would
break the Colab run fails CI. `RecordingBackend` stands in for ART's GPU service (vLLM + Unsloth):
it is the only double, and it runs ART's own `Model.register` / `TrainableModel.train` code.

    .venv/bin/python -m pytest tests/test_art_backend.py -q
"""

import ast
import importlib
import importlib.util
import inspect
import json
import sys
import types
from pathlib import Path

import art
import pytest

from mcp_rl.training.art_backend import QWEN_3B, ARTTrainer, art_train, check_art_settings, t4_internal_config

ART_DIR = Path(importlib.util.find_spec("art").submodule_search_locations[0])


# ---- the pinned ART API ---------------------------------------------------------------
@pytest.mark.parametrize("func, params", [
    (art.TrainableModel.__init__, {"name", "project", "base_model", "_internal_config"}),
    (art.TrainableModel.train, {"trajectory_groups", "config", "_config"}),
    (art.TrainableModel.register, {"backend"}),
    (art.TrainableModel.get_step, set()),
    (art.Model.get_inference_name, set()),
    (art.Model.openai_client, set()),
])
def test_pinned_art_signatures(func, params):
    assert params <= set(inspect.signature(func).parameters)
    assert inspect.iscoroutinefunction(func) == (func.__name__ in {"train", "register", "get_step"})


def test_model_train_takes_an_art_train_config():
    assert isinstance(inspect.signature(art.TrainableModel.train).parameters["config"].default, art.TrainConfig)
    assert {"learning_rate", "beta"} <= set(art.TrainConfig.model_fields)


@pytest.mark.parametrize("typed_dict, keys", [
    (art.dev.InternalModelConfig, {"init_args", "engine_args", "peft_args"}),
    (art.dev.InitArgs, {"max_seq_length", "load_in_4bit", "fast_inference", "max_lora_rank"}),
    (art.dev.EngineArgs, {"enforce_eager", "gpu_memory_utilization", "dtype", "num_scheduler_steps"}),
    (art.dev.PeftArgs, {"r", "lora_alpha"}),
    (art.dev.TrainConfig, {"scale_rewards", "logprob_calculation_chunk_size"}),
])
def test_pinned_art_config_keys(typed_dict, keys):
    assert keys <= set(typed_dict.__annotations__)


def test_pinned_art_chunks_logprobs_and_pads_to_2048_as_check_art_settings_assumes():
    train = (ART_DIR / "unsloth" / "train.py").read_text()
    assert '_config.get("logprob_calculation_chunk_size", 1024)' in train and "seq_len % chunk_size == 0" in train
    assert "math.ceil(max_tokens / 2048) * 2048" in (ART_DIR / "local" / "backend.py").read_text()


def test_local_backend_is_shipped_even_where_it_cannot_import():
    tree = ast.parse((ART_DIR / "local" / "backend.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LocalBackend")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert {"in_process", "path"} <= {a.arg for a in init.args.kwonlyargs}
    assert "LocalBackend" in (ART_DIR / "local" / "__init__.py").read_text()


# ---- building the model without a backend --------------------------------------------
def test_trainer_builds_a_t4_trainable_model_without_a_backend():
    trainer = ARTTrainer("agent-001", "mcp-rl", max_seq_length=4096, gpu_memory_utilization=0.7)
    model = trainer.model
    assert isinstance(model, art.TrainableModel) and model.base_model == QWEN_3B and trainer.step == 0
    assert model._internal_config["init_args"] == {"max_seq_length": 4096, "load_in_4bit": True,
                                                   "fast_inference": True, "max_lora_rank": 8}
    assert model._internal_config["engine_args"] == {"enforce_eager": True, "gpu_memory_utilization": 0.7,
                                                     "num_scheduler_steps": 1, "dtype": "float16"}
    json.dumps(model.model_dump())  # LocalBackend.register writes exactly this to model.json


def test_dtype_none_leaves_the_choice_to_art():
    assert "dtype" not in t4_internal_config(dtype=None)["engine_args"]


@pytest.mark.parametrize("kwargs, match", [
    ({"loss": "ppo"}, "dr_grpo"),
    ({"learning_rate": 0}, "learning_rate"),
    # What ART / vLLM would reject on the GPU, after minutes of loading: rejected here, on the CPU.
    ({"max_seq_length": 4100}, r"max_seq_length 4100 is not a multiple of logprob_chunk_size 8"),
    ({"logprob_chunk_size": 1024, "max_seq_length": 3000}, "multiple of 1024"),
    ({"logprob_chunk_size": 3, "max_seq_length": 6144}, "must divide 2048"),
    ({"lora_r": 12}, r"lora_r 12 is not a rank vLLM 0\.9\.2 serves"),
    ({"internal_config": t4_internal_config(lora_r=24)}, "lora_r 24"),  # a given config is checked too
    ({"internal_config": t4_internal_config(max_seq_length=1001)}, "max_seq_length 1001"),
])
def test_trainer_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ARTTrainer(**kwargs)


def test_check_art_settings_accepts_the_t4_and_arts_default_chunk():
    for seq, chunk in ((8192, 8), (4096, 8), (8192, 1024), (2048, 1024), (1000, 8), (3000, 8)):
        check_art_settings(seq, chunk, 16)


def test_art_merges_our_config_as_it_would_on_a_t4(monkeypatch, tmp_path):
    import torch

    # get_model_config reads the GPU's compute capability: a T4 is 7.5 (the hardware boundary).
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    try:
        importlib.import_module("art.local")
    except ImportError:  # core ART: load art.local.checkpoints without the backend-only __init__
        package = types.ModuleType("art.local")
        package.__path__ = [str(ART_DIR / "local")]
        monkeypatch.setitem(sys.modules, "art.local", package)
        monkeypatch.delitem(sys.modules, "art.local.checkpoints", raising=False)
    from art.dev.get_model_config import get_model_config

    config = get_model_config(QWEN_3B, str(tmp_path), ARTTrainer().model._internal_config)
    sys.modules.pop("art.local.checkpoints", None)
    assert config["init_args"]["max_seq_length"] == 8192 and config["init_args"]["load_in_4bit"]
    assert config["init_args"]["model_name"] == QWEN_3B
    assert {k: config["engine_args"][k] for k in ("enforce_eager", "gpu_memory_utilization", "dtype",
                                                  "num_scheduler_steps")} == \
        {"enforce_eager": True, "gpu_memory_utilization": 0.8, "dtype": "float16", "num_scheduler_steps": 1}
    assert config["peft_args"]["r"] == 8


# ---- register / train / policy ---------------------------------------------------------
class RecordingBackend(art.Backend):
    """ART's GPU service stand-in: records what ART's Model.train sends, counts steps like ART."""

    def __init__(self, art_path: Path | None = None):
        super().__init__()
        self.steps, self.calls, self.art_path = 0, [], art_path

    async def register(self, model):
        self.registered = model

    async def _prepare_backend_for_training(self, model, config=None):
        return "http://127.0.0.1:8000/v1", "default"

    async def _get_step(self, model):
        return self.steps

    async def _train_model(self, model, trajectory_groups, config, dev_config, verbose=False):
        self.calls.append((trajectory_groups, config, dev_config))
        self.steps += 1
        if self.art_path:  # the row LocalBackend._log_metrics appends
            folder = self.art_path / model.project / "models" / model.name
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "history.jsonl", "a") as f:
                f.write(json.dumps({"train/loss": 0.25, "train/grad_norm": 1.5, "train/num_groups_trainable": 1,
                                    "step": self.steps}) + "\n")
        yield {"loss": 0.25}


def group(*rewards):
    return art.TrajectoryGroup([art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=r)
                                for r in rewards])


async def test_register_without_the_backend_extra_explains_the_install():
    try:
        importlib.import_module("art.local")
        pytest.skip("ART's backend extra is installed here; register would start vLLM")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"openpipe-art\[backend\]"):
        await ARTTrainer().register()


async def test_policy_and_training_need_register_first():
    trainer = ARTTrainer()
    with pytest.raises(RuntimeError, match="register"):
        trainer.policy
    with pytest.raises(RuntimeError, match="register"):
        await trainer.train([group(1.0, 0.0)])


async def test_train_goes_through_the_pinned_model_train(tmp_path):
    backend = RecordingBackend(tmp_path)
    trainer = await ARTTrainer(learning_rate=3e-5, art_path=tmp_path).register(backend)
    metrics = await trainer.train([group(1.0, 0.0), group(0.5, 0.5)])
    (groups, config, dev_config), = backend.calls
    assert len(groups) == 1 and config.learning_rate == 3e-5
    assert dev_config == {"scale_rewards": False, "logprob_calculation_chunk_size": 8}  # ART's T4 notebooks
    assert (metrics["skipped_groups"], metrics["updated"], metrics["step"], trainer.step) == (1, 1, 1, 1)
    assert metrics["art/loss"] == 0.25


async def test_train_returns_loss_and_grad_norm_under_the_portable_trainers_names(tmp_path):
    trainer = await ARTTrainer(art_path=tmp_path, logprob_chunk_size=1024).register(RecordingBackend(tmp_path))
    metrics = await trainer.train([group(1.0, 0.0)])
    # The pipeline's step line reads rec.get("loss"), as PortableTrainer returns it.
    assert (metrics["loss"], metrics["grad_norm"]) == (0.25, 1.5) == (metrics["art/loss"], metrics["art/grad_norm"])


async def test_policy_step_is_the_trained_step_before_its_first_call(tmp_path):
    backend = RecordingBackend(tmp_path)
    backend.steps = 5  # ART resumed from checkpoint 5 on register
    trainer = await ARTTrainer(art_path=tmp_path).register(backend)
    policy = trainer.policy
    assert policy.step == 5  # the first rollouts after register are labelled 5, not 0
    await trainer.train([group(1.0, 0.0)])
    # No completion has run since the update: rollouts read this label before their first call.
    assert policy.step == trainer.step == 6


async def test_only_zero_variance_groups_reach_no_training(tmp_path):
    backend = RecordingBackend()
    trainer = await ARTTrainer(art_path=tmp_path).register(backend)
    metrics = await trainer.train([group(0.0, 0.0)])
    assert backend.calls == [] and (metrics["updated"], metrics["skipped_groups"], trainer.step) == (0, 1, 0)


async def test_policy_samples_from_the_registered_model():
    pytest.importorskip("mcp_rl.policies.policy")
    trainer = await ARTTrainer("agent-007").register(RecordingBackend())
    policy = trainer.policy
    assert policy.model_name == trainer.model.get_inference_name() == "agent-007"
    assert str(trainer.model.openai_client().base_url).startswith("http://127.0.0.1:8000/v1")
    assert trainer.policy is policy


async def test_art_train_adapts_to_the_05_backend_api():
    class Backend05:  # ART 0.5.x: backend.train(model, groups, ...) -> TrainResult(step, metrics)
        async def train(self, model, groups, learning_rate):
            self.seen = (model, len(groups), learning_rate)
            return types.SimpleNamespace(step=4, metrics={"loss": 0.5, "note": "x"})
    backend, model = Backend05(), ARTTrainer().model
    assert await art_train(model, backend, [group(1.0, 0.0)], learning_rate=1e-5) == {"art/loss": 0.5, "step": 4.0}
    assert backend.seen == (model, 1, 1e-5)


# ---- save / load -----------------------------------------------------------------------
def test_save_then_load_restores_the_step(tmp_path):
    trainer = ARTTrainer("agent-001")
    trainer.step = 3
    trainer.save(tmp_path / "run")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["art_trainer.json", "manifest.json"]  # no temp file
    again = ARTTrainer("agent-001")
    assert again.load(tmp_path / "run")["art_checkpoint"].endswith("agent-001/checkpoints/0003")
    assert again.step == 3


def test_save_writes_a_manifest_that_hashes_arts_own_lora(tmp_path):
    """ART saves its LoRA itself; the step folder records where (art_trainer.json) and its manifest hashes both,
    so a resume checks ART's files too (mcp_rl.runs.parts.Trainer: `save` writes the manifest)."""
    from mcp_rl.training.manifest import CheckpointCorrupt, verify_manifest

    trainer = ARTTrainer("agent-001", art_path=tmp_path / ".art")
    trainer.step = 1
    lora = trainer.checkpoint_dir()
    lora.mkdir(parents=True)
    (lora / "adapter_model.safetensors").write_bytes(b"lora")
    trainer.save(tmp_path / "step-0001")
    files = json.loads((tmp_path / "step-0001" / "manifest.json").read_text())["files"]
    assert set(files) == {"art_trainer.json", "art_checkpoint/adapter_model.safetensors"}
    (lora / "adapter_model.safetensors").write_bytes(b"LORA")
    with pytest.raises(CheckpointCorrupt, match="adapter_model.safetensors is not the file saved"):
        verify_manifest(tmp_path / "step-0001", art_checkpoint=lora)


async def test_start_registers_once_and_there_is_no_warm_start():
    trainer, calls = ARTTrainer("agent-001"), []

    async def register(backend=None):
        calls.append(backend)
        trainer.backend = object()

    trainer.register = register
    await trainer.start()
    await trainer.start()
    assert len(calls) == 1 and trainer.sft_steps == 0
    with pytest.raises(ValueError, match="no warm start"):
        trainer.warm_start([object()], epochs=1, learning_rate=1e-4, batch_size=1)


@pytest.mark.parametrize("other, error", [({"name": "someone-else"}, ValueError), (None, FileNotFoundError)])
def test_load_refuses_another_models_record(tmp_path, other, error):
    if other is not None:
        ARTTrainer("agent-001").save(tmp_path)
    with pytest.raises(error):
        ARTTrainer(**(other or {})).load(tmp_path)
