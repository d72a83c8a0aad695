"""The package as shipped: every module's doctests, and the install sets (the Colab T4 sets, ART +
vLLM and the light Unsloth one, must resolve for Python 3.12 on manylinux, so a pin that would break
Colab fails CI here). Run: pytest tests/test_packaging.py"""

import ast
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64", "linux_x86_64", "any"]


def test_every_modules_doctests_pass():
    # The examples in docstrings are the API's smallest documentation: all of them run, in one place.
    import doctest
    import importlib
    import pkgutil

    import mcp_rl

    names = [m.name for m in pkgutil.walk_packages(mcp_rl.__path__, "mcp_rl.") if not m.name.endswith("__main__")]
    results = {n: doctest.testmod(importlib.import_module(n), report=False) for n in names}
    assert {n: r.failed for n, r in results.items() if r.failed} == {}
    assert sum(r.attempted for r in results.values()) >= 30


def test_colab_extra_pins_the_t4_stack():
    colab = PYPROJECT["project"]["optional-dependencies"]["colab"]
    assert "openpipe-art[backend]==0.4.11" in colab
    assert "vllm==0.9.2" in colab  # vLLM V1 (0.10+) has no T4 support


def test_cpu_extra_pins_cpu_torch():
    assert "torch==2.13.0" in PYPROJECT["project"]["optional-dependencies"]["cpu"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_colab_set_resolves_for_python_312(tmp_path):
    """pip's resolver on package metadata only (--dry-run; no wheels are installed)."""
    reqs = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["colab"]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--target", str(tmp_path / "t"), "--python-version", "3.12",
           "--only-binary=:all:", "--report", str(tmp_path / "report.json"),
           *[f"--platform={p}" for p in PLATFORMS], *reqs]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, f"the Colab set does not resolve:\n{proc.stderr[-4000:]}"
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads((tmp_path / "report.json").read_text())["install"]}
    assert resolved["vllm"] == "0.9.2" and resolved["openpipe-art"] == "0.4.11"
    assert resolved["fastmcp"] == "4.2.3"
    assert resolved["torchao"] == "0.12.0" and resolved["torch"] == "2.7.0"  # the torchao built for vLLM's torch
    assert resolved["gguf"] == "0.19.0"  # the notebooks' GGUF export
    from test_art_stack import ART_STACK  # what tests/test_art_stack.py runs our merge on

    assert {k: resolved.get(k) for k in ART_STACK} == ART_STACK


def test_unsloth_extra_leaves_torch_and_vllm_alone():
    extra = PYPROJECT["project"]["optional-dependencies"]["unsloth"]
    names = {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("!")[0].strip().lower() for r in extra}
    assert not names & {"torch", "torchvision", "triton", "xformers", "vllm", "openpipe-art", "unsloth"}
    assert PYPROJECT["tool"]["mcp-rl"]["unsloth"].startswith("unsloth==")  # installed --no-deps afterwards


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_unsloth_set_resolves_for_python_312(tmp_path):
    """The light install (metadata only): core + the unsloth extra, then Unsloth alone (--no-deps)."""
    def resolve(reqs: list[str], report: str, *extra: str) -> dict:
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--target", str(tmp_path / "t"), "--python-version", "3.12",
               "--only-binary=:all:", "--report", str(tmp_path / report), *extra,
               *[f"--platform={p}" for p in PLATFORMS], *reqs]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=850)
        assert proc.returncode == 0, f"the Unsloth set does not resolve:\n{proc.stderr[-4000:]}"
        return {re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
                for i in json.loads((tmp_path / report).read_text())["install"]}

    resolved = resolve(PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["unsloth"],
                       "extra.json")
    assert resolved["unsloth-zoo"] == "2026.10.9" and resolved["transformers"] == "5.17.0"
    assert resolved["fastmcp"] == "4.2.3" and resolved["openpipe-art"] == "0.4.11"
    assert "vllm" not in resolved and "xformers" not in resolved
    major, minor = (int(x) for x in resolved["torch"].split(".")[:2])
    assert (2, 4) <= (major, minor) < (2, 15)  # Unsloth's range: the torch Colab has fits
    alone = resolve([PYPROJECT["tool"]["mcp-rl"]["unsloth"]], "unsloth.json", "--no-deps")
    assert list(alone) == ["unsloth"]
    print("resolved:", {k: resolved[k] for k in ("torch", "transformers", "peft", "trl", "bitsandbytes", "unsloth-zoo")})


def test_the_readme_opens_with_what_it_does_the_two_commands_a_result_and_where_to_go():
    readme = (ROOT / "README.md").read_text()
    first = readme[: readme.index("## Where to go next")]
    block = first[first.index("```bash"):].split("```")[1]  # exactly two: the main job and the tests
    assert [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()] == ["make demo", "make test"]
    assert "![" in first and "colab-badges:start" in first  # one result with its plot, then the Colab way in
    assert len(first.splitlines()) <= 70


def test_every_relative_link_in_the_readme_and_docs_resolves():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://", "mailto:")):
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to {target}, which is missing"


def _absolute(node: ast.ImportFrom, path: Path) -> str | None:
    """The module an ImportFrom names, relative ones resolved against `path`'s package."""
    if not node.level:
        return node.module
    package = path.relative_to(ROOT).parent.parts[: len(path.relative_to(ROOT).parent.parts) - node.level + 1]
    return ".".join([*package, *([node.module] if node.module else [])])


def _module_imports(path: Path) -> tuple[set[str], set[str]]:
    """(mcp_rl modules imported at module level, private names imported from another mcp_rl module)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            node.module, node.level = _absolute(node, path), 0
    mods, private = set(), set()
    for node in tree.body:  # module level only: an import inside a function is a deliberate late one
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mcp_rl"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                mods.add(sub if (ROOT / (sub.replace(".", "/") + ".py")).exists() else node.module)
        elif isinstance(node, ast.Import):
            mods |= {a.name for a in node.names if a.name.startswith("mcp_rl")}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mcp_rl"):
            private |= {f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")
                        and a.name != "__version__"}
    return mods, private


def _package_modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in (ROOT / "mcp_rl").rglob("*.py")}


def test_the_package_has_no_import_cycles_and_no_private_names_cross_modules():
    modules = _package_modules()
    graph, crossing = {}, []
    for name, path in modules.items():
        mods, private = _module_imports(path)
        graph[name] = {m for m in mods if m in modules and m != name}
        crossing += [f"{name} imports {p}" for p in private]
    assert not crossing, crossing
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:  # depth-first; a grey node met again closes a cycle
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(trail[trail.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
