"""Deterministic company database for the company-db MCP server.

Builds a small SQLite database (9 departments, 150 employees, 42 projects) from
the name lists below and one seeded ``random.Random``: every build has the same
rows. It keeps the edge cases real data has, so questions about it are not
trivial: a department with no projects (Legal), a department with no budget,
projects led by someone who has since moved to another department, a project
with no lead, tied salaries (the two best-paid employees earn the same), a
duplicated employee name, NULL end dates of unfinished projects, NULL
``manager_id`` of department heads, NULL bonuses and a few missing emails.

Run:  python -m mcp_rl.environments.company.build_db [--out data/company.db]
Use:  from mcp_rl.environments.company.build_db import build_db; build_db("x.db")
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sqlite3
import tempfile
from pathlib import Path

import sqlite_utils

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "company.db"  # the repository's data/
SEED = 20240630
TODAY = dt.date(2024, 6, 30)  # the data's "now"; fixed so builds never depend on the clock

# Comments inside CREATE TABLE stay in sqlite_master, so agents reading the
# schema see what a NULL means.
SCHEMA = """
CREATE TABLE departments (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    location TEXT NOT NULL,
    budget INTEGER,                 -- yearly budget in USD; NULL = not yet approved
    founded_year INTEGER NOT NULL
);
CREATE TABLE employees (
    id INTEGER PRIMARY KEY,         -- assigned in hire order
    name TEXT NOT NULL,             -- not unique: two people share a name
    department_id INTEGER NOT NULL REFERENCES departments(id),
    role TEXT NOT NULL,             -- 'Director' heads a department; 'Manager' leads a team
    salary INTEGER NOT NULL CHECK (salary > 0),   -- yearly, USD
    bonus INTEGER,                  -- yearly, USD; NULL = not bonus-eligible
    hire_date TEXT NOT NULL,        -- ISO date YYYY-MM-DD
    manager_id INTEGER REFERENCES employees(id),  -- NULL for department heads
    email TEXT UNIQUE,              -- NULL = missing
    remote INTEGER NOT NULL DEFAULT 0 CHECK (remote IN (0, 1))
);
CREATE TABLE projects (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    department_id INTEGER NOT NULL REFERENCES departments(id),  -- owning department
    lead_id INTEGER REFERENCES employees(id),  -- may work in another department now; NULL = no lead
    status TEXT NOT NULL CHECK (status IN ('active', 'completed', 'on_hold')),
    priority TEXT NOT NULL CHECK (priority IN ('low', 'medium', 'high')),
    budget INTEGER,                 -- USD; NULL = not set
    start_date TEXT NOT NULL,       -- ISO date
    end_date TEXT,                  -- NULL unless completed
    CHECK (end_date IS NULL OR end_date >= start_date)
);
CREATE INDEX idx_employees_department ON employees(department_id);
CREATE INDEX idx_employees_manager ON employees(manager_id);
CREATE INDEX idx_projects_department ON projects(department_id);
CREATE INDEX idx_projects_lead ON projects(lead_id);
"""

# name, location, budget, founded, headcount, project count, individual-contributor roles
DEPARTMENTS = [
    ("Engineering", "San Francisco", 4_200_000, 2009, 38, 12,
     ["Software Engineer", "Senior Software Engineer", "QA Engineer", "DevOps Engineer", "Data Engineer"]),
    ("Sales", "New York", 2_600_000, 2009, 26, 6, ["Account Executive", "Sales Representative", "Sales Engineer"]),
    ("Marketing", "New York", 1_350_000, 2011, 16, 6, ["Marketing Specialist", "Content Writer", "Designer"]),
    ("Finance", "Chicago", 900_000, 2009, 12, 3, ["Accountant", "Financial Analyst"]),
    ("Human Resources", "Chicago", 650_000, 2012, 10, 3, ["HR Generalist", "Recruiter"]),
    ("Customer Support", "Austin", 780_000, 2013, 20, 4, ["Support Specialist", "Support Engineer"]),
    ("Operations", "Austin", None, 2010, 14, 5, ["Operations Analyst", "Logistics Coordinator"]),
    ("Research", "Boston", 1_900_000, 2016, 9, 3, ["Research Scientist", "Research Engineer"]),
    ("Legal", "Washington", 540_000, 2018, 5, 0, ["Counsel", "Paralegal"]),
]
IC_SALARY = {  # role -> (low, high) yearly USD; rounded to 1000 below, so ties are common
    "Software Engineer": (95, 135), "Senior Software Engineer": (130, 165), "QA Engineer": (80, 110),
    "DevOps Engineer": (105, 140), "Data Engineer": (105, 145), "Account Executive": (70, 110),
    "Sales Representative": (55, 80), "Sales Engineer": (95, 125), "Marketing Specialist": (60, 85),
    "Content Writer": (55, 75), "Designer": (70, 100), "Accountant": (65, 90),
    "Financial Analyst": (75, 105), "HR Generalist": (55, 75), "Recruiter": (55, 80),
    "Support Specialist": (45, 62), "Support Engineer": (60, 85), "Operations Analyst": (60, 85),
    "Logistics Coordinator": (50, 70), "Research Scientist": (120, 160), "Research Engineer": (110, 145),
    "Counsel": (140, 175), "Paralegal": (55, 75),
}
FIRST = ("Aaliyah Aaron Abigail Adrian Aisha Alan Alice Amir Ana Andre Anika Ben Bianca Carlos Chen Chloe "
         "Daniel Deepa Diego Elena Emeka Emily Ethan Fatima Felix Grace Hana Hassan Ian Ines Isaac Ivy "
         "Jamal Javier Jin Jordan Julia Kai Kenji Laura Leila Liam Lucas Maya Mei Mohammed Nadia Noah "
         "Olivia Omar Priya Rafael Ravi Rosa Samuel Sara Sofia Tariq Tom Uma Victor Yara Yusuf Zoe").split()
LAST = ("Adams Ahmed Alvarez Bauer Brooks Chen Cohen Costa Das Diaz Edwards Evans Fischer Garcia Gupta "
        "Haddad Hall Huang Ito Jensen Johnson Kang Khan Kim Kowalski Lee Lopez Martin Meyer Mendez Moreau "
        "Murphy Nakamura Nguyen Novak Okafor Olsen Patel Perez Petrov Quinn Reyes Rossi Santos Schmidt "
        "Shah Silva Singh Smith Sullivan Tanaka Taylor Torres Walker Wang Weber Williams Wilson Wu Young").split()
CODENAMES = ("Apollo Atlas Aurora Beacon Bluebird Borealis Cascade Comet Condor Delta Ember Falcon Forge "
             "Galaxy Granite Harbor Helix Horizon Indigo Juniper Keystone Lighthouse Lumen Maple Meridian "
             "Mosaic Nebula Nimbus Orion Pegasus Phoenix Polaris Quartz Redwood Sapphire Sequoia Summit "
             "Tempest Titan Vertex Voyager Zephyr").split()
PURPOSES = {
    "Engineering": ["Platform Migration", "API Gateway", "Mobile App", "Data Pipeline", "Search Rewrite", "CI Overhaul"],
    "Sales": ["CRM Rollout", "Partner Program", "EMEA Expansion", "Pricing Review"],
    "Marketing": ["Brand Refresh", "Website Redesign", "Webinar Series", "Launch Campaign"],
    "Finance": ["Audit Readiness", "Budget Tooling", "Expense Automation"],
    "Human Resources": ["Onboarding Revamp", "Benefits Review", "Learning Portal"],
    "Customer Support": ["Help Center", "Chatbot Pilot", "Ticket Triage"],
    "Operations": ["Warehouse Automation", "Vendor Consolidation", "Fleet Tracking"],
    "Research": ["Forecasting Model", "Recommendation Study", "Anomaly Detection"],
}
TIED_TOP_SALARY = 215_000  # paid to exactly two heads (Engineering, Sales): the company-wide maximum is a tie
DUPLICATE_NAME = "Jordan Lee"


def _day(rng: random.Random, start: dt.date, end: dt.date) -> dt.date:
    return start + dt.timedelta(days=rng.randrange((end - start).days + 1))


def _people(rng: random.Random) -> list[dict]:
    """Employees of every department, with hierarchy; ids get assigned later."""
    names = [f"{f} {l}" for f in FIRST for l in LAST if f"{f} {l}" != DUPLICATE_NAME]
    names = rng.sample(names, 148) + [DUPLICATE_NAME, DUPLICATE_NAME]
    names[20], names[148] = names[148], names[20]  # the two namesakes land in different departments
    people, k = [], 0
    for dept_id, (dept, _loc, _b, founded, headcount, _np, ic_roles) in enumerate(DEPARTMENTS, 1):
        start = dt.date(max(founded, 2012), 1, 1)
        head = {"dept": dept_id, "role": "Director", "boss": None, "name": names[k],
                "salary": TIED_TOP_SALARY if dept in ("Engineering", "Sales") else rng.randrange(160, 206, 5) * 1000,
                "bonus": rng.randrange(15, 41) * 1000, "hired": _day(rng, start, start + dt.timedelta(days=4 * 365))}
        k += 1
        team = [head]
        managers = []
        for _ in range(headcount // 10):  # small departments report straight to their head
            m = {"dept": dept_id, "role": "Manager", "boss": head, "name": names[k],
                 "salary": rng.randrange(115, 156, 5) * 1000, "bonus": rng.randrange(8, 21) * 1000,
                 "hired": _day(rng, start, start + dt.timedelta(days=8 * 365))}
            k += 1
            managers.append(m)
        team += managers
        for _ in range(headcount - len(team)):
            role = rng.choice(ic_roles)
            lo, hi = IC_SALARY[role]
            team.append({"dept": dept_id, "role": role, "boss": rng.choice(managers or [head]), "name": names[k],
                         "salary": rng.randrange(lo, hi + 1) * 1000,
                         "bonus": rng.randrange(2, 9) * 1000 if rng.random() < 0.35 else None,
                         "hired": _day(rng, start, TODAY - dt.timedelta(days=14))})
            k += 1
        people += team
    # Ids follow hire order, as HR systems assign them; name breaks same-day ties.
    people.sort(key=lambda p: (p["hired"], p["name"]))
    seen: dict[str, int] = {}
    for i, p in enumerate(people, 1):
        p["id"] = i
        local = p["name"].lower().replace(" ", ".")
        seen[local] = seen.get(local, 0) + 1
        p["email"] = f"{local}{seen[local] if seen[local] > 1 else ''}@acme-corp.test"
        p["remote"] = int(rng.random() < 0.3)
    for p in rng.sample([p for p in people if p["role"] not in ("Director", "Manager")], 7):
        p["email"] = None
    return people


def _projects(rng: random.Random, people: list[dict]) -> list[dict]:
    codenames = rng.sample(CODENAMES, len(CODENAMES))
    statuses = ["active"] * 17 + ["completed"] * 17 + ["on_hold"] * 8
    rng.shuffle(statuses)
    rows = []
    for dept_id, (dept, *_rest) in enumerate(DEPARTMENTS, 1):
        n_projects = DEPARTMENTS[dept_id - 1][5]
        senior = [p for p in people if p["dept"] == dept_id and (p["role"] in ("Director", "Manager")
                                                                 or "Senior" in p["role"] or rng.random() < 0.3)]
        for _ in range(n_projects):
            pid = len(rows) + 1
            status = statuses[pid - 1]
            start = _day(rng, dt.date(2019, 1, 1), dt.date(2024, 5, 1))
            end = min(start + dt.timedelta(days=rng.randrange(60, 541)), TODAY) if status == "completed" else None
            rows.append({"id": pid, "name": f"{codenames[pid - 1]} {rng.choice(PURPOSES[dept])}",
                         "department_id": dept_id, "lead_id": rng.choice(senior)["id"], "status": status,
                         "priority": rng.choice(["low", "medium", "medium", "high"]),
                         "budget": rng.randrange(10, 241) * 5000, "start_date": start.isoformat(),
                         "end_date": end.isoformat() if end else None})
    # Leads who moved: projects still owned by the old department, led from a new one.
    by_dept = {d: [p for p in people if p["dept"] == d and p["role"] != "Director"] for d in range(1, 10)}
    owned = {d: [r for r in rows if r["department_id"] == d] for d in range(1, 10)}
    owned[1][3]["lead_id"] = rng.choice(by_dept[8])["id"]  # an Engineering project led from Research
    owned[3][1]["lead_id"] = rng.choice(by_dept[2])["id"]  # a Marketing project led from Sales
    on_hold = [r for r in rows if r["status"] == "on_hold"]
    on_hold[0]["lead_id"] = None
    for r in rng.sample(rows, 4):
        r["budget"] = None
    return rows


def _rows(seed: int = SEED) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    people = _people(rng)
    employees = [{"id": p["id"], "name": p["name"], "department_id": p["dept"], "role": p["role"],
                  "salary": p["salary"], "bonus": p["bonus"], "hire_date": p["hired"].isoformat(),
                  "manager_id": p["boss"]["id"] if p["boss"] else None, "email": p["email"], "remote": p["remote"]}
                 for p in sorted(people, key=lambda p: p["id"])]
    departments = [{"id": i, "name": d[0], "location": d[1], "budget": d[2], "founded_year": d[3]}
                   for i, d in enumerate(DEPARTMENTS, 1)]
    return {"departments": departments, "employees": employees, "projects": _projects(rng, people)}


def build_db(path: str | os.PathLike = DEFAULT_PATH) -> Path:
    """Build the company database at ``path`` (atomically) and return the path.

    Rows go into a temporary file next to ``path`` that replaces ``path`` only
    once complete and checked, so a crash never leaves a half-written database
    (and never clobbers a good one).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        db = sqlite_utils.Database(tmp, execute_plugins=False)
        try:
            db.executescript(SCHEMA)
            with db.atomic():
                for table, rows in _rows().items():
                    db[table].insert_all(rows)
            problems = db.execute("PRAGMA foreign_key_check").fetchall()
            if problems:
                raise RuntimeError(f"generated rows break foreign keys: {problems[:5]}")
        finally:
            db.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it owner-only; a database is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_PATH), help="where to write the database (default: %(default)s)")
    out = build_db(parser.parse_args(argv).out)
    with sqlite3.connect(out) as conn:
        counts = {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                  for t in ("departments", "employees", "projects")}
    conn.close()
    print(f"wrote {out}: " + ", ".join(f"{n} {t}" for t, n in counts.items()))


if __name__ == "__main__":
    main()
