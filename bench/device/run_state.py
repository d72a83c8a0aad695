"""Carry a paused learning run from one GPU machine to the next.

A device call returns at most 8 files of 16 MiB (64 MiB in all) from $OUT and carries at most 64 MiB
(the working tree included), and a machine can be gone by the next call (bench/RESULTS.md section 18).
`pack` writes what a paused run folder needs to resume, as a gzipped tar cut into parts small enough
to come back; `unpack` checks the parts and rebuilds the folder on a fresh machine:

    python3 bench/device/run_state.py pack /tmp/runs/smollm2-seed2 $OUT/state --logs /tmp/runs/logs/smollm2-seed2-*.log
    # here: copy the parts into .dev/gpu/state/, carry that folder; there (.dev/gpu/setup.sh does it):
    python3 bench/device/run_state.py unpack .dev/gpu/state /tmp/runs

The pack keeps one checkpoint, the one state.json's step names (LoRA weights and optimizer state,
~56 MiB raw for SmolLM2 at rank 16 in float32): the older one the run keeps is not needed to resume.
Everything else in the folder goes (evaluations, metrics, the tool-call log), plus the run's call logs.
A folder already here at the same or a later step is left alone. Written by hand: no library splits
an archive for a size-capped transfer and checks it back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tarfile
from pathlib import Path

PART_MIB = 15  # under the 16 MiB a returned file may have


def _step(run_dir: Path) -> tuple[int, str]:
    state_file = run_dir / "state.json"
    if not state_file.is_file():
        raise SystemExit(f"pack: {run_dir} has no state.json: not a run folder (or not started)")
    state = json.loads(state_file.read_text())
    return int(state["step"]), str(state.get("phase", "?"))


def pack(run_dir: Path, dest: Path, logs: list[Path], part_mib: float = PART_MIB) -> dict:
    """Write dest/<run>.tgz.NN parts and dest/<run>.json (their checksums); returns the manifest."""
    step, phase = _step(run_dir)
    keep = f"step-{step:04d}"
    if phase not in ("new", "base_done") and not (run_dir / "checkpoints" / keep).is_dir():
        raise SystemExit(f"pack: {run_dir} records step {step} (phase {phase}) but has no checkpoints/{keep}")
    name = run_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob(f"{name}.tgz.*"), dest / f"{name}.json"]:  # the manifest is written last
        old.unlink(missing_ok=True)
    archive = dest / f"{name}.tgz"

    def only_the_last_checkpoint(info: tarfile.TarInfo):
        parts = Path(info.name).parts  # run/<name>/checkpoints/step-NNNN/...
        if len(parts) >= 4 and parts[2] == "checkpoints" and parts[3] != keep:
            return None
        return info

    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        tar.add(run_dir, arcname=f"run/{name}", filter=only_the_last_checkpoint)
        for log in logs:
            tar.add(log, arcname=f"logs/{log.name}")
    data = archive.read_bytes()
    archive.unlink()
    size = int(part_mib * 2**20)
    parts = []
    for i, at in enumerate(range(0, len(data), size)):
        part = dest / f"{name}.tgz.{i:02d}"
        part.write_bytes(data[at:at + size])
        parts.append({"file": part.name, "sha256": hashlib.sha256(data[at:at + size]).hexdigest()})
    manifest = {"run": name, "step": step, "phase": phase, "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    (dest / f"{name}.json").write_text(json.dumps(manifest, indent=1))
    print(f"pack: {name} at step {step} ({phase}): {len(data) / 2**20:.1f} MiB in {len(parts)} parts under {dest}",
          flush=True)
    return manifest


def _safe_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The archive's members, refused if one would land outside the target (our own packs never do)."""
    members = tar.getmembers()
    for m in members:
        p = Path(m.name)
        if p.is_absolute() or ".." in p.parts or p.parts[0] not in ("run", "logs") or not (m.isfile() or m.isdir()):
            raise SystemExit(f"unpack: refusing archive member {m.name[:80]!r}: not a pack this script wrote")
    return members


def _manifest(path: Path) -> dict:
    """A manifest `pack` wrote, checked: a half-copied or foreign one gets a one-line error."""
    try:
        m = json.loads(path.read_text())
        m["step"] = int(m["step"])
        ok = (isinstance(m["run"], str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", m["run"])
              and all(isinstance(p["file"], str) and "/" not in p["file"] for p in m["parts"]))
        if ok:
            return m
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"unpack: {path.name} is not a manifest pack wrote ({type(e).__name__}: {str(e)[:80]}): "
                         "copy it again") from None
    raise SystemExit(f"unpack: {path.name} names a run or part that is not a plain file name: not a pack this script "
                     "wrote")


def unpack(src: Path, runs: Path) -> list[str]:
    """Rebuild every packed run in `src` under `runs` (logs under runs/logs); returns the runs rebuilt."""
    done = []
    manifests = sorted(src.glob("*.json"))
    if not manifests:
        raise SystemExit(f"unpack: no <run>.json manifest in {src}")
    for mf in manifests:
        m = _manifest(mf)
        name, step = m["run"], m["step"]
        target = runs / name
        if (target / "state.json").is_file() and _step(target)[0] >= step:
            print(f"unpack: {target} is already at step {_step(target)[0]} >= the pack's {step}: left as it is")
            continue
        missing = [p["file"] for p in m["parts"] if not (src / p["file"]).is_file()]
        if missing:
            raise SystemExit(f"unpack: {name}: parts missing from {src}: {', '.join(missing[:4])}")
        chunks = []
        for p in m["parts"]:
            chunk = (src / p["file"]).read_bytes()
            if hashlib.sha256(chunk).hexdigest() != p["sha256"]:
                raise SystemExit(f"unpack: {name}: {p['file']} is damaged (checksum differs): copy it again")
            chunks.append(chunk)
        data = b"".join(chunks)
        if len(data) != m["bytes"] or hashlib.sha256(data).hexdigest() != m["sha256"]:
            raise SystemExit(f"unpack: {name}: the joined parts differ from the pack: copy them again")
        staging = runs / f".{name}.unpacking"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        archive = staging / "pack.tgz"
        archive.write_bytes(data)
        with tarfile.open(archive, "r:gz") as tar:
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
            tar.extractall(staging, members=_safe_members(tar), **extra)
        archive.unlink()
        old = runs / f".{name}.older"
        if target.exists():  # an older state of the same run (the pack is further on): set aside until replaced
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
        (staging / "run" / name).rename(target)
        shutil.rmtree(old, ignore_errors=True)
        if (staging / "logs").is_dir():
            (runs / "logs").mkdir(exist_ok=True)
            for log in (staging / "logs").iterdir():
                shutil.copy2(log, runs / "logs" / log.name)
        shutil.rmtree(staging)
        print(f"unpack: {target} at step {step} ({m['phase']})", flush=True)
        done.append(name)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="a paused run folder -> parts under DEST")
    p.add_argument("run_dir", type=Path)
    p.add_argument("dest", type=Path)
    p.add_argument("--logs", nargs="*", type=Path, default=[], help="the run's call logs, carried with it")
    p.add_argument("--part-mib", type=float, default=PART_MIB)
    u = sub.add_parser("unpack", help="parts under SRC -> run folders under RUNS")
    u.add_argument("src", type=Path)
    u.add_argument("runs", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "pack":
        pack(args.run_dir, args.dest, args.logs, args.part_mib)
    else:
        unpack(args.src, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
