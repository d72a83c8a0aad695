"""Shared pytest fixtures. ``company_db``: the company database, built once per session."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so tests can `import mcp_server` (a top-level script, not a package)
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def company_db(tmp_path_factory) -> Path:
    """Path to a company database built by data/build_db.py. Shared: copy it before anything that may write."""
    spec = importlib.util.spec_from_file_location("company_build_db", ROOT / "data" / "build_db.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_db(tmp_path_factory.mktemp("company") / "company.db")
