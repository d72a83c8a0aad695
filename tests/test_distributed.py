"""Tests for mcp_rl/scale/distributed.py and bench/checks/check_ddp.py: 2 gloo ranks train the LoRA 1 process trains
on the union of their batches, and a rank that dies ends the others with a clear error.

Real processes on 127.0.0.1 (gloo), a tiny random Llama with SmolLM2's tokenizer: about 20 s each
on 2 cores. Run: pytest tests/test_distributed.py
"""

import importlib.util
import sys
from pathlib import Path

import pytest

from mcp_rl.scale import distributed

BENCH = Path(__file__).resolve().parent.parent / "bench" / "checks" / "check_ddp.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("check_ddp", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_ddp"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    from mcp_rl.policies.local_policy import load_local_tokenizer

    path = tmp_path_factory.mktemp("tok")
    load_local_tokenizer().save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("n, world, shares", [
    (5, 2, [[0, 2, 4], [1, 3]]),
    (1, 2, [[0], []]),       # a rank may get nothing: it still joins the all-reduce, with zeros
    (4, 1, [[0, 1, 2, 3]]),
    (7, 3, [[0, 3, 6], [1, 4], [2, 5]]),
])
def test_shard_and_interleave_partition_in_order(n, world, shares):
    items = list(range(n))
    got = [distributed.shard(items, r, world) for r in range(world)]
    assert got == shares and distributed.interleave(got) == items


def test_one_process_helpers_are_the_identity():
    assert (distributed.rank(), distributed.world(), distributed.is_main()) == (0, 1, True)
    assert distributed.shard([1, 2, 3]) == [1, 2, 3] and distributed.unshard([1, 2]) == [1, 2]
    assert distributed.total(3.0) == 3.0 and distributed.total([1, 2]) == [1, 2]
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.init() is False  # no WORLD_SIZE > 1: nothing to join


@pytest.mark.timeout(240)
def test_two_gloo_ranks_equal_one_process_on_the_union(bench, tok_dir, tmp_path, capsys):
    out = tmp_path / "ddp.txt"
    assert bench.main(["--tokenizer", tok_dir, "--steps", "2", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[-1] == "equal: True"
    assert sum("rank 0 vs other ranks: LoRA 0," in line for line in lines) == 2  # dr_grpo and grpo


@pytest.mark.timeout(240)
def test_a_rank_that_dies_ends_the_others_with_a_clear_error(bench, tok_dir, tmp_path):
    codes, errs = bench.run_ranks(tok_dir, ["dr_grpo"], 1, 2, tmp_path, die_rank=1, timeout=200)
    assert codes == [4, 3]  # rank 0 caught RankFailed; rank 1 is the one that died
    assert "gradient all-reduce failed" in errs[0] and "rerun with --resume" in errs[0]
    assert not list(tmp_path.glob("rank*.pt"))  # nothing written by either


RUNNER = Path(__file__).resolve().parent / "ddp_pipeline_run.py"


def torchrun(out, steps, *extra):
    import subprocess

    from mcp_rl.mcp.launch import free_port

    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(RUNNER), str(out), str(steps), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=400)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pipeline_under_torchrun_dies_cleanly_and_resumes(tmp_path):
    import json

    out = tmp_path / "run"
    died = torchrun(out, 3, "--die-at", "2")  # rank 1 crashes as step 2 starts
    assert died.returncode != 0 and "exitcode  : 3" in died.stderr  # torchrun names the rank that died
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 1 and state["phase"] == "training"
    assert not [p.name for p in out.rglob("*") if ".tmp-" in p.name]  # nothing half-written
    assert (out / "tool_calls.rank1.jsonl").exists()  # rank 1 logs its own tool calls; rank 0 owns the rest

    resumed = torchrun(out, 3, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming the recorded run at step 1" in resumed.stdout
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 3 and state["phase"] == "done"
    assert [h["step"] for h in state["history"]] == [0, 1, 2, 3]  # no step lost or repeated
    steps = state["history"][1:]  # each GRPO step records the ranks' check: bitwise-identical LoRA weights
    assert all(h["rank_lora_identical"] is True and h["rank_state_diff"] == 0.0 for h in steps), steps
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0002", "step-0003"]
    assert (out / "report.md").exists()


def _check_same_rank(rank: int, port: int, offset: float, out: str) -> None:
    """One gloo rank of the test below: a trainer-like object whose weight rank 1 shifts by `offset`."""
    import json
    import os
    import types

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        weight = torch.full((4,), 0.5) + (offset if rank == 1 else 0.0)
        trainer = types.SimpleNamespace(step=3, params=[weight], optimizer=types.SimpleNamespace(state={}))
        try:
            seen = distributed.check_same(trainer, "test check")
        except RuntimeError as e:
            seen = {"error": str(e)[:200]}
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("offset, identical, error", [(0.0, True, False), (1e-7, False, False), (1e-3, None, True)])
def test_check_same_reports_bitwise_identity_and_raises_past_its_tolerance(tmp_path, offset, identical, error):
    import json

    import torch.multiprocessing as mp

    from mcp_rl.mcp.launch import free_port

    mp.spawn(_check_same_rank, args=(free_port(), offset, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        if error:  # every rank raises, naming the rank that differs
            assert "rank 1's trainer differs from rank 0's" in seen["error"]
        else:  # within tolerance: no error, but a difference of even one bit is reported
            assert seen["rank_lora_identical"] is identical and (seen["rank_state_diff"] > 0) is (not identical)
