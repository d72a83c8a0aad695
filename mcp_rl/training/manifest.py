"""Checksums of a checkpoint's files: written when it is saved, checked before anything loads it.

    write_manifest(ckpt)                     # ckpt/manifest.json: size and sha256 of every file in it
    verify_manifest(ckpt)                    # CheckpointCorrupt (a ValueError) naming the first file that differs
    verify_manifest(ckpt, only="adapter/")   # the adapter's files only (export, serve --adapter)

A checkpoint copied in part (a Drive sync, an interrupted `cp`, a full disk), or a file whose end a
crash zeroed before the data reached the disk, loaded without a word: a zeroed tail of safetensors
reads as zero weights; a cut one failed deep inside safetensors. An ART checkpoint folder holds only
ART's record; its manifest adds the files of ART's LoRA folder under `art_checkpoint/`. Checkpoints
saved before manifests (and other tools' adapters) have none: they are loaded after the one check
that needs no record, that each safetensors file is as long as its own header says.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

__all__ = ["MANIFEST", "CheckpointCorrupt", "write_manifest", "verify_manifest", "check_safetensors"]

MANIFEST = "manifest.json"
ART_PREFIX = "art_checkpoint/"
_FORMAT = 1


class CheckpointCorrupt(ValueError):
    """A checkpoint file that is not as it was saved; the message is one line naming it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _files(folder: Path) -> dict[str, Path]:
    # Names a loader never reads are left out: a crash's `<name>.tmp-XXXX` leftovers, the manifest itself.
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    return {name: p for name, p in files.items() if name != MANIFEST and ".tmp-" not in name}


def write_manifest(folder: str | os.PathLike, art_checkpoint: str | os.PathLike | None = None) -> Path:
    """Record size and sha256 of every file under `folder` (and of ART's LoRA folder) in folder/manifest.json."""
    folder = Path(folder)
    entries = _files(folder)
    if art_checkpoint is not None and Path(art_checkpoint).is_dir():
        entries.update({ART_PREFIX + name: p for name, p in _files(Path(art_checkpoint)).items()})
    files = {name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for name, p in entries.items()}
    path = folder / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump({"format": _FORMAT, "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def _corrupt(path: Path, how: str, folder: Path) -> CheckpointCorrupt:
    return CheckpointCorrupt(f"{path} {how} (a copy cut short, or a crash before it reached the disk): copy "
                             f"{folder} again from where it was written, or use an earlier checkpoint")


def verify_manifest(folder: str | os.PathLike, *, only: str | None = None,
                    art_checkpoint: str | os.PathLike | None = None) -> bool:
    """Check the files `folder`'s manifest lists (those under `only`; ART's LoRA files only when
    `art_checkpoint` says where that folder is). False when there is no manifest (an older checkpoint)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return False
    try:
        files = json.loads(path.read_text())["files"]
        assert isinstance(files, dict)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise CheckpointCorrupt(f"{path} is unreadable (empty or cut short): copy {folder} again from where it "
                                "was written, or delete the manifest to load the checkpoint unchecked") from None
    for name, rec in files.items():
        if name.startswith(ART_PREFIX):
            if art_checkpoint is None or (only is not None and only != ART_PREFIX):
                continue
            file = Path(art_checkpoint) / name[len(ART_PREFIX):]
        elif only is not None and not name.startswith(only):
            continue
        else:
            file = folder / name
        if not file.is_file():
            raise CheckpointCorrupt(f"{file} is missing from the checkpoint (its manifest lists it): copy {folder} "
                                    "again from where it was written, or use an earlier checkpoint")
        size = file.stat().st_size
        if size != rec["bytes"]:
            raise _corrupt(file, f"is {size} bytes, not the {rec['bytes']} saved", folder)
        if _sha256(file) != rec["sha256"]:
            raise _corrupt(file, "is not the file saved (its sha256 differs)", folder)
    return True


def check_safetensors(path: str | os.PathLike) -> None:
    """Refuse a safetensors file shorter or longer than its header says (the check needing no manifest)."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > size:
                raise ValueError
            header = json.loads(f.read(n))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (ValueError, struct.error, KeyError, TypeError, IndexError):
        raise CheckpointCorrupt(f"{path} is not a whole safetensors file (its header is cut or damaged): copy it "
                                "again from where it was written, or use an earlier checkpoint") from None
    if size != 8 + n + end:
        raise CheckpointCorrupt(f"{path} is {size} bytes but its header says {8 + n + end} (a copy cut short?): copy "
                                "it again from where it was written, or use an earlier checkpoint")
