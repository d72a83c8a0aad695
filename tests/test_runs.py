"""Tests for mcp_rl/runs/run.py: a run folder's phases are idempotent; "base" is always step 0.

The real loop (company server over HTTP, LocalPolicy, PortableTrainer) on a tiny random Llama
with SmolLM2's tokenizer, as in tests/test_pipeline.py. Run: pytest tests/test_runs.py
"""

import dataclasses
import json

import pytest

from mcp_rl.runs import parts
from mcp_rl.runs import pipeline
from mcp_rl.runs.callbacks import HeldOutCurve, TrainerCallback
from mcp_rl.runs.config import apply_overrides, preset
from mcp_rl.environments.company import command as company_server_command
from mcp_rl.mcp.launch import HttpServer
from mcp_rl.mcp.guard import SideEffectsRefused
from mcp_rl.runs.run_folder import _LOADED, _Loaded
from mcp_rl.runs.run import open_run, run
from mcp_rl.tasks.scenarios import Scenario


class StandIn:
    """The Trainer protocol's bookkeeping without a model (mcp_rl.runs.parts.Trainer)."""

    step, sft_steps, policy = 0, 0, None

    async def start(self):
        pass

    def save(self, path):
        path.mkdir(parents=True, exist_ok=True)


@pytest.fixture
def build(tiny_trainer):
    return tiny_trainer


@pytest.fixture(scope="module")
def server():
    with HttpServer(company_server_command()) as s:
        yield s.spec


def config(out, steps=1):
    return apply_overrides(preset("cpu", server="company"), [
        f"out={out}", f"train.steps={steps}", "train.groups_per_step=1", "train.group_size=2",
        "train.warm_start_scenarios=2", "train.eval_scenarios=2", "rollout.max_turns=6", "rollout.max_tokens=8",
        "reward.audit_scenarios=0"])  # the reward audit has its own tests (test_reward_audit.py)


@pytest.fixture
def built(monkeypatch, build):
    calls = []

    def counting(cfg):
        calls.append(cfg.out)
        return build(cfg)

    monkeypatch.setattr(parts, "build_trainer", counting)
    _LOADED.clear()
    yield calls
    _LOADED.clear()


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_running_every_phase_twice_resumes_and_never_relabels(tmp_path, server, built, capsys):
    cfg = config(tmp_path / "run")
    train, _, test = pipeline.load_splits(cfg)
    run = open_run(cfg)
    await run.trainer()
    await run.evaluate("base", server, test)
    await run.warm_start(server, train)
    await run.train(server, train)
    await run.evaluate("trained", server, test)
    first = json.loads((tmp_path / "run" / "state.json").read_text())
    capsys.readouterr()

    again = open_run(cfg)  # a notebook re-run: same process, same folder
    trainer = await again.trainer()
    await again.evaluate("base", server, test)
    assert await again.warm_start(server, train) is None
    await again.train(server, train)
    await again.evaluate("trained", server, test)
    out = capsys.readouterr().out
    assert "resuming the recorded run at step 1" in out and "base: evaluated at step 0" in out
    assert "already at step 1 of 1" in out and "trained: evaluated earlier at step 1" in out
    assert built == [str(tmp_path / "run")]  # the loaded model was reused, not built twice
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["history"] == first["history"] and state["evals"] == {"base": 0, "trained": 1}
    assert trainer is run._trainer


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_fresh_run_starts_a_new_folder_at_step_0(tmp_path, server, built):
    cfg = config(tmp_path / "run")
    _, _, test = pipeline.load_splits(cfg)
    first = open_run(cfg)
    await first.trainer()
    await first.evaluate("base", server, test)
    fresh = open_run(cfg, fresh=True)
    assert fresh.dir != first.dir and fresh.dir.name.startswith("run-") and fresh.state.phase == "new"
    await fresh.trainer()
    assert len(built) == 2  # a new folder gets its own untrained model


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_trained_model_is_never_evaluated_as_base(tmp_path, server, built):
    cfg = config(tmp_path / "run")
    run = open_run(cfg)
    trainer = await run.trainer()
    trainer.step = 3  # as if ART had resumed a checkpoint behind the run's back
    with pytest.raises(ValueError, match="not the base model"):
        await open_run(cfg).trainer(trainer)


def test_base_past_step_0_without_a_saved_result_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    open_run(config(run_dir))  # records config.json
    (run_dir / "state.json").write_text(json.dumps({"step": 2, "history": [], "phase": "training", "evals": {}}))
    run = open_run(config(run_dir))
    run._trainer = type("T", (), {"step": 2, "policy": None})()
    import asyncio

    with pytest.raises(ValueError, match="past the base evaluation"):
        asyncio.run(run.evaluate("base", None, []))


def test_an_existing_run_needs_resume_or_fresh(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "state.json").write_text("{}")
    with pytest.raises(ValueError, match="--resume"):
        open_run(config(tmp_path / "x"), resume=False)


