"""Answer balance: no constant answer may earn more than a small share of a split.

    for value, count, share in answer_balance(load_scenarios("data/scenarios.jsonl", split="test")):
        print(f"{value!r} scores on {count} tasks ({share:.1%})")
    kept = balance_answers(scenarios, max_share=0.02, seed=0)   # per split, deterministic

A policy that looks nothing up and answers `1` to every task earns verified success on every
task whose answer is 1 (and on every 1.0); 0-3 are common counts, a few department names are
common lookups. So the generators cap how many tasks of a split any one constant answer can
pass: at most max(1, floor(max_share * n)) of a split's n verified tasks. The floor of one task
per value is what keeps tiny sets (tests, a 49-task split) generable at all: under 1 / max_share
tasks (50 at 2%) one task is already over the share, and every value still appears once.

Values are grouped the way `verify_answer` matches a constant answer to them:
- numbers (and strings that are one: "1,234", "12.5%") by value within the verifier's relative
  tolerance: "about 150" passes 149, 150 and 151, "about 50%" passes 50 and 0.5; a group is the
  set of tasks one constant passes, so two numbers 1.5% apart can share one;
- text by `verify.normalize`; a text is also grouped with an expected text it contains as whole words
  ("Platform Engineering" with "Engineering"): conservative, as the verifier pays that only when the
  other words restate the question;
- booleans as the words yes / no, ISO dates by date, a one-item list as its item, a longer list as its
  sorted items (exactly; the F1 of a partial list is below full credit, so no success);
- None (no verified answer: RULER scores it) belongs to no group and is never dropped.
A constant that names two values at once ("Engineering 1") is the verifier's to refuse.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable

from mcp_rl.rewards.verify import normalize, verify_answer

log = logging.getLogger(__name__)

MAX_ANSWER_SHARE = 0.02  # the default cap: the share of a split one constant answer may pass
REL_TOL = 1e-2           # verify_answer's default relative tolerance (RewardConfig.rel_tol)
ABS_TOL = 1e-4           # and its absolute one

_NUMBER = re.compile(r"[-+]?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|[-+]?\$?\.\d+%?")
_ISO_DATE = re.compile(r"(\d{4})-(\d{1,2})-(\d{1,2})(?:[T ]\d{1,2}:\d{2}\S*)?")  # time of day ignored, as verify does


@dataclass(frozen=True)
class _Value:
    kind: str                 # "num" | "text" | "key"
    key: Any                  # num: tuple of accepted values; text: tuple of words; key: hashable
    label: str                # a constant answer that passes it


def _parse(answer) -> _Value | None:
    """How a constant answer would have to look to pass this expected answer."""
    if answer is None:
        return None
    if isinstance(answer, bool):  # verify_answer reads the first word: "yes" passes True and the text "yes"
        return _Value("text", ("yes",) if answer else ("no",), "yes" if answer else "no")
    if isinstance(answer, (int, float)):
        return _Value("num", (float(answer),), _fmt(float(answer))) if math.isfinite(answer) else None
    if isinstance(answer, (list, tuple, set, frozenset)):
        items = [_parse(x) for x in answer]
        if len(items) == 1 and items[0] is not None:
            return items[0]
        keys = sorted(repr((v.kind, v.key)) if v else repr(None) for v in items)
        return _Value("key", ("list", tuple(keys)), ", ".join(sorted(str(x) for x in answer)))
    s = str(answer).strip()
    if _NUMBER.fullmatch(s):
        value = float(re.sub(r"[+$%,]", "", s))
        # "12.5%" expected passes 12.5 and 0.125 alike (verify_answer's percent rule).
        return _Value("num", (value, value / 100) if s.endswith("%") else (value,), s)
    if m := _ISO_DATE.fullmatch(s):
        return _Value("key", ("date", *map(int, m.groups())), s[:m.end(3)])
    words = tuple(normalize(s).split())
    return _Value("text", words, s) if words else _Value("key", ("raw", s.lower()), s)


def _fmt(x: float) -> str:
    return str(int(x)) if x.is_integer() and abs(x) < 1e15 else repr(x)


def _tol(e: float, rel_tol: float) -> float:
    return max(rel_tol * abs(e), ABS_TOL)


def _intervals(v: _Value, rel_tol: float) -> list[tuple[float, float]]:
    """The constants c for which "about c%" passes v: c or c/100 within tolerance of an accepted value."""
    out = []
    for e in v.key:
        t = _tol(e, rel_tol)
        out += [(e - t, e + t), (100 * (e - t), 100 * (e + t))]
    out.sort()
    merged = [list(out[0])]
    for lo, hi in out[1:]:  # one task counts once however many of its intervals hold c
        if lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [tuple(m) for m in merged]


def _nice(lo: float, hi: float) -> float:
    """The number in [lo, hi] with the fewest decimals (what a constant answer would write)."""
    for d in range(16):
        c = math.ceil(lo * 10 ** d) / 10 ** d
        if lo <= c <= hi:
            return c
    return (lo + hi) / 2


def _best_number(items: list[tuple[int, _Value]], rel_tol: float) -> tuple[str, list[int]]:
    """A sweep over the constants' number line: the point inside the most tasks' intervals."""
    events = []
    for i, v in items:
        for lo, hi in _intervals(v, rel_tol):
            events += [(lo, 0, i, hi), (hi, 1, i, hi)]
    events.sort(key=lambda e: (e[0], e[1]))  # closed intervals: openings before closings at one point
    live: dict[int, float] = {}
    best: tuple[int, float, float, list[int]] = (0, 0.0, 0.0, [])
    for x, kind, i, hi in events:
        if kind == 1:
            live.pop(i, None)
            continue
        live[i] = hi
        if len(live) > best[0]:
            best = (len(live), x, min(live.values()), sorted(live))
    if not best[0]:
        return "", []
    lo, hi, covered = best[1:]
    values = [v for i, v in items if i in set(covered)]
    inside = sorted(e for v in values for e in v.key if lo <= e <= hi)  # a task's own value reads best
    c = inside[(len(inside) - 1) // 2] if inside else _nice(lo, hi)
    if all(v.key == (c,) for v in values):
        return _fmt(c), covered
    plain = all(any(abs(c - e) <= _tol(e, rel_tol) for e in v.key) for v in values)
    return f"about {_fmt(c)}" + ("" if plain else "%"), covered


def _contains(outer: tuple, inner: tuple) -> bool:
    n = len(inner)
    return any(outer[k:k + n] == inner for k in range(len(outer) - n + 1))


def _best_text(items: list[tuple[int, _Value]]) -> tuple[str, list[int]]:
    """The expected text that, given as the answer, passes the most tasks (itself and texts it contains)."""
    by_words: dict[tuple, list[int]] = defaultdict(list)
    label: dict[tuple, str] = {}
    for i, v in items:
        by_words[v.key].append(i)
        label.setdefault(v.key, v.label)
    by_first: dict[str, list[tuple]] = defaultdict(list)
    for words in by_words:
        by_first[words[0]].append(words)
    best: tuple[int, str, list[int]] = (0, "", [])
    for outer in by_words:
        inners = {w for first in set(outer) for w in by_first[first] if _contains(outer, w)}
        covered = sorted(i for w in inners for i in by_words[w])
        if (len(covered), label[outer]) > best[:2]:
            best = (len(covered), label[outer], covered)
    return best[1], best[2]


def _best(items: list[tuple[int, _Value]], rel_tol: float) -> tuple[str, list[int]]:
    """The constant answer that passes the most of `items`, and the indices it passes."""
    keys: dict[Any, list[int]] = defaultdict(list)
    labels: dict[Any, str] = {}
    for i, v in items:
        if v.kind == "key":
            keys[v.key].append(i)
            labels.setdefault(v.key, v.label)
    candidates = [(labels[k], idx) for k, idx in keys.items()]
    candidates.append(_best_number([(i, v) for i, v in items if v.kind == "num"], rel_tol))
    candidates.append(_best_text([(i, v) for i, v in items if v.kind == "text"]))
    return max(candidates, key=lambda c: (len(c[1]), c[0]))


def answer_balance(scenarios: Iterable, top: int | None = 5, rel_tol: float = REL_TOL) -> list[tuple[str, int, float]]:
    """The constant answers that pass the most of these scenarios: [(answer, count, share)], best first.

    Pass one split. The first row is the best any constant answer can do; each later row is the best
    among the tasks the rows before it did not pass (`top=None`: until every task is passed). `share` is
    of the scenarios with a verified answer; `answer` is a string `verify_answer` gives full credit on
    `count` of them ("about 150" where a group spans several values).

    >>> from mcp_rl.tasks.scenarios import Scenario
    >>> answer_balance([Scenario("a", "t", answer=1), Scenario("b", "t", answer=1.0),
    ...                 Scenario("c", "t", answer="Sales"), Scenario("d", "t", answer=150)])
    [('1', 2, 0.5), ('Sales', 1, 0.25), ('150', 1, 0.25)]
    """
    items = [(i, v) for i, s in enumerate(scenarios) if (v := _parse(s.answer)) is not None]
    n, rows = len(items), []
    while items and (top is None or len(rows) < top):
        label, covered = _best(items, rel_tol)
        rows.append((label, len(covered), len(covered) / n))
        gone = set(covered)
        items = [(i, v) for i, v in items if i not in gone]
    return rows


def balance_report(scenarios: Iterable, top: int | None = 5, rel_tol: float = REL_TOL) -> dict:
    """`answer_balance` of each split: {split: [(answer, count, share)]} (None: scenarios without one)."""
    groups: dict[Any, list] = defaultdict(list)
    for s in scenarios:
        groups[s.split].append(s)
    return {split: answer_balance(group, top, rel_tol) for split, group in groups.items()}


def answer_cap(n: int, max_share: float = MAX_ANSWER_SHARE) -> int:
    """How many of a split's n verified tasks one constant answer may pass: floor(max_share * n), at least 1."""
    if not 0 < max_share <= 1:
        raise ValueError(f"max_share (max_answer_share) is a fraction in (0, 1], got {max_share}; 0.02 is the default")
    return max(1, math.floor(max_share * n + 1e-9))


