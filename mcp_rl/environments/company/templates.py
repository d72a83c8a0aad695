"""The company environment's grounded question templates: questions about its schema (departments,
employees, projects), parameterised by values read live from the database through the server's own
SQL tool; mcp_rl/tasks/grounded.py draws instances from them and computes each answer through the server.

    scenarios = await grounded_scenarios(session, 300, templates=company_templates)
"""

from __future__ import annotations

import logging

from mcp_rl.tasks.context import run_sql_all
from mcp_rl.tasks.grounded import Template, quoted_params

log = logging.getLogger(__name__)

ED = "employees e JOIN departments d ON d.id = e.department_id"
# The columns company_templates reads; a database with these tables but other columns gets the generic ones only.
COMPANY = {"departments": set("id name location budget founded_year".split()),
           "employees": set("id name role hire_date department_id salary bonus remote email manager_id".split()),
           "projects": set("id name department_id lead_id status priority budget start_date end_date".split())}


async def company_templates(session, ctx) -> list[Template]:
    """Questions about the company schema, parameterized by values read from it; none (with a warning)
    for a database without the company tables and columns (`COMPANY`)."""
    columns = {t.name: {c for c, _ in t.columns} for t in ctx.tables}
    missing = sorted(name for name, need in COMPANY.items() if not need <= columns.get(name, set()))
    if missing:
        log.warning("no company questions: the database lacks the company columns of %s", ", ".join(missing))
        return []
    tool = ctx.sql_tool
    async def col(sql):
        return [r[0] for r in await run_sql_all(session, sql, tool)]
    depts = await col("SELECT name FROM departments ORDER BY id")
    locs = await col("SELECT DISTINCT location FROM departments ORDER BY location")
    roles = await col("SELECT DISTINCT role FROM employees ORDER BY role")
    years = await col("SELECT DISTINCT substr(hire_date, 1, 4) FROM employees ORDER BY 1")
    pyears = await col("SELECT DISTINCT substr(start_date, 1, 4) FROM projects ORDER BY 1")
    statuses = await col("SELECT DISTINCT status FROM projects ORDER BY 1")
    prios = await col("SELECT DISTINCT priority FROM projects ORDER BY 1")
    # Questions about a person by name are only checkable when the name is unique.
    people = await col("SELECT name FROM employees GROUP BY name HAVING COUNT(*) = 1 ORDER BY name")
    bosses = set(await col("SELECT DISTINCT m.name FROM employees e JOIN employees m ON m.id = e.manager_id"))
    projects = await col("SELECT name FROM projects ORDER BY id")
    leads = set(await col("SELECT DISTINCT e.name FROM projects p JOIN employees e ON e.id = p.lead_id"))
    D = [quoted_params(dept=d) for d in depts]
    S = [quoted_params(status=s, st=s.replace("_", " ")) for s in statuses]
    years = [str(y) for y in years]
    ystep = [quoted_params(y1=a, y2=b) for a, b in zip(years, years[2:])]
    in_dept = "e.department_id = (SELECT id FROM departments WHERE name = {q_dept})"
    topk = ("SELECT e.name FROM employees e WHERE " + in_dept + " AND e.salary >= (SELECT salary FROM employees e "
            "WHERE " + in_dept + " ORDER BY salary DESC LIMIT 1 OFFSET {k1}) ORDER BY e.name")
    argbest = ("WITH c AS (SELECT d.name AS name, {agg} AS v FROM departments d {join} GROUP BY d.id) "
               "SELECT name FROM c WHERE v = (SELECT {fn}(v) FROM c)")
    best = [
        quoted_params(what="the most employees", agg="COUNT(e.id)", join="LEFT JOIN employees e ON e.department_id = d.id", fn="MAX"),
        quoted_params(what="the fewest employees", agg="COUNT(e.id)", join="LEFT JOIN employees e ON e.department_id = d.id", fn="MIN"),
        quoted_params(what="the highest average salary", agg="AVG(e.salary)", join="JOIN employees e ON e.department_id = d.id", fn="MAX"),
        quoted_params(what="the lowest average salary", agg="AVG(e.salary)", join="JOIN employees e ON e.department_id = d.id", fn="MIN"),
        quoted_params(what="the most remote workers", agg="SUM(e.remote)", join="JOIN employees e ON e.department_id = d.id", fn="MAX"),
        quoted_params(what="the most projects", agg="COUNT(p.id)", join="LEFT JOIN projects p ON p.department_id = d.id", fn="MAX"),
        quoted_params(what="the largest total project budget", agg="SUM(p.budget)", join="JOIN projects p ON p.department_id = d.id", fn="MAX"),
        quoted_params(what="the largest budget per employee", agg="d.budget * 1.0 / COUNT(e.id)",
           join="JOIN employees e ON e.department_id = d.id", fn="MAX"),
    ]
    nulls = [
        quoted_params(what="departments have no approved budget", sql="SELECT COUNT(*) FROM departments WHERE budget IS NULL"),
        quoted_params(what="projects have no lead", sql="SELECT COUNT(*) FROM projects WHERE lead_id IS NULL"),
        quoted_params(what="projects have no budget set", sql="SELECT COUNT(*) FROM projects WHERE budget IS NULL"),
        quoted_params(what="projects have no end date yet", sql="SELECT COUNT(*) FROM projects WHERE end_date IS NULL"),
        quoted_params(what="employees have no email address on file", sql="SELECT COUNT(*) FROM employees WHERE email IS NULL"),
        quoted_params(what="employees are not bonus-eligible (no bonus recorded)", sql="SELECT COUNT(*) FROM employees WHERE bonus IS NULL"),
    ]
    T = Template
    return [
        T("dept_headcount", 1, ["count", "join"], ["How many employees work in the {dept} department?",
          "What is the headcount of {dept}?", "How many people are on the {dept} team?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.name = {q_dept}", D),
        T("role_count", 1, ["count", "filter"], ["How many employees have the job title {role}?",
          "How many people at the company work as {role}?"],
          "SELECT COUNT(*) FROM employees WHERE role = {q_role}", [quoted_params(role=r) for r in roles]),
        T("hired_in_year", 2, ["count", "date"], ["How many employees were hired in {y}?",
          "How many people joined the company during {y}?"],
          "SELECT COUNT(*) FROM employees WHERE hire_date BETWEEN '{y}-01-01' AND '{y}-12-31'", [quoted_params(y=y) for y in years]),
        T("hired_between", 3, ["count", "date"], ["How many employees were hired between {y1} and {y2}, inclusive?",
          "From the start of {y1} to the end of {y2}, how many people were hired?"],
          "SELECT COUNT(*) FROM employees WHERE hire_date BETWEEN '{y1}-01-01' AND '{y2}-12-31'", ystep),
        T("dept_location", 1, ["lookup"], ["In which city is the {dept} department located?", "Where is {dept} based?"],
          "SELECT location FROM departments WHERE name = {q_dept}", D, "one"),
        T("depts_in_city", 2, ["list", "filter"], ["Which departments are located in {loc}?",
          "List the departments based in {loc}."], "SELECT name FROM departments WHERE location = {q_loc} ORDER BY name",
          [quoted_params(loc=c) for c in locs], "list"),
        T("avg_salary_dept", 2, ["aggregate", "join"], ["What is the average salary in the {dept} department, rounded to the nearest dollar?",
          "Rounded to whole dollars, what do {dept} employees earn on average?"],
          "SELECT ROUND(AVG(e.salary)) FROM " + ED + " WHERE d.name = {q_dept}", D),
        T("max_salary_role", 2, ["aggregate", "filter"], ["What is the highest salary paid to a {role}?",
          "How much does the best-paid {role} earn per year?"],
          "SELECT MAX(salary) FROM employees WHERE role = {q_role}", [quoted_params(role=r) for r in roles]),
        T("status_count", 1, ["count", "filter"], ["How many projects are {st}?", "How many projects have the status '{status}'?"],
          "SELECT COUNT(*) FROM projects WHERE status = {q_status}", S),
        T("dept_status_projects", 3, ["count", "join", "filter"], ["How many {st} projects does the {dept} department own?",
          "Of the projects owned by {dept}, how many are {st}?"],
          "SELECT COUNT(*) FROM projects p JOIN departments d ON d.id = p.department_id WHERE d.name = {q_dept} AND p.status = {q_status}",
          [{**a, **b} for a in D for b in S]),
        T("dept_prio_projects", 3, ["count", "join", "filter"], ["How many {prio}-priority projects does {dept} own?",
          "Count the projects owned by the {dept} department with priority '{prio}'."],
          "SELECT COUNT(*) FROM projects p JOIN departments d ON d.id = p.department_id WHERE d.name = {q_dept} AND p.priority = {q_prio}",
          [{**a, **quoted_params(prio=p)} for a in D for p in prios]),
        T("remote_dept", 2, ["count", "filter", "join"], ["How many employees in {dept} work remotely?",
          "How many remote workers does the {dept} department have?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.name = {q_dept} AND e.remote = 1", D),
        T("remote_share", 3, ["aggregate", "join"], ["What percentage of {dept} employees work remotely? Round to one decimal place.",
          "To one decimal, what share (in percent) of the {dept} department is remote?"],
          "SELECT ROUND(100.0 * SUM(e.remote) / COUNT(*), 1) FROM " + ED + " WHERE d.name = {q_dept}", D),
        T("no_bonus_dept", 3, ["count", "null", "join"], ["How many employees in {dept} have no bonus recorded?",
          "How many {dept} employees are not bonus-eligible (their bonus is missing)?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.name = {q_dept} AND e.bonus IS NULL", D),
        T("avg_bonus_dept", 3, ["aggregate", "null", "join"], ["Among {dept} employees who get a bonus, what is the average bonus, rounded to the nearest dollar?",
          "Ignoring people without a bonus, what is the mean bonus in {dept} (whole dollars)?"],
          "SELECT ROUND(AVG(e.bonus)) FROM " + ED + " WHERE d.name = {q_dept} AND e.bonus IS NOT NULL", D),
        T("total_pay_dept", 4, ["aggregate", "null", "join"], ["What is the total yearly pay of the {dept} department, salary plus bonus, counting a missing bonus as zero?",
          "Adding salaries and bonuses (no bonus = 0), how much does {dept} pay its people per year?"],
          "SELECT SUM(e.salary + COALESCE(e.bonus, 0)) FROM " + ED + " WHERE d.name = {q_dept}", D),
        T("null_counts", 2, ["count", "null"], ["How many {what}?", "Count how many {what}."], "{sql}", nulls),
        T("top_paid", 3, ["top-k", "list", "join"], ["Who are the {k} highest-paid employees in {dept}?",
          "List the {k} best-paid people in the {dept} department."], topk,
          [{**a, "k": k, "k1": k - 1, "expect": k} for a in D for k in (2, 3)], "list"),
        T("dept_best", 3, ["group-by", "aggregate"], ["Which department has {what}?", "Name the department with {what}."],
          argbest, best, "one"),
        T("depts_over", 3, ["group-by", "list"], ["Which departments have more than {k} employees?",
          "List every department with a headcount above {k}."],
          "SELECT d.name FROM " + ED + " GROUP BY d.id HAVING COUNT(*) > {k} ORDER BY d.name", [{"k": k} for k in (12, 15, 20, 25)], "list"),
        T("depts_projects_atleast", 3, ["group-by", "list", "join"], ["Which departments own at least {k} projects?",
          "List the departments that own {k} or more projects."],
          "SELECT d.name FROM departments d JOIN projects p ON p.department_id = d.id GROUP BY d.id HAVING COUNT(*) >= {k} ORDER BY d.name",
          [{"k": k} for k in (4, 5, 6)], "list"),
        T("project_lead", 2, ["lookup", "join"], ["Who leads the project {proj}?", "Who is the lead of {proj}?"],
          "SELECT e.name FROM projects p JOIN employees e ON e.id = p.lead_id WHERE p.name = {q_proj}",
          [quoted_params(proj=p) for p in projects], "one"),
        T("project_lead_dept", 4, ["join", "three-tables"], ["In which department does the lead of {proj} work?",
          "Which department is the person leading {proj} a member of?"],
          "SELECT d.name FROM projects p JOIN employees e ON e.id = p.lead_id JOIN departments d ON d.id = e.department_id WHERE p.name = {q_proj}",
          [quoted_params(proj=p) for p in projects], "one"),
        T("cross_dept_leads", 4, ["join", "nested", "three-tables"], ["How many projects are led by someone who works in a different department from the one that owns the project?"],
          "SELECT COUNT(*) FROM projects p JOIN employees e ON e.id = p.lead_id WHERE e.department_id <> p.department_id", [{}]),
        T("lead_dept_budget", 4, ["join", "aggregate", "three-tables"], ["What is the total budget of projects led by employees of {dept}, ignoring projects without a budget?",
          "Summing only set budgets, how much project budget is led by people from the {dept} department?"],
          "SELECT SUM(p.budget) FROM projects p JOIN employees e ON e.id = p.lead_id JOIN departments d ON d.id = e.department_id WHERE d.name = {q_dept}", D),
        T("city_headcount", 3, ["count", "join"], ["How many employees work in departments based in {loc}?",
          "What is the combined headcount of the departments located in {loc}?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.location = {q_loc}", [quoted_params(loc=c) for c in locs]),
        T("projects_started", 2, ["count", "date"], ["How many projects started in {y}?", "How many projects have a start date in {y}?"],
          "SELECT COUNT(*) FROM projects WHERE start_date BETWEEN '{y}-01-01' AND '{y}-12-31'", [quoted_params(y=str(y)) for y in pyears]),
        T("completed_in", 3, ["count", "date", "null"], ["How many projects ended in {y}?",
          "How many projects have an end date in {y}?"],
          "SELECT COUNT(*) FROM projects WHERE end_date BETWEEN '{y}-01-01' AND '{y}-12-31'", [quoted_params(y=str(y)) for y in pyears]),
        T("first_hire", 3, ["date", "top-k", "join"], ["Who was the first person hired into {dept}?",
          "Which current {dept} employee has the earliest hire date?"],
          "SELECT e.name FROM employees e WHERE " + in_dept + " AND e.hire_date = (SELECT MIN(hire_date) FROM employees e WHERE " + in_dept + ")",
          D, "one"),
        T("above_company_avg", 4, ["nested", "aggregate"], ["How many employees in {dept} earn more than the company-wide average salary?",
          "How many {dept} salaries are above the average salary of the whole company?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.name = {q_dept} AND e.salary > (SELECT AVG(salary) FROM employees)", D),
        T("above_dept_avg", 4, ["nested", "aggregate"], ["How many {dept} employees earn more than their department's average salary?"],
          "SELECT COUNT(*) FROM " + ED + " WHERE d.name = {q_dept} AND e.salary > (SELECT AVG(salary) FROM employees WHERE department_id = d.id)", D),
        T("above_own_avg_all", 5, ["nested", "group-by"], ["Across the company, how many employees earn more than the average salary of their own department?"],
          "SELECT COUNT(*) FROM employees e WHERE e.salary > (SELECT AVG(x.salary) FROM employees x WHERE x.department_id = e.department_id)", [{}]),
        T("out_earn_manager", 5, ["self-join", "nested"], ["How many employees in {dept} earn more than their own manager?",
          "In {dept}, how many people have a higher salary than the person they report to?"],
          "SELECT COUNT(*) FROM employees e JOIN employees m ON m.id = e.manager_id WHERE " + in_dept + " AND e.salary > m.salary", D),
        T("hired_after_paid", 3, ["count", "filter", "date"], ["How many employees hired in {y} or later earn more than ${amt:,}?",
          "Since the start of {y}, how many hires have a salary above {amt}?"],
          "SELECT COUNT(*) FROM employees WHERE hire_date >= '{y}-01-01' AND salary > {amt}",
          [{"y": y, "amt": a} for y in years[::3] for a in (80000, 100000, 130000)]),
        T("depts_founded_before", 2, ["list", "filter"], ["Which departments were founded before {y}?",
          "List the departments founded earlier than {y}."],
          "SELECT name FROM departments WHERE founded_year < {y} ORDER BY name", [{"y": y} for y in range(2010, 2019)], "list"),
        T("prio_status", 3, ["count", "filter"], ["How many {prio}-priority projects are {st}?"],
          "SELECT COUNT(*) FROM projects WHERE priority = {q_prio} AND status = {q_status}",
          [{**b, **quoted_params(prio=p)} for b in S for p in prios]),
        T("direct_reports", 3, ["count", "self-join"], ["How many people report directly to {who}?",
          "How many direct reports does {who} have?"],
          "SELECT COUNT(*) FROM employees e JOIN employees m ON m.id = e.manager_id WHERE m.name = {q_who}",
          [quoted_params(who=w) for w in people if w in bosses]),
        T("manager_of", 3, ["lookup", "self-join"], ["Who is {who}'s direct manager?", "Who does {who} report to?"],
          "SELECT m.name FROM employees e JOIN employees m ON m.id = e.manager_id WHERE e.name = {q_who}",
          [quoted_params(who=w) for w in people], "one"),
        T("salary_of", 1, ["lookup"], ["What is {who}'s yearly salary?", "How much does {who} earn per year?"],
          "SELECT salary FROM employees WHERE name = {q_who}", [quoted_params(who=w) for w in people]),
        T("dept_of", 2, ["lookup", "join"], ["Which department does {who} work in?", "What department is {who} in?"],
          "SELECT d.name FROM " + ED + " WHERE e.name = {q_who}", [quoted_params(who=w) for w in people], "one"),
        # Below: questions whose answers rarely repeat (sums, averages, dates, names), so the answer
        # cap (mcp_rl/tasks/balance.py) that turns away the common small counts leaves enough to draw from.
        T("role_payroll", 2, ["aggregate", "filter"], ["What is the combined yearly salary of all employees with the job title {role}?",
          "Adding up their salaries, how much is paid per year to the people working as {role}?"],
          "SELECT SUM(salary) FROM employees WHERE role = {q_role}", [quoted_params(role=r) for r in roles]),
        T("role_avg_salary", 2, ["aggregate", "filter"], ["What is the average salary of a {role}, rounded to the nearest dollar?",
          "Rounded to whole dollars, what do employees with the title {role} earn on average?"],
          "SELECT ROUND(AVG(salary)) FROM employees WHERE role = {q_role}", [quoted_params(role=r) for r in roles]),
        T("role_salary_gap", 3, ["aggregate", "filter"], ["How much more does the best-paid {role} earn than the lowest-paid {role}?",
          "What is the gap between the highest and the lowest salary among employees titled {role}?"],
          "SELECT MAX(salary) - MIN(salary) FROM employees WHERE role = {q_role}", [quoted_params(role=r) for r in roles]),
        T("role_top_earner", 2, ["top-k", "filter"], ["Which {role} has the highest salary?", "Who is the best-paid {role}?"],
          "SELECT name FROM employees WHERE role = {q_role} AND salary = (SELECT MAX(salary) FROM employees WHERE role = {q_role})",
          [quoted_params(role=r) for r in roles], "one"),
        T("reports_payroll", 3, ["aggregate", "self-join"], ["What is the combined salary of everyone who reports directly to {who}?",
          "Adding up the salaries of {who}'s direct reports, what is the total?"],
          "SELECT SUM(e.salary) FROM employees e JOIN employees m ON m.id = e.manager_id WHERE m.name = {q_who}",
          [quoted_params(who=w) for w in people if w in bosses]),
        T("lead_budget", 3, ["aggregate", "join"], ["What is the total budget of the projects led by {who}, ignoring projects without a budget?",
          "Summing only set budgets, how much project budget does {who} lead?"],
          "SELECT SUM(p.budget) FROM projects p JOIN employees e ON e.id = p.lead_id WHERE e.name = {q_who}",
          [quoted_params(who=w) for w in people if w in leads]),
        T("project_days", 3, ["date", "filter"], ["How many days did the project {proj} run, from its start date to its end date?",
          "From start to end date, how many days long was the project {proj}?"],
          "SELECT CAST(julianday(end_date) - julianday(start_date) AS INTEGER) FROM projects WHERE name = {q_proj} "
          "AND end_date IS NOT NULL", [quoted_params(proj=p) for p in projects]),
        T("project_start", 1, ["lookup", "date"], ["On what date did the project {proj} start?", "What is the start date of {proj}?"],
          "SELECT start_date FROM projects WHERE name = {q_proj}", [quoted_params(proj=p) for p in projects], "one"),
        T("year_avg_salary", 3, ["aggregate", "date"], ["What is the average salary of the employees hired in {y}, rounded to the nearest dollar?",
          "Rounded to whole dollars, what do the people who joined in {y} earn on average?"],
          "SELECT ROUND(AVG(salary)) FROM employees WHERE hire_date BETWEEN '{y}-01-01' AND '{y}-12-31'", [quoted_params(y=y) for y in years]),
        T("dept_latest_hire", 3, ["date", "top-k", "join"], ["Who is the most recently hired employee in {dept}?",
          "Which {dept} employee has the latest hire date?"],
          "SELECT e.name FROM employees e WHERE " + in_dept + " AND e.hire_date = (SELECT MAX(hire_date) FROM employees e WHERE " + in_dept + ")",
          D, "one"),
        T("dept_top_project", 3, ["top-k", "join"], ["Which project owned by {dept} has the largest budget?",
          "Name the {dept} department's project with the biggest budget."],
          "SELECT p.name FROM projects p WHERE p.department_id = (SELECT id FROM departments WHERE name = {q_dept}) "
          "AND p.budget = (SELECT MAX(budget) FROM projects WHERE department_id = p.department_id)", D, "one"),
        T("dept_most_reports", 4, ["self-join", "group-by", "nested"], ["Within {dept}, which employee has the most direct reports?",
          "Who in the {dept} department has the largest number of people reporting directly to them?"],
          "SELECT m.name FROM employees e JOIN employees m ON m.id = e.manager_id WHERE m." + in_dept[2:] + " GROUP BY m.id "
          "HAVING COUNT(*) = (SELECT MAX(k) FROM (SELECT COUNT(*) AS k FROM employees e JOIN employees m ON m.id = e.manager_id "
          "WHERE m." + in_dept[2:] + " GROUP BY m.id))", D, "one"),
    ]


__all__ = ["COMPANY", "company_templates"]