def test_a_server_with_side_effects_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    import asyncio

    script = tmp_path / "notes.py"
    script.write_text("from fastmcp import FastMCP\nmcp = FastMCP('notes')\n\n@mcp.tool\n"
                      "def write_note(text: str) -> str:\n    return 'ok'\n\nmcp.run(show_banner=False)\n")

    class Loaded(Exception):
        pass

    def build(cfg):
        raise Loaded

    monkeypatch.setattr(parts, "build_trainer", build)
    cfg = apply_overrides(config(tmp_path / "run"), [f"server={script}"])
    with pytest.raises(SideEffectsRefused, match="side effects: write_note"):
        asyncio.run(run(cfg))
    assert json.loads((tmp_path / "run" / "config.json").read_text())["allow_side_effects"] is False
    with pytest.raises(Loaded):  # opted in: the run goes on to load the model
        asyncio.run(run(apply_overrides(cfg, ["allow_side_effects=true"]), resume=True))


def test_config_json_records_no_key_or_token(tmp_path):
    cfg = apply_overrides(config(tmp_path / "run"), ["server_token=tok-123", "worker_token=wk-456",
                                                     "reward.judge_api_key=sk-secret-789"])
    open_run(cfg)
    text = (tmp_path / "run" / "config.json").read_text()
    assert "tok-123" not in text and "wk-456" not in text and "sk-secret-789" not in text
    recorded = json.loads(text)
    assert recorded["reward"]["judge_api_key"] == recorded["server_token"] == "<redacted>"
    assert cfg.reward.judge_api_key == "sk-secret-789"  # the run itself still has the key


def test_train_evaluates_the_split_the_config_names(tmp_path):
    import asyncio

    cfg = apply_overrides(config(tmp_path / "run"), ["train.eval_every=1", "train.eval_every_split=test",
                                                     "train.eval_every_scenarios=1"])
    r = open_run(cfg)
    r._trainer, r.state.phase, r.state.step = StandIn(), "training", 1  # no step left: only the hooks run
    seen = {}

    class Look(TrainerCallback):
        async def on_train_begin(self, run):
            seen["curves"] = [(c.scenarios, c.every, c.key) for c in run.callbacks if isinstance(c, HeldOutCurve)]

    r.callbacks.append(Look())
    asyncio.run(r.train("server", [Scenario(id="s1", task="q")], ["v1", "v2"], ["t1", "t2"]))
    # the test split, cut to eval_every_scenarios: not the val list given; gone from the run after train
    assert seen["curves"] == [(["t1"], 1, "test_success")] and not any(isinstance(c, HeldOutCurve) for c in r.callbacks)


class _ARTLike(StandIn):
    """ART saves each update itself: after a stop mid-step its checkpoints can be one update past the run's record."""

    def __init__(self, actual_step: int):
        self.step, self.actual = 0, actual_step

    def load(self, path):
        self.step = self.actual
        return {"step": 1}  # what the run recorded with its step-0001 checkpoint


@pytest.mark.parametrize("actual, steps_after", [(1, 1), (2, 2), (3, None)])
def test_an_update_the_run_did_not_record_is_counted_not_trained_again(tmp_path, actual, steps_after):
    import asyncio

    r = open_run(config(tmp_path / "run", steps=3))
    r.state = dataclasses.replace(r.state, step=1, phase="training", history=[{"step": 1, "reward_mean": 0.1}])
    (tmp_path / "run" / "checkpoints" / "step-0001").mkdir(parents=True)
    if steps_after is None:
        with pytest.raises(ValueError, match="2 updates past the run's record"):
            asyncio.run(r.trainer(_ARTLike(actual)))
        return
    asyncio.run(r.trainer(_ARTLike(actual)))
    assert r.step == steps_after and len(r.state.history) == steps_after
    if steps_after == 2:
        assert "recovered" in r.state.history[-1] and (tmp_path / "run" / "checkpoints" / "step-0002").is_dir()
        assert json.loads((tmp_path / "run" / "state.json").read_text())["step"] == 2


def test_a_second_art_model_in_one_process_is_refused_before_it_loads(tmp_path, monkeypatch):
    import asyncio

    monkeypatch.setattr(parts, "build_trainer", lambda cfg: pytest.fail("a second vLLM engine was started"))
    monkeypatch.setitem(_LOADED, f"{tmp_path / 'first'}|Qwen/Qwen2.5-3B-Instruct|art", _Loaded(StandIn(), 0))
    monkeypatch.setitem(_LOADED, f"{tmp_path / 'cpu'}|smollm2|portable", _Loaded(StandIn(), 0))
    cfg = apply_overrides(config(tmp_path / "second"), ["train.backend=art", "train.warm_start_scenarios=0"])
    with pytest.raises(RuntimeError, match="already loaded in this process for .*first.*Restart session"):
        asyncio.run(open_run(cfg).trainer())
    monkeypatch.setattr(parts, "build_trainer", lambda cfg: StandIn())
    asyncio.run(open_run(config(tmp_path / "third")).trainer())  # a portable run: the other portable one is let go
    assert not any(k.startswith(str(tmp_path / "cpu")) for k in _LOADED) and len(_LOADED) == 2


# ---- resuming safely (found by review, session 11) ---------------------------------------
def _recorded(tmp_path, phase="training", step=1):
    cfg = config(tmp_path / "run")
    r = open_run(cfg)
    r.state = dataclasses.replace(r.state, phase=phase, step=step)
    r.commit()
    return cfg


