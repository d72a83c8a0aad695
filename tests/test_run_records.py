"""A run folder's record (mcp_rl/runs/run.py, mcp_rl/runs/config.py's redacted): refused when missing or
unreadable, never silently restarted; custom rewards recorded by name; no secret in config.json.
No model is loaded (fake trainers). Run: pytest tests/test_run_records.py
"""

import asyncio
import dataclasses
import json

import pytest

from mcp_rl import cli
from mcp_rl.runs.config import apply_overrides, preset
from mcp_rl.training.manifest import MANIFEST, CheckpointCorrupt, write_manifest
from mcp_rl.runs.run import RunFolderError, open_run


def config(out, **reward):
    cfg = apply_overrides(preset("cpu", server="company"), [f"out={out}", "train.steps=2"])
    return dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, **reward)) if reward else cfg


def recorded(tmp_path, step=1, **reward):
    """A run folder past its base evaluation, at `step`, with its checkpoint and base evaluation."""
    cfg = config(tmp_path / "run", **reward)
    r = open_run(cfg)
    r.state = dataclasses.replace(r.state, phase="training", step=step, evals={"base": 0})
    r.commit()
    (tmp_path / "run" / "eval_base.jsonl").write_text('{"id": "s1", "success": 0.0}\n')
    (tmp_path / "run" / "checkpoints" / f"step-{step:04d}").mkdir(parents=True)
    return cfg


def my_reward(traj, scenario):
    return 1.0


def other_reward(traj, scenario):
    return 0.0


# ---- custom rewards: recorded as name, module.qualname, weight ------------------------------
def test_a_run_with_a_custom_reward_reopens(tmp_path):
    cfg = recorded(tmp_path, custom=[("mine", my_reward, 0.5)])
    custom = json.loads((tmp_path / "run" / "config.json").read_text())["reward"]["custom"]
    assert custom == [{"name": "mine", "fn": f"{__name__}.my_reward", "weight": 0.5}]
    assert open_run(cfg).step == 1  # was: TypeError in runs._said (a function is no JSON)
    changed = dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, custom=[("mine", other_reward, 0.5)]))
    with pytest.raises(ValueError, match=r"reward.custom.0.fn: \"\S*my_reward\" -> \"\S*other_reward\""):
        open_run(changed)


def test_a_custom_reward_recorded_by_the_old_repr_still_reopens(tmp_path):
    cfg = recorded(tmp_path, custom=[("mine", my_reward, 0.5)])
    path = tmp_path / "run" / "config.json"
    data = json.loads(path.read_text())
    data["reward"]["custom"] = [["mine", "<function my_reward at 0x7f3a2c1d5e40>", 0.5]]  # what main wrote
    path.write_text(json.dumps(data))
    assert open_run(cfg).step == 1
    with pytest.raises(ValueError, match="reward.custom"):
        open_run(dataclasses.replace(cfg, reward=dataclasses.replace(cfg.reward, custom=[("mine", other_reward, 0.5)])))


# ---- a record that is gone: refused, never restarted --------------------------------------
def test_checkpoints_without_state_json_are_refused_not_restarted(tmp_path):
    cfg = recorded(tmp_path)
    (tmp_path / "run" / "state.json").unlink()
    with pytest.raises(RunFolderError, match=r"holds step-0001, eval_base.jsonl, metrics.jsonl but no state.json.*fresh=True") as e:
        open_run(cfg)
    assert "\n" not in str(e.value)
    assert (tmp_path / "run" / "eval_base.jsonl").read_text().startswith('{"id": "s1"')  # left as it was
    fresh = open_run(cfg, fresh=True)  # asked for explicitly: a new folder beside it
    assert fresh.dir != tmp_path / "run" and fresh.step == 0


def test_a_folder_with_only_its_config_is_still_a_new_run(tmp_path):
    """open_run writes config.json at once: a run stopped before its first commit has nothing else."""
    cfg = config(tmp_path / "run")
    open_run(cfg)
    assert open_run(cfg).state.phase == "new"


def test_state_json_without_config_json_is_refused(tmp_path):
    cfg = recorded(tmp_path)
    (tmp_path / "run" / "config.json").unlink()
    other = apply_overrides(cfg, ["train.learning_rate=0.5", "train.seed=7"])
    with pytest.raises(RunFolderError, match="has no config.json beside it.*restore config.json"):
        open_run(other)
    assert not (tmp_path / "run" / "config.json").exists()  # not rewritten with the new settings


