"""Scenarios: the tasks an agent is trained and evaluated on, stored as JSONL.

    scenarios = load_scenarios("data/scenarios.jsonl", split="train")
    save_scenarios("mine.jsonl", split_scenarios(scenarios))     # each scenario's split from its id

A `Scenario` is one task (and, where it can be checked, its answer and the reference that computed
it). Writing them is mcp_rl/tasks/generate.py's job (grounded questions over a SQL server's live schema,
mcp_rl/tasks/grounded.py; or tasks an LLM writes from the server's tools).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")


@dataclass
class Scenario:
    id: str
    task: str
    difficulty: int = 3          # 1..5
    answer: str | int | float | list | None = None   # verified ground truth, None if unknown
    reference: str | None = None  # e.g. the SQL that produced `answer`
    tags: list[str] = field(default_factory=list)
    split: str | None = None      # "train" | "val" | "test"
    # structured extras an environment reads: "actions" (gold tool calls [{"tool", "arguments"}], which
    # demonstrations replay), "task_id", "reward_basis", ...; JSON values only, left out of the file when empty
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"scenario id must be a non-empty string, got {self.id!r}")
        if not isinstance(self.task, str) or not self.task.strip():
            raise ValueError(f"scenario {self.id}: task must be a non-empty string")
        if isinstance(self.difficulty, bool) or not isinstance(self.difficulty, int) or not 1 <= self.difficulty <= 5:
            raise ValueError(f"scenario {self.id}: difficulty must be an integer 1..5, got {self.difficulty!r}")
        if self.split is not None and self.split not in SPLITS:
            raise ValueError(f"scenario {self.id}: split must be one of {SPLITS} or None, got {self.split!r}")
        if not isinstance(self.tags, list) or not all(isinstance(t, str) for t in self.tags):
            raise ValueError(f"scenario {self.id}: tags must be a list of strings, got {self.tags!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"scenario {self.id}: extra must be a JSON object, got {type(self.extra).__name__}")


def normalize_task(task: str) -> str:
    """The text two tasks are compared by: case, punctuation and spacing ignored."""
    return re.sub(r"[^a-z0-9]+", " ", task.lower()).strip()


def task_id(prefix: str, task: str) -> str:
    """A stable id from the task text, so regenerating gives the same ids (and splits)."""
    return f"{prefix}-{hashlib.sha1(normalize_task(task).encode()).hexdigest()[:10]}"


# --- JSONL ------------------------------------------------------------------

def _record(s: Scenario) -> dict:
    d = dataclasses.asdict(s)
    if not d["extra"]:
        del d["extra"]
    return d


def _lines(scenarios: Iterable[Scenario]) -> str:
    return "".join(json.dumps(_record(s), ensure_ascii=False) + "\n" for s in scenarios)


def save_scenarios(path: str | os.PathLike, scenarios: Iterable[Scenario]) -> None:
    """Write all scenarios; atomic (temp file + os.replace), so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_lines(scenarios))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def append_scenarios(path: str | os.PathLike, scenarios: Iterable[Scenario]) -> None:
    """Append scenarios and fsync: generation saves each batch as it comes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = _lines(scenarios)
    with open(path, "a+", encoding="utf-8") as f:
        # A file cut off mid-line by an earlier crash would glue the next record onto it.
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(f.tell() - 1)
            if f.read(1) != "\n":
                text = "\n" + text
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def load_scenarios(path: str | os.PathLike, split: str | None = None) -> list[Scenario]:
    """Read a JSONL file; a bad line raises ValueError naming the file and line number."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no scenario file at {path}; generate one with `python -m mcp_rl scenarios`")
    names = {f.name for f in dataclasses.fields(Scenario)}
    out: list[Scenario] = []
    seen: dict[str, int] = {}
    # Split on "\n" only: str.splitlines() also breaks at U+2028, U+2029 and U+0085, which
    # json.dumps(ensure_ascii=False) leaves unescaped inside a task's text.
    for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        missing = {"id", "task"} - record.keys()
        unknown = record.keys() - names
        if missing or unknown:
            raise ValueError(f"{where}: missing fields {sorted(missing)}, unknown fields {sorted(unknown)}; "
                             f"a scenario has fields {sorted(names)}")
        try:
            scenario = Scenario(**record)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        if scenario.id in seen:
            raise ValueError(f"{where}: duplicate id {scenario.id!r} (first on line {seen[scenario.id]})")
        seen[scenario.id] = lineno
        if split is None or scenario.split == split:
            out.append(scenario)
    return out


VAL_SHARE, TEST_SHARE = 0.1, 0.2  # the committed file's split shares


def split_of(scenario_id: str, seed: int = 0, val: float = VAL_SHARE, test: float = TEST_SHARE) -> str:
    """The split a scenario with this id gets from `split_scenarios` (a hash of id and seed)."""
    digest = hashlib.sha256(f"{seed}:{scenario_id}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    return "test" if u < test else "val" if u < test + val else "train"


def split_scenarios(scenarios: list[Scenario], seed: int = 0, val: float = VAL_SHARE,
                    test: float = TEST_SHARE) -> list[Scenario]:
    """Set `.split` on each scenario (in place; also returned) from a hash of its id and the seed.

    Each scenario's split depends only on (id, seed), never on the others, so
    adding scenarios later does not move old ones between train and test.
    """
    if not (0 <= val and 0 <= test and val + test <= 1):
        raise ValueError(f"val and test are fractions with val + test <= 1, got val={val}, test={test}")
    for s in scenarios:
        s.split = split_of(s.id, seed, val, test)
    return scenarios


# --- LLM generation ---------------------------------------------------------
