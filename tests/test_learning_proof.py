"""Tests for bench/experiments/learning_proof.py and learning_parallel.sh on a CPU (the GPU runs' machinery).

    .venv/bin/python -m pytest tests/test_learning_proof.py -q

A tiny random Llama (`--random-weights ... --random-shape tiny`) with SmolLM2's tokenizer stands in for
the real weights: it learns nothing, it exercises the runner, the pause at a deadline, the resume from
the step checkpoint and the results folder. The company server runs over HTTP as in the GPU runs.
"""

import gzip
import json
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXP = "bench/experiments"  # learning_proof.py, its configs and tools, from the repo root
CONFIG = f"{EXP}/learning/smollm2.yaml"
SMALL = ",".join(["train.steps=6", "train.groups_per_step=2", "train.group_size=2", "train.warm_start_scenarios=4",
                  "train.warm_start_gate_scenarios=2", "train.warm_start_max_extra_epochs=0", "train.eval_scenarios=4",
                  "train.eval_every=3", "train.eval_every_scenarios=2", "rollout.concurrency=4", "rollout.max_turns=6",
                  "rollout.max_tokens=16", "train.precision=fp32"])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from mcp_rl.policies.models import load_local_tokenizer

    path = tmp_path_factory.mktemp("tok")
    load_local_tokenizer().save_pretrained(path)
    return path


def parallel(tmp_path, tokenizer_dir, deadline, *runs, out="out", machine="runs"):
    """One device call: a fresh $OUT each time; the run folders under `machine` (/tmp/runs on every GPU box)."""
    env = {**os.environ, "OUT": str(tmp_path / out), "TMPDIR": str(tmp_path),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "LP_ARGS": f"--random-weights {tokenizer_dir} --random-shape tiny", "LP_RUNS": str(tmp_path / machine)}
    return subprocess.run(["bash", f"{EXP}/learning_parallel.sh", str(deadline), *runs], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=280)


