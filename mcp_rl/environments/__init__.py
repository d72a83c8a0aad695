"""Environments shipped with mcp-rl, one folder each (`mcp_rl.environment.Environment` says what one holds).

    company/   a read-only SQLite company database (departments, employees, projects) behind a FastMCP
               server: grounded question templates, SQL demonstrations, counterfactual worlds
    tau2_telecom/  τ²-bench telecom in solo mode (`tau2-telecom`): a τ² environment per rollout, scored by
               τ²'s own evaluator, paid when the episode diagnosed first; its tasks carry their gold actions
               and their diagnosis (needs the [tau2] extra)

A folder here is an environment when its module defines `recognise(spec) -> Environment | None`:
its own name (`--server company`) and the specs of its server (a command line running its script,
its FastMCP object) are recognised, so a run gets the same demonstrations and worlds however the
server was named. Add one by adding a folder; nothing else in the library names it.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

DEFAULT = "company"  # the environment the CLI's eval and audit-reward use when no --server is given


@functools.lru_cache(maxsize=1)
def names() -> tuple[str, ...]:
    """The shipped environments' names (their folders)."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg))


def recognise(spec: Any):
    """The shipped Environment that `spec` names or serves, else None."""
    for name in names():
        found = importlib.import_module(f"{__name__}.{name}").recognise(spec)
        if found is not None:
            return found
    return None


__all__ = ["DEFAULT", "names", "recognise"]
