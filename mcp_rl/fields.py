"""Dataclass fields that carry their help text (the CLI's flags and the docs read it).

    lr: float = described(5e-5, "LoRA learning rate")
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

__all__ = ["described"]


def described(default: Any, help: str):
    """A dataclass field with `default` (a fresh copy per instance for a list or dict) and `help` in its metadata.

    >>> from dataclasses import dataclass, fields
    >>> @dataclass
    ... class C:
    ...     tags: list = described([], "labels")
    >>> C().tags is C().tags, fields(C)[0].metadata["help"]
    (False, 'labels')
    """
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})
