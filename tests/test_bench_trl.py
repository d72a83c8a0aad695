"""Tests for bench/speed/bench_trl.py: on a tiny model, TRL's GRPOTrainer step and ours compute the same loss.

Skipped without trl (CI does not install it). About 30 s on 2 cores:

    PYTHONPATH=DIR_WITH_TRL python -m pytest tests/test_bench_trl.py -q
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

BENCH = Path(__file__).resolve().parent.parent / "bench" / "speed" / "bench_trl.py"


@pytest.mark.slow
def test_tiny_run_writes_both_rows_with_the_same_objective(tmp_path):
    from mcp_rl.policies.local_policy import load_local_tokenizer

    load_local_tokenizer().save_pretrained(tmp_path / "tok")
    spec = importlib.util.spec_from_file_location("bench_trl", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_trl"] = bench
    spec.loader.exec_module(bench)
    out = tmp_path / "trl.txt"
    assert bench.main(["--tokenizer", str(tmp_path / "tok"), "--model-dir", str(tmp_path / "model"), "--shape", "tiny",
                       "--seq-len", "48", "--seqs", "4", "--steps", "1", "--out", str(out)]) == 0
    ours, trl = [json.loads(x) for x in out.with_suffix(".jsonl").read_text().splitlines()]
    assert [ours["trainer"], trl["trainer"]] == ["mcp_rl PortableTrainer", "TRL GRPOTrainer"]
    assert ours["seq_len"] == trl["seq_len"] == 48 and ours["tok_s"] > 0 and trl["tok_s"] > 0
    # Dr. GRPO divides by max_seq_len in ours, by max_completion_length in TRL: otherwise the same loss.
    assert trl["loss"] * trl["completion_len"] / 48 == pytest.approx(ours["loss"], rel=1e-2, abs=1e-6)
    assert "TRL / ours" in out.read_text()
