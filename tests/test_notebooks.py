"""Tests for notebooks/: static checks on every notebook, then (slow) papermill runs on a CPU.

    .venv/bin/python -m pytest tests/test_notebooks.py -q                 # all
    .venv/bin/python -m pytest tests/test_notebooks.py -q -m "not slow"   # static checks only

Static: valid nbformat, identical to what notebooks/build_notebooks.py generates, outputs and
execution counts stripped, every code cell parses, every mcp_rl name used is public API,
the install cell matches pyproject's colab extra, one papermill "parameters" cell, a Colab
badge, thin cells. Slow: each notebook executed end to end with the embedded model and tiny
settings, into tmp_path, on the kernel of this interpreter.
"""

import ast
import importlib
import importlib.util
import json
import re
import sys
import time
import tomllib
from pathlib import Path

import nbformat
import pytest

import mcp_rl

ROOT = Path(__file__).resolve().parents[1]
NB_DIR = ROOT / "notebooks"
NOTEBOOKS = ["01_train_sql_agent.ipynb", "02_bring_your_own_server.ipynb"]
MAX_CELL_LINES = 40


def load(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NB_DIR / name, as_version=4)


def code_cells(nb) -> list:
    return [c for c in nb.cells if c.cell_type == "code"]


def python_source(cell) -> str:
    """Cell source with IPython `!shell` and `%magic` lines replaced by `pass` (same indentation)."""
    lines = []
    for line in cell.source.splitlines():
        stripped = line.lstrip()
        lines.append(line[: len(line) - len(stripped)] + "pass" if stripped.startswith(("!", "%")) else line)
    return "\n".join(lines)


def mcp_rl_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "mcp_rl":
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mcp_rl."):
            names.add(node.module)  # a submodule import: not public API, reported as such
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "mcp_rl":
            names.add(node.attr)
    return names


def install_cell(nb):
    return next(c for c in code_cells(nb) if "pip install" in c.source)


# ---------------------------------------------------------------- static checks
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_valid_nbformat(name):
    nbformat.validate(load(name))


