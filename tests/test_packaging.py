"""The package as shipped: every module's doctests, and the Colab install's locks (notebooks/locks/, made by
`python notebooks/lock.py --refresh`), checked offline: complete, made from pyproject's pins, hashed. No
test asks the package index anything, so a release elsewhere cannot turn CI red.
Run: pytest tests/test_packaging.py"""

import ast
import importlib.util
import json
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


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


def lock_module():
    spec = importlib.util.spec_from_file_location("lock", ROOT / "notebooks" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def locked(preset: str) -> dict[str, str]:
    return {name: p["version"] for name, p in
            json.loads((ROOT / "notebooks" / "locks" / f"{preset}.json").read_text())["packages"].items()}


@pytest.mark.parametrize("preset", ["t4", "t4-unsloth", "cpu"])
def test_each_colab_lock_is_complete_and_made_from_pyproject(preset):
    """Offline (no index is asked): what pyproject asks for is locked, and every locked package's own
    requirements on Colab's Python are met inside the lock or by what the machine keeps."""
    assert lock_module().problems(preset, PYPROJECT) == []


def test_the_lock_check_finds_a_missing_package_a_version_out_of_range_and_a_stale_request():
    import doctest

    lock = lock_module()
    assert doctest.testmod(lock).failed == 0
    made = json.loads((ROOT / "notebooks" / "locks" / "t4.json").read_text())
    missing = {**made, "packages": {k: v for k, v in made["packages"].items() if k != "aiohttp"}}
    assert any("aiohttp" in p and "is not in the lock" in p for p in lock.problems("t4", PYPROJECT, missing))
    older = {**made, "packages": {**made["packages"], "vllm": {**made["packages"]["vllm"], "version": "0.9.1"}}}
    assert any("vllm==0.9.1 does not meet vllm==0.9.2" in p for p in lock.problems("t4", PYPROJECT, older))
    moved = {**PYPROJECT, "project": {**PYPROJECT["project"], "dependencies": [*PYPROJECT["project"]["dependencies"],
                                                                               "rich==1.0"]}}
    assert any("pyproject asks for other packages" in p for p in lock.problems("t4", moved, made))


def test_the_t4_lock_holds_the_art_stack_vllm_runs_on():
    resolved = locked("t4")
    assert resolved["vllm"] == "0.9.2" and resolved["openpipe-art"] == "0.4.11"
    assert resolved["fastmcp"] == "4.2.3"
    assert resolved["torchao"] == "0.12.0" and resolved["torch"] == "2.7.0"  # the torchao built for vLLM's torch
    assert resolved["gguf"] == "0.19.0"  # the notebooks' GGUF export
    assert "numpy" not in resolved  # Colab's stays
    from test_art_stack import ART_STACK  # what tests/test_art_stack.py runs our merge on

    assert {k: resolved.get(k) for k in ART_STACK} == ART_STACK


def test_every_lock_line_is_pinned_and_hashed():
    for txt in sorted((ROOT / "notebooks" / "locks").glob("*.txt")):
        lines = [line for line in txt.read_text().replace("\\\n", "").splitlines() if line and not line.startswith("#")]
        assert lines and all(re.fullmatch(r"[a-z0-9-]+==\S+ +--hash=sha256:[0-9a-f]{64}", line) for line in lines), txt.name
        assert "Made 20" in txt.read_text() and "notebooks/lock.py --refresh" in txt.read_text()


def test_unsloth_extra_leaves_torch_and_vllm_alone():
    extra = PYPROJECT["project"]["optional-dependencies"]["unsloth"]
    names = {r.split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("!")[0].strip().lower() for r in extra}
    assert not names & {"torch", "torchvision", "triton", "xformers", "vllm", "openpipe-art", "unsloth"}
    assert PYPROJECT["tool"]["mcp-rl"]["unsloth"].startswith("unsloth==")  # installed --no-deps afterwards


def test_the_light_lock_keeps_colabs_torch_and_pins_unsloth_alone():
    resolved = locked("t4-unsloth")
    assert resolved["unsloth-zoo"] == "2026.10.9" and resolved["transformers"] == "5.17.0"
    assert resolved["fastmcp"] == "4.2.3" and resolved["openpipe-art"] == "0.4.11"
    assert "vllm" not in resolved and "xformers" not in resolved and "torch" not in resolved
    assert f"unsloth=={resolved['unsloth']}" == PYPROJECT["tool"]["mcp-rl"]["unsloth"]


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
