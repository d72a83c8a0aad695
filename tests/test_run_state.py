"""bench/device/run_state.py: a paused run folder packed into parts that a device call can return, and rebuilt.

    .venv/bin/python -m pytest tests/test_run_state.py -q
"""

import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "device"))

import run_state  # noqa: E402


def make_run(root: Path, step: int, ckpt_bytes: int = 1000) -> Path:
    """A run folder shaped like mcp_rl.runs.run writes it: state.json, metrics, two checkpoints (the last two)."""
    run = root / "smollm2-seed2"
    for s in (step - 1, step):
        ckpt = run / "checkpoints" / f"step-{s:04d}"
        (ckpt / "adapter").mkdir(parents=True)
        (ckpt / "optimizer.pt").write_bytes(os.urandom(ckpt_bytes))  # incompressible, like float32 moments
        (ckpt / "adapter" / "adapter_model.safetensors").write_bytes(os.urandom(ckpt_bytes // 2))
    (run / "state.json").write_text(json.dumps({"step": step, "phase": "warm_start_done", "history": []}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": step, "reward_mean": 0.1}) + "\n")
    (run / "eval_base.jsonl").write_text('{"scenario_id": "s1", "success": false}\n')
    return run


def test_a_run_packs_into_returnable_parts_keeps_only_its_last_checkpoint_and_comes_back(tmp_path):
    run = make_run(tmp_path / "box1", step=7, ckpt_bytes=3 * 2**20)
    log = tmp_path / "box1" / "logs" / "smollm2-seed2-1.log"
    log.parent.mkdir()
    log.write_text("paused after step 7\n")
    m = run_state.pack(run, tmp_path / "out" / "state", [log], part_mib=2)
    parts = sorted((tmp_path / "out" / "state").glob("smollm2-seed2.tgz.*"))
    assert [p.name for p in parts] == [p["file"] for p in m["parts"]] and len(parts) == 3  # ~4.5 MiB in 2 MiB parts
    assert all(p.stat().st_size <= 2 * 2**20 for p in parts) and m["step"] == 7
    assert run_state.unpack(tmp_path / "out" / "state", tmp_path / "box2") == ["smollm2-seed2"]
    back = tmp_path / "box2" / "smollm2-seed2"
    assert sorted(p.name for p in (back / "checkpoints").iterdir()) == ["step-0007"]
    for rel in ("state.json", "metrics.jsonl", "eval_base.jsonl", "checkpoints/step-0007/optimizer.pt",
                "checkpoints/step-0007/adapter/adapter_model.safetensors"):
        assert (back / rel).read_bytes() == (run / rel).read_bytes(), rel
    assert (tmp_path / "box2" / "logs" / log.name).read_text() == log.read_text()
    assert (run / "checkpoints" / "step-0006").is_dir()  # packing leaves the run itself as it was
    assert not list((tmp_path / "box2").glob(".*unpacking"))


def test_unpack_leaves_a_run_that_is_already_further_and_replaces_an_older_one(tmp_path, capsys):
    run_state.pack(make_run(tmp_path / "box1", step=5), tmp_path / "state", [])
    make_run(tmp_path / "box2", step=6)
    assert run_state.unpack(tmp_path / "state", tmp_path / "box2") == []
    assert "already at step 6" in capsys.readouterr().out
    older = make_run(tmp_path / "box3", step=3)
    assert run_state.unpack(tmp_path / "state", tmp_path / "box3") == ["smollm2-seed2"]
    assert json.loads((older / "state.json").read_text())["step"] == 5
    assert sorted(p.name for p in (older / "checkpoints").iterdir()) == ["step-0005"]
    assert [p.name for p in (tmp_path / "box3").iterdir()] == ["smollm2-seed2"]  # nothing set aside is left


def test_a_damaged_or_missing_part_is_named_and_nothing_is_unpacked(tmp_path):
    run_state.pack(make_run(tmp_path / "box1", step=2, ckpt_bytes=3 * 2**20), tmp_path / "state", [], part_mib=2)
    part = tmp_path / "state" / "smollm2-seed2.tgz.01"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit, match=r"smollm2-seed2.tgz.01 is damaged"):
        run_state.unpack(tmp_path / "state", tmp_path / "box2")
    part.unlink()
    with pytest.raises(SystemExit, match=r"parts missing .*smollm2-seed2.tgz.01"):
        run_state.unpack(tmp_path / "state", tmp_path / "box2")
    assert not (tmp_path / "box2" / "smollm2-seed2").exists()


def test_pack_refuses_a_folder_that_is_not_a_resumable_run(tmp_path):
    with pytest.raises(SystemExit, match="no state.json"):
        run_state.pack(tmp_path, tmp_path / "state", [])
    run = make_run(tmp_path / "box", step=4)
    import shutil

    shutil.rmtree(run / "checkpoints" / "step-0004")
    with pytest.raises(SystemExit, match="records step 4 .* no checkpoints/step-0004"):
        run_state.pack(run, tmp_path / "state", [])


def test_unpack_refuses_an_archive_member_outside_its_folder(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    data = buf.getvalue()
    state = tmp_path / "state"
    state.mkdir()
    (state / "x.tgz.00").write_bytes(data)
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    (state / "x.json").write_text(json.dumps({"run": "x", "step": 1, "phase": "p", "bytes": len(data), "sha256": sha,
                                              "parts": [{"file": "x.tgz.00", "sha256": sha}]}))
    with pytest.raises(SystemExit, match="refusing archive member '../escape.txt'"):
        run_state.unpack(state, tmp_path / "box")
    assert not (tmp_path / "escape.txt").exists()


def test_the_command_line_packs_and_unpacks(tmp_path):
    run = make_run(tmp_path / "box1", step=3)
    for args in (["pack", str(run), str(tmp_path / "state")], ["unpack", str(tmp_path / "state"), str(tmp_path / "b2")]):
        out = subprocess.run([sys.executable, "bench/device/run_state.py", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr[-1000:]
    assert json.loads((tmp_path / "b2" / "smollm2-seed2" / "state.json").read_text())["step"] == 3
    bad = subprocess.run([sys.executable, "bench/device/run_state.py", "unpack", str(tmp_path / "nothing"), str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "no <run>.json manifest" in bad.stderr


@pytest.mark.parametrize("text, needle", [
    ('{"run": "smollm2-seed2", "step": 3, "parts": [{"fi', "is not a manifest pack wrote (JSONDecodeError"),
    ('{"run": "smollm2-seed2", "parts": []}', "is not a manifest pack wrote (KeyError"),
    ('{"run": "../elsewhere", "step": 3, "parts": []}', "not a plain file name"),
])
def test_a_half_copied_or_foreign_manifest_gets_a_one_line_error(tmp_path, text, needle):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "smollm2-seed2.json").write_text(text)
    with pytest.raises(SystemExit, match=re.escape(needle)):
        run_state.unpack(tmp_path / "state", tmp_path / "box")
    assert not (tmp_path / "box").exists() and not (tmp_path / "elsewhere").exists()
