"""mcp_rl.redact: every way a secret reaches a spec, URL or parameter, table-driven."""

import pytest

from mcp_rl.redact import redact, redact_params

CASES = [
    ("postgresql://user:PW@host/db", "postgresql://user:***@host/db"),
    ("uvx mcp-server-postgres postgresql://user:PW@host:5432/db", "uvx mcp-server-postgres postgresql://user:***@host:5432/db"),
    ("http://alice:s3cret@127.0.0.1:8000/mcp", "http://alice:***@127.0.0.1:8000/mcp"),
    ("https://h/mcp?key=abc", "https://h/mcp?key=***"),
    ("https://h/mcp?a=1&token=abc#frag", "https://h/mcp?a=***&token=***#frag"),
    ("npx server --pat X", "npx server --pat ***"),
    ("npx server --api-key=sk-123", "npx server --api-key=***"),
    ("npx server --token 'a b'", "npx server --token ***"),
    ("psql -U bob -p PW", "psql -U bob -p ***"),
    ("GITHUB_TOKEN=ghp_1 uvx server", "GITHUB_TOKEN=*** uvx server"),
    ("PGPASSWORD=x psql", "PGPASSWORD=*** psql"),
    ("Authorization: Bearer abcdefgh1234", "Authorization: Bearer ***"),
    ("mcp-pg postgresql://bob:p@ss@db/x", "mcp-pg postgresql://bob:***@db/x"),  # a raw @ in the password
    ("npx server-github ghp_abcdefghijklmnopqrstuv", "npx server-github ***"),  # a token no flag names
    ("https://h/sk-abcdefghijklmnopqrstu/mcp", "https://h/***/mcp"),
    ("srv --passphrase X --client-secret=Y --mysecret Z", "srv --passphrase *** --client-secret=*** --mysecret ***"),
    ("DB_PASS=x srv", "DB_PASS=*** srv"),
    ("npx srv --header 'Authorization: Bearer TOK111'", "npx srv --header 'Authorization: Bearer ***'"),  # probe, round 2
    ("srv --header 'X-Api-Key: abc123'", "srv --header 'X-Api-Key: ***'"),
    # nothing secret: left alone
    ("python mcp_server.py --transport http --port 8000", "python mcp_server.py --transport http --port 8000"),
    ("--keyword x --pattern y --max-tokens 9", "--keyword x --pattern y --max-tokens 9"),
    ("http://127.0.0.1:8000/mcp", "http://127.0.0.1:8000/mcp"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_redact(text, expected):
    assert redact(text) == expected


def test_redact_params_masks_keys_and_strings():
    params = {"api_key": "k", "headers": {"X-Api-Key": "k2"}, "api_base": "http://u:p@h/v1?sig=1",
              "temperature": 0.5, "token": None}
    assert redact_params(params) == {"api_key": "***", "headers": {"X-Api-Key": "***"},
                                     "api_base": "http://u:***@h/v1?sig=***", "temperature": 0.5, "token": None}