def test_notebooks_are_what_the_generator_writes():
    spec = importlib.util.spec_from_file_location("build_notebooks", NB_DIR / "build_notebooks.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert sorted(builder.NOTEBOOKS) == NOTEBOOKS
    stale = [n for n in NOTEBOOKS if (NB_DIR / n).read_text() != builder.render(n)]
    assert not stale, f"{stale} differ from notebooks/build_notebooks.py: run it to rebuild them"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_outputs_and_execution_counts_are_stripped(name):
    for cell in code_cells(load(name)):
        assert cell.outputs == [] and cell.execution_count is None, cell.source[:80]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_code_cell_parses(name):
    for cell in code_cells(load(name)):
        try:
            ast.parse(python_source(cell))
        except SyntaxError as e:
            pytest.fail(f"{name}: a cell does not parse ({e}):\n{cell.source}")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_mcp_rl_names_are_public_api(name):
    used = set().union(*(mcp_rl_names(ast.parse(python_source(c))) for c in code_cells(load(name))))
    assert used, "the notebook calls nothing from mcp_rl"
    missing = sorted(used - set(mcp_rl.__all__))
    assert not missing, f"{name} uses names outside mcp_rl.__all__: {missing}"
    # A public name that is also a submodule's name (rollout, evaluate) resolves to the module once
    # the submodule is imported; importing everything first makes such a shadowed name show up here.
    for module in {mcp_rl._WHERE[n] for n in mcp_rl.__all__}:
        importlib.import_module(f"mcp_rl.{module}")
    modules = sorted(n for n in used if type(getattr(mcp_rl, n)).__name__ == "module")
    assert not modules, f"{name}: `from mcp_rl import {modules}` gives a submodule, not the function"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_install_cell_matches_pyproject_colab_extra(name):
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["colab"]
    cell = install_cell(load(name)).source
    pips = [line.strip() for line in cell.splitlines() if line.strip().startswith("!pip")]
    assert pips[0] == '!pip install -q -e ".[colab]"', pips
    # triton goes in a second step (torch 2.7.0 pins triton 3.3.0), so it must not be in the extra.
    assert re.fullmatch(r"!pip install -q triton==[\d.]+", pips[1]) and len(pips) == 2, pips
    assert not any(r.startswith("triton") for r in extra)
    for req in extra:  # the cell's comment names the pinned versions: they must be pyproject's
        if "==" in req:
            package, version = req.split("==")
            assert version in cell, f"install cell does not mention {package} {version} (pyproject's pin)"
    assert 'REPO_URL = "https://github.com/OWNER/mcp-rl"' in cell
    assert 'find_spec("mcp_rl") is None' in cell  # skipped where mcp_rl is importable (CI)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_papermill_parameters_cell_every_name_parsed(name):
    from papermill.inspection import inspect_notebook

    nb = load(name)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and tagged[0].cell_type == "code"
    assigned = {t.id for node in ast.parse(tagged[0].source).body if isinstance(node, ast.Assign)
                for t in node.targets}
    assert set(inspect_notebook(str(NB_DIR / name))) == assigned  # papermill can override every one


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_colab_badge_opens_this_notebook(name):
    first = load(name).cells[0]
    assert first.cell_type == "markdown"
    assert "https://colab.research.google.com/assets/colab-badge.svg" in first.source
    assert f"colab.research.google.com/github/OWNER/mcp-rl/blob/main/notebooks/{name})" in first.source


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_cells_are_thin_and_explained(name):
    nb = load(name)
    for cell in code_cells(nb):
        assert len(cell.source.splitlines()) <= MAX_CELL_LINES or "parameters" in cell.metadata.get("tags", []), \
            cell.source[:80]
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("markdown") >= 6 and "code\ncode\ncode\ncode" not in "\n".join(kinds)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_keys_are_never_printed(name):
    for cell in code_cells(load(name)):
        for node in ast.walk(ast.parse(python_source(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("print", "display"):
                names = {n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)}
                assert "KEY" not in names, cell.source[:120]


# ---------------------------------------------------------------- execution (CPU, embedded model)
# Sized so each notebook runs in a few minutes on 2 cores (measured: see the closing notes of [notebooks]).
TINY = {"PRESET": "cpu", "MODEL": "smollm2", "STEPS": 1, "GROUPS_PER_STEP": 1, "GROUP_SIZE": 2,
        "EVAL_SCENARIOS": 2, "MAX_TOKENS": 48, "MAX_TURNS": 3, "LLM_SCENARIOS": 0}
RUNS = {
    "01_train_sql_agent.ipynb": {**TINY, "WARM_START": 4, "MAX_TURNS": 6},  # a demonstration takes ~5 turns
    "02_bring_your_own_server.ipynb": {**TINY, "TOOL_PREFIX": True, "MAX_TURNS": 2,
                                       "SERVER": f"{sys.executable} -m mcp_server_time"},
}


@pytest.fixture
def venv_kernel(tmp_path, monkeypatch):
    """Kernel "python3" pinned to this interpreter: JUPYTER_PATH comes before user and system kernels."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (mcp-rl venv)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for key in ("OPENROUTER_API_KEY", "OPENAI_API_KEY", "HF_TOKEN"):  # CI runs the no-key path
        monkeypatch.delenv(key, raising=False)
    return "python3"


def stream_text(nb) -> str:
    return "\n".join(o.get("text", "") for c in code_cells(nb) for o in c.outputs if o.get("output_type") == "stream")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_on_cpu(name, tmp_path, venv_kernel):
    import papermill

    run = tmp_path / "run"
    start = time.monotonic()
    out = papermill.execute_notebook(
        str(NB_DIR / name), str(tmp_path / name), parameters={**RUNS[name], "OUT": str(run)},
        kernel_name=venv_kernel, cwd=str(ROOT), progress_bar=False, execution_timeout=300)
    print(f"{name} executed in {time.monotonic() - start:.0f} s")
    text = stream_text(out)
    assert "No OPENROUTER_API_KEY" in text
    assert re.search(r"base: success [\d.]+%", text) and re.search(r"trained: success [\d.]+%", text)
    assert re.search(r"step 1/1 \| reward", text)
    assert (run / "report.md").is_file() and (run / "eval_bars.png").is_file()
    assert (run / "final" / "adapter" / "adapter_config.json").is_file()
    assert (run / "merged" / "config.json").is_file()
    assert load(name).cells[0].source == out.cells[0].source  # the committed notebook is untouched
    assert code_cells(load(name))[0].outputs == []