# ---- a record that is unreadable: one line naming the file --------------------------------
@pytest.mark.parametrize("name, text, says", [
    ("state.json", "", "is empty"),
    ("state.json", '{"step": 3, "hist', "is not valid JSON"),
    ("state.json", "[]", "holds a JSON list"),
    ("state.json", '{"step": 1, "history": []}', "its 'phase' is null"),
    ("state.json", '{"step": "x", "history": [], "phase": "training"}', "its 'step' is \"x\""),
    ("state.json", '{"step": 1, "history": {}, "phase": "training"}', "its 'history'"),
    ("config.json", "", "is empty"),
    ("config.json", '{"server": "comp', "is not valid JSON"),
    ("config.json", '"text"', "holds a JSON str"),
])
def test_a_corrupt_record_names_its_file(tmp_path, name, text, says):
    cfg = recorded(tmp_path)
    (tmp_path / "run" / name).write_text(text)
    with pytest.raises(RunFolderError) as e:
        open_run(cfg)
    message = str(e.value)
    assert message.startswith(str(tmp_path / "run" / name)) and says in message and "\n" not in message
    assert "restore it from a backup" in message and "fresh=True" in message


def test_the_cli_prints_a_corrupt_record_as_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MCP_RL_DEBUG", raising=False)
    recorded(tmp_path)
    (tmp_path / "run" / "state.json").write_text('{"step": 1, "hi')
    assert cli.main(["train", "--out", str(tmp_path / "run"), "--resume", "--set", "train.steps=2",
                     "--set", "server=company"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'run' / 'state.json'} is not valid JSON") and err.count("\n") == 1


# ---- checkpoints: checked against their manifest before a resume loads them ---------------
def test_a_resume_refuses_a_checkpoint_that_differs_from_its_manifest(tmp_path):
    cfg = recorded(tmp_path)
    ckpt = tmp_path / "run" / "checkpoints" / "step-0001"
    (ckpt / "adapter").mkdir()
    weights = ckpt / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(b"w" * 4096)
    write_manifest(ckpt)
    weights.write_bytes(b"w" * 2048 + b"\0" * 2048)  # the tail zeroed, as after a crash before fsync

    class Trainer:
        step, sft_steps = 0, 0

        async def start(self):
            pass

        def load(self, path):
            pytest.fail("a checkpoint that is not as saved was loaded")

    with pytest.raises(CheckpointCorrupt, match="adapter_model.safetensors is not the file saved"):
        asyncio.run(open_run(cfg).trainer(Trainer()))


def test_checkpoints_of_a_trainer_without_its_own_manifest_get_one(tmp_path):
    """Both backends write their manifest in `save` (ART's hashes its own LoRA: test_art_backend.py); a
    trainer of the user's that writes none gets one from the run, so a resume still checks its files."""

    class Mine:
        def save(self, path):
            path.mkdir(parents=True)
            (path / "weights.bin").write_bytes(b"w")

    r = open_run(config(tmp_path / "run"))
    r.state.step = 1
    r._checkpoint(Mine())
    files = json.loads((tmp_path / "run" / "checkpoints" / "step-0001" / MANIFEST).read_text())["files"]
    assert set(files) == {"weights.bin"} and json.loads((tmp_path / "run" / "state.json").read_text())["step"] == 1


# ---- secrets inside values stay out of config.json ----------------------------------------
def secret_config(out, temperature=0.3):
    return apply_overrides(config(out), [
        "server=http://bob:hunter2@mcp.example.com/mcp?api_key=sk-in-url",
        "rollout_workers=['http://w1:8101/?token=wk-in-url']",
        "reward.judge_base_url=https://u:judge-pw@judge.example.com/v1?key=jk-in-url",
        f"reward.judge_params={{api_key: sk-judge-param, temperature: {temperature}}}"])


def test_config_json_hides_secrets_inside_values(tmp_path):
    cfg = secret_config(tmp_path / "run")
    open_run(cfg)
    text = (tmp_path / "run" / "config.json").read_text()
    for secret in ("hunter2", "sk-in-url", "wk-in-url", "judge-pw", "jk-in-url", "sk-judge-param"):
        assert secret not in text
    data = json.loads(text)
    assert data["server"] == "http://bob:***@mcp.example.com/mcp?api_key=***"
    assert data["reward"]["judge_params"] == {"api_key": "***", "temperature": 0.3}
    assert cfg.reward.judge_params["api_key"] == "sk-judge-param"  # the run itself keeps them


def test_a_resume_compares_redacted_values(tmp_path):
    cfg = secret_config(tmp_path / "run")
    r = open_run(cfg)
    r.state = dataclasses.replace(r.state, phase="training", step=1)
    r.commit()
    assert open_run(secret_config(tmp_path / "run")).step == 1  # the same secrets: no change
    with pytest.raises(ValueError, match="reward.judge_params.temperature: 0.3 -> 0.9"):
        open_run(secret_config(tmp_path / "run", temperature=0.9))
