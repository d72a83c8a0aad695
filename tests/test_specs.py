"""mcp_rl.mcp.specs / connect: no secret of a spec reaches a description or an error message, table-driven.

Every spec below carries the secret "hunter2" (a DSN password, a --pat value, a URL query key, a
known token format); each row is one message a user can see. Run: pytest tests/test_specs.py -q
"""

import asyncio

import pytest

from mcp_rl.mcp.connect import ToolSession
from mcp_rl.mcp.specs import ServerUnavailable, describe_spec, make_client

SECRET = "hunter2"
GH = "ghp_" + "hunter2" * 4  # a GitHub token's format, standing where no flag names it

DESCRIBED = [  # spec -> what the description must still show
    ("uvx mcp-server-postgres postgresql://bob:hunter2@db:5432/x", "postgresql://bob:***@db:5432/x"),
    ("npx -y @s/github --pat hunter2 --port 80", "--pat *** --port 80"),
    ("npx -y @modelcontextprotocol/server-github " + GH, "server-github ***"),
    ("npx srv --passphrase hunter2", "--passphrase ***"),
    ("mcp-pg postgresql://bob:p@ss-hunter2@db/x", "postgresql://bob:***@db/x"),
    ("https://bob:hunter2@host.io/mcp?key=hunter2", "http: https://host.io/mcp?key=***"),
    ("https://host.io/sk-hunter2hunter2hunter2/mcp", "host.io/***/mcp"),
    ("http://host.io:bad/mcp?token=hunter2", "host.io:bad/mcp"),  # a malformed port: described, not raised
    ({"command": "uvx", "args": ["mcp-pg", "postgresql://bob:hunter2@db/x"], "env": {"PGPASSWORD": SECRET}},
     "(env: PGPASSWORD)"),
    ({"url": "https://h/mcp?api_key=hunter2", "headers": {"X-Key": SECRET}}, "(with X-Key)"),
]


@pytest.mark.parametrize("spec, shown", DESCRIBED)
def test_describe_spec_hides_secrets(spec, shown):
    text = describe_spec(spec)
    assert shown in text and SECRET not in text, text


ERRORS = [  # (spec, make_client kwargs, error, what the message says)
    ("mcp-pg 'postgresql://bob:hunter2@db/x", {}, ValueError, "Cannot parse"),  # unbalanced quote
    ("no-such-command-xyz postgresql://bob:hunter2@db/x --pat hunter2", {}, ServerUnavailable, "not found on PATH"),
    ("python no_such_file.py --api-key hunter2", {}, ServerUnavailable, "no such file"),
    ("python no_such_file.py " + GH, {}, ServerUnavailable, "no such file"),
    ("uvx mcp-pg postgresql://bob:hunter2@db/x", {"token": "t"}, ValueError, "http"),
    ({"command": "https://bob:hunter2@h/mcp"}, {}, ValueError, "use 'url'"),
    ({"command": "npx x", "env_passthrough": "GITHUB_TOKEN=hunter2"}, {}, ValueError, "env_passthrough"),
]


@pytest.mark.parametrize("spec, kw, error, says", ERRORS)
def test_make_client_errors_hide_secrets(spec, kw, error, says):
    with pytest.raises(error) as e:
        make_client(spec, **kw)
    assert says in str(e.value) and SECRET not in str(e.value), str(e.value)


def _connect_error(spec) -> str:
    async def go():
        async with ToolSession(spec, connect_timeout=10):
            pass
    with pytest.raises(ServerUnavailable) as e:
        asyncio.run(go())
    return str(e.value)


def test_connect_error_hides_secrets_of_the_url():
    text = _connect_error("http://bob:hunter2@127.0.0.1:1/mcp?key=hunter2")
    assert "Could not connect" in text and SECRET not in text, text


def test_connect_error_hides_secrets_a_server_writes_to_stderr():
    # The command spells the DSN in pieces, so only the server's stderr holds it whole.
    spec = ("python -c 'import sys; print(\"connecting to postgresql://bob:\" + \"hunter\" + \"2@db failed\", "
            "file=sys.stderr); sys.exit(1)'")
    text = _connect_error(spec)
    assert "connecting to postgresql://bob:***@db failed" in text and SECRET not in text, text


def test_http_clients_share_one_tls_context():
    # Each rollout opens its own session: a TLS context per client (the CA bundle loaded, ~20 ms on
    # the event loop) held 192 rollouts ~4 s before their first request (bench/HISTORY.md section 30).
    from mcp_rl.mcp.specs import _http_client

    first, second = _http_client(), _http_client()
    assert first._transport._pool._ssl_context is second._transport._pool._ssl_context
