"""Config fields checked against their annotations, naming the field: what a YAML, TOML or JSON file
(or a `--set` override) gives is only as typed as its syntax, and a wrong type used to fail later as a
TypeError naming nothing, or pass unnoticed ("no" is a true string).

    values = check_types(TrainConfig, {"learning_rate": "1e-4", "steps": 3.0}, "train.")

A float field takes an int or a float, and text that reads as one ("1e-4": YAML 1.1 reads an exponent
without a dot as text); an int field a whole number (3.0 too); a bool field only true or false; a
text field text (a path too); a list field a list of its items' type; a dict field a mapping.
Annotations this does not know (sections, ToolPolicy) are left to their dataclass.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing

from mcp_rl.quote import quoted, short

__all__ = ["check_types", "check_own_types", "quoted"]

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _typed(value, hint, name: str):
    """`value` as the type `hint` names (an int for a float, "1e-4" for a float, a path for text),
    or ValueError naming the field. Hints this does not know (sections, ToolPolicy) pass unchecked."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        return _typed(value, rest[0], name) if len(rest) == 1 else value
    kind = typing.get_origin(hint) or hint
    got = f"got {quoted(value)} ({type(value).__name__})"
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, {got}: write true or false without quotes")
    elif kind is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be a whole number, {got}")
    elif kind is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-4 (no dot) as text
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, {got}")
        return float(value)
    elif kind is str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be text, {got}: quote it")
    elif kind is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ValueError(f"{name} must be a list, {got}: write [a, b] (YAML) or [\"a\", \"b\"] (JSON/TOML)")
        if args:
            return [_typed(v, args[0], f"{name}[{i}]") for i, v in enumerate(value)]
    elif kind is dict and not isinstance(value, dict):
        raise ValueError(f"{name} must be a mapping of names to values, {got}")
    return value


def check_types(cls, values: dict, where: str = "") -> dict:
    """`values` (fields of dataclass `cls`) with each one checked against its annotation (see `_typed`).

    >>> from mcp_rl.runs.config import TrainConfig
    >>> check_types(TrainConfig, {"learning_rate": "1e-4", "steps": 3.0})
    {'learning_rate': 0.0001, 'steps': 3}
    >>> check_types(TrainConfig, {"eval_warm_start": "no"}, "train.")
    Traceback (most recent call last):
    ...
    ValueError: train.eval_warm_start must be true or false, got 'no' (str): write true or false without quotes
    """
    hints = typing.get_type_hints(cls)
    return {k: _typed(v, hints[k], where + k) if k in hints else v for k, v in values.items()}


def check_own_types(obj, where: str) -> None:
    """Check (and convert in place) every field of dataclass instance `obj`."""
    names = [f.name for f in dataclasses.fields(obj)]
    for k, v in check_types(type(obj), {k: getattr(obj, k) for k in names}, where).items():
        setattr(obj, k, v)
