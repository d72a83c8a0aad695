"""mcp_rl/training/manifest.py: a checkpoint's files checked against the sizes and sha256 saved with them.
Run: pytest tests/test_manifest.py
"""

import json
import struct

import pytest

from mcp_rl.training.manifest import MANIFEST, CheckpointCorrupt, check_safetensors, verify_manifest, write_manifest


def safetensors_bytes(n_floats: int = 64) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x01" * (4 * n_floats)


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(safetensors_bytes())
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    (tmp_path / "optimizer.pt").write_bytes(b"o" * 100)
    (tmp_path / "step-0002.tmp-abc").mkdir()  # a crashed save's leftover: not part of the checkpoint
    (tmp_path / "step-0002.tmp-abc" / "x").write_text("x")
    write_manifest(tmp_path)
    return tmp_path


def zero_tail(path, n=16):
    data = path.read_bytes()
    path.write_bytes(data[:-n] + b"\0" * n)


def test_an_intact_checkpoint_passes(ckpt):
    assert verify_manifest(ckpt) is True
    files = json.loads((ckpt / MANIFEST).read_text())["files"]
    assert set(files) == {"adapter/adapter_model.safetensors", "adapter/adapter_config.json", "optimizer.pt"}


@pytest.mark.parametrize("damage, says", [
    (lambda p: zero_tail(p), "is not the file saved (its sha256 differs)"),
    (lambda p: p.write_bytes(p.read_bytes()[:-10]), "bytes, not the"),
    (lambda p: p.unlink(), "is missing from the checkpoint"),
])
def test_a_damaged_file_is_named_in_one_line(ckpt, damage, says):
    weights = ckpt / "adapter" / "adapter_model.safetensors"
    damage(weights)
    with pytest.raises(CheckpointCorrupt, match="adapter_model.safetensors") as e:
        verify_manifest(ckpt)
    assert says in str(e.value) and "\n" not in str(e.value) and "earlier checkpoint" in str(e.value)


def test_only_checks_the_files_asked_for(ckpt):
    (ckpt / "optimizer.pt").write_bytes(b"cut")
    assert verify_manifest(ckpt, only="adapter/") is True  # export needs the adapter alone
    with pytest.raises(CheckpointCorrupt, match="optimizer.pt"):
        verify_manifest(ckpt)


def test_no_manifest_is_an_older_checkpoint_and_an_unreadable_one_is_named(ckpt):
    (ckpt / MANIFEST).write_text('{"files": {"adap')
    with pytest.raises(CheckpointCorrupt, match="manifest.json is unreadable"):
        verify_manifest(ckpt)
    (ckpt / MANIFEST).unlink()
    assert verify_manifest(ckpt) is False


def test_a_safetensors_file_must_be_as_long_as_its_header_says(tmp_path):
    path = tmp_path / "a.safetensors"
    path.write_bytes(safetensors_bytes())
    check_safetensors(path)
    path.write_bytes(safetensors_bytes()[:-7])
    with pytest.raises(CheckpointCorrupt, match="header says"):
        check_safetensors(path)
    path.write_bytes(safetensors_bytes()[:20])
    with pytest.raises(CheckpointCorrupt, match="not a whole safetensors file"):
        check_safetensors(path)


def test_a_checkpoint_written_in_a_temporary_folder_lists_its_files(tmp_path):
    """Checkpoints.save writes into `<name>.tmp-XXXX` and renames it: its own name is no leftover."""
    d = tmp_path / "step-0001.tmp-xyz"
    (d / "adapter").mkdir(parents=True)
    (d / "adapter" / "adapter_model.safetensors").write_bytes(safetensors_bytes())
    write_manifest(d)
    assert list(json.loads((d / MANIFEST).read_text())["files"]) == ["adapter/adapter_model.safetensors"]
