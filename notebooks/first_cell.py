# Set-up: find mcp-rl, change into it, install what PRESET needs (notebooks/install_cell.py). Looked for in
# this folder or a parent; /content (an earlier run, or an uploaded zip of the repository: unpacked); a clone
# of REPO_URL when set; your Google Drive (mounted if need be: a folder mcp-rl* under MyDrive). Re-runs are safe.
import os
import runpy
import subprocess
import sys
import zipfile
from pathlib import Path

REPO_URL = ""  # the mcp-rl git repository (notebooks/sync.py fills it in from pyproject.toml)
REPO_BRANCH = "main"  # the branch this notebook came from (the same source)
HOME = Path("/content") if Path("/content").is_dir() else Path.cwd()  # Colab's working folder


def checkouts(*patterns: str) -> list[Path]:
    found = [p.parent.parent for pattern in patterns for p in sorted(Path("/").glob(pattern.lstrip("/")))]
    return [d for d in found if (d / "notebooks" / "install_cell.py").is_file()]


def find_checkout() -> Path | None:
    found = [d for d in (Path.cwd(), *Path.cwd().parents) if (d / "notebooks" / "install_cell.py").is_file()]
    for z in [] if found else sorted(HOME.glob("*.zip")):  # an uploaded zip: unpacked once, beside it
        if not (HOME / z.stem).exists() and any(n.endswith("mcp_rl/__init__.py") for n in zipfile.ZipFile(z).namelist()):
            zipfile.ZipFile(z).extractall(HOME / z.stem)
    found = found or checkouts(f"{HOME}/*/mcp_rl/__init__.py", f"{HOME}/*/*/mcp_rl/__init__.py")
    if not found and REPO_URL.strip():
        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", REPO_BRANCH, REPO_URL, str(HOME / "mcp-rl")],
                       check=True)
        found = checkouts(f"{HOME}/mcp-rl/mcp_rl/__init__.py")
    if not found and any(k.startswith("COLAB_") for k in os.environ):
        from google.colab import drive
        drive.mount(f"{HOME}/drive")
        found = checkouts(*(f"{HOME}/drive/MyDrive/{'*/' * k}mcp-rl*/mcp_rl/__init__.py" for k in range(3)))
    return found[0] if found else None


if (root := find_checkout()) is None:
    raise RuntimeError("no mcp-rl checkout here, and REPO_URL is empty. Any one of these, then run this cell again: "
                       "(1) upload the repository's zip into /content (the folder icon on the left); (2) put the "
                       "repository folder on your Google Drive (MyDrive/mcp-rl); (3) set REPO_URL at the top of this "
                       "cell to its git URL; (4) outside Colab, start Jupyter inside a checkout")
os.chdir(root)
if str(root) not in sys.path:
    sys.path.insert(0, str(root))
print("checkout:", root)
runpy.run_path(str(root / "notebooks" / "install_cell.py"))["install"](PRESET)  # noqa: F821 - PRESET: the first cell
