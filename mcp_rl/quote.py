"""What a message may quote of its input: a short prefix, never the whole of it.

    short("employees")            # "'employees'"
    short("x" * 100_000, 5)       # "'xxxxx…' (100000 chars)"
    quoted(3.5)                   # '3.5' (text as short(); anything else cut to 40 chars)

Every error of ours that quotes what a model, a client or a config file sent goes through these
(a model or client pays for every character sent back, and a 100,000-character argument must not
come back whole). Secrets are a separate concern: `mcp_rl.redact`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["short", "quoted", "SHORT_CHARS"]

SHORT_CHARS = 60  # what a message quotes of something sent to us


def short(value: Any, limit: int = SHORT_CHARS) -> str:
    """`value` quoted for a message, cut to a prefix of `limit` characters.

    >>> short("employees")
    "'employees'"
    >>> short("x" * 100_000, 5)
    "'xxxxx…' (100000 chars)"
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit] + '…'!r} ({len(text)} chars)"


def quoted(value: Any) -> str:
    """A value for a message: text as a short quoted prefix, anything else as its repr cut to 40 chars.

    >>> quoted("no"), quoted([1] * 30)
    ("'no'", '[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, …')
    """
    text = repr(value)
    return short(value, 40) if isinstance(value, str) else text if len(text) <= 40 else text[:40] + "…"
