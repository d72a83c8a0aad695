"""bench/speed/bench_step.py on a CPU with a tiny random model: old and new modes alternate, and a run cut across two
device calls goes on with --first-step, its rows appended and the table built from all of them."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "speed"))
import bench_step  # noqa: E402

TINY = ["--shape", "tiny", "--steps", "1", "--greedy-scenarios", "0",
        "--set", "rollout.concurrency=4", "train.groups_per_step=1", "train.group_size=2", "rollout.max_tokens=8"]


@pytest.mark.timeout(600)
def test_a_run_goes_on_from_its_rows_with_first_step(tmp_path, capsys):
    from mcp_rl.policies.models import load_local_tokenizer

    load_local_tokenizer().save_pretrained(tmp_path / "tok")
    out = tmp_path / "steps.txt"
    base = ["--random-weights", str(tmp_path / "tok"), "--out", str(out), *TINY]
    assert bench_step.main(base) == 0
    assert bench_step.main([*base, "--first-step", "2"]) == 0
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert sorted((r["step"], r["mode"]) for r in rows) == [(1, "new"), (1, "old"), (2, "new"), (2, "old")]
    table = out.read_text()
    assert "| 1 | old |" in table and "| 2 | new |" in table and "mean without each call's first step" not in table
    assert all(r["first_of_call"] for r in rows)  # one step a mode a call: each paid its call's warm-up
    with pytest.raises(SystemExit):  # the same steps again would count twice
        bench_step.main([*base, "--first-step", "2"])
    assert "already has steps from 2 on" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a second call on a fresh machine: nothing to go on from
        bench_step.main([*base[:2], "--out", str(tmp_path / "elsewhere.txt"), *TINY, "--first-step", "3"])
    assert "no rows at" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_the_join_mode_is_new_with_continuous_batching(tmp_path):
    from mcp_rl.policies.models import load_local_tokenizer

    load_local_tokenizer().save_pretrained(tmp_path / "tok")
    out = tmp_path / "steps.txt"
    assert bench_step.main(["--random-weights", str(tmp_path / "tok"), "--out", str(out), "--modes", "new", "join",
                            *TINY]) == 0
    rows = {r["mode"]: r for r in map(json.loads, out.with_suffix(".jsonl").read_text().splitlines())}
    assert rows["join"]["join"] and not rows["new"].get("join") and sorted(rows) == ["join", "new"]
    assert rows["join"]["decode"]["rows"] >= 2 and "joined" in rows["join"]["decode"]
    table = out.read_text()
    assert "| joined |" in table and "speedup over new: join " in table


def test_step_host_bench_times_both_settings_and_checks_tokenizing_equal(tmp_path):
    """bench_step_host.py on a small step: a row per setting, the rollouts all reached the policy, and
    ART's tokenizing gave the same results through the view before session 25 and now."""
    import bench_step_host

    out = tmp_path / "host.txt"
    assert bench_step_host.main(["--rollouts", "12", "--repeats", "1", "--models", "smollm2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [(r["part"], r["rollouts"]) for r in rows] == [("open sessions", 12)] * 2 + [("ART tokenizing, smollm2", 192)] * 2
    assert rows[-1]["same_as_before"] and all(r["median_s"] > 0 for r in rows)
    assert "| open sessions | one shared | 12 |" in out.read_text()