def _rank(seed: int, scenario_id: str) -> bytes:
    return hashlib.sha256(f"balance:{seed}:{scenario_id}".encode()).digest()


def balance_answers(scenarios: list, max_share: float = MAX_ANSWER_SHARE, seed: int = 0,
                    rel_tol: float = REL_TOL) -> list:
    """The scenarios, minus those that let one constant answer pass over `answer_cap` of their split.

    Each split (scenarios without one form one group) is balanced on its own, on its final size:
    the most-passed constant keeps the tasks ranked first by a hash of (seed, id), the rest are
    dropped, and this repeats until no constant passes more than the cap. The result depends only
    on the scenarios' ids, answers and splits, not on their order; kept scenarios keep their order.
    Logs how many were dropped per value.
    """
    answer_cap(1, max_share)  # checks max_share
    groups: dict[Any, list[int]] = defaultdict(list)
    for i, s in enumerate(scenarios):
        groups[s.split].append(i)
    dropped: set[int] = set()
    for split, idx in groups.items():
        order = sorted(idx, key=lambda i: _rank(seed, scenarios[i].id))  # who stays: by id hash, not file order
        rank = {i: r for r, i in enumerate(order)}
        items = [(i, v) for i in order if (v := _parse(scenarios[i].answer)) is not None]
        counts: Counter = Counter()
        while True:
            cap = answer_cap(len(items), max_share)
            label, covered = _best(items, rel_tol)
            if len(covered) <= cap:
                break
            keep = sorted(covered, key=rank.__getitem__)[:cap]
            gone = set(covered) - set(keep)
            counts[label] += len(gone)
            dropped |= gone
            items = [(i, v) for i, v in items if i not in gone]
        if counts:
            log.info("split %s: dropped %d scenarios so no constant answer passes over %d of %d (%.0f%%): %s",
                     split, sum(counts.values()), answer_cap(len(items), max_share), len(items), 100 * max_share,
                     ", ".join(f"{k!r} x{c}" for k, c in counts.most_common()))
    return [s for i, s in enumerate(scenarios) if i not in dropped]


