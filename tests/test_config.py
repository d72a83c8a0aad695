"""Config dataclasses, presets, files and overrides. Run: pytest tests/test_config.py"""

import pytest

from mcp_rl.runs.config import Config, TrainConfig, apply_overrides, load_config, preset
from mcp_rl.runs.train_config import PROMPT_TOKENS


def test_presets_are_variants_of_one_dataclass():
    cpu, t4 = preset("cpu"), preset("t4")
    assert type(cpu) is type(t4) is Config
    assert cpu.model == "smollm2" and cpu.train.backend == "portable" and cpu.train.warm_start_scenarios > 0
    assert t4.model == "Qwen/Qwen2.5-3B-Instruct" and t4.train.backend == "art" and t4.load_in_4bit


def test_t4_preset_is_sized_like_arts_t4_notebooks():
    t4 = preset("t4")
    # ART's T4 notebooks: 8192-token sequences, log-probs in chunks of 8, 3-4 turns.
    assert (t4.train.max_seq_len, t4.train.logprob_chunk_size) == (8192, 8)
    assert t4.train.max_seq_len % t4.train.logprob_chunk_size == 0
    assert (t4.rollout.max_turns, t4.rollout.max_tokens) == (4, 384)
    # The prompt, every assistant turn and every (capped, ~3 chars a token) tool result fit.
    worst = PROMPT_TOKENS + t4.rollout.max_turns * (t4.rollout.max_tokens + t4.rollout.max_result_chars // 3)
    assert worst <= t4.train.max_seq_len


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


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{k}: &{k} [{', '.join([f'*{j}'] * 9)}]\n" for j, k in zip("abcdefgh", "bcdefghi")) + "train: {steps: 1}\n"


@pytest.mark.timeout(20)
def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """~400 bytes whose nested aliases stand for 9**9 strings: refused while parsing, in one line naming the
    alias, before anything copies it (it ran out of memory after ~45 s: issue [hardening] item 6)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 450
    with pytest.raises(ValueError, match=r"bomb.yaml is not valid YAML \(an alias \(\*name\), which config files may not "
                                         r"use at line 2\)"):
        load_config(path)


@pytest.mark.parametrize("text", ["preset: [a]\n", "preset: {a: 1}\n", "preset: 3\n"])
def test_a_preset_that_is_not_a_name_is_one_clear_error(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match="unknown preset .*; presets are: cpu"):
        load_config(path)


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
    (["rollout_workers=[127.0.0.1:8101]"], "http"),
    (["policy_port=70000"], "policy_port"),
    (["train.warm_start_scenarios=0", "train.warm_start_gate_scenarios=4"], "gate_scenarios checks a warm start"),
    (["train.warm_start_gate_scenarios=4", "train.warm_start_min_completed=90"], r"share of episodes in \[0, 1\]"),
    (["train.warm_start_max_extra_epochs=-1"], "must be >= 0"),
    (["train.warm_start_max_tool_errors=-0.5"], "count per episode"),
    (["policy_join=true"], "set policy_reuse_prefix=false"),  # the cpu preset reuses prefixes
])
def test_bad_values_say_how_to_fix(overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(preset("cpu"), overrides)


@pytest.mark.parametrize("base, overrides, message", [
    # ART asserts seq_len % logprob_calculation_chunk_size == 0 inside training, on the GPU.
    ("t4", ["train.max_seq_len=8196"], r"train.max_seq_len 8196 is not a multiple of train.logprob_chunk_size 8.*8200"),
    ("t4", ["train.logprob_chunk_size=1000"], "not a multiple"),
    # 3 divides 6144 but not the 2048-multiples ART pads shorter steps to.
    ("t4", ["train.max_seq_len=6144", "train.logprob_chunk_size=3"], "must divide 2048"),
    ("t4", ["train.logprob_chunk_size=0"], "logprob_chunk_size must be positive"),
    ("t4", ["train.lora_r=12"], r"train.lora_r 12 is not a rank vLLM.*8, 16, 32, 64, 128, 256, 320, 512"),
    ("cpu", ["train.backend=art", "train.max_seq_len=3000"], "multiple of 1024"),
    # An episode's own tokens must fit: ART would cut the end, where the answer is.
    ("cpu", ["rollout.max_turns=12"], r"\(12 x 96\).*raise train.max_seq_len to at least 2176"),
    ("t4", ["rollout.max_tokens=2048"], "lower rollout.max_turns or rollout.max_tokens"),
])
def test_settings_the_gpu_would_reject_fail_on_the_cpu(base, overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(preset(base), overrides)


@pytest.mark.parametrize("overrides", [
    ["train.lora_r=12", "train.max_seq_len=3000"],  # vLLM's ranks and ART's chunks bind only the ART backend
    ["rollout.max_turns=8", "rollout.max_tokens=128"],  # 1024 + 8 x 128 = 2048 fits exactly
])
def test_portable_backend_is_not_held_to_vllm_limits(overrides):
    apply_overrides(preset("cpu"), overrides)


def test_defaults_are_a_valid_config():
    cfg = Config()
    assert PROMPT_TOKENS + cfg.rollout.max_turns * cfg.rollout.max_tokens <= cfg.train.max_seq_len


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


@pytest.mark.parametrize("raw, expected", [("2e-4", 2e-4), ("1E3", 1000.0), ("0.5", 0.5), ("3", 3)])
def test_overrides_read_exponent_floats_as_numbers(raw, expected):
    cfg = apply_overrides(preset("cpu"), [f"train.learning_rate={raw}"])
    assert cfg.train.learning_rate == expected


def test_override_strings_stay_strings():
    assert apply_overrides(preset("cpu"), ["out=runs/1e5-x"]).out == "runs/1e5-x"


# ---- field types, named (YAML 1.1 included) --------------------------------------------------
@pytest.mark.parametrize("text, field, value", [
    ("train:\n  learning_rate: 1e-4\n", "learning_rate", 1e-4),  # YAML 1.1 reads it as the text '1e-4'
    ("train:\n  warm_start_lr: 5E-5\n", "warm_start_lr", 5e-5),
    ("train:\n  steps: 4.0\n", "steps", 4),
    ("train:\n  eval_temperature: 1\n", "eval_temperature", 1.0),
])
def test_yaml_numbers_are_read_as_the_field_needs(tmp_path, text, field, value):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    got = getattr(load_config(path).train, field)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text, message", [
    ("train:\n  steps: three\n", r"train.steps must be a whole number, got 'three' \(str\)"),
    ("train:\n  steps: 2.5\n", "train.steps must be a whole number, got 2.5"),
    ("train:\n  learning_rate: [1, 2]\n", r"train.learning_rate must be a number, got \[1, 2\] \(list\)"),
    ("train: [1, 2]\n", r"train must be a section of fields .*got \[1, 2\] \(list\)"),
    ("allow_side_effects: 'no'\n", "allow_side_effects must be true or false, got 'no'"),
    ("train:\n  gradient_checkpointing: 'off'\n", "train.gradient_checkpointing must be true or false, got 'off'"),
    ("reward:\n  exact_integers: 'yes'\n", "reward.exact_integers must be true or false, got 'yes'"),
    ("reward:\n  verified_weight: [1]\n", "reward.verified_weight must be a number"),
    ("rollout:\n  max_turns: many\n", "rollout.max_turns must be a whole number"),
    ("model: no\n", "model must be text, got False"),  # YAML 1.1: an unquoted no is false
    ("rollout_workers: http://h:8101\n", "rollout_workers must be a list, got 'http://h:8101'"),
    ("deny_tools: [1]\n", r"deny_tools\[0\] must be text, got 1"),
    ("reward:\n  judge_params: [temperature]\n", "reward.judge_params must be a mapping"),
    ("train:\n  steps: 3\n  bad: [\n", "is not valid YAML .* at line 4"),
])
def test_a_value_of_the_wrong_type_names_its_field(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as e:
        load_config(path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("overrides, message", [
    (["train.steps=three"], "train.steps must be a whole number"),
    (["tool_prefix='no'"], "tool_prefix must be true or false"),
    (["rollout_workers=[http://h:81/?a=1]"], "is not YAML .*quote text"),
])
def test_overrides_of_the_wrong_type_name_their_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(preset("cpu"), overrides)


def test_dataclasses_built_in_python_are_checked_too():
    with pytest.raises(ValueError, match="train.steps must be a whole number"):
        TrainConfig(steps="3")
    with pytest.raises(ValueError, match="train must be a section"):
        Config(train=[1, 2])
    from pathlib import Path
    assert Config(out=Path("runs/x")).out == "runs/x"  # a path where text goes is text


def test_an_infinite_learning_rate_is_refused():
    """Probe, round 2: `learning_rate: .inf` passed the > 0 check."""
    with pytest.raises(ValueError, match="finite number > 0"):
        apply_overrides(preset("cpu"), ["train.learning_rate=.inf"])


def test_run_config_reads_a_runs_record_without_its_secrets(tmp_path):
    import json

    from mcp_rl.runs.config import redacted, run_config

    def fn(traj, scenario):
        return 0.0

    cfg = preset("cpu", server_token="s3cret", worker_token="w", model="m", train={"steps": 5},
                 reward={"judge_api_key": "k", "custom": [("c", fn, 0.5)]})
    (tmp_path / "config.json").write_text(json.dumps({**redacted(cfg), "gone_field": 1}))
    back = run_config(tmp_path)
    assert (back.model, back.train.steps, back.rollout.max_tokens) == ("m", 5, cfg.rollout.max_tokens)
    assert (back.server_token, back.worker_token, back.reward.judge_api_key, back.reward.custom) == (None, None, None, [])
    with pytest.raises(ValueError, match="not a run folder"):
        run_config(tmp_path / "nothing")


def test_with_fields_without_train_checks_takes_any_turn_budget():
    from mcp_rl.runs.config import with_fields

    with pytest.raises(ValueError, match="max_seq_len"):
        with_fields(Config(), {"rollout.max_turns": 40})
    cfg = with_fields(Config(server_tools=["a"]), {"rollout.max_turns": 40}, train_checks=False)
    assert cfg.rollout.max_turns == 40 and cfg.rollout.tool_policy.allow == ("a",)