@pytest.mark.parametrize("change, refused", [
    ("train.steps=5", None), ("train.eval_every=2", None), ("rollout.concurrency=4", None),
    ("train.learning_rate=0.5", "train.learning_rate: 0.0001 -> 0.5"), ("train.seed=3", "train.seed: 0 -> 3"),
    ("train.groups_per_step=4", "train.groups_per_step"), ("train.eval_scenarios=9", "train.eval_scenarios"),
])
def test_a_resume_with_settings_that_shape_the_run_is_refused(tmp_path, change, refused):
    cfg = apply_overrides(_recorded(tmp_path), [change])
    if refused is None:
        assert open_run(cfg).step == 1
    else:
        with pytest.raises(ValueError, match="recorded with other settings") as e:
            open_run(cfg)
        assert refused in str(e.value) and "fresh=True" in str(e.value)
        assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["seed"] == 0  # record kept


def test_a_resume_trains_on_the_list_it_started_with(tmp_path):
    r = open_run(config(tmp_path / "run"))
    first = [Scenario(id=f"s{i}", task="q") for i in range(4)]
    assert [s.id for s in r._pin_train(first)] == ["s0", "s1", "s2", "s3"]
    more = [Scenario(id="new", task="q")] + first[::-1]  # a cell that wrote more tasks, in another order
    assert [s.id for s in r._pin_train(more)] == ["s0", "s1", "s2", "s3"]
    with pytest.raises(ValueError, match="1 of the 4 training scenarios"):
        r._pin_train(first[:3])


def test_a_trainer_left_midway_is_not_reused(tmp_path, monkeypatch):
    """A step (or warm start) that updated the weights and then failed before its commit: the next
    `run.trainer()` must not take that trainer as the one at the recorded step."""
    import asyncio

    cfg = _recorded(tmp_path, phase="training", step=0)

    class Trainer(StandIn):
        loads = 0

        def load(self, path):
            Trainer.loads += 1

    (tmp_path / "run" / "checkpoints" / "step-0000").mkdir(parents=True)
    r = open_run(cfg)
    trainer = asyncio.run(r.trainer(Trainer()))
    assert Trainer.loads == 1
    asyncio.run(r.trainer(trainer))
    assert Trainer.loads == 1  # synced: reused as it is

    async def fails(*a, **k):
        trainer.step += 1  # the update happened, then the step failed before its commit
        raise OSError("disk full")

    monkeypatch.setattr(pipeline, "train_step", fails)
    with pytest.raises(OSError):
        asyncio.run(r.train("server", [Scenario(id="s1", task="q")]))
    asyncio.run(r.trainer(trainer))
    assert Trainer.loads == 2  # reloaded from the recorded checkpoint, not reused

    dirty = Trainer()
    dirty.sft_steps = 8  # a warm start that stopped before its commit
    base = open_run(apply_overrides(config(tmp_path / "other"), []))
    base.state.phase = "base_done"
    with pytest.raises(ValueError, match="8 warm-start updates"):
        asyncio.run(base.trainer(dirty))


def test_checkpoints_are_pruned_by_number(tmp_path):
    r = open_run(config(tmp_path / "run"))
    for step in (9998, 9999, 10000):
        r.state.step = step
        r._checkpoint(StandIn())
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-10000", "step-9999"]


def test_a_server_interrupted_while_starting_is_not_left_running(monkeypatch):
    """Ctrl-C (or a cancelled task) during the wait for the port left the child process running
    (found by review): the start now stops it on any exception."""
    import socket
    import sys

    server = HttpServer([sys.executable, "-c", "import time; time.sleep(60)"], startup_timeout=30)
    calls = []

    def interrupted(*a, **k):
        calls.append(a)
        raise KeyboardInterrupt

    monkeypatch.setattr(socket, "create_connection", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert calls and server.proc.poll() is not None  # stopped, not orphaned


@pytest.mark.parametrize("given, says", [({}, "pass its token"), ({"token": "wrong"}, "does not accept the token")])
def test_a_server_that_needs_a_token_says_so(company_db, given, says):
    """A missing or wrong token read as 'Server returned an error response' (found by review)."""
    import asyncio

    from mcp_rl.mcp.connect import ServerUnavailable, ToolSession

    async def connect(url):
        async with ToolSession(url, connect_timeout=10, **given):
            pass

    with HttpServer(company_server_command(company_db), token="s3cret") as srv:
        with pytest.raises(ServerUnavailable, match="refused the request for authentication \\(HTTP 401") as e:
            asyncio.run(connect(srv.url))
    assert says in str(e.value) and "s3cret" not in str(e.value)


def test_a_field_the_code_no_longer_has_does_not_block_a_resume(tmp_path):
    """config.json from an older version: a field since renamed or dropped is no change of the run."""
    cfg = _recorded(tmp_path)
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())
    recorded["train"]["old_knob"] = 3
    (tmp_path / "run" / "config.json").write_text(json.dumps(recorded))
    assert open_run(cfg).step == 1
