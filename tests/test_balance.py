"""Tests for mcp_rl/tasks/balance.py: no constant answer passes over the cap of a split.

    .venv/bin/python -m pytest tests/test_balance.py -q

Every grouping claim is checked against the real verifier: the constant answer
`answer_balance` reports must get full credit from `verify_answer` on exactly the
tasks it says it passes.
"""

from __future__ import annotations

import logging
import random

import pytest

from mcp_rl.tasks.balance import (AnswerCap, answer_balance, answer_cap, balance_answers, balance_priors, balance_report,
                            balance_splits)
from mcp_rl.tasks.scenarios import Scenario
from mcp_rl.rewards.verify import verify_answer

FULL = 0.999  # evaluate.SUCCESS: what counts as verified success


def passes(constant: str, answers) -> int:
    return sum(verify_answer(constant, a) >= FULL for a in answers if a is not None)


def tasks(answers, split="train"):
    return [Scenario(f"t{i}", f"task {i}", answer=a, split=split) for i, a in enumerate(answers)]


@pytest.mark.parametrize("answers, label, count", [
    ([1, 1.0, "1", 2], "1", 3),                                    # one value however it is typed
    ([149, 150, 151, 200], "about 150", 3),                        # within the verifier's 1% tolerance
    ([3, 300, 7], "about 300%", 2),                                # "300%" passes 300 and 3 (its fraction)
    (["12.5%", 0.125, 12.5, 13], "about 12.5%", 3),
    (["Engineering", ["Engineering"], "engineering!", "the Engineering"], "Engineering", 4),
    ([True, True, "yes", False], "yes", 3),
    (["2024-01-15", "2024-01-15T10:00:00", "2024-1-15", "2024-01-16"], "2024-01-15", 3),
    ([["Ann", "Bo"], ["Bo", "Ann"], ["ann", "bo!"], ["Ann"], "Bo"], "Ann, Bo", 3),
    ([None, None, 0, 0.0, 0.00001], "about 0", 3),                 # None has no group; 1e-5 is within abs_tol
    ([85000, 85800, 87000], "about 85000", 2),                     # 87000 is 1.4% from 85800: a group of its own
])
def test_answer_balance_groups_as_the_verifier_matches(answers, label, count):
    rows = answer_balance(tasks(answers), top=None)
    assert rows[0][:2] == (label, count)
    assert passes(label, answers) == count
    verified = sum(a is not None for a in answers)
    assert sum(c for _, c, _ in rows) == verified and rows[0][2] == pytest.approx(count / verified)


@pytest.mark.parametrize("n, share, cap", [
    (0, 0.02, 1), (10, 0.02, 1), (49, 0.02, 1), (50, 0.02, 1), (99, 0.02, 1), (100, 0.02, 2),
    (374, 0.02, 7), (10, 0.5, 5), (7, 1.0, 7),
])
def test_answer_cap_is_the_share_with_a_floor_of_one(n, share, cap):
    assert answer_cap(n, share) == cap


@pytest.mark.parametrize("share", [0, -0.1, 1.5])
def test_a_bad_share_is_refused(share):
    with pytest.raises(ValueError, match="fraction in"):
        answer_cap(10, share)
    with pytest.raises(ValueError, match="fraction in"):
        balance_answers(tasks([1]), share)


def random_split(rng: random.Random, split: str, n: int) -> list[Scenario]:
    pool = [0, 1, 1, 1, 2, 3, "Engineering", "Sales", 149, 150, 151, True, ["A", "B"]]
    answers = [rng.choice(pool) if rng.random() < 0.6 else rng.randrange(1000, 10**6) for _ in range(n)]
    answers += [None] * 5
    return [Scenario(f"{split}-{i}", "t", answer=a, split=split) for i, a in enumerate(answers)]


@pytest.mark.parametrize("seed, sizes, share", [
    (0, {"train": 300, "val": 40, "test": 80}, 0.02),
    (1, {"train": 120, "test": 30}, 0.05),
    (2, {"train": 20}, 0.02),
])
def test_balance_answers_caps_every_split_on_its_final_size(seed, sizes, share):
    rng = random.Random(seed)
    scenarios = [s for split, n in sizes.items() for s in random_split(rng, split, n)]
    kept = balance_answers(scenarios, share, seed=seed)
    for split in sizes:
        group = [s for s in kept if s.split == split]
        answers = [s.answer for s in group]
        cap = answer_cap(sum(a is not None for a in answers), share)
        assert all(count <= cap for _, count, _ in answer_balance(group, top=None))
        # The real verifier agrees: no constant drawn from the answers passes more than the cap.
        constants = {str(a) for a in answers if a is not None} | {"1", "about 150", "yes", "A, B", "100%"}
        assert max(passes(c, answers) for c in constants) <= cap
        assert sum(a is None for a in answers) == 5  # tasks without a verified answer are never dropped
    assert [s.id for s in kept] == [s.id for s in scenarios if s in kept]  # order kept


