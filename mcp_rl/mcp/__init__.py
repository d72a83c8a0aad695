"""Talking to MCP servers: naming a server, sessions, tool schemas and results, the tool guard, the tool-call log, a server on a local HTTP port."""
