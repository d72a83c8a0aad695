"""A run folder's record: reading state.json and config.json, refusing one that is gone or unreadable,
and comparing the recorded settings with a resume's (mcp_rl/runs/run.py owns the folder and uses these).

    state = RunState.read(run_dir)         # step, phase, history, evals, train_ids; a new run's if absent
    check_record(run_dir)                  # RunFolderError when the run's files outlived its record
    changes(read_record(run_dir / "config.json"), redacted(cfg))   # ["train.seed: 0 -> 3", ...]

Every refusal is a `RunFolderError` (a ValueError): one line naming the file and what to do, which
the CLI prints as it is. A folder is never taken for a new run while it holds checkpoints,
evaluations or metrics, and a state.json is never resumed without the config.json it was recorded with.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RunFolderError", "RunState", "RESUMABLE_CHANGES", "PHASES", "read_record", "check_record", "changes",
           "legacy_custom"]


# What may change when a run resumes: its length, the periodic evaluation's cadence, where servers,
# workers and the judge live, and memory or speed knobs that leave the update's math as it was.
# Any other field shapes what is learned or measured, and a change to it is refused.
RESUMABLE_CHANGES = {
    "out", "server", "server_token", "rollout_workers", "worker_token", "policy_port", "policy_batch",
    "policy_batch_wait_s", "policy_batch_gap_s", "train.deadline_s", "train.train_budget_s", "train.pause_at_deadline",
    "rollout.call_timeout", "rollout.timeout", "rollout.concurrency",
    "reward.judge_base_url", "reward.judge_api_key", "reward.judge_retries", "reward.judge_backoff_s",
    "reward.judge_timeout_s",
    "train.steps", "train.eval_every", "train.eval_every_split", "train.eval_every_scenarios",
    "train.micro_batch_size", "train.micro_batch_tokens", "train.logprob_chunk_size", "train.gradient_checkpointing",
    "train.precision",
}


def said(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:60] + "…"


def legacy_custom(recorded: dict, new: dict) -> None:
    """config.json written before custom rewards were recorded by name: each entry was [name, "<function
    QUALNAME at 0x...>", weight], whose address changes every process. An entry whose name, weight and
    function name match the new config's counts as that entry."""
    old, now = (recorded.get("reward") or {}).get("custom"), (new.get("reward") or {}).get("custom")
    if not isinstance(old, list) or not isinstance(now, list) or len(old) != len(now):
        return
    for i, (a, b) in enumerate(zip(old, now)):
        m = isinstance(a, list) and len(a) == 3 and re.fullmatch(r"<function (\S+) at 0x[0-9a-fA-F]+>", str(a[1]))
        if m and a[0] == b["name"] and a[2] == b["weight"] and b["fn"].endswith("." + m.group(1)):
            old[i] = b


def changes(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Each recorded field a resume may not change (RESUMABLE_CHANGES may), as 'name: old -> new'."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b, name = old.get(k), new.get(k), prefix + k
        if isinstance(a, dict) and isinstance(b, dict):
            out += changes(a, b, name + ".")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and name not in RESUMABLE_CHANGES:
            out += changes(dict(zip(map(str, range(len(a))), a)), dict(zip(map(str, range(len(b))), b)), name + ".")
        elif a != b and name not in RESUMABLE_CHANGES and k in old and k in new:  # a field added or
            out.append(f"{name}: {said(a)} -> {said(b)}")                          # dropped since: no record
    return out


class RunFolderError(ValueError):
    """A run folder whose record is missing or unreadable; the message is one line naming the file."""


FRESH = "or start a new run (open_run(cfg, fresh=True), FRESH_RUN = True in the notebooks, or another --out)"
PHASES = ("new", "base_done", "training", "done")


def read_record(path: Path) -> dict:
    """state.json or config.json as a dict, or RunFolderError saying what is wrong with it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise RunFolderError(f"{path} cannot be read ({type(e).__name__}): restore it from a backup, {FRESH}") from None
    if not text.strip():
        raise RunFolderError(f"{path} is empty (a crash while it was written, or a copy cut short): restore it from a "
                             f"backup, {FRESH}")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise RunFolderError(f"{path} is not valid JSON ({getattr(e, 'msg', e)} at line {getattr(e, 'lineno', '?')}: "
                             f"cut short?): restore it from a backup, {FRESH}") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path} holds a JSON {type(data).__name__}, not the object a run records: restore it "
                             f"from a backup, {FRESH}")
    return data


@dataclass
class RunState:
    """What state.json records: how far the run got. `history` holds the warm start's record and one per GRPO
    step (metrics.jsonl is a copy); `evals` the step each phase evaluation was made at; `train_ids` the
    training scenarios the run started with, in order (the step batches are drawn from that order)."""

    step: int = 0
    phase: str = "new"  # new -> base_done -> training -> done
    history: list = field(default_factory=list)
    evals: dict = field(default_factory=dict)
    train_ids: list | None = None

    @classmethod
    def read(cls, run_dir: Path) -> "RunState":
        """The folder's state.json (a new run's state if there is none), or RunFolderError naming what is wrong."""
        path = Path(run_dir) / "state.json"
        if not path.exists():
            return cls()
        state = read_record(path)
        state.setdefault("evals", {})
        step = state.get("step")
        wrong = ("phase" if state.get("phase") not in PHASES else
                 "step" if isinstance(step, bool) or not isinstance(step, int) or step < 0 else
                 "history" if not isinstance(state.get("history"), list) else
                 "evals" if not isinstance(state["evals"], dict) else None)
        if wrong:
            raise RunFolderError(f"{path} is not a run's state: its {wrong!r} is {said(state.get(wrong))} (a run "
                                 f"records phase one of {', '.join(PHASES)}, a step >= 0, a history list): restore "
                                 f"it from a backup, {FRESH}")
        known = {f.name for f in dataclasses.fields(cls)}  # older keys (pending_eval) are left behind
        return cls(**{k: v for k, v in state.items() if k in known})

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        if data["train_ids"] is None:
            del data["train_ids"]
        return data


def check_record(out: Path) -> None:
    """Refuse a folder a run has written to whose record is gone: resuming would start it over its files."""
    if (out / "state.json").exists():
        if not (out / "config.json").exists():
            raise RunFolderError(f"{out / 'state.json'} has no config.json beside it, so the settings the run was "
                                 f"recorded with are unknown and a resume could mix two runs: restore config.json, "
                                 f"{FRESH}")
        return
    written = sorted(p.name for p in (out / "checkpoints").glob("step-*")) + sorted(
        p.name for p in out.glob("eval_*.jsonl")) + [p.name for p in out.glob("metrics.jsonl")]
    if written:
        raise RunFolderError(f"{out} holds {', '.join(written[:3])}{' ...' if len(written) > 3 else ''} but no "
                             "state.json, the record of how far the run got: resuming would start it again over "
                             f"them; restore state.json, {FRESH}")
