"""The Colab install's locks: exactly what each GPU/Colab PRESET installs, made by hand, checked offline.

    python notebooks/lock.py --refresh          # resolve every preset against PyPI today, rewrite the locks
    python notebooks/lock.py --refresh t4       # one preset
    python notebooks/lock.py --check            # offline: each lock is complete and matches pyproject (CI does this)

`notebooks/locks/<preset>.txt` is a pip requirements file of exact versions with sha256 hashes, which
the install cell (notebooks/install_cell.py) installs with `--no-deps --require-hashes`: a Colab user
gets the versions we tested, whatever is released tomorrow. `<preset>.json` beside it keeps what the
resolver saw (each package's own requirements), so `--check` proves without a network that the lock
is closed: every requirement of every locked package, on Colab's Python and platform, is met by
another locked package or by one the machine keeps (numpy always; torch and its CUDA libraries on the
presets that run on Colab's torch). Moving to newer versions is a choice made here, with `--refresh`,
never by a test: no test asks the index anything.

Why by hand and not pip-tools/uv: the resolve must run for another Python and platform than this
machine's (`pip install --dry-run --report` with `--python-version/--platform` does that, with
nothing installed), and pip's constraints files take no hashes.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LOCKS = HERE / "locks"
INDEX = "https://pypi.org/simple"
PYTHON = "3.12"  # Colab's Python; the hashes are for its wheels
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "linux_x86_64", "any"]  # bitsandbytes needs manylinux_2_24
ENVIRONMENT = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0", "sys_platform": "linux",
               "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
# What the machine keeps (never in a lock): a new numpy breaks Colab's compiled packages; the light presets
# run on Colab's torch, with its CUDA libraries and triton, and torchao is picked by that torch at install.
COLAB_TORCH = r"torch|torchvision|torchaudio|triton|nvidia-.*|torchao"
KEPT = {"t4": r"numpy", "t4-unsloth": rf"numpy|{COLAB_TORCH}", "cpu": rf"numpy|{COLAB_TORCH}"}


def canonical(name: str) -> str:
    """PEP 503's normal form.

    >>> canonical("Unsloth_Zoo"), canonical("ruamel.yaml")
    ('unsloth-zoo', 'ruamel-yaml')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def kept(preset: str, name: str) -> bool:
    """Whether `name` is the machine's own on `preset` (so not locked).

    >>> kept("t4", "numpy"), kept("t4", "torch"), kept("t4-unsloth", "nvidia-cublas-cu12")
    (True, False, True)
    """
    return re.fullmatch(KEPT[preset], canonical(name)) is not None


def requested(preset: str, pyproject: dict) -> tuple[list[str], list[str]]:
    """(requirements resolved together, packages added alone with --no-deps) for `preset`."""
    deps, extras, tool = (pyproject["project"]["dependencies"], pyproject["project"]["optional-dependencies"],
                          pyproject["tool"]["mcp-rl"])
    if preset == "t4":  # pillow and protobuf as ART's own T4 notebooks pin them
        return deps + extras["colab"] + ["pillow==11.3.0", "protobuf==5.29.5"], []
    if preset == "t4-unsloth":  # Unsloth itself asks for xformers, whose wheels each pin a torch: --no-deps
        return deps + extras["unsloth"] + [f"torch=={tool['lock-torch']}"], [tool["unsloth"]]
    if preset == "cpu":
        cpu = [r for r in extras["cpu"] if canonical(Requirement(r).name) != "torch"]
        return deps + cpu + [f"torch=={tool['lock-torch']}"], [tool["embedded-model"]]
    raise ValueError(f"no lock for preset {preset!r}: one of {', '.join(KEPT)}")


