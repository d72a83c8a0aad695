"""Config dataclasses, presets, files and overrides. Run: pytest tests/test_config.py"""

import pytest

from mcp_rl.config import Config, TrainConfig, apply_overrides, load_config, preset


def test_presets_are_variants_of_one_dataclass():
    cpu, t4 = preset("cpu"), preset("t4")
    assert type(cpu) is type(t4) is Config
    assert cpu.model == "smollm2" and cpu.train.backend == "portable" and cpu.train.warm_start_scenarios > 0
    assert t4.model == "Qwen/Qwen2.5-3B-Instruct" and t4.train.backend == "art" and t4.load_in_4bit


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "preset: cpu\nmodel: smollm2\ntrain:\n  steps: 7\n"),
    (".toml", 'model = "smollm2"\n[train]\nsteps = 7\n'),
    (".json", '{"train": {"steps": 7}}'),
])
def test_load_config_files(tmp_path, suffix, text):
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.train.steps == 7 and cfg.train.warm_start_scenarios == preset("cpu").train.warm_start_scenarios


def test_overrides_parse_values():
    cfg = apply_overrides(preset("cpu"), ["train.steps=9", "rollout.temperature=0.5", "tool_prefix=true", "out=runs/x"])
    assert (cfg.train.steps, cfg.rollout.temperature, cfg.tool_prefix, cfg.out) == (9, 0.5, True, "runs/x")


@pytest.mark.parametrize("overrides, message", [
    (["train.stepz=1"], "unknown field 'stepz'"),
    (["nosuch.x=1"], "not a config section"),
    (["steps"], "field=value"),
    (["train.group_size=1"], "group_size must be >= 2"),
    (["train.backend=tpu"], "backend must be"),
    (["rollout.max_turns=0"], "max_turns"),
    (["load_in_4bit=true"], "needs CUDA"),
])
def test_bad_values_say_how_to_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(preset("cpu"), overrides)


def test_unknown_preset_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="presets are: cpu, t4"):
        preset("gpu")
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_every_field_has_help():
    import dataclasses
    for cls in (Config, TrainConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
