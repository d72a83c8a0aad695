"""Shared pytest fixtures and the session-end process check. ``company_db``: the company database,
built once per session; ``tiny_trainer``: a PortableTrainer factory over a random 2-layer Llama (for
plumbing, not learning).

Every process a test starts inherits ``MCP_RL_TEST_SESSION`` (set when the session starts). When the
session ends, a process still alive with this session's mark fails the run (exit status 1) and is
stopped: a server (mcp_server.py, a rollout worker, uvicorn, a notebook kernel) still running, or
any marked process that has lost its parent (an orphan). Linux only (it reads /proc).

No test reaches the network beyond loopback (tests/netguard/sitecustomize.py, in this process and in
every Python process a test starts): a test that tries errors at that call, fails in its teardown, and
the session fails too.
"""

import importlib.util
import os
import re
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # so tests can `import mcp_server` (a top-level script, not a package)
    sys.path.insert(0, str(ROOT))

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two workers on two cores: one math thread each, in what they start too, so torch's
    # OpenMP threads do not spin against the other worker's (two SmolLM2 test files alone: 12% less CPU, 5% more wall).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

MARK = "MCP_RL_TEST_SESSION"
SERVERISH = re.compile(r"mcp_server|mcp_rl|--transport|uvicorn|ipykernel")


NETGUARD = Path(__file__).resolve().parent / "netguard"


def pytest_sessionstart(session):
    os.environ[MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    # The network guard: this process, and (through PYTHONPATH's sitecustomize) every Python it starts.
    log = Path(tempfile.mkstemp(prefix="mcp-rl-net-", suffix=".log")[1])
    os.environ["MCP_RL_NET_LOG"] = str(log)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NETGUARD), os.environ.get("PYTHONPATH")]))
    spec = importlib.util.spec_from_file_location("mcp_rl_netguard", NETGUARD / "sitecustomize.py")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    guard.install()


# `make test` (pytest-xdist, --dist worksteal) gives each of its two workers one half of the collected tests, in
# order, and lets an idle one take from the other's tail. The longest tests go at the head of each half, so none
# starts late and ends the run alone: the notebooks (tutorial ~320 s, notebook 02 ~90 s) head the first half, the
# torchrun runs (~190, ~140, ~120 s) the second; each group slow tests first. Measured: bench/HISTORY.md section 32.
FIRST_HALF, SECOND_HALF = ("test_notebooks.py",), ("test_learning_proof.py", "test_distributed.py")


def pytest_collection_modifyitems(config, items):
    def group(names):
        return sorted((i for i in items if i.path.name in names), key=lambda i: i.get_closest_marker("slow") is None)

    first, second = group(FIRST_HALF), group(SECOND_HALF)
    rest = [i for i in items if i.path.name not in FIRST_HALF + SECOND_HALF]
    cut = max(0, len(items) // 2 - len(first))
    items[:] = first + rest[:cut] + second + rest[cut:]


def _net_log() -> str:
    path = os.environ.get("MCP_RL_NET_LOG")
    return Path(path).read_text() if path and Path(path).is_file() else ""


@pytest.fixture(autouse=True)
def no_network_beyond_loopback():
    """Fails the test (in its teardown) that reached beyond loopback, even where a library swallowed the error."""
    before = len(_net_log())
    yield
    if reached := _net_log()[before:]:
        pytest.fail(f"this test reached for the network beyond loopback (tests/netguard):\n{reached[:2000]}",
                    pytrace=False)


def _proc(pid: int) -> tuple[int, str, bytes, str] | None:
    """(parent pid, state, environment, command line) of a live process; None if gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        env = Path(f"/proc/{pid}/environ").read_bytes()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except (OSError, ValueError):
        return None
    return int(fields[1]), fields[0], env, cmd


def leaked_processes(mark: str) -> dict[int, str]:
    """Live processes carrying `mark` that are servers, or orphans (not descendants of this process)."""
    if not Path("/proc").is_dir():
        return {}
    needle = f"\0{MARK}={mark}\0".encode()
    procs = {int(p.name): _proc(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    procs = {pid: info for pid, info in procs.items() if info is not None}

    def descends(pid: int) -> bool:
        seen = set()
        while pid in procs and pid not in seen:
            seen.add(pid)
            pid = procs[pid][0]
            if pid == os.getpid():
                return True
        return False

    return {pid: cmd for pid, (_, state, env, cmd) in procs.items()
            if pid != os.getpid() and state != "Z" and needle in b"\0" + env + b"\0"
            and (SERVERISH.search(cmd) or not descends(pid))}


def pytest_sessionfinish(session, exitstatus):
    problems = session.config.stash.get(WORKER_PROBLEMS, [])  # what xdist's workers found (pytest_testnodedown)
    if reached := _net_log():
        problems.append(f"the tests reached for the network beyond loopback:\n{reached[:4000]}")
    mark = os.environ.get(MARK)
    deadline = time.monotonic() + 10  # a server told to stop may still be on its way out
    while mark and (left := leaked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if mark and left:
        lines = "\n".join(f"  pid {pid}: {cmd[:160]}" for pid, cmd in left.items())
        problems.append(f"tests left {len(left)} process(es) running (now killed); stop what a test starts in its "
                        f"fixture's teardown:\n{lines}")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if os.environ.get("MCP_RL_NET_LOG"):  # this session's own log, read above: not left in the temp folder
        Path(os.environ["MCP_RL_NET_LOG"]).unlink(missing_ok=True)
    if not problems:
        return
    sys.stderr.write("".join(f"\nERROR: {p}\n" for p in problems))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its exit status does not reach the controller
        session.config.workeroutput["mcp_rl_problems"] = problems


WORKER_PROBLEMS = pytest.StashKey[list]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """Under pytest-xdist (make test), the controller fails the run on what a worker's session end found."""
    if found := getattr(node, "workeroutput", {}).get("mcp_rl_problems"):
        node.config.stash.setdefault(WORKER_PROBLEMS, []).extend(found)


@pytest.fixture(scope="session")
def company_db(tmp_path_factory) -> Path:
    """Path to a company database built by the company environment's build_db.py. Shared: copy it before anything that may write."""
    from mcp_rl.environments.company import build_db as module
    return module.build_db(tmp_path_factory.mktemp("company") / "company.db")


@pytest.fixture(scope="session")
def tiny_trainer():
    """`tiny_trainer(cfg, **trainer_kw)`: a PortableTrainer over a random 2-layer Llama with SmolLM2's
    tokenizer, the same weights each call (seed 0). Shaped like `parts.build_trainer`, so tests
    patch it in; it exercises the plumbing and learns nothing worth a claim."""
    from mcp_rl.policies.local_policy import LocalPolicy
    from mcp_rl.policies.models import load_local_tokenizer, tiny_llama
    from mcp_rl.training.portable import PortableTrainer

    tok = load_local_tokenizer()

    def make(cfg=None, **trainer_kw):
        policy = LocalPolicy(tiny_llama(tok), tok, name="tiny")
        return PortableTrainer(policy, **{"learning_rate": 1e-3, "max_seq_len": 4096, **trainer_kw})

    return make
