# Install: find or clone mcp-rl, change into it, and install what this machine needs.
# INSTALL picks the Colab stack (see "Which install" above): "art" = OpenPipe ART + vLLM 0.9.2 (the
# faster sampler; replaces Colab's torch with 2.7, several minutes), "unsloth" = the light install:
# Unsloth inside the portable trainer on Colab's own torch (no vLLM, no torch reinstall; use it
# with PRESET = "t4-unsloth").
# Safe to re-run, also after "Restart session": it installs once per machine and always changes into
# the checkout. On a Colab T4 the first run takes several minutes (vLLM 0.9.2 and its torch 2.7 are
# large downloads); pip then warns that some of Colab's preinstalled packages (torchvision,
# torchaudio, ...) want another torch: expected, this notebook does not use them.
# Outside Colab (CI, your own machine) it installs nothing: use `make install` (the CPU set and the embedded model).
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_URL = ""  # the mcp-rl git repository (notebooks/sync.py fills it in from pyproject.toml)
REPO_BRANCH = "main"  # the branch this notebook came from (the same source)
INSTALL = "art"  # "art" (ART + vLLM) or "unsloth" (the light install)


def sh(*cmd: str) -> str:
    """Run one command; a failure stops the cell with the command and the end of its output."""
    print("$", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"this command failed (exit {done.returncode}): {' '.join(cmd)}\n"
                           + (done.stdout + done.stderr)[-3000:])
    return done.stdout


def find_checkout() -> Path | None:
    here = Path.cwd()
    for d in (here, *here.parents, here / "mcp-rl", Path("/content/mcp-rl")):
        if (d / "mcp_rl" / "__init__.py").is_file() and (d / "pyproject.toml").is_file():
            return d
    return None


root = find_checkout()
if root is None:
    if not REPO_URL.strip():
        raise RuntimeError("REPO_URL is empty: set it at the top of this cell to the mcp-rl git URL "
                           "(https://github.com/<owner>/mcp-rl), then run the cell again")
    target = Path("/content/mcp-rl") if Path("/content").is_dir() else Path("mcp-rl").resolve()
    sh("git", "clone", "--depth", "1", "--branch", REPO_BRANCH, REPO_URL, str(target))
    root = target
os.chdir(root)
if str(root) not in sys.path:
    sys.path.insert(0, str(root))
print("checkout:", root)

gpu = ""
if shutil.which("nvidia-smi"):
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    gpu = smi.splitlines()[0] if smi else ""
print("GPU:", gpu or "none")

stamp = root / ".colab-installed"
if INSTALL not in ("art", "unsloth"):
    raise ValueError(f"INSTALL must be 'art' or 'unsloth', got {INSTALL!r}")
if not any(k.startswith("COLAB_") for k in os.environ):
    print("not on Colab: nothing installed here (run `make install`: the CPU set and the embedded model)")
elif stamp.exists():
    done = stamp.read_text().strip()
    if not done.startswith(INSTALL + " "):
        raise RuntimeError(f"this machine already has another install ({done}); to switch, choose "
                           "Runtime > Disconnect and delete runtime, then run this cell again")
    print("already installed on this machine:", done)
elif not gpu:
    raise RuntimeError("no GPU: choose Runtime > Change runtime type > T4 GPU, then run this cell again "
                       "(without a GPU, run the CPU demo on your machine: make demo)")
else:
    import numpy  # keep Colab's numpy, as ART's own T4 notebooks do: a new one needs a restart

    pip = ["uv", "pip", "install", "--system"] if shutil.which("uv") else [sys.executable, "-m", "pip", "install"]
    if INSTALL == "unsloth":  # at most about two minutes: Colab's torch, triton and torchvision stay
        # The unsloth extra (unsloth_zoo 2026.10.9, bitsandbytes, transformers 5.17.0, peft 0.21.0, ...),
        # then Unsloth itself without its dependencies: they name xformers, which would replace torch.
        sh(*pip, "-q", "-e", ".[unsloth]", f"numpy=={numpy.__version__}")
        sh(*pip, "-q", "--no-deps", "unsloth==2026.10.9")
    else:
        # The colab extra: openpipe-art[backend] 0.4.11, vLLM 0.9.2, Unsloth 2025.8.6, bitsandbytes.
        sh(*pip, "-q", "-e", ".[colab]", f"numpy=={numpy.__version__}", "pillow==11.3.0", "protobuf==5.29.5")
        if "T4" in gpu:  # as ART's T4 notebooks do: triton 3.2.0 after the rest (torch 2.7 pins 3.3.0)
            sh(*pip, "-q", "triton==3.2.0")
    stamp.write_text(f"{INSTALL} {gpu}\n")
    print("installed. If Colab asks to restart the session, do so and run this cell again.")
