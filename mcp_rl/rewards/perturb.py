"""Perturbed copies of a SQLite database: the counterfactual worlds of `mcp_rl.rewards.counterfactual`.

    perturb_copy("data/company.db", "/tmp/world1.db", world=1, seed=0)   # the source is only read
    rename_literals({"sql": "... WHERE city = 'Chicago'"}, text_values(db))  # world 0's replayed call

The perturbation (`perturb_copy`): key columns (primary keys, foreign keys, `id`, `*_id`) keep their values,
so joins join. Every world moves numbers per row by 10-40% of the column's range (positives stay positive)
and ISO dates per row by 20-400 days, the n-th date column of a row a week further (durations move).
World 0 keeps every row and adds a copy of each (new id, same references: a count other than 0 doubles,
a filter on one person still finds them), renames all text ("Chicago" -> "Chicagox"; copies of distinct
values and of one value in ten -> "Chicagoy") and replays the call with its quoted literals renamed alike
(`'Chicago'` -> `'Chicagox'`), so a filter selects the same rows while every name shown differs; 0/1
flags become 1/2. Worlds 1.. drop max(1, 10%) of each table's rows, relabel each text column's values
by a derangement ('Legal' names another department, 'on_hold' means what 'active' meant) and redraw 15%
of the cells of columns with repeats, flip 15% of flags, point 15% of foreign keys at other keys, and
null max(1, 10%) of the values of a column that has NULLs. Measured on the 500 demonstrations of
data/scenarios.jsonl (bench/checks/check_counterfactual.py): all grounded at K=4 (seeds 0-3); at K=3 one
zero count stayed 0 in every world at 2 of 4 seeds (Legal's on-hold projects; Finance employees who
out-earn their manager). Zero counts are the hard case: only a world where the rows happen to qualify
moves them.
CHECK constraints are off in the copies; the source file is only read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import random
import re
import sqlite3
from pathlib import Path
from typing import Any

__all__ = ["perturb_copy", "rename_literals", "text_values", "SUFFIX"]

SUFFIX = "x"  # a word character: "Chicagox" normalises to another word, so "Chicago" is not shown
_ISO = re.compile(r"^(\d{4}-\d{2}-\d{2})(.*)$", re.S)
_QUOTED = re.compile(r"'((?:[^']|'')*)'")


def _kind(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "none"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return "flag" if set(vals) <= {0, 1} else "number"
    if all(isinstance(v, str) for v in vals):
        return "date" if all(_ISO.match(v) for v in vals) else "text"
    return "none"  # blobs and mixed columns are left as they are


def _numbers(vals: list, rng: random.Random) -> list:
    present = [v for v in vals if v is not None]
    spread = (max(present) - min(present)) or abs(present[0]) or 1
    out = []
    for v in vals:
        if v is None:
            out.append(None)
            continue
        delta = rng.choice((-1, 1)) * rng.uniform(0.1, 0.4) * spread
        new = v + (max(1, round(delta)) if delta > 0 else min(-1, round(delta))) if isinstance(v, int) else v + delta
        out.append(v - (new - v) if v > 0 >= new else new)  # a positive stays positive (salary > 0)
    return out


def _shift(value: str, days: int) -> str:
    m = _ISO.match(value)
    try:
        return (dt.date.fromisoformat(m[1]) + dt.timedelta(days=days)).isoformat() + m[2]
    except ValueError:
        return value


def _texts(vals: list, rng: random.Random, world: int, copies: int) -> list:
    """World 0: every value renamed (in the last `copies` rows, copies of the first ones, some get another
    suffix: all where the column's values are distinct, as a UNIQUE name must stay unique). Other worlds: the column's
    distinct values relabelled by a derangement ('Legal' names another department, 'on_hold' means what
    'active' meant), then 15% of the cells of a column with repeats drawn again from its values."""
    present = [v for v in vals if v is not None]
    distinct = sorted(set(present))
    if not world:  # the copies of one value in ten (all, if the values are distinct) get "y": COUNT(DISTINCT) moves
        real = [v for v in vals[:len(vals) - copies] if v is not None]
        other = set(distinct) if len(set(real)) == len(real) else set(rng.sample(distinct, max(1, len(distinct) // 10)))
        return [None if v is None else v + ("y" if v in other and i >= len(vals) - copies else SUFFIX)
                for i, v in enumerate(vals)]
    order = distinct[:]
    rng.shuffle(order)
    relabel = {v: order[(i + 1) % len(order)] for i, v in enumerate(order)}
    out = [None if v is None else relabel[v] for v in vals]
    if len(distinct) < len(present):
        out = [rng.choice(present) if v is not None and rng.random() < 0.15 else v for v in out]
    return out


def _keys(con: sqlite3.Connection, table: str) -> tuple[set[str], dict[str, list]]:
    """(key columns: primary keys, foreign keys, `id` and `*_id`; {foreign key column: the values it may
    take, the referenced keys, and None where the column holds NULLs})."""
    cols = con.execute('SELECT name, pk, "notnull" FROM pragma_table_info(?)', (table,)).fetchall()
    pks = {c for c, pk, _ in cols if pk}
    refs = {}
    for r in con.execute("SELECT * FROM pragma_foreign_key_list(?)", (table,)):
        col, ref, to = r[3], r[2], r[4]
        if col in pks:
            continue
        to = to or next((c for c, pk, _ in con.execute("SELECT name, pk, 0 FROM pragma_table_info(?)", (ref,)) if pk), None)
        if to is None:
            continue
        values = [v for (v,) in con.execute(f'SELECT DISTINCT "{to}" FROM "{ref}" WHERE "{to}" IS NOT NULL')]
        nulls = con.execute(f'SELECT COUNT(*) FROM "{table}" WHERE "{col}" IS NULL').fetchone()[0]
        refs[col] = values + [None] * bool(nulls)
    keys = pks | set(refs) | {c for c, _, _ in cols if c.lower() == "id" or c.lower().endswith("_id")}
    return keys, refs


def perturb_copy(src: str | Path, dst: str | Path, world: int, *, seed: int = 0, drop: float = 0.1) -> None:
    """Copy the SQLite file `src` to `dst` and perturb the copy as world `world` (0 renames text and adds a
    copy of every row; the others relabel text and drop rows; see the module docstring). Deterministic in
    (src's rows, world, seed)."""
    with contextlib.closing(sqlite3.connect(f"{Path(src).resolve().as_uri()}?mode=ro", uri=True)) as a, \
            contextlib.closing(sqlite3.connect(dst)) as b:
        a.backup(b)
    with contextlib.closing(sqlite3.connect(dst, isolation_level=None)) as con:
        con.execute("PRAGMA foreign_keys=OFF")
        con.execute("PRAGMA ignore_check_constraints=ON")
        con.execute("BEGIN")
        tables = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' AND sql NOT LIKE 'CREATE VIRTUAL%'")]
        keyed = {t: _keys(con, t) for t in tables}  # before any table changes: references are the real keys
        for table in tables:
            rng = random.Random(f"{seed}:{world}:{table}")
            cur = con.execute(f'SELECT * FROM "{table}"')
            cols = [d[0] for d in cur.description]
            rows = [list(r) for r in cur.fetchall()]
            keys, refs = keyed[table]
            pk = [c for c, p, t in con.execute("SELECT name, pk, type FROM pragma_table_info(?)", (table,))
                  if p and t.upper() == "INTEGER"]
            copies = 0
            if not world and len(pk) == 1 and len(cols) == len(con.execute(  # no hidden columns to lose
                    "SELECT 1 FROM pragma_table_xinfo(?)", (table,)).fetchall()):
                # Every row twice (a new id; references still point at the real rows): any count but 0
                # doubles, while a filter on one person still finds them.
                j, top = cols.index(pk[0]), max((r[cols.index(pk[0])] or 0 for r in rows), default=0)
                copies = len(rows)
                rows += [[top + r[j] if i == j else v for i, v in enumerate(r)] for r in rows]
            elif world and len(rows) > 1:
                gone = set(rng.sample(range(len(rows)), max(1, round(drop * len(rows)))))
                rows = [r for i, r in enumerate(rows) if i not in gone]
            days = [rng.choice((-1, 1)) * rng.randint(20, 400) for _ in rows]
            nth_date = 0
            for j, col in enumerate(cols):
                vals, kind = [r[j] for r in rows], _kind([r[j] for r in rows])
                if col in refs and world:  # 15% of references point elsewhere: joins join, per-group counts move
                    vals = [rng.choice(refs[col]) if rng.random() < 0.15 else v for v in vals]
                elif col in keys:
                    continue
                elif kind == "number":
                    vals = _numbers(vals, rng)
                elif kind == "flag":  # world 0 recodes 0/1 as 1/2 (MIN(remote) moves); others flip 15%
                    vals = [None if v is None else v + 1 if not world else 1 - v if rng.random() < 0.15 else v
                            for v in vals]
                elif kind == "date":  # a row's dates move together, the n-th a week further: durations move
                    vals = [None if v is None else _shift(v, d + 7 * nth_date + rng.randint(0, 3)) for v, d in zip(vals, days)]
                    nth_date += 1
                elif kind == "text":
                    vals = _texts(vals, rng, world, copies)
                if world and col not in keys - set(refs) and None in vals:
                    # A column that may be NULL gets max(1, 10%) more NULLs: "how many have no email" moves.
                    filled = [i for i, v in enumerate(vals) if v is not None]
                    for i in rng.sample(filled, min(len(filled), max(1, round(0.1 * len(filled))))):
                        vals[i] = None
                for r, v in zip(rows, vals):
                    r[j] = v
            con.execute(f'DELETE FROM "{table}"')
            names = ", ".join(f'"{c}"' for c in cols)
            # OR IGNORE: a copied row that would break a UNIQUE constraint (a number drawn equal) is left out.
            con.executemany(f'INSERT OR IGNORE INTO "{table}" ({names}) VALUES ({", ".join("?" * len(cols))})', rows)
        con.execute("COMMIT")


def rename_literals(args: Any, renamed: set[str]) -> Any:
    """`args` with every quoted SQL literal that names a renamed text value (any case) renamed alike.

    >>> rename_literals({"sql": "SELECT 1 WHERE city = 'chicago' AND x = 'Other'"}, {"chicago"})
    {'sql': "SELECT 1 WHERE city = 'chicagox' AND x = 'Other'"}
    """
    if isinstance(args, dict):
        return {k: rename_literals(v, renamed) for k, v in args.items()}
    if isinstance(args, list):
        return [rename_literals(v, renamed) for v in args]
    if not isinstance(args, str):
        return args
    return _QUOTED.sub(lambda m: f"'{m[1]}{SUFFIX}'" if m[1].replace("''", "'").lower() in renamed else m[0], args)




def text_values(db: str | Path) -> set[str]:
    """The text values (lower case) world 0 renames: every value of a non-key text column."""
    out: set[str] = set()
    with contextlib.closing(sqlite3.connect(f"{Path(db).resolve().as_uri()}?mode=ro", uri=True)) as con:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"):
            keys = _keys(con, table)[0]
            cur = con.execute(f'SELECT * FROM "{table}"')
            cols, rows = [d[0] for d in cur.description], cur.fetchall()
            for j, col in enumerate(cols):
                if col not in keys and _kind([r[j] for r in rows]) == "text":
                    out |= {r[j].lower() for r in rows if r[j] is not None}
    return out
