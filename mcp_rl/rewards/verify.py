"""Answer verification: score an agent's free-text final answer against a verified ground truth.

    verify_answer("There are 42 employees.", 42)        # 1.0
    verify_answer("Sales, Bob", ["Alice", "Bob"])        # 0.5 (order-insensitive F1)

Numbers (formatting, scale words, percents, tolerance), dates, yes/no, strings (normalized)
and lists are read by the rules in `verify_answer`'s docstring; an answer that names several
candidates where one is asked (a hedge: "Engineering Finance Legal", "1 2 3") earns nothing. Pure
functions, no I/O; `mcp_rl.rewards.score` re-exports `verify_answer` and weighs it with the rest.
Run the doctests: `python -m doctest mcp_rl/rewards/verify.py`.
"""

from __future__ import annotations

import ast
import json
import math
import re
import unicodedata
from datetime import date, datetime
from typing import Any, NamedTuple, Sequence

__all__ = ["verify_answer", "normalize", "shown", "Evidence"]

# Hand-written: no kept library compares free-text agent answers to SQL results
# (math_verify-style graders target LaTeX). dateutil is avoided on purpose: its fuzzy
# mode reads bare numbers such as "42" as dates.

_MONTHS = {m: i for i, m in enumerate(
    "jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
# Whole month names or their abbreviations only: "Marketing 2 2019" is no March 2nd (red-team, session 17).
_MONTH_RE = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
             r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?(?![a-z])")
_DATE_RE = re.compile(
    r"\b(?P<iso>\d{4})[-/.](?P<im>\d{1,2})[-/.](?P<id>\d{1,2})\b"
    r"|\b(?P<um>\d{1,2})/(?P<ud>\d{1,2})/(?P<uy>\d{4})\b"
    rf"|\b(?:(?P<d1>\d{{1,2}})(?:st|nd|rd|th)?\s+)?(?P<mon>{_MONTH_RE})\s+"
    r"(?:(?P<d2>\d{1,2})(?:st|nd|rd|th)?,?\s+)?(?P<y>\d{4})\b", re.I)
_NUM_RE = re.compile(
    r"(?<![\w.])(?P<sign>[-−+])?\s?[$€£]?\s?(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?P<exp>[eE][-+]?\d+)?(?:(?P<pct>\s?%|\s(?:percent|per cent)\b)|(?P<sfx>[kKmMbB]\b)"
    r"|\s(?P<word>thousand|million|billion)\b)?", re.I)
_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "b": 1e9, "billion": 1e9}
_APPROX_RE = re.compile(r"^(?:about|approximately|approx\.?|around|roughly|~|≈)\s*", re.I)
_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
# Extra words that turn "contains the answer" into a hedge or a denial.
_HEDGES = {"or", "not", "no", "nor", "never", "either", "neither", "isnt", "arent", "wasnt", "unknown"}
_TRUE, _FALSE = {"yes", "true", "y", "correct"}, {"no", "false", "n", "incorrect"}
# Words an answer may carry around the expected value without naming another candidate: function
# words, and the generic nouns of a sentence that restates the question. Any other word that the
# question does not hold makes a one-value answer a hedge ("Customer Support Engineering Finance").
_FILLER = set("""
a an the is are was were be been being am it its this that these those there here of in on at to for from by
with as has have had do does did which who whom whose what where when how than then so its it's s i we our
they their them he she his her you your answer final result total value named called name department dept
team group person people one only just exactly overall count number amount
""".split())


class _Num(NamedTuple):
    value: float
    exact: bool      # written plainly (no "about", scale word or exponent): held to its stated precision
    percent: bool
    decimals: int = 0  # stated decimals, trailing zeros dropped: "149.0" is stated like "149"


def _decimals(digits: str) -> int:
    return len(digits.partition(".")[2].rstrip("0"))


def _num(m: re.Match, approx: bool = False) -> _Num:
    raw = m["num"].replace(",", "") + (m["exp"] or "")
    value = float(raw) * (-1 if m["sign"] in ("-", "−") else 1)
    scale = (m["sfx"] or m["word"] or "").lower()
    value *= _SCALE.get(scale, 1.0)
    exact = not (approx or scale or "e" in raw.lower())
    return _Num(value, exact, bool(m["pct"]), _decimals(m["num"]))


def _whole_number(text: str) -> _Num | None:
    """The number `text` is, if it is nothing but one ("$1,234.50", "about 42", "three")."""
    s = text.strip().rstrip(".").strip()
    approx = bool(_APPROX_RE.match(s))
    s = _APPROX_RE.sub("", s)
    if s.lower() in _WORDS:
        return _Num(float(_WORDS[s.lower()]), not approx, False, 0)
    m = _NUM_RE.fullmatch(s)
    return _num(m, approx) if m else None


def _date(m: re.Match) -> date | None:
    try:
        if m["iso"]:
            return date(int(m["iso"]), int(m["im"]), int(m["id"]))
        if m["uy"]:  # numeric m/d/yyyy is read US-style unless the month cannot be one
            a, b = int(m["um"]), int(m["ud"])
            return date(int(m["uy"]), *((a, b) if a <= 12 else (b, a)))
        return date(int(m["y"]), _MONTHS[m["mon"][:3].lower()], int(m["d1"] or m["d2"] or 0))
    except (ValueError, KeyError):
        return None


def _find_date(text: str) -> date | None:
    """The date `text` is, if it is one, perhaps with a time of day (ignored)."""
    s = text.strip().rstrip(".")
    s = re.sub(r"[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?$", "", s)
    m = _DATE_RE.fullmatch(s)
    return _date(m) if m else None


def normalize(text: str) -> str:
    """Lower case, accents, punctuation and articles removed, whitespace collapsed.

    >>> normalize("  The  Café, Inc.! ")
    'cafe inc'
    """
    s = unicodedata.normalize("NFKD", str(text))
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = re.sub(r"[^\w\s]|_", lambda m: "" if m[0] == "'" else " ", s)
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def _stem(word: str) -> str:
    """A crude stem, enough to see that "works" restates the question's "work"."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def _string_match(pred: str, exp: str, question: str = "") -> float:
    p, e = normalize(pred).split(), normalize(exp).split()
    if not e:
        return float(pred.strip().lower() == exp.strip().lower())
    asked = {_stem(w) for w in normalize(question).split()} | {_stem(w) for w in e}
    for i in range(len(p) - len(e) + 1):
        if p[i:i + len(e)] == e:
            rest = p[:i] + p[i + len(e):]
            # A hedge word, or a content word the question does not hold (another candidate,
            # whatever the separator: spaces, slashes, a list, a table), earns nothing.
            # Digits too: "Finance 7" is a name and a number at once (one constant for two answer types).
            other = [w for w in rest if w not in _FILLER and _stem(w) not in asked]
            return float(not (_HEDGES & set(rest)) and not other)
    return 0.0


def _close(p: _Num, e: _Num, rel_tol: float, abs_tol: float, exact_integers: bool) -> bool:
    """Within the tolerance, and, when both are written plainly (exact_integers), within half a unit
    of the coarser stated digit: "149" and "149.0" miss 148, "41.3" misses 41.7, "41.66" and "42" do not."""
    # A percent on either side matches the number or its fraction: "12.5%" ~ 12.5 ~ 0.125.
    ps = [(p.value, p.decimals), (p.value / 100, p.decimals + 2)] if p.percent else [(p.value, p.decimals)]
    es = [(e.value, e.decimals), (e.value / 100, e.decimals + 2)] if e.percent else [(e.value, e.decimals)]
    for (a, da), (b, db) in ((x, y) for x in ps for y in es):
        tol = max(rel_tol * abs(b), abs_tol)
        if exact_integers and p.exact and e.exact:
            tol = min(tol, 0.5 * 10.0 ** -min(da, db))
        if abs(a - b) <= tol * (1 + 1e-9):
            return True
    return False


def _numbers(text: str) -> list[_Num]:
    """Every number written in `text`, dates removed ("as of 2024-01-05" is no number)."""
    if (n := _whole_number(text)) is not None:
        return [n]
    return [_num(m) for m in _NUM_RE.finditer(_DATE_RE.sub(" ", text))]


def _one_value(found: list, asked: list, same) -> Any | None:
    """The one value an answer gives, leaving out the values the question itself holds; None when
    it gives several different ones (a hedge: "10 20 30 40") or none."""
    own = [x for x in found if not any(same(x, q) for q in asked)] or found
    if not own or any(not same(x, own[-1]) for x in own):
        return None
    return own[-1]


def _scalar(pred: str, exp: Any, rel_tol: float, abs_tol: float, exact_integers: bool, question: str = "") -> float:
    if isinstance(exp, bool):
        words = set(normalize(pred).split())
        said_true, said_false = bool(words & _TRUE), bool(words & _FALSE)
        first = normalize(pred).split()[:1]
        # "yes no" names both: a hedge, whichever comes first.
        return float(bool(first) and first[0] in (_TRUE if exp else _FALSE) and not (said_true and said_false))
    if isinstance(exp, (int, float)):
        if not math.isfinite(exp):
            raise ValueError(f"expected answer {exp!r} is not a finite number; fix the scenario")
        e_num = _Num(float(exp), True, False, _decimals(repr(float(exp))) if "e" not in repr(float(exp)) else 17)
    elif isinstance(exp, (date, datetime)):
        e_day = exp.date() if isinstance(exp, datetime) else exp
        return float(_date_of(pred, question) == e_day)
    elif isinstance(exp, str):
        if (e_date := _find_date(exp)) is not None:
            return float(_date_of(pred, question) == e_date)
        if (e_num := _whole_number(exp)) is None:
            return _string_match(pred, exp, question)
    else:
        raise TypeError(f"cannot verify against an expected answer of type {type(exp).__name__}; "
                        "use str, int, float, bool, a date, or a list of those")
    if _HEDGES & {"or", "either", "neither", "nor"} & set(normalize(pred).split()):
        return 0.0
    same = lambda a, b: _close(a, b, rel_tol, abs_tol, exact_integers) or _close(b, a, rel_tol, abs_tol, exact_integers)  # noqa: E731
    p_num = _one_value(_numbers(pred), _numbers(question) if question else [], same)
    return float(p_num is not None and _close(p_num, e_num, rel_tol, abs_tol, exact_integers))


def _date_of(pred: str, question: str) -> date | None:
    s = pred.strip().rstrip(".")
    found = [d for d in map(_date, _DATE_RE.finditer(s)) if d]
    asked = [d for d in map(_date, _DATE_RE.finditer(question)) if d]
    # A number beside the date that the question does not hold ("2019-06-23 (407 days)", "... Marketing 2")
    # makes the answer a constant for two answer types.
    q_numbers = _numbers(question) if question else []
    if any(not any(_close(n, q, 0.0, 0.0, False) for q in q_numbers) for n in _numbers(_DATE_RE.sub(" ", s))):
        return None
    return _one_value(found, asked, lambda a, b: a == b)


def _split_items(pred: str) -> list[str]:
    s = pred.strip()
    if s[:1] == "[" and s[-1:] == "]":
        # complete_task's answer arrives as str(arg): a JSON list or a Python repr of one.
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(s)
                if isinstance(value, list):
                    return [str(v) for v in value]
            except (ValueError, SyntaxError):
                pass
        s = s[1:-1]
    # Commas split items unless they are thousands separators ("1,234").
    parts = re.split(r"\s*(?:;|\n|\band\b|&|,(?!\d{3}(?!\d)))\s*", s)
    items = [re.sub(r"^(?:[-*•]|\d+[.)])\s+", "", x).strip().strip("'\"") for x in parts]
    return [x for x in items if x]


def verify_answer(predicted: str | None, expected: Any, *, question: str = "", evidence: Evidence | None = None,
                  rel_tol: float = 1e-2, abs_tol: float = 1e-4, exact_integers: bool = True) -> float:
    """Score an agent's final answer against a verified ground truth, in [0, 1].

    Rules (in this order, by the type of `expected`). An answer that names several candidates
    where one is asked scores 0 (a hedge), whatever the separator; `question` (the task) lets an
    answer restate what was asked without that counting as another candidate.
    - bool: the first word of the answer is yes/true or no/false, and it does not say both.
    - number (or a string that is one, "$1,234.50", "12.5%"): the answer is read as a number
      if it is nothing but one ("1,234", "$1.2M", "about 42", "three"); else every number in
      the text other than those the question holds must be the same value ("There are 42
      employees" is 42; "10 20 30 40" and "42 or 43" are hedges). Match within rel_tol / abs_tol;
      when both sides are written plainly (no "about", scale word or exponent), also within half a
      unit of the coarser stated digit (exact_integers): "43" and "149.0" miss 42 and 148, "41.3"
      misses 41.7, "41.66" matches it. A percent on either side matches the value or its fraction.
    - date (a date object or a string that is one): the one date in the answer (other than the
      question's), any of 2024-01-15, 01/15/2024 (US order), 15 Jan 2024, January 15th, 2024.
    - string: equal after `normalize`, or contained as whole words when every other word is a
      function word or restates the question: "The Engineering department" is Engineering,
      "Engineering or Sales", "not Engineering" and "Customer Support Engineering Finance" are not.
    - list/tuple/set: order-insensitive F1 (2*matched / (len(expected) + len(answer items)))
      over a one-to-one matching of items by the rules above, so both missing and extra
      items cost credit. The answer is split as a JSON/Python list or on , ; "and" newlines.
    With `evidence` (the episode's successful tool results, see `shown`), an expected value (each
    item of a list) counts only if a tool result showed it: a right guess earns nothing.

    >>> verify_answer("There are 42 employees.", 42)
    1.0
    >>> verify_answer("$1,234.50", "1234.5"), verify_answer("12.5%", 0.125)
    (1.0, 1.0)
    >>> verify_answer("43", 42), verify_answer("42.3", 42.0)
    (0.0, 1.0)
    >>> verify_answer("the engineering department", "Engineering")
    1.0
    >>> verify_answer("Sales, Bob", ["Alice", "Bob"])
    0.5
    >>> verify_answer("Jan 15, 2024", "2024-01-15"), verify_answer(None, 1)
    (1.0, 0.0)
    >>> verify_answer("42", 42, evidence=[("42", "SELECT COUNT(*) FROM t")]), verify_answer("42", 42, evidence=[])
    (1.0, 0.0)
    """
    if expected is None:
        raise ValueError("expected is None: the scenario has no verified answer; "
                         "score it with RULER (set RewardConfig.judge_model) instead")
    if predicted is None:
        return 0.0
    pred = str(predicted)
    opts = (rel_tol, abs_tol, exact_integers)
    seen = (lambda e: True) if evidence is None else (lambda e: shown(e, evidence, question, *opts))  # noqa: E731
    if not isinstance(expected, (list, tuple, set, frozenset)):
        return _scalar(pred, expected, *opts, question) if seen(expected) else 0.0
    return _f1(_split_items(pred), list(expected), *opts, seen=seen)


def _f1(items: list[str], exp_items: list, *opts: Any, seen=lambda e: True) -> float:
    if not exp_items or not items:
        return float(not exp_items and not items)
    unused, matched = list(items), 0
    for e in exp_items:
        hit = next((p for p in unused if _scalar(p, e, *opts) == 1.0), None) if seen(e) else None
        if hit is not None:
            unused.remove(hit)
            matched += 1
    return 2 * matched / (len(exp_items) + len(items))


# (values a tool result showed, the arguments of the call that returned them[, the values its replay showed in
# each counterfactual world, None for a failed call]): see `shown`.
Evidence = Sequence[tuple]


def _holds(text: str, exp: Any, opts: tuple) -> bool:
    """`text` writes the value `exp` somewhere (a number within tolerance, a date, whole words)."""
    if isinstance(exp, (date, datetime)) or (isinstance(exp, str) and _find_date(exp)):
        day = exp if isinstance(exp, date) and not isinstance(exp, datetime) else (
            exp.date() if isinstance(exp, datetime) else _find_date(exp))
        return any(_date(m) == day for m in _DATE_RE.finditer(text))
    e_num = _Num(float(exp), True, False, _decimals(repr(float(exp)))) if isinstance(exp, (int, float)) else \
        _whole_number(exp) if isinstance(exp, str) else None
    if e_num is not None:  # a coarser number ("42 rows") is no evidence of a finer one (41.7)
        return any(_close(_num(m), e_num, *opts) and _decimals(m["num"]) >= e_num.decimals
                   for m in _NUM_RE.finditer(_DATE_RE.sub(" ", text)))
    e, t = normalize(str(exp)).split(), normalize(text).split()
    if any(c.isdigit() for c in str(exp)) and re.search(rf"(?<![\d.]){re.escape(str(exp).strip())}(?!\d)", text, re.I):
        return True  # "09:30" inside "2026-12-06T09:30:00+09:00": normalize would glue "T09" into one word
    return bool(e) and any(t[i:i + len(e)] == e for i in range(len(t) - len(e) + 1))


def shown(expected: Any, evidence: Evidence, question: str = "", rel_tol: float = 1e-2, abs_tol: float = 1e-4,
          exact_integers: bool = True) -> bool:
    """Whether some successful tool result in `evidence` shows `expected`: the grounding rule.

    The value must be in what the server returned, and not merely echoed from the call's own
    arguments (`SELECT 'Engineering'`, `SELECT 42`) unless the question itself names it. Where an
    evidence entry carries a third element, the values its call showed when replayed on counterfactual
    worlds (mcp_rl.rewards.counterfactual), the value must also have moved in one of them (`_moved`). A yes/no
    answer cannot be read off a result: any successful lookup grounds it.

    >>> shown("Engineering", [("Engineering", "SELECT d.name FROM departments d ...")])
    True
    >>> shown("Engineering", [("Engineering", "SELECT 'Engineering'")]), shown(42, [])
    (False, False)
    """
    if isinstance(expected, bool):
        return bool(evidence)
    opts = (rel_tol, abs_tol, exact_integers)
    asked = bool(question) and _holds(question, expected, opts)
    return any(_holds(ev[0], expected, opts) and (asked or not _echoed(ev[1], expected, opts))
               and _moved(ev, expected, opts) for ev in evidence)


def _moved(ev: tuple, expected: Any, opts: tuple) -> bool:
    """No worlds (no counterfactual replay): True. Else the value moved with the data: some world's
    replay of the call succeeded with a non-empty result that does not show it (mcp_rl.rewards.counterfactual).
    An encoded echo (`CAST(x'3432' AS INTEGER)`) shows it in every world, or nothing where its filter
    row is gone; an honest query shows another value."""
    if len(ev) < 3 or ev[2] is None:
        return True
    return any(w is not None and str(w).strip() and not _holds(str(w), expected, opts) for w in ev[2])


# Honest SQL writes small numbers that are no answer: LIMIT 1, OFFSET 0, remote = 1, 1 = 1.
_INCIDENTAL = re.compile(r"\b(?:limit|offset)\s+\d+|(?:=|<>|!=)\s*[01]\b|\b[01]\s*(?==|<>|!=)", re.I)
_LITERAL = re.compile(r"'((?:[^']|'')*)'")
_ARITH = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([-+*/])\s*(\d+(?:\.\d+)?)(?![\w.])")


def _echoed(args: str, exp: Any, opts: tuple) -> bool:
    """The call's own arguments make the value: written out (`SELECT 42`), split into literals that are
    joined (`'E' || 'ngineering'`), or computed from two literals (`SELECT 55-13`). Cheap checks, not a
    proof: hex and char() encodings pass them; the counterfactual replay (mcp_rl.rewards.counterfactual, read by
    `_moved`) refuses those where the scoring has worlds (bench/checks/check_cheats.py measures both)."""
    text = _INCIDENTAL.sub(" ", args)
    if _holds(text, exp, opts):
        return True
    joined = "".join(normalize(x).replace(" ", "") for x in _LITERAL.findall(text))
    target = normalize(str(exp)).replace(" ", "")
    if target and not isinstance(exp, (int, float)) and target in joined:
        return True
    if isinstance(exp, (int, float)) or (isinstance(exp, str) and _whole_number(exp) is not None):
        ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
               "/": lambda a, b: a / b if b else float("nan")}
        values = [str(ops[o](float(a), float(b))) for a, o, b in _ARITH.findall(text)]
        return any(_holds(v, exp, opts) for v in values)
    return False