# ---------------------------------------------------------------- refresh (the network; by hand only)
def resolve(requirements: list[str], *, no_deps: bool = False) -> list[dict]:
    """pip's resolver for Colab's Python and platform on package metadata only (nothing is installed),
    against PyPI alone: this machine's pip configuration (local wheels, constraints) is left out."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL")}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--index-url", INDEX, "--target", f"{tmp}/t",
               "--python-version", PYTHON, "--only-binary=:all:", "--report", str(report),
               *[f"--platform={p}" for p in PLATFORMS], *(["--no-deps"] if no_deps else []), *requirements]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode:
            raise RuntimeError(f"pip could not resolve {requirements[:3]}...:\n{done.stderr[-3000:]}")
        return json.loads(report.read_text())["install"]


def refresh(preset: str, pyproject: dict) -> dict:
    together, alone = requested(preset, pyproject)
    packages = {}
    for items, no_deps in ((resolve(together), False), *((resolve([r], no_deps=True), True) for r in alone)):
        for item in items:
            meta, info = item["metadata"], item["download_info"]
            if not info["url"].startswith("https://"):
                raise RuntimeError(f"{meta['name']} came from {info['url'][:80]}, not the index")
            if not kept(preset, meta["name"]):
                packages[canonical(meta["name"])] = {
                    "version": meta["version"], "sha256": info["archive_info"]["hashes"]["sha256"],
                    "requires_dist": meta.get("requires_dist", []), **({"no_deps": True} if no_deps else {})}
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, text=True).stdout.split()[1]
    return {"preset": preset, "made": datetime.date.today().isoformat(), "pip": pip, "python": PYTHON,
            "requested": together + alone, "kept": KEPT[preset], "packages": dict(sorted(packages.items()))}


def render(lock: dict) -> str:
    """The requirements file pip installs: a header saying when and how, then one pinned, hashed line a package."""
    head = [f"# The Colab install for PRESET = {lock['preset']!r}: notebooks/install_cell.py installs exactly this",
            "# (--no-deps --require-hashes), then this checkout itself (--no-deps).",
            f"# Made {lock['made']} by `python notebooks/lock.py --refresh` (pip {lock['pip']}): PyPI as served that",
            f"# day, resolved for CPython {lock['python']} on manylinux x86_64. Kept from the machine, not locked:",
            f"# {lock['kept'].replace('|', ', ')}. Checked offline by `python notebooks/lock.py --check`.", ""]
    return "\n".join(head + [f"{name}=={p['version']} \\\n    --hash=sha256:{p['sha256']}"
                             for name, p in lock["packages"].items()]) + "\n"


# ---------------------------------------------------------------- check (offline; the tests run this)
def problems(preset: str, pyproject: dict, lock: dict | None = None) -> list[str]:
    """What is wrong with `preset`'s committed lock, [] when nothing: the requests are pyproject's and
    each is met, the lock is closed under its packages' own requirements, and the .txt is its render."""
    path, from_file = LOCKS / f"{preset}.json", lock is None
    if from_file:
        if not path.is_file():
            return [f"{path.relative_to(ROOT)} is missing: run `python notebooks/lock.py --refresh {preset}`"]
        lock = json.loads(path.read_text())
    together, alone = requested(preset, pyproject)
    found = []
    if lock["requested"] != together + alone:
        found.append(f"{preset}: pyproject asks for other packages than the lock was made for: "
                     f"run `python notebooks/lock.py --refresh {preset}`")
    locked = {name: Version(p["version"]) for name, p in lock["packages"].items()}
    wanted = [(Requirement(r), None) for r in together + alone]
    seen = set()
    while wanted:
        req, by = wanted.pop()
        name = canonical(req.name)
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if kept(preset, name):
            continue
        if name not in locked:
            found.append(f"{preset}: {req} (asked for by {by or 'pyproject'}) is not in the lock")
            continue
        if not req.specifier.contains(locked[name], prereleases=True):
            found.append(f"{preset}: {name}=={locked[name]} does not meet {req} (asked for by {by or 'pyproject'})")
        if lock["packages"][name].get("no_deps"):
            continue
        for text in lock["packages"][name]["requires_dist"]:
            dep = Requirement(text)
            if dep.marker is None or any(dep.marker.evaluate({**ENVIRONMENT, "extra": e})
                                         for e in ("", *req.extras)):
                wanted.append((Requirement(str(dep).split(";")[0]), name))
    txt = LOCKS / f"{preset}.txt"
    if from_file and (not txt.is_file() or txt.read_text() != render(lock)):
        found.append(f"{txt.relative_to(ROOT)} is not the render of {path.name}: run `python notebooks/lock.py --refresh {preset}`")
    return found


def main(argv: list[str]) -> int:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    presets = [a for a in argv if not a.startswith("--")] or list(KEPT)
    if "--refresh" in argv:
        LOCKS.mkdir(exist_ok=True)
        for preset in presets:
            lock = refresh(preset, pyproject)
            (LOCKS / f"{preset}.json").write_text(json.dumps(lock, indent=1) + "\n")
            (LOCKS / f"{preset}.txt").write_text(render(lock))
            print(f"{preset}: {len(lock['packages'])} packages locked")
    found = [p for preset in presets for p in problems(preset, pyproject)]
    print("\n".join(found) or f"locks complete: {', '.join(presets)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
