"""Build notebooks/*.ipynb from their percent-format sources (notebooks/NN_*.py, read with jupytext).

    python notebooks/sync.py            # rewrite the .ipynb files (outputs stripped) and README's badges
    python notebooks/sync.py --check    # exit 1 if a committed notebook or the README differs

Each `NN_name.py` is the readable source of `NN_name.ipynb` (`# %%` starts a code cell,
`# %% [markdown]` a text cell, `tags=["parameters"]` marks papermill's cell). Two things are
filled in here, so they live in one place each:
- the cell tagged "install" becomes notebooks/first_cell.py, with REPO_URL set (it finds or clones the
  checkout, then runs notebooks/install_cell.py from it);
- the repository URL is pyproject.toml's `[tool.mcp-rl] repository` (empty, or a GitHub https URL;
  anything else is refused), its branch `[tool.mcp-rl] branch` (default main). When it is set, each
  notebook and the README get "Open in Colab" badges for it; when it is empty, the README says
  so instead of showing a badge that points nowhere.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import jupytext
import nbformat

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
README_START, README_END = "<!-- colab-badges:start -->", "<!-- colab-badges:end -->"
NO_REPO = ("No public repository URL is set yet, so there is no Colab badge: open a notebook in Colab with "
           "*File → Upload notebook*, and its first cell finds the code (a zip of this repository uploaded to "
           "`/content`, or the folder on your Google Drive). The badges appear here once `[tool.mcp-rl] "
           "repository` in pyproject.toml is set and `python notebooks/sync.py` has run.")
TITLES = {"01_train_sql_agent": "Tutorial: train a SQL agent on the company MCP server (free T4: "
                                "Qwen2.5-3B-Instruct in 4 bits, ART + vLLM 0.9.2)",
          "02_bring_your_own_server": "Bring your own MCP server (stdio command or HTTP URL), with your "
                                      "own reward function"}


GITHUB = re.compile(r"https://github\.com/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?(\.git)?/?")


def check_repository(repo: str) -> str:
    """`repo` stripped, if empty or a GitHub https URL (Colab opens notebooks from GitHub only).

    >>> check_repository("git@github.com:me/mcp-rl.git")
    Traceback (most recent call last):
    ValueError: [tool.mcp-rl] repository must be empty or https://github.com/<owner>/<name>: Colab's badge and the install cell's git clone need that form; got 'git@github.com:me/mcp-rl.git'
    """
    repo = repo.strip()
    if repo and not GITHUB.fullmatch(repo):
        raise ValueError("[tool.mcp-rl] repository must be empty or https://github.com/<owner>/<name>: Colab's "
                         f"badge and the install cell's git clone need that form; got {repo[:80]!r}")
    return repo


def settings() -> tuple[str, str]:
    """pyproject.toml's `[tool.mcp-rl]` repository (checked) and branch (default main)."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mcp-rl"]
    branch = str(table.get("branch", "main")).strip()
    if not re.fullmatch(r"[A-Za-z0-9_./-]+", branch):
        raise ValueError(f"[tool.mcp-rl] branch must be a git branch name; got {branch[:80]!r}")
    return check_repository(table["repository"]), branch


def repository() -> str:
    return settings()[0]


def colab_url(repo: str, stem: str, branch: str = "main") -> str:
    path = re.sub(r"^https://github\.com/", "", repo).removesuffix("/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{path}/blob/{branch}/notebooks/{stem}.ipynb"


def badge(repo: str, stem: str, branch: str = "main") -> str:
    return f"[![Open In Colab]({BADGE})]({colab_url(repo, stem, branch)})"


def install_source(repo: str, branch: str = "main") -> str:
    """The first cell with REPO_URL and REPO_BRANCH filled in: it clones the branch the badge opens."""
    text = (HERE / "first_cell.py").read_text().strip()
    for line, value in (('REPO_URL = ""', repo), ('REPO_BRANCH = "main"', branch)):
        if line not in text:
            raise ValueError(f"notebooks/first_cell.py must contain the line {line!r}")
        text = text.replace(line, line.split(" = ")[0] + f' = "{value}"', 1)
    return text


def sources() -> list[Path]:
    return sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))


def render(source: Path, repo: str, branch: str = "main") -> str:
    nb = jupytext.read(source, fmt="py:percent")
    stem = source.stem
    out = nbformat.v4.new_notebook()
    out.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "accelerator": "GPU",  # Colab opens it on a GPU runtime
        "colab": {"provenance": [], "gpuType": "T4"},
    }
    for i, cell in enumerate(nb.cells):
        tags = list(cell.metadata.get("tags", []))
        text = install_source(repo, branch) if "install" in tags else cell.source
        if i == 0 and repo and cell.cell_type == "markdown":
            title, _, rest = text.partition("\n")
            text = f"{title}\n\n{badge(repo, stem, branch)}\n{rest}"
        new = nbformat.v4.new_markdown_cell(text) if cell.cell_type == "markdown" else nbformat.v4.new_code_cell(text)
        new.id = f"{stem.split('_')[0]}-{i:02d}"  # fixed ids: rebuilding gives the same file
        if tags:
            new.metadata["tags"] = tags
        out.cells.append(new)
    nbformat.validate(out)
    return nbformat.writes(out, version=4) + "\n"


def readme_block(repo: str, branch: str = "main") -> str:
    if not repo:
        return f"{README_START}\n{NO_REPO}\n{README_END}"
    lines = [f"{badge(repo, p.stem, branch)} {TITLES.get(p.stem, p.stem)}\n" for p in sources()]
    return f"{README_START}\n" + "\n".join(lines) + README_END


def render_readme(repo: str, branch: str = "main") -> str:
    text = (ROOT / "README.md").read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"README.md needs the lines {README_START} and {README_END} around the badges")
    return text[:start] + readme_block(repo, branch) + text[end + len(README_END):]


def main(argv: list[str]) -> int:
    try:
        repo, branch = settings()
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    stale: list[str] = []
    targets = {src.with_suffix(".ipynb"): render(src, repo, branch) for src in sources()}
    targets[ROOT / "README.md"] = render_readme(repo, branch)
    for path, text in targets.items():
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        elif not path.exists() or path.read_text() != text:
            path.write_text(text)
            print("wrote", path.relative_to(ROOT))
    if stale:
        print(f"out of date: {', '.join(stale)}; run python notebooks/sync.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
