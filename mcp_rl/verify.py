"""Answer verification: score an agent's free-text final answer against a verified ground truth.

    verify_answer("There are 42 employees.", 42)        # 1.0
    verify_answer("Sales, Bob", ["Alice", "Bob"])        # 0.5 (order-insensitive F1)

Numbers (formatting, scale words, percents, tolerance), dates, yes/no, strings (normalized,
hedges rejected) and lists are read by the rules in `verify_answer`'s docstring. Pure
functions, no I/O; `mcp_rl.rewards` re-exports `verify_answer` and weighs it with the rest.
Run the doctests: `python -m doctest mcp_rl/verify.py`.
"""

from __future__ import annotations

import ast
import json
import math
import re
import unicodedata
from datetime import date, datetime
from typing import Any, NamedTuple

__all__ = ["verify_answer", "normalize"]

# Hand-written: no kept library compares free-text agent answers to SQL results
# (math_verify-style graders target LaTeX). dateutil is avoided on purpose: its fuzzy
# mode reads bare numbers such as "42" as dates.

_MONTHS = {m: i for i, m in enumerate(
    "jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_MONTH_RE = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
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


def _find_number(text: str) -> _Num | None:
    """The whole string as a number, else the LAST number in the text (dates removed)."""
    if (n := _whole_number(text)) is not None:
        return n
    found = list(_NUM_RE.finditer(_DATE_RE.sub(" ", text)))
    return _num(found[-1]) if found else None


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


def _find_date(text: str, whole: bool = False) -> date | None:
    s = text.strip().rstrip(".")
    if whole:  # the string is one date, perhaps with a time of day (ignored)
        s = re.sub(r"[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?$", "", s)
        m = _DATE_RE.fullmatch(s)
        return _date(m) if m else None
    found = [d for d in map(_date, _DATE_RE.finditer(s)) if d]
    return found[-1] if found else None


def normalize(text: str) -> str:
    """Lower case, accents, punctuation and articles removed, whitespace collapsed.

    >>> normalize("  The  Café, Inc.! ")
    'cafe inc'
    """
    s = unicodedata.normalize("NFKD", str(text))
    s = "".join(c for c in s if not unicodedata.combining(c)).lower()
    s = re.sub(r"[^\w\s]|_", lambda m: "" if m[0] == "'" else " ", s)
    return " ".join(w for w in s.split() if w not in ("a", "an", "the"))


def _string_match(pred: str, exp: str) -> float:
    p, e = normalize(pred).split(), normalize(exp).split()
    if not e:
        return float(pred.strip().lower() == exp.strip().lower())
    for i in range(len(p) - len(e) + 1):
        if p[i:i + len(e)] == e:
            return float(not (_HEDGES & set(p[:i] + p[i + len(e):])))
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


def _scalar(pred: str, exp: Any, rel_tol: float, abs_tol: float, exact_integers: bool) -> float:
    if isinstance(exp, bool):
        words = normalize(pred).split()
        return float(bool(words) and words[0] in (_TRUE if exp else _FALSE))
    if isinstance(exp, (int, float)):
        if not math.isfinite(exp):
            raise ValueError(f"expected answer {exp!r} is not a finite number; fix the scenario")
        e_num = _Num(float(exp), True, False, _decimals(repr(float(exp))) if "e" not in repr(float(exp)) else 17)
    elif isinstance(exp, (date, datetime)):
        d = _find_date(pred)
        return float(d is not None and d == (exp.date() if isinstance(exp, datetime) else exp))
    elif isinstance(exp, str):
        if (e_date := _find_date(exp, whole=True)) is not None:
            return float(_find_date(pred) == e_date)
        if (e_num := _whole_number(exp)) is None:
            items = _split_items(pred)  # "Sales, Marketing, Finance" names three: scored as a list
            return _string_match(pred, exp) if len(items) < 2 else _f1(items, [exp], rel_tol, abs_tol, exact_integers)
    else:
        raise TypeError(f"cannot verify against an expected answer of type {type(exp).__name__}; "
                        "use str, int, float, bool, a date, or a list of those")
    p_num = _find_number(pred)
    return float(p_num is not None and _close(p_num, e_num, rel_tol, abs_tol, exact_integers))


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


def verify_answer(predicted: str | None, expected: Any, *, rel_tol: float = 1e-2,
                  abs_tol: float = 1e-4, exact_integers: bool = True) -> float:
    """Score an agent's final answer against a verified ground truth, in [0, 1].

    Rules (in this order, by the type of `expected`):
    - bool: the first word of the answer is yes/true or no/false.
    - number (or a string that is one, "$1,234.50", "12.5%"): the answer is read as a number
      if it is nothing but one ("1,234", "$1.2M", "about 42", "three"), else the LAST number
      in the text counts (agents put the result at the end: "of 5 teams ... 42"). Match within
      rel_tol / abs_tol; when both sides are written plainly (no "about", scale word or exponent),
      also within half a unit of the coarser stated digit (exact_integers): "43" and "149.0" miss
      42 and 148, "41.3" misses 41.7, "41.66" matches it. A percent on either side matches the
      value or its fraction.
    - date (a date object or a string that is one): the last date in the answer, any of
      2024-01-15, 01/15/2024 (US order), 15 Jan 2024, January 15th, 2024; time of day ignored.
    - string: equal after `normalize`, or contained as whole words when the extra words hold
      no hedge or denial ("or", "not", ...). An answer that splits into several items ("Sales,
      Marketing") is scored as a list against the one expected item, so naming every candidate
      does not earn full credit.
    - list/tuple/set: order-insensitive F1 (2*matched / (len(expected) + len(answer items)))
      over a one-to-one matching of items by the rules above, so both missing and extra
      items cost credit. The answer is split as a JSON/Python list or on , ; "and" newlines.

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
    """
    if expected is None:
        raise ValueError("expected is None: the scenario has no verified answer; "
                         "score it with RULER (set RewardConfig.judge_model) instead")
    if predicted is None:
        return 0.0
    pred = str(predicted)
    opts = (rel_tol, abs_tol, exact_integers)
    if not isinstance(expected, (list, tuple, set, frozenset)):
        return _scalar(pred, expected, *opts)
    return _f1(_split_items(pred), list(expected), *opts)


def _f1(items: list[str], exp_items: list, *opts: Any) -> float:
    if not exp_items or not items:
        return float(not exp_items and not items)
    unused, matched = list(items), 0
    for e in exp_items:
        hit = next((p for p in unused if _scalar(p, e, *opts) == 1.0), None)
        if hit is not None:
            unused.remove(hit)
            matched += 1
    return 2 * matched / (len(exp_items) + len(items))