@pytest.mark.slow
def test_two_runs_pause_move_to_a_fresh_machine_and_resume_to_the_end(tmp_path, tokenizer_dir):
    runs = (f"a:{CONFIG}:0:{SMALL}", f"b:{CONFIG}:1:{SMALL}")
    # A 1 s deadline has passed by step 1 however fast the machine: both pause after it. (12 s paused one run
    # and not the other on a fast CI machine: the random model's steps take ~0 s.)
    first = parallel(tmp_path, tokenizer_dir, 1, *runs, out="out1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert all("paused after step" in (tmp_path / "runs" / "logs" / f"{n}-1.log").read_text() for n in "ab")
    out1 = tmp_path / "out1"
    returned = sorted(p.relative_to(out1).as_posix() for p in out1.rglob("*") if p.is_file())
    assert len(returned) <= 8 and "learning.tgz" in returned, returned  # what a device call can return
    assert {"state/a.json", "state/b.json", "state/a.tgz.00", "state/b.tgz.00"} <= set(returned), returned
    # The machine is gone: the next one starts from the returned parts alone, at the same path (setup.sh does this).
    (tmp_path / "runs").rename(tmp_path / "gone")
    subprocess.run([sys.executable, "bench/device/run_state.py", "unpack", str(out1 / "state"), str(tmp_path / "runs")],
                   cwd=ROOT, check=True, capture_output=True, timeout=60)
    second = parallel(tmp_path, tokenizer_dir, 200, *runs, out="out2")
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "(pid" in second.stdout and "--resume" in second.stdout
    for name, seed in (("a", 0), ("b", 1)):
        results = tmp_path / "runs" / "results" / name
        proof = json.loads((results / "proof.json").read_text())
        assert proof["steps"] == 6 and {"base", "warm_start"} <= set(proof["comparisons"])
        assert "Sampling over the GRPO steps: prefill" in (results / "proof.md").read_text()
        assert json.loads((results / "config.json").read_text())["train"]["seed"] == seed
        assert len(list(results.glob("timings-call*.json"))) == 2 and not (results / "checkpoints").exists()
        assert "paused after step" in (results / "run-call1.log").read_text()  # the first box's log came along
        assert (results / "run-call2.log").is_file()
        trained = gzip.decompress((results / "eval_trained.jsonl.gz").read_bytes()).decode().splitlines()
        assert [json.loads(x)["scenario_id"] for x in trained] and not list(results.glob("eval_*.jsonl"))
        steps = [json.loads(x) for x in (results / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
        assert [h["step"] for h in steps] == [1, 2, 3, 4, 5, 6]  # resumed, no step repeated
    with tarfile.open(tmp_path / "out2" / "learning.tgz") as tar:
        names = tar.getnames()
    assert "results/a/proof.json" in names and "logs/b-2.log" in names
    assert not (tmp_path / "out2" / "state").exists()  # finished runs leave no state behind
    third = parallel(tmp_path, tokenizer_dir, 200, *runs, out="out3")
    assert third.stdout.count(": finished") == 2
    summary = subprocess.run([sys.executable, f"{EXP}/learning_summary.py", str(tmp_path / "runs" / "results"),
                              "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    data = json.loads(summary.stdout)
    assert [(r["name"], r["seed"], r["steps"]) for r in data["runs"]] == [("a", 0, 6), ("b", 1, 6)]
    assert data["families"]["smollm2"]["seeds"] == 2 and data["unfinished"] == []


def test_the_unsloth_loader_is_imported_before_transformers(tmp_path):
    """Unsloth patches transformers on import: learning_proof asks for it before anything imports transformers
    (ART does). A stand-in for `import_unsloth` in a fresh interpreter records what was imported by then."""
    code = (f"import sys; sys.path.insert(0, '{EXP}')\n"
            "import mcp_rl.policies.unsloth_loader as u\n"
            "def fake():\n"
            "    print('transformers imported:', 'transformers' in sys.modules); raise u.UnslothUnavailable('no GPU')\n"
            "u.import_unsloth = fake\n"
            "import learning_proof\n"
            f"learning_proof.main(['--config', '{CONFIG}', '--out', '{tmp_path}/r', "
            "'--set', 'train.loader=unsloth'])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "transformers imported: False" in out.stdout, out.stdout + out.stderr[-2000:]
    assert out.returncode != 0 and "UnslothUnavailable: no GPU" in out.stderr


@pytest.mark.parametrize("args, needle", [
    ([], "usage:"),
    (["soon", f"a:{CONFIG}:0"], "usage:"),
    (["60", f"a:{EXP}/learning/nope.yaml:0"], f"bad run spec 'a:{EXP}/learning/nope.yaml:0'"),
    (["60", f"a:{CONFIG}:x"], "integer seed"),
    (["60", f"a b:{CONFIG}:0"], "bad run spec"),
    (["60", "a:" + "x" * 500 + ":0"], "bad run spec 'a:xxx"),  # quoted as a short prefix, not whole
])
def test_a_bad_run_spec_stops_before_any_run(tmp_path, args, needle):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "LP_RUNS": str(tmp_path / "runs")}
    out = subprocess.run(["bash", f"{EXP}/learning_parallel.sh", *args], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and needle in out.stderr and len(out.stderr) < 300
    assert not (tmp_path / "runs").exists()


def test_the_held_out_curve_counts_the_same_scenarios_at_every_point(monkeypatch):
    """Session 10's runs evaluated the warm start on 128 held-out scenarios and every 5 steps the first 64:
    plotted together, the curve mixed two sets. Every point now counts the periodic evaluations' ones."""
    monkeypatch.syspath_prepend(str(ROOT / EXP))
    from learning_proof import held_out_curve

    row = lambda i, ok: {"scenario_id": f"s{i}", "verified": float(ok)}  # noqa: E731
    rows = {"warm_start": [row(i, i in (0, 3)) for i in range(4)], "trained": [row(i, i < 3) for i in range(4)]}
    periodic = {5: [row(0, 0), row(1, 1)], 10: [row(0, 1), row(1, 1)]}  # the first 2 of 4
    curve = held_out_curve(rows, periodic, 10)
    assert [(c["step"], c["label"], c["n"], c["success"]) for c in curve] == [
        (0, "warm_start", 2, 0.5), (5, "test_step5", 2, 0.5), (10, "trained", 2, 1.0)]
    assert [c["n"] for c in held_out_curve(rows, {}, 10)] == [4, 4]  # no periodic evaluation: the whole set


def test_the_summary_checks_issue_17s_targets_over_seeds(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / EXP))
    import learning_summary

    def run(name, seed, over_base, warm, trained, se, proof=True):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model": "smollm2", "train": {"seed": seed}}))
        if proof:
            comparisons = {"base": {"other": 0.0, "gap": over_base},
                           "warm_start": {"other": warm, "final": trained, "gap": trained - warm, "se_paired": se}}
            (d / "proof.json").write_text(json.dumps({"steps": 17, "comparisons": comparisons}))

    run("s1", 1, 0.20, 0.05, 0.15, 0.03)   # +10 over its warm start
    run("s0", 0, 0.16, 0.10, 0.16, 0.04)   # +6
    run("s2", 2, 0.0, 0.0, 0.0, 0.0, proof=False)
    (tmp_path / "logs-only").mkdir()       # no config.json: not a run
    text, data = learning_summary.report(tmp_path)
    f = data["families"]["smollm2"]
    assert [r["name"] for r in data["runs"]] == ["s0", "s1"] and data["unfinished"] == ["s2"]
    assert f["mean_over_warm"] == pytest.approx(0.08) and f["se_mean"] == pytest.approx(0.025)
    assert f["every_seed_warm"] and f["every_seed_base"] and f["mean_met"]  # +8.0 at 3.2 s.e.
    assert "seeds finished: 2 of the 3 asked for" in text and "Unfinished (no proof.json): s2" in text
    run("s3", 3, 0.14, 0.10, 0.13, 0.05)   # +3 over its warm start, +14 over base
    f = learning_summary.report(tmp_path)[1]["families"]["smollm2"]
    assert not (f["every_seed_warm"] or f["every_seed_base"] or f["mean_met"])
    (tmp_path / "s3" / "proof.json").write_text('{"steps": 17, "compar')  # half-written
    with pytest.raises(ValueError, match="s3: config.json or proof.json is not a finished run's"):
        learning_summary.report(tmp_path)


def test_the_summary_compares_rl_with_its_equal_time_imitation_baseline(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / EXP))
    import learning_summary

    def rows(d, label, wins):  # 10 scenarios, grounded as the run scored them live
        d.mkdir(exist_ok=True)
        (d / f"eval_{label}.jsonl").write_text("".join(
            json.dumps({"scenario_id": f"q{i}", "grounded": float(i < wins), "completed": True}) + "\n" for i in range(10)))

    for seed, (rl, imit) in enumerate([(6, 3), (5, 3), (4, 4)]):
        d = tmp_path / f"smollm2-v2-seed{seed}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model": "smollm2", "train": {"seed": seed}}))
        comparisons = {"base": {"other": 0.0, "gap": rl / 10},
                       "warm_start": {"other": 0.2, "final": rl / 10, "gap": rl / 10 - 0.2, "se_paired": 0.1}}
        (d / "proof.json").write_text(json.dumps({"steps": 30, "comparisons": comparisons}))
        for label, wins in (("base", 0), ("warm_start", 2), ("trained", rl)):
            rows(d, label, wins)
        imit_dir = tmp_path / f"smollm2-v2-seed{seed}-imitation"
        imit_dir.mkdir()
        (imit_dir / "config.json").write_text(json.dumps({"model": "smollm2", "train": {"seed": seed}}))
        if seed < 2:
            rows(imit_dir, "imitation", imit)
    text, data = learning_summary.report(tmp_path, seeds_asked=3)
    f = data["families"]["smollm2"]
    assert [r["name"] for r in data["runs"]] == [f"smollm2-v2-seed{k}" for k in range(3)]  # baselines are not runs
    assert f["imitation_seeds"] == 2 and f["mean_over_imit"] == pytest.approx(0.25)  # +30 and +20 points
    se = math.sqrt(sum((g * (1 - g) * 10 / 9) / 10 for g in (0.3, 0.2))) / 2  # paired differences of 0/1
    assert f["se_mean_imit"] == pytest.approx(se) and f["imit_met"]
    assert "imitation baseline missing or unfinished: smollm2-v2-seed2" in text
    assert "seed0: imitation 30.0%, RL - imitation +30.0" in text


def test_proof_md_reports_the_update_sizes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / EXP))
    from learning_proof import proof_tables

    for label, ok in (("base", (0, 0)), ("warm_start", (1, 0)), ("trained", (1, 1))):
        rows = [{"scenario_id": f"s{i}", "verified": float(v)} for i, v in enumerate(ok)]
        (tmp_path / f"eval_{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history = [{"step": 0, "phase": "warm_start"},
               {"step": 1, "reward_mean": 0.1, "success_rate": 0.1, "seconds": 30, "max_seq_tokens": 900.0,
                "max_padding": 40.0, "skipped_steps": 0.0, "gpu_peak_gib_before_update": 21.5,
                "gpu_peak_gib_update": 9.25},
               {"step": 2, "reward_mean": 0.2, "success_rate": 0.2, "seconds": 30, "max_seq_tokens": 2500.0,
                "max_padding": 1800.0, "skipped_steps": 1.0, "gpu_peak_gib_before_update": 12.0,
                "gpu_peak_gib_update": 30.04},
               {"step": 3, "reward_mean": 0.2, "success_rate": 0.2, "seconds": 30}]  # no update: no sizes
    text = proof_tables(tmp_path, {}, history)["table"]
    assert ("Update sizes: longest sequence 2500 tokens; widest micro-batch 1800 tokens of padding (step 2); "
            "skipped updates (non-finite gradient) 1") in text
    assert ("GPU memory peaks over the GRPO steps: rollouts, evaluations and warm start 21.5 GiB; update 30.0 GiB "
            "(step 2)") in text
    history = [h for h in history if "gpu_peak_gib_update" not in h]  # a CPU run: no line
    assert "GPU memory" not in proof_tables(tmp_path, {}, history)["table"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_under_torchrun_two_ranks_run_to_the_end_and_the_ddp_table_compares_them(tmp_path, tokenizer_dir):
    """Issue [multi-gpu]'s machinery on gloo: learning_proof.py as 2 ranks vs 1 process, then ddp_table.py.
    Only rank 0 evaluates, so only it knows the final evaluation's time: its step budget must hold on both
    ranks (a 90 s deadline that rank 1 alone would meet by stopping after step 1)."""
    from mcp_rl.mcp.launch import free_port

    env = {**os.environ, "TQDM_DISABLE": "1", "MCP_RL_DIST_TIMEOUT_S": "120"}
    args = [f"{EXP}/learning_proof.py", "--config", CONFIG, "--seed", "0", "--random-weights",
            str(tokenizer_dir), "--random-shape", "tiny", "--deadline-s", "90", "--set", *SMALL.split(",")]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1"]
    two = subprocess.run([*torchrun, "--master-port", str(free_port()), *args, "--out", str(tmp_path / "r2")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stdout[-2000:] + two.stderr[-2000:]
    one = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "r1")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=200)
    assert one.returncode == 0, one.stdout[-2000:] + one.stderr[-2000:]
    steps = [json.loads(x) for x in (tmp_path / "r2" / "metrics.jsonl").read_text().splitlines() if "reward_mean" in x]
    # Both ranks stop at the same step, whatever the deadline let through on a loaded machine (6 on a quiet one):
    # a rank that went on alone would have hung in the all-reduce and failed the run.
    assert 1 <= len(steps) <= 6 and all(h["rank_lora_identical"] is True for h in steps)
    alone = sum("reward_mean" in x for x in (tmp_path / "r1" / "metrics.jsonl").read_text().splitlines())
    assert json.loads((tmp_path / "r2" / "timings-call1.json").read_text())["ranks"] == 2  # rank 0's; rank 1 wrote none
    table = subprocess.run([sys.executable, f"{EXP}/ddp_table.py", str(tmp_path / "r1"), str(tmp_path / "r2"),
                            "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    rows = json.loads(table.stdout)
    assert [(r["ranks"], r["groups"], r["steps"], r["identical"]) for r in rows] == [(1, 2, alone, None),
                                                                                     (2, 2, len(steps), True)]
    paused = subprocess.run([*torchrun, "--master-port", str(free_port()), *args, "--out", str(tmp_path / "r3"),
                             "--pause"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert paused.returncode != 0 and "--pause works in one process only" in paused.stderr


@pytest.mark.parametrize("files", [
    {},                                                                    # not a run folder
    {"metrics.jsonl": '{"reward_mean": 0.1, "seco', "config.json": "{}"},  # a half-written metrics line
    {"metrics.jsonl": '{"reward_mean": 0.1}\n', "config.json": "{}"},      # a step without its seconds
    {"metrics.jsonl": '{"reward_mean": 0.1, "seconds": 3}\n', "config.json": "{}", "proof.json": '{"comparisons": {}}'},
])
def test_the_ddp_table_names_a_run_it_cannot_read(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = subprocess.run([sys.executable, f"{EXP}/ddp_table.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "not a finished learning-proof run folder" in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr) < 400


@pytest.mark.parametrize("change, checkpointing", [([], False), (["train.gradient_checkpointing=true"], True)])
def test_the_rehearsals_trainer_is_what_config_json_records(tokenizer_dir, change, checkpointing):
    """learning_proof built its own trainer without gradient checkpointing while config.json recorded
    `gradient_checkpointing: true`, and batched the policy by flags config.json never saw. Its trainer now
    comes from `parts.build_trainer(cfg, model=...)`: every setting from the config it records."""
    sys.path.insert(0, str(ROOT / EXP))
    from learning_proof import random_model

    from mcp_rl.runs import parts
    from mcp_rl.runs.config import apply_overrides, load_config

    cfg = apply_overrides(load_config(ROOT / CONFIG), ["out=/tmp/unused", *change])
    trainer = parts.build_trainer(cfg, model=random_model(str(tokenizer_dir), "tiny"))
    policy = trainer.policy
    assert (policy.max_batch, policy.batch_wait_s, policy.batch_gap_s) == (192, 0.3, None) == (
        cfg.policy_batch, cfg.policy_batch_wait_s, cfg.policy_batch_gap_s)
    assert trainer.model.get_base_model().is_gradient_checkpointing is checkpointing is cfg.train.gradient_checkpointing


def small_scenarios(path, train=12, test=4, val=2):
    """A slice of the company tasks: a rehearsal plays every training demonstration, so few of them."""
    from mcp_rl.tasks.scenarios import load_scenarios, save_scenarios

    want, out = {"train": train, "test": test, "val": val}, []
    for s in load_scenarios(ROOT / "data" / "scenarios.jsonl"):
        if want.get(s.split, 0) > 0:
            want[s.split] -= 1
            out.append(s)
    save_scenarios(path, out)
    return path


@pytest.mark.timeout(400)
def test_the_imitation_baseline_continues_the_grpo_runs_warm_start_for_the_budget(tmp_path, tokenizer_dir):
    """Issue 40 item 2 rehearsed: a GRPO run forks its warm start; `--baseline imitation` continues that very
    checkpoint with SFT on all the training demonstrations for the budget, evaluates it as "imitation", and
    compares it with base, warm start and the GRPO run's trained policy (paired, on the same scenarios)."""
    scenarios = small_scenarios(tmp_path / "small.jsonl")
    env = {**os.environ, "TQDM_DISABLE": "1"}
    common = [f"{EXP}/learning_proof.py", "--config", CONFIG, "--seed", "0", "--random-weights", str(tokenizer_dir),
              "--random-shape", "tiny", "--deadline-s", "0", "--train-budget-s", "0", "--set", *SMALL.split(","),
              "train.steps=2", "train.eval_every=0", f"scenarios={scenarios}",
              "reward.audit_max_success=1.0",  # 12 tasks are too few to balance: the audit is not what is tested
              "train.warm_start_batch_size=1", "rollout.max_result_chars=400"]  # short updates: several fit the budget
    rl, imitation = tmp_path / "rl", tmp_path / "rl-imitation"
    grpo = subprocess.run([sys.executable, *common, "--out", str(rl)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=200)
    assert grpo.returncode == 0, grpo.stdout[-2000:] + grpo.stderr[-2000:]
    forked = json.loads((imitation / "state.json").read_text())
    assert (forked["step"], forked["phase"], forked["evals"]) == (0, "training", {"base": 0, "warm_start": 0})
    assert (imitation / "checkpoints" / "step-0000" / "manifest.json").is_file()
    budget = 10.0
    out = subprocess.run([sys.executable, *common, "--out", str(imitation), "--baseline", "imitation",
                          "--imitation-s", str(budget)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "base: evaluated at step 0 of this run" in out.stdout  # the GRPO run's, not evaluated again
    proof = json.loads((imitation / "proof.json").read_text())
    sft, warm = proof["imitation"], proof["warm_start"]
    assert proof["baseline"] == "imitation" and proof["warm_start_source"] == str(rl)
    assert (imitation / "eval_imitation.jsonl").is_file() and set(proof["comparisons"]) == {"base", "warm_start"}
    spent, longest = sft["sft_seconds"], sft["longest_update_s"]
    assert sft["stopped"] == "budget" and budget - longest < spent <= budget  # stopped when one more would not fit
    assert sft["demonstrations"] > warm["demonstrations"] == 4  # all 12 training tasks, not the warm start's 4
    assert warm == json.loads((rl / "proof.json").read_text())["warm_start"]  # the GRPO run's own warm start
    c = proof["rl_vs_imitation"]
    assert c["n"] == 4 and c["target_gap"] == 0.03 and c["se_paired"] == c["se_paired"]  # paired, not NaN
    assert "| RL-trained vs imitation | 4 |" in (imitation / "proof.md").read_text()
    assert (rl / "eval_warm_start.jsonl").read_bytes() == (imitation / "eval_warm_start.jsonl").read_bytes()


def test_an_imitation_run_waits_for_its_grpo_runs_warm_start(tmp_path, tokenizer_dir):
    """Started beside a GRPO run that has not forked its warm start, the imitation baseline would warm up a
    second time (not the same checkpoint): it refuses in one line, before any model loads."""
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "state.json").write_text('{"step": 0, "phase": "base_done"}')
    out = subprocess.run([sys.executable, f"{EXP}/learning_proof.py", "--config", CONFIG, "--out",
                          str(tmp_path / "rl-imitation"), "--baseline", "imitation"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "has not committed its warm start yet" in out.stderr
    assert not (tmp_path / "rl-imitation").exists()


def test_the_imitation_phase_spends_its_budget_and_resumes_at_the_next_batch():
    from mcp_rl.runs.imitation import epoch_order, sft_for_budget

    class Trainer:  # each update takes 1 s of the fake clock
        def __init__(self):
            self.seen = []

        def sft_step(self, batch, learning_rate):
            self.seen.append(batch)
            now[0] += 1.0
            return {"nll": 1.0}

    now, trainer = [0.0], Trainer()
    demos = list(range(5))  # batches of 2: 3 a epoch
    first = sft_for_budget(trainer, demos, budget_s=10, learning_rate=1e-4, batch_size=2, seed=0,
                           stop_at=4.0, clock=lambda: now[0])
    assert (first["updates"], first["stopped"], first["epoch"], first["batch"]) == (4, "deadline", 1, 1)
    rest = sft_for_budget(trainer, demos, budget_s=10, learning_rate=1e-4, batch_size=2, seed=0, position=first,
                          clock=lambda: now[0])
    assert (rest["updates"], rest["seconds"], rest["stopped"]) == (6, 10.0, "budget")
    order = epoch_order(5, 0, 1)
    assert trainer.seen[4] == [order[2], order[3]]  # epoch 1's second batch: none repeated, none skipped
    assert sorted(x for b in trainer.seen[:3] for x in b) == demos  # an epoch visits every demonstration once


def test_learning_parallel_holds_an_imitation_run_until_its_grpo_run_forks_the_warm_start(tmp_path, tokenizer_dir):
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "state.json").write_text('{"step": 0, "phase": "base_done"}')
    out = parallel(tmp_path, tokenizer_dir, 60, f"a-imitation:{CONFIG}:0")
    assert "a-imitation: waiting for a's warm start (its fork" in out.stdout, out.stdout[-1000:] + out.stderr[-1000:]
    assert "a is not running in this call: skipped" in out.stdout
    assert not (tmp_path / "runs" / "a-imitation").exists() and not list((tmp_path / "runs" / "logs").iterdir())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_learning_parallel_starts_an_imitation_run_once_its_grpo_run_forks_the_warm_start(tmp_path, tokenizer_dir):
    sets = ",".join([*SMALL.split(","), "train.steps=2", "train.eval_every=0", "reward.audit_max_success=1.0",
                     f"scenarios={small_scenarios(tmp_path / 'small.jsonl')}", "train.warm_start_batch_size=1",
                     "rollout.max_result_chars=400"])
    env = {**os.environ, "OUT": str(tmp_path / "out"), "TMPDIR": str(tmp_path), "LP_PAUSE": "", "TQDM_DISABLE": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "LP_RUNS": str(tmp_path / "runs"),
           "LP_ARGS": f"--random-weights {tokenizer_dir} --random-shape tiny --imitation-s 6"}
    out = subprocess.run(["bash", f"{EXP}/learning_parallel.sh", "300", f"a:{CONFIG}:0:{sets}",
                          f"a-imitation:{CONFIG}:0:{sets}"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=380)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "a-imitation: waiting for a's warm start (its fork" in out.stdout
    assert "--resume --baseline imitation" in out.stdout  # started on the fork
    proof = json.loads((tmp_path / "runs" / "results" / "a-imitation" / "proof.json").read_text())
    assert proof["warm_start_source"] == str(tmp_path / "runs" / "a") and proof["imitation"]["stopped"] == "budget"
    assert (tmp_path / "runs" / "results" / "a" / "proof.json").is_file()
