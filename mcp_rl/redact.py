"""Secrets out of anything printed, logged or recorded: one helper for specs, URLs and parameters.

    redact("uvx mcp-pg postgresql://bob:hunter2@db/x")   # 'uvx mcp-pg postgresql://bob:***@db/x'
    redact("http://h/mcp?api_key=abc&x=1")              # 'http://h/mcp?api_key=***&x=***'
    redact("server --pat ghp_123 --port 80")            # 'server --pat *** --port 80'
    redact_params({"api_key": "k", "temperature": 0})   # {'api_key': '***', 'temperature': 0}

What counts as a secret: a URL's password (any scheme, DSNs included), every query value of a
URL (keys hide in `?key=`, `?token=`, `?sig=` alike, and a URL's query is rarely worth printing),
the value after a secret-looking flag (`--token X`, `--api-key=X`, `-p X`, `--pat X`), a
secret-looking `NAME=value` environment pair, and a mapping's secret-looking keys. Hand-written:
no kept library redacts command lines and DSNs together (urllib only parses).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["redact", "redact_params", "MASK"]

MASK = "***"
# Words that make a flag, env name or key secret-looking (`--api-key`, `PGPASSWORD`, `judgeApiKey`).
_WORDS = {"token", "secret", "password", "passwd", "pwd", "pw", "pass", "passphrase", "pat", "key", "apikey",
          "apitoken", "accesstoken", "secretkey", "privatekey", "clientsecret", "auth", "authorization",
          "credential", "credentials", "cookie", "bearer", "sig", "signature", "pgpassword"}


def _secret_name(name: str) -> bool:
    words = re.split(r"[-_.\s]+|(?<=[a-z])(?=[A-Z])", name.strip("-"))
    # Whole words, so --keyword and --max-tokens stay; but "secret" and "passw" are secret anywhere (--mysecret).
    return any(w.lower() in _WORDS for w in words) or bool(re.search("secret|passw", name, re.I))


# scheme://user:password@host -> password hidden (user kept: it helps to know who). Up to the last
# @ before the path: a password is often pasted with a raw @ in it ("bob:p@ss@db").
_USERINFO = re.compile(r"(?P<pre>\b[a-z][a-z0-9+.\-]*://[^\s/@:]*):(?P<pw>[^\s/]*)@", re.I)
# ?a=1&b=2 in a URL -> every value hidden.
_QUERY = re.compile(r"(?P<pre>[?&][^\s=&#]+=)(?P<val>[^\s&#]*)")
# --token X, --token=X, -p X (a short -p is a password flag for psql/mysql).
_FLAG = re.compile(r"(?<!\S)(?P<name>--?[A-Za-z][\w-]*)(?P<sep>=|\s+)(?P<val>\"[^\"]*\"|'[^']*'|\S+)")
# GITHUB_TOKEN=abc, PGPASSWORD=abc (not a URL's query: that is _QUERY's)
_ENV = re.compile(r"(?<![?&\w])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<val>[^\s&]+)")
# Tokens whose format names them wherever they stand (a positional argument, a URL path): GitHub,
# OpenAI/Anthropic-style sk-, Slack, Hugging Face, AWS access key ids, JWTs.
_KNOWN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_\-]{16,}"
                    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|hf_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}"
                    r"|eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]+)")
# Authorization: Bearer abc, X-Api-Key: abc (a --header value of a stdio spec too)
_BEARER = re.compile(r"(?P<pre>\b(?:bearer|basic)\s+)(?P<val>[A-Za-z0-9._~+/=\-]{3,})", re.I)
_HEADER = re.compile(r"(?P<pre>\b(?:x-api-key|api-key|x-auth-token|authorization)\s*:\s*)(?!bearer\b|basic\b)(?P<val>[^\s'\"]+)", re.I)


def _flag(m: re.Match) -> str:
    secret = m["name"] == "-p" or _secret_name(m["name"])
    return m["name"] + m["sep"] + (MASK if secret and not m["val"].startswith("-") else m["val"])


def redact(text: Any) -> str:
    """`text` (a spec, URL, command line or message) with every secret replaced by `***`.

    >>> redact("postgresql://bob:hunter2@db:5432/x")
    'postgresql://bob:***@db:5432/x'
    >>> redact("http://127.0.0.1:8000/mcp?api_key=abc&x=1")
    'http://127.0.0.1:8000/mcp?api_key=***&x=***'
    >>> redact("npx srv --pat ghp_123 --api-key=sk-1 --port 80")
    'npx srv --pat *** --api-key=*** --port 80'
    >>> redact("GITHUB_TOKEN=ghp_1 uvx mcp-server-time")
    'GITHUB_TOKEN=*** uvx mcp-server-time'
    >>> redact("python mcp_server.py --transport http")
    'python mcp_server.py --transport http'
    """
    s = text if isinstance(text, str) else str(text)
    s = _USERINFO.sub(lambda m: f"{m['pre']}:{MASK}@", s)
    s = _QUERY.sub(lambda m: m["pre"] + MASK, s)
    s = _FLAG.sub(_flag, s)
    s = _ENV.sub(lambda m: f"{m['name']}={MASK}" if _secret_name(m["name"]) else m[0], s)
    s = _HEADER.sub(lambda m: m["pre"] + MASK, s)
    s = _BEARER.sub(lambda m: m["pre"] + MASK, s)
    return _KNOWN.sub(MASK, s)


def redact_params(value: Any) -> Any:
    """A copy of a JSON-like value with secret-looking keys masked and every string redacted.

    >>> redact_params({"api_key": "k", "temperature": 0, "extra_headers": {"Authorization": "Bearer abcdefgh12"}})
    {'api_key': '***', 'temperature': 0, 'extra_headers': {'Authorization': '***'}}
    >>> redact_params(["http://u:p@h/x", 3])
    ['http://u:***@h/x', 3]
    """
    if isinstance(value, dict):
        return {k: (MASK if isinstance(k, str) and _secret_name(k) and v not in (None, "")
                    else redact_params(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_params(v) for v in value)
    return redact(value) if isinstance(value, str) else value