class AnswerCap:
    """Admits answers one at a time while no constant answer passes over its split's cap (generation).

    `caps` maps a split to the most tasks one constant may pass there (`answer_cap` of the split's
    expected size). `refused` counts the refusals per constant answer, for the log.
    """

    def __init__(self, caps: dict, rel_tol: float = REL_TOL):
        self.caps, self.rel_tol = caps, rel_tol
        self.items: dict[Any, list[tuple[int, _Value]]] = defaultdict(list)
        self.refused: Counter = Counter()

    def admit(self, split, answer) -> bool:
        """Whether a task of `split` with this answer keeps every constant within the cap (and count it if so)."""
        v = _parse(answer)
        if v is None:
            return True
        items = self.items[split] + [(len(self.items[split]), v)]
        # Every constant was within the cap before, so only one passing the new task can exceed it.
        label, covered = _best(items, self.rel_tol)
        if len(covered) > self.caps[split]:
            self.refused[label] += 1
            return False
        self.items[split] = items
        return True


def _said(answer) -> str:
    return ", ".join(map(str, answer)) if isinstance(answer, (list, tuple)) else str(answer)


def balance_priors(scenarios: list, max_share: float = MAX_ANSWER_SHARE, seed: int = 0, k: int = 3) -> list:
    """The scenarios, minus held-out ones that a policy which memorised the training answers would pass.

    Such a policy answers a held-out task with the answer of a training task worded like it
    (Name the department with the most *employees* -> Engineering; ... most *projects*? Engineering
    again): synthetic data has priors, and a lookup that merely lists candidates can ground the
    guess. So in each split other than train, at most `answer_cap` of the tasks may be passed by the
    answer of one of their `k` nearest training tasks (word Jaccard over `normalize`d text, ties by
    id); the rest are dropped, ranked as `balance_answers` ranks. Measured on the committed tasks
    before this pass: 3 of 82 test tasks passed by the nearest one, 6 by one of the 3 nearest.
    """
    answer_cap(1, max_share)  # checks max_share
    train = [(set(normalize(s.task).split()), s) for s in scenarios if s.split == "train" and s.answer is not None]
    by_split: dict[Any, list[int]] = defaultdict(list)
    for i, s in enumerate(scenarios):
        if s.split not in (None, "train") and s.answer is not None:
            by_split[s.split].append(i)
    dropped: set[int] = set()
    for split, idx in by_split.items():
        hits = []
        for i in idx:
            s = scenarios[i]
            words = set(normalize(s.task).split())
            near = sorted(train, key=lambda t: (-len(words & t[0]) / max(1, len(words | t[0])), t[1].id))[:k]
            if any(verify_answer(_said(t.answer), s.answer, question=s.task) >= 0.999 for _, t in near):
                hits.append(i)
        cap = answer_cap(len(idx), max_share)
        gone = sorted(hits, key=lambda i: _rank(seed, scenarios[i].id))[cap:]
        if gone:
            log.info("split %s: dropped %d of %d tasks that a nearest training task's answer passes (cap %d): %s",
                     split, len(gone), len(idx), cap, ", ".join(scenarios[i].id for i in gone))
        dropped |= set(gone)
    return [s for i, s in enumerate(scenarios) if i not in dropped]


def balance_splits(scenarios: list, max_share: float = MAX_ANSWER_SHARE, seed: int = 0) -> list:
    """Both passes on split scenarios: constant answers, then memorised answers, then constants again
    (the held-out splits shrank, and their caps with them)."""
    scenarios = balance_priors(balance_answers(scenarios, max_share, seed), max_share, seed)
    return balance_answers(scenarios, max_share, seed)
