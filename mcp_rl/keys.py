"""API keys for notebooks and scripts, read without ever printing or saving them.

    key = get_secret("OPENROUTER_API_KEY")                          # Colab secret, else env var, else None
    key = get_secret("OPENROUTER_API_KEY", prompt=True, export=True)  # may ask (interactive only); sets env

Order: a Colab secret (the key icon in Colab's sidebar, `google.colab.userdata`), then the
environment variable of the same name, then, only when `prompt=True` and someone can answer,
a `getpass` prompt. `export=True` puts a found key into `os.environ` (this process only), where
litellm and the scenario generator look for it, so it never has to sit in a config that is
written to disk. The value is never printed, logged or returned in an error message.
"""

from __future__ import annotations

import getpass
import logging
import os
import sys

log = logging.getLogger(__name__)

__all__ = ["get_secret"]


def _colab_secret(name: str) -> str | None:
    try:
        from google.colab import userdata  # only importable inside Colab
    except ImportError:
        return None
    try:
        return userdata.get(name) or None
    except Exception as e:  # noqa: BLE001 - not set, or notebook access not granted: fall through
        # Only the exception's type: its text could in principle echo what was looked up.
        log.info("Colab secret %s not available (%s)", name, type(e).__name__)
        return None


def _can_prompt() -> bool:
    """Whether a getpass prompt can be answered: a Jupyter kernel that accepts input, or a terminal."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    kernel = getattr(shell, "kernel", None)
    if kernel is not None:
        # papermill/nbclient run cells with allow_stdin=False: a prompt there would raise.
        return bool(getattr(kernel, "_allow_stdin", False))
    return sys.stdin is not None and sys.stdin.isatty()


def get_secret(name: str, *, prompt: bool = False, export: bool = False) -> str | None:
    """The secret `name` from Colab secrets, the environment, or (prompt=True, interactive) getpass.

    Returns None when it is nowhere; an empty answer to the prompt counts as none."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"get_secret needs a variable name such as 'OPENROUTER_API_KEY', got {name!r}")
    value = _colab_secret(name) or os.environ.get(name) or None
    if value is None and prompt and _can_prompt():
        try:
            value = getpass.getpass(f"{name} (press Enter to skip): ").strip() or None
        except (EOFError, KeyboardInterrupt, OSError, RuntimeError) as e:
            log.info("no answer to the %s prompt (%s)", name, type(e).__name__)
            value = None
    if value and export:
        os.environ[name] = value
    return value
