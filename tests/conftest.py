"""Shared pytest fixtures. ``company_db``: the company database, built once per session;
``tiny_trainer``: a PortableTrainer factory over a random 2-layer Llama (for plumbing, not learning)."""

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


@pytest.fixture(scope="session")
def tiny_trainer():
    """`tiny_trainer(cfg, **trainer_kw)`: a PortableTrainer over a random 2-layer Llama with SmolLM2's
    tokenizer, the same weights each call (seed 0). Shaped like `parts.build_trainer`, so tests
    patch it in; it exercises the plumbing and learns nothing worth a claim."""
    from mcp_rl.local_policy import LocalPolicy
    from mcp_rl.models import load_local_tokenizer, tiny_llama
    from mcp_rl.train import PortableTrainer

    tok = load_local_tokenizer()

    def make(cfg=None, **trainer_kw):
        policy = LocalPolicy(tiny_llama(tok), tok, name="tiny")
        return PortableTrainer(policy, **{"learning_rate": 1e-3, "max_seq_len": 4096, **trainer_kw})

    return make
