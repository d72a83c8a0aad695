"""Tests for mcp_rl/keys.py: where get_secret looks, in which order, and that it never prints a value.

    .venv/bin/python -m pytest tests/test_keys.py -q

google.colab exists only inside Colab; a stand-in module is put in sys.modules for the Colab
cases (that import is the boundary to Colab's runtime, the one place a double belongs here).
"""

import sys
import types

import pytest

from mcp_rl import keys
from mcp_rl.keys import get_secret

NAME = "MCP_RL_TEST_SECRET"


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)

    def no_prompt(*a, **k):
        raise AssertionError("getpass must not be called here")
    monkeypatch.setattr(keys.getpass, "getpass", no_prompt)


def fake_colab(monkeypatch, secrets: dict, error: Exception | None = None):
    def get(name):
        if error:
            raise error
        if name not in secrets:
            raise KeyError(name)  # Colab raises SecretNotFoundError
        return secrets[name]
    colab = types.ModuleType("google.colab")
    colab.userdata = types.SimpleNamespace(get=get)
    google = sys.modules.get("google") or types.ModuleType("google")
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setattr(google, "colab", colab, raising=False)
    monkeypatch.setitem(sys.modules, "google.colab", colab)


def test_missing_everywhere_is_none():
    assert get_secret(NAME) is None


def test_environment_variable(monkeypatch):
    monkeypatch.setenv(NAME, "from-env")
    assert get_secret(NAME) == "from-env"


def test_colab_secret_comes_first(monkeypatch):
    monkeypatch.setenv(NAME, "from-env")
    fake_colab(monkeypatch, {NAME: "from-colab"})
    assert get_secret(NAME) == "from-colab"


@pytest.mark.parametrize("error", [None, PermissionError("notebook access not granted")])
def test_colab_without_the_secret_falls_back_to_env(monkeypatch, error):
    monkeypatch.setenv(NAME, "from-env")
    fake_colab(monkeypatch, {}, error)
    assert get_secret(NAME) == "from-env"


def test_no_prompt_unless_asked_and_interactive(monkeypatch):
    monkeypatch.setattr(keys, "_can_prompt", lambda: False)
    assert get_secret(NAME, prompt=True) is None   # non-interactive (papermill, CI): no prompt


@pytest.mark.parametrize("answer,expected", [("typed-key", "typed-key"), ("  ", None), (EOFError(), None)])
def test_prompt_when_interactive(monkeypatch, answer, expected):
    def prompt(text):
        assert NAME in text
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(keys, "_can_prompt", lambda: True)
    monkeypatch.setattr(keys.getpass, "getpass", prompt)
    assert get_secret(NAME, prompt=True) == expected


def test_export_sets_the_environment_only_when_found(monkeypatch):
    import os
    fake_colab(monkeypatch, {NAME: "from-colab"})
    assert get_secret(NAME, export=True) == "from-colab" and os.environ[NAME] == "from-colab"
    monkeypatch.delitem(sys.modules, "google.colab")
    monkeypatch.delenv(NAME)
    assert get_secret(NAME, export=True) is None and NAME not in os.environ


def test_pytest_session_cannot_prompt():
    # Under pytest stdin is captured (not a terminal) and there is no Jupyter kernel.
    assert keys._can_prompt() is False


def test_value_is_never_printed(monkeypatch, capsys, caplog):
    fake_colab(monkeypatch, {}, RuntimeError("boom"))
    monkeypatch.setenv(NAME, "s3cret-value")
    with caplog.at_level("DEBUG"):
        assert get_secret(NAME, export=True) == "s3cret-value"
    out = capsys.readouterr()
    assert "s3cret-value" not in out.out + out.err + caplog.text


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
def test_bad_name_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="variable name"):
        get_secret(bad)