def test_balance_answers_is_deterministic_and_order_free():
    scenarios = random_split(random.Random(3), "train", 200)
    kept = {s.id for s in balance_answers(scenarios, 0.02, seed=0)}
    shuffled = scenarios[:]
    random.Random(4).shuffle(shuffled)
    assert {s.id for s in balance_answers(shuffled, 0.02, seed=0)} == kept
    assert {s.id for s in balance_answers(scenarios, 0.02, seed=1)} != kept  # the seed picks who stays


def test_balance_answers_logs_what_it_dropped(caplog):
    scenarios = tasks([1] * 4 + ["Sales"] * 3 + [7])
    with caplog.at_level(logging.INFO, logger="mcp_rl.tasks.balance"):
        kept = balance_answers(scenarios, 0.02)
    assert sorted(s.answer for s in kept if s.answer != "Sales") == [1, 7] and len(kept) == 3
    assert "dropped 5" in caplog.text and "'1' x3" in caplog.text and "'Sales' x2" in caplog.text


def test_answer_cap_admits_until_a_constant_reaches_the_cap():
    cap = AnswerCap({"train": 2, "test": 1})
    assert [cap.admit("train", a) for a in (1, 1.0, "1", 2, None, None)] == [True, True, False, True, True, True]
    assert [cap.admit("test", a) for a in (1, 150, 151, "x")] == [True, True, False, True]
    assert cap.refused == {"1": 1, "about 150": 1}


def test_balance_report_is_per_split():
    report = balance_report(tasks([1, 1, 2]) + tasks([5], split="test"))
    assert report == {"train": [("1", 2, 2 / 3), ("2", 1, 1 / 3)], "test": [("5", 1, 1.0)]}


def _memorised(scenarios, k=3):
    """Held-out tasks that one of their k nearest training tasks' answers passes (what balance_priors caps)."""
    from mcp_rl.rewards.verify import normalize
    train = [s for s in scenarios if s.split == "train"]
    out = []
    for s in scenarios:
        if s.split in ("val", "test") and s.answer is not None:
            w = set(normalize(s.task).split())
            near = sorted(train, key=lambda t: (-len(w & (v := set(normalize(t.task).split()))) / len(w | v), t.id))[:k]
            out += [s.id] if any(verify_answer(str(t.answer), s.answer, question=s.task) >= FULL for t in near) else []
    return out


def test_balance_priors_caps_held_out_tasks_a_memorised_answer_passes():
    depts = ["Sales", "Legal", "Finance", "Marketing", "Research", "Operations"]
    train = [Scenario(f"tr{i}", f"Name the department with the most {w}.", answer="Engineering", split="train")
             for i, w in enumerate(["employees", "managers", "remote staff"])]
    # Worded like the training tasks, with the same answer: a memorised "Engineering" passes each.
    copies = [Scenario(f"te{i}", f"Name the department with the most {w}.", answer="Engineering", split="test")
              for i, w in enumerate(["projects", "interns", "contractors"])]
    others = [Scenario(f"o{i}", f"Which office hosts team {i}?", answer=d, split="test") for i, d in enumerate(depts)]
    scenarios = train + copies + others + [Scenario("n", "Name the department with the most awards.", split="test")]
    kept = balance_priors(scenarios, 0.02)
    assert len(_memorised(scenarios)) == 3 and len(_memorised(kept)) == 1   # the cap: one task of the split
    assert {s.id for s in train + others} <= {s.id for s in kept} and "n" in {s.id for s in kept}  # train, None kept
    shuffled = scenarios[::-1]
    assert {s.id for s in balance_priors(shuffled, 0.02)} == {s.id for s in kept}  # order-free


def test_the_committed_tasks_pass_both_caps():
    from pathlib import Path
    from mcp_rl.tasks.scenarios import load_scenarios
    scenarios = load_scenarios(Path(__file__).resolve().parents[1] / "data" / "scenarios.jsonl")
    for split in ("val", "test"):
        held = [s for s in scenarios if s.split == split]
        assert len([i for i in _memorised(scenarios) if i in {s.id for s in held}]) <= answer_cap(len(held))
        assert answer_balance(held, top=1)[0][1] <= answer_cap(len(held))
    assert len(balance_splits(scenarios)) == len(scenarios)  # regenerated with both passes: nothing left to drop
